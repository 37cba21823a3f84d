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

from .location import DB_FILENAME, PgLocation, parse_state

BUSY_TIMEOUT_MS = 30_000
__all__ = ["DB_FILENAME", "default_state", "default_state_dir", "store_target"]
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
_warned_paths: set[str] = set()
_warn_lock = threading.Lock()


class StateDirWarning(UserWarning):
    """The state directory's filesystem forced a safer, slower journal mode."""


def default_state() -> Path | PgLocation:
    """The state: ``$WF_MAGIC_HOME`` (a folder or a ``postgresql://`` URL) if set, else
    ``./.wf_magic``."""
    env = os.environ.get("WF_MAGIC_HOME")
    return parse_state(env) if env else Path.cwd() / ".wf_magic"


def default_state_dir() -> Path:
    """This machine's folder of the default state (on PostgreSQL, its local folder)."""
    state = default_state()
    return state.local_dir if isinstance(state, PgLocation) else state


def store_target(state: str | os.PathLike[str] | PgLocation) -> Path | PgLocation:
    """What a ``Store`` opens for ``state``: a folder's ``state.db``, or the PostgreSQL schema."""
    parsed = parse_state(state)
    return parsed if isinstance(parsed, PgLocation) else parsed / DB_FILENAME


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
                warnings.warn(network_fs_text(state_dir, fstype), StateDirWarning, stacklevel=3)
        return "DELETE"
    return "WAL"


POSTGRES_URL_FORM = "postgresql://USER@HOST/DB?schema=NAME"
"""The state-database URL a team across hosts is pointed at (``--db`` / ``WF_MAGIC_HOME``)."""


def network_fs_text(state_dir: Path, fstype: str) -> str:
    """The one warning for a state dir on a network filesystem: the journal mode it forces,
    and that a run's lock file there does not keep a driver on another host out."""
    return (
        f"State dir {state_dir} is on a network filesystem ({fstype}); WAL is unsafe there, "
        "using journal_mode=DELETE, and a run's lock file there does not exclude drivers on "
        "other hosts (two hosts may drive one run at once). Set WF_MAGIC_HOME to a local disk "
        "for one host, or WF_MAGIC_SQLITE_JOURNAL_MODE to override the journal mode; for a "
        f"team across hosts use PostgreSQL: --db {POSTGRES_URL_FORM} (or WF_MAGIC_HOME set "
        "to that URL)."
    )


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
        _set_journal_mode(conn, choose_journal_mode(db_path.parent))
        sync = "FULL" if durability == "full" else "NORMAL"
        conn.execute(f"PRAGMA synchronous = {sync}")
    return conn


def _set_journal_mode(conn: sqlite3.Connection, mode: str) -> None:
    """Set the journal mode, waiting out other openers doing the same.

    Switching a new database to WAL takes an exclusive lock, and SQLite reports a
    conflict with another connection switching it (or recovering its WAL) as "database
    is locked" at once, without calling the busy handler: fifty threads opening one new
    state dir met it. Retry until the busy timeout, as any other wait on the lock would.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = 0.001
    while True:
        try:
            conn.execute(f"PRAGMA journal_mode = {mode}").fetchall()
            return
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", None) or sqlite3.SQLITE_BUSY
            if code & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


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
