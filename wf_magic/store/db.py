"""Open the state database: location, pragmas, journal mode and the network-filesystem fallback."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

BUSY_TIMEOUT_MS = 30_000
DB_FILENAME = "state.db"
_NETWORK_FS = {
    "nfs",
    "nfs4",
    "cifs",
    "smbfs",
    "smb3",
    "fuse",
    "9p",
    "afs",
    "ceph",
    "glusterfs",
    "lustre",
}
_FRESH_S = 2.0
"""An empty state.db younger than this is being created by another opener, not left empty."""
_warned_paths: set[str] = set()
_warn_lock = threading.Lock()


class StateDirWarning(UserWarning):
    """The state directory's filesystem forced a safer, slower journal mode."""


def default_state_dir() -> Path:
    """The state dir: ``$WF_MAGIC_HOME`` if set, else ``./.wf_magic``."""
    env = os.environ.get("WF_MAGIC_HOME")
    return Path(env) if env else Path.cwd() / ".wf_magic"


def filesystem_type(path: Path) -> str | None:
    """The filesystem type holding ``path`` from /proc/mounts (None where unknown)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount_point = parts[1].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > len(best):
            best, best_type = mount_point, parts[2]
    return best_type


def choose_journal_mode(state_dir: Path) -> str:
    """WAL unless overridden or the state dir lives on a network filesystem."""
    override = os.environ.get("WF_MAGIC_SQLITE_JOURNAL_MODE")
    if override:
        return override.strip().upper()
    fstype = filesystem_type(state_dir) or ""
    if fstype.split(".")[0] in _NETWORK_FS or fstype.startswith("fuse"):
        key = str(state_dir)
        with _warn_lock:
            if key not in _warned_paths:
                _warned_paths.add(key)
                warnings.warn(
                    f"State dir {state_dir} is on a network filesystem ({fstype}); WAL is unsafe "
                    "there, using journal_mode=DELETE. Set WF_MAGIC_HOME to a local disk for "
                    "speed, or WF_MAGIC_SQLITE_JOURNAL_MODE to override.",
                    StateDirWarning,
                    stacklevel=3,
                )
        return "DELETE"
    return "WAL"


def connect(
    db_path: Path, *, durability: str = "normal", read_only: bool = False
) -> sqlite3.Connection:
    """Open ``db_path`` with the house pragmas (busy timeout, foreign keys, journal mode).

    Connections are in autocommit mode (``isolation_level=None``); writers open their own
    ``BEGIN IMMEDIATE`` transactions through :func:`immediate`.
    """
    if read_only:
        uri = f"file:{db_path}?mode=ro"
        conn = sqlite3.connect(
            uri,
            uri=True,
            timeout=BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
    else:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            db_path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    if not read_only:
        mode = choose_journal_mode(db_path.parent)
        conn.execute(f"PRAGMA journal_mode = {mode}")
        sync = "FULL" if durability == "full" else "NORMAL"
        conn.execute(f"PRAGMA synchronous = {sync}")
    return conn


def read_only_uri(db_path: Path) -> str:
    """The URI that opens ``db_path`` read-only.

    A WAL reader needs to create the ``-shm`` file beside the database; where the directory
    cannot be written (a read-only filesystem) nothing can write the database either, so it
    is opened ``immutable`` (no shared memory, no locks).
    """
    immutable = "&immutable=1" if not os.access(db_path.parent, os.W_OK) else ""
    return f"file:{db_path}?mode=ro{immutable}"


def connect_reader(db_path: Path) -> sqlite3.Connection:
    """A connection that only reads (a WAL reader: it never waits for the writer)."""
    target = str(db_path) if os.access(db_path.parent, os.W_OK) else read_only_uri(db_path)
    conn = sqlite3.connect(
        target,
        uri=target.startswith("file:"),
        timeout=BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=False,
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA query_only = ON")
    return conn


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction: commit on success, roll back on any exception.

    A failed COMMIT (disk full, busy) leaves the transaction open, and some failures roll it
    back on their own: either way the connection ends outside any transaction, so the next
    write can begin, and nothing of this one lands.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with suppress(sqlite3.Error):  # the original failure is the one to report
                conn.execute("ROLLBACK")
        raise


def schema_is_current(db_path: Path) -> bool:
    """Whether ``db_path`` holds this version's schema, checked read-only (no write lock).

    False when the file is missing, empty, not a database or its ledger is behind or
    diverges: the caller then opens the writer, which migrates or says what is wrong.
    """
    from .migrations import ledger_is_current

    try:
        if db_path.stat().st_size == 0:
            return False
        conn = sqlite3.connect(read_only_uri(db_path), uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except (OSError, sqlite3.Error):
        return False
    try:
        return ledger_is_current(conn)
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def open_state_db(db_path: Path, *, durability: str = "normal") -> sqlite3.Connection:
    """Open and migrate the state database, translating OS/SQLite failures for the user.

    Raises:
        UsageError: the state dir cannot be created, or the file is not a usable database.
        MigrationError: the migration ledger diverges.
    """
    from ..errors import UsageError
    from .migrations import apply_migrations

    _warn_if_empty(db_path)
    try:
        conn = connect(db_path, durability=durability)
    except OSError as exc:
        raise UsageError(
            f"Cannot use state dir {db_path.parent}: {exc.strerror or exc}. Point --db or "
            "WF_MAGIC_HOME at a directory you can write."
        ) from None
    except sqlite3.DatabaseError as exc:
        raise _unusable(db_path, exc) from None
    try:
        apply_migrations(conn)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise _unusable(db_path, exc) from None
    except BaseException:
        conn.close()
        raise
    return conn


def _warn_if_empty(db_path: Path) -> None:
    """Say once that an empty (0-byte) ``state.db`` is being set up as a new database."""
    try:
        stat = db_path.stat()
    except OSError:
        return
    # A file another opener created a moment ago is also empty until it migrates; only an
    # empty file that has been sitting there is worth a word.
    empty = stat.st_size == 0 and time.time() - stat.st_mtime > _FRESH_S
    key = f"empty:{db_path}"
    with _warn_lock:
        if not empty or key in _warned_paths:
            return
        _warned_paths.add(key)
    warnings.warn(
        f"{db_path} is empty (0 bytes); treating it as a new state database (no runs).",
        StateDirWarning,
        stacklevel=4,
    )


def _unusable(path: Path, exc: sqlite3.DatabaseError) -> Exception:
    """Only a file that is not a database at all is worth moving aside; a damaged one, a full
    disk or a held lock is said as it is (``StateDBError``)."""
    from ..errors import UsageError
    from .faults import state_db_fault

    code = getattr(exc, "sqlite_errorcode", None)
    if code != sqlite3.SQLITE_NOTADB:
        fault = state_db_fault(exc, path, None)
        if fault is not None:
            return fault
    return UsageError(
        f"{path} is not a usable wf_magic state database ({exc}). Move it aside, or point "
        "--db or WF_MAGIC_HOME at another directory."
    )
