"""Open a state on PostgreSQL: connect with psycopg 3, choose the schema, migrate it.

psycopg is imported here, on first use of a ``postgresql://`` state: ``import wf_magic`` and
every SQLite state never import it (the ``wf_magic[postgresql]`` extra installs it).
"""

from __future__ import annotations

import os
import threading

from ..arg_values import env_number, number_in
from ..errors import StateDBError, UsageError
from .location import PgLocation
from .pgconn import PgConnection, wrap_error
from .pgschema import apply_migrations

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
    idle_timeout_s = _idle_timeout_s()  # a bad $WF_MAGIC_LEASE_TTL is refused before connecting
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
