"""Open a state on PostgreSQL: connect with psycopg 3, choose the schema, migrate it.

psycopg is imported here, on first use of a ``postgresql://`` state: ``import wf_magic`` and
every SQLite state never import it (the ``wf_magic[postgresql]`` extra installs it).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any
from urllib.parse import unquote, urlsplit

from ..arg_values import env_number, number_in
from ..errors import StateDBError, UsageError, WorkflowError
from .location import PgLocation
from .pgconn import PgConnection, wrap_error
from .pgschema import apply_migrations
from .pgurl import url_problem

CONNECT_TIMEOUT_S = 10
BUSY_TIMEOUT_S = 30
"""How long a write waits for another writer's transaction (SQLite's busy timeout)."""


DEFAULT_LEASE_TTL_S = 30.0
LEASE_TTL_ENV = "WF_MAGIC_LEASE_TTL"
LEASE_TTL_RANGE_S = (0.3, 86400.0)
"""A lease shorter than 0.3 s expires between its own renewals; one past a day never does."""


def lease_ttl_s() -> float:
    """The TTL of a driver's lease (store/leases.py): ``$WF_MAGIC_LEASE_TTL`` seconds (default
    30, from 0.3 to 86400). Here, beside the session settings that follow from it.

    Raises:
        UsageError: the variable is not a finite number in that range (``nan``, ``inf``, ``0``).
    """
    low, high = LEASE_TTL_RANGE_S
    return env_number(LEASE_TTL_ENV, DEFAULT_LEASE_TTL_S, number_in(low, high), environ=os.environ)


def _idle_timeout_s() -> int:
    """Half the lease TTL, at least 5 s: a paused driver's transaction ends (and releases
    the writers' lock) before its lease can be taken over."""
    return max(5, int(lease_ttl_s() / 2))


INSUFFICIENT_PRIVILEGE = "42501"
"""The SQLSTATE of a statement the role may not run (``permission denied for ...``)."""


def _unsaid(text: str, location: PgLocation) -> str:
    """``text`` (a libpq message) with the URL's password, as written and decoded, masked."""
    password = urlsplit(location.url).password
    for secret in {password, unquote(password or "")} - {None, ""}:
        text = text.replace(str(secret), "***")
    return text


def _permission_error(detail: str, raw: Any, location: PgLocation) -> UsageError:
    """A privilege the role lacks said as the permission problem it is, with the grant."""
    user, db, schema = raw.info.user, raw.info.dbname, location.schema
    return UsageError(
        f"State {location.where}: role {user!r} may not use the schema {schema!r} "
        f"({_unsaid(' '.join(detail.split()), location)}). Have the database owner run "
        f'GRANT CREATE ON DATABASE "{db}" TO "{user}" (for a new schema) or '
        f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO "{user}" (for one that exists), or '
        "choose a ?schema=NAME the role owns."
    )


def _privilege_problem(raw: Any, schema: str, *, migrate: bool) -> str | None:
    """What the role lacks for ``schema``, as the server words it: USAGE on it (without which
    the server silently leaves it off the search path), or CREATE on the database to make it."""
    usage, create = raw.execute(
        "SELECT (SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace"
        " WHERE nspname = %s), has_database_privilege(current_database(), 'CREATE')",
        (schema,),
    ).fetchone()
    if usage is False:
        return f"permission denied for schema {schema}"
    if usage is None and migrate and not create:
        return f"permission denied for database {raw.info.dbname}"
    return None


def _migrate(conn: PgConnection, raw: Any, location: PgLocation) -> None:
    """Migrate ``location``'s schema once per process; a refused privilege said as such."""
    with _migrate_lock:
        if location.where in _migrated:
            return
        try:
            apply_migrations(conn, location.schema)
        except BaseException as exc:
            refused = getattr(exc, "sqlstate", None) == INSUFFICIENT_PRIVILEGE
            error = _permission_error(str(exc), raw, location) if refused else None
            conn.close()
            if error is not None:
                raise error from None
            if isinstance(exc, UsageError):  # the schema's own problem: which state it is
                raise UsageError(f"State {location.where}: {exc}") from None
            said = _migration_failure(exc, location)
            if said is not None:
                raise said from None
            raise
        _migrated.add(location.where)


