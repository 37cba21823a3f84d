"""The contract suite's second backend: a fresh PostgreSQL schema per test.

A module opts in with ``pytestmark = pytest.mark.backends``: its tests then run once on SQLite
(always) and once on PostgreSQL when ``WF_MAGIC_TEST_PG`` names a server
(``postgresql://USER@HOST:PORT/DB``; `.ci/run` starts one), skipped with the reason otherwise.
The ``state_dir`` fixture is then a :class:`PgState`: it opens like a folder path everywhere a
test passes it on (``Engine(state_dir)``, ``wf --db``), and the helpers that read or edit rows
behind wf_magic's back (``db_rows``, ``tamper``) speak to the schema instead of ``state.db``.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

PG_ENV = "WF_MAGIC_TEST_PG"
_BY_LOCAL: dict[Path, PgState] = {}
"""Each PostgreSQL test state by its local folder (an Engine's ``state_dir`` there)."""


def pg_state_of(state: object) -> PgState | None:
    """The PostgreSQL test state ``state`` is, or is the local folder of; None for SQLite."""
    if isinstance(state, PgState):
        return state
    if isinstance(state, Path):
        return _BY_LOCAL.get(state)
    return None


def pg_server() -> str | None:
    """The test server's URL, or None when none is configured."""
    return os.environ.get(PG_ENV) or None


class PgState(os.PathLike):  # type: ignore[type-arg]
    """A state on the test server: one new schema; ``local`` is its local folder."""

    def __init__(self, server: str, local: Path):
        self.schema = f"t_{uuid.uuid4().hex[:16]}"
        sep = "&" if "?" in server else "?"
        self.url = f"{server}{sep}schema={self.schema}"
        self.server = server
        self.local = local
        _BY_LOCAL[local] = self

    @classmethod
    def for_location(cls, location: Any) -> PgState:
        """The test handle of an Engine's ``location`` (its schema on the test server)."""
        state = cls.__new__(cls)
        state.schema = location.schema
        state.server = location.url
        state.url = f"{location.url}?schema={location.schema}"
        state.local = location.local_dir
        return state

    def __fspath__(self) -> str:
        return self.url

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"PgState({self.url!r})"

    def __truediv__(self, other: str) -> Path:
        return self.local / other

    @property
    def parent(self) -> Path:
        return self.local.parent

    def exists(self) -> bool:
        return True

    def connect(self) -> Any:
        import psycopg

        conn = psycopg.connect(self.server, autocommit=True)
        conn.execute(f'SET search_path TO "{self.schema}"')
        return conn

    def rows(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        import psycopg

        from wf_magic.store.pgconn import translate

        text = translate(sql)
        try:
            with self.connect() as conn:
                cur = conn.execute(text, params or None)
                return [tuple(r) for r in cur.fetchall()] if cur.description else []
        except psycopg.errors.UndefinedTable as exc:  # not created yet: as sqlite3 says it
            raise sqlite3.OperationalError(f"no such table ({exc})") from None

    def tamper(self, sql: str, params: tuple[object, ...] = ()) -> None:
        from wf_magic.store.pgconn import translate

        text = translate(sql)
        with self.connect() as conn, conn.transaction():
            conn.execute(text, params or None)
