"""Open a state on PostgreSQL: connect with psycopg 3, choose the schema, migrate it.

psycopg is imported here, on first use of a ``postgresql://`` state: ``import wf_magic`` and
every SQLite state never import it (the ``wf_magic[postgresql]`` extra installs it).
"""

from __future__ import annotations

import os
import threading

from ..errors import StateDBError, UsageError
from .location import PgLocation
from .pgconn import PgConnection, wrap_error
from .pgschema import apply_migrations

CONNECT_TIMEOUT_S = 10
_migrated: set[str] = set()
_migrate_lock = threading.Lock()


def open_pg(location: PgLocation, *, migrate: bool) -> PgConnection:
    """A connection to ``location`` with its schema first on the search path; ``migrate``:
    create and migrate the schema first (once per process and location).

    Raises:
        UsageError: psycopg is not installed.
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
    except psycopg.Error as exc:
        wrapped = wrap_error(exc)
        raise StateDBError(
            "unreachable", detail=" ".join(str(wrapped).split()), db_path=location.where
        ) from None
    conn = PgConnection(raw, location.lock_key)
    if migrate:
        with _migrate_lock:
            if location.where not in _migrated:
                try:
                    apply_migrations(conn, location.schema)
                except BaseException:
                    conn.close()
                    raise
                _migrated.add(location.where)
    return conn