def _migration_failure(exc: BaseException, location: PgLocation) -> WorkflowError | None:
    """What a server error while migrating means for the user (None: not a server error).

    A connection lost meanwhile is the server being unreachable; any other refusal (a table
    of the same name already there, made by something else) means the schema is not one
    wf_magic can bring to this version: said in one line naming it and what to do.
    """
    import psycopg

    if not isinstance(exc, psycopg.Error | sqlite3.Error):  # raw, or wrapped by PgConnection
        return None
    detail = _unsaid(" ".join(str(exc).split()), location)
    if isinstance(
        exc, psycopg.OperationalError | psycopg.InterfaceError | sqlite3.OperationalError
    ):
        return StateDBError("unreachable", detail=detail, db_path=location.where)
    # A usage error, as a SQLite file that is no wf_magic database is (store/opening.py).
    return UsageError(
        f"State {location.where}: the schema {location.schema!r} is not a usable wf_magic "
        f"state ({detail}); it holds tables wf_magic did not create, or ones changed by hand. "
        "Choose another ?schema=NAME (a new or empty one), or remove what is in the way."
    )


_migrated: set[str] = set()
_migrate_lock = threading.Lock()


def open_pg(location: PgLocation, *, migrate: bool) -> PgConnection:
    """A connection to ``location`` with its schema first on the search path; ``migrate``:
    create and migrate the schema first (once per process and location).

    Raises:
        UsageError: psycopg is not installed.
        UsageError: the URL is malformed, ``$WF_MAGIC_LEASE_TTL`` is out of range, or the
            role lacks a privilege the schema needs (named, with the grant).
        StateDBError: the server cannot be reached or refused the session (``unreachable``).
        MigrationError: the schema's migration ledger diverges.
    """
    try:
        import psycopg
    except ImportError:
        raise UsageError(
            f"State {location.where} is on PostgreSQL, which needs psycopg 3: "
            "pip install 'wf_magic[postgresql]'."
        ) from None
    idle_timeout_s = _idle_timeout_s()  # a bad $WF_MAGIC_LEASE_TTL is refused before connecting
    problem = url_problem(location.url)
    if problem is not None:
        raise UsageError(
            f"State {location.where}: libpq cannot read the URL: {_unsaid(problem, location)}; "
            "write it as postgresql://USER@HOST[:PORT]/DB?schema=NAME (percent-encode a "
            "reserved character in the user or password)."
        )
    try:
        raw = psycopg.connect(
            location.url,
            autocommit=True,
            prepare_threshold=None,  # nothing prepared server-side: PgBouncer-safe
            # Parameters bound client-side: the Store's SQL leaves types to the values (as
            # SQLite does), which server-side binding cannot always infer (`? IS NULL`).
            cursor_factory=psycopg.ClientCursor,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=f"wf_magic pid {os.getpid()}",
        )
        raw.execute(f'SET search_path TO "{location.schema}"')
        # A writer waits for the writers' lock as SQLite's busy timeout does, and a session
        # left idle inside a transaction (a driver paused mid-write: SIGSTOP, a laptop lid)
        # is ended by the server, so it cannot hold every other writer of the state for ever.
        raw.execute(
            f"SET lock_timeout = '{BUSY_TIMEOUT_S}s';"
            f" SET idle_in_transaction_session_timeout = '{idle_timeout_s}s'"
        )
        lacks = _privilege_problem(raw, location.schema, migrate=migrate)
    except psycopg.Error as exc:
        wrapped = wrap_error(exc)
        raise StateDBError(
            "unreachable", detail=" ".join(str(wrapped).split()), db_path=location.where
        ) from None
    if lacks is not None:
        error = _permission_error(lacks, raw, location)
        raw.close()
        raise error
    conn = PgConnection(raw, location.lock_key)
    if migrate:
        _migrate(conn, raw, location)
    return conn
