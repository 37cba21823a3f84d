"""Open the state database for use: migrate it, or check read-only that it is current.

Kept apart from ``db.py`` (connections and pragmas), which ``migrations.py`` builds on: this
module sits on both, so neither needs a function-level import of the other.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import warnings
from pathlib import Path

from ..errors import READ_ONLY_ERRNOS, StateDirReadOnly, UsageError
from .db import BUSY_TIMEOUT_MS, StateDirWarning, connect, read_only_uri
from .faults import state_db_fault
from .migrations import apply_migrations, ledger_is_current

_FRESH_S = 2.0
"""An empty state.db younger than this is another opener's, mid-creation: not worth a word."""
_warned_empty: set[str] = set()
_warn_lock = threading.Lock()


def schema_is_current(db_path: Path) -> bool:
    """Whether ``db_path`` holds this version's schema, checked read-only (no write lock).

    False when the file is missing, empty, not a database or its ledger is behind or
    diverges: the caller then opens the writer, which migrates or says what is wrong.
    """
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
        StateDirReadOnly: the state dir or its database file cannot be written.
        UsageError: the state dir cannot be created, or the file is not a usable database.
        MigrationError: the migration ledger diverges.
    """
    _warn_if_empty(db_path)
    try:
        conn = connect(db_path, durability=durability)
    except OSError as exc:
        read_only = StateDirReadOnly.from_os_error(str(db_path.parent), exc)
        if read_only is not None:
            raise read_only from None
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
    key = str(db_path)
    with _warn_lock:
        if not empty or key in _warned_empty:
            return
        _warned_empty.add(key)
    warnings.warn(
        f"{db_path} is empty (0 bytes); treating it as a new state database (no runs).",
        StateDirWarning,
        stacklevel=4,
    )


def write_problem(db_path: Path) -> str | None:
    """Why the state dir or its database file cannot be written; None when both can.

    Asked only after SQLite failed to open or write (it says "unable to open database file"
    of a directory it cannot create its ``-wal`` in): a file is created and removed in the
    directory, and the database is opened for writing (never written), so the reason is the
    operating system's own (a read-only filesystem, permissions, ``chattr +i``).
    """
    probe = db_path.parent / f".wf_magic-write-probe-{os.getpid()}-{threading.get_ident()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno in READ_ONLY_ERRNOS:
            return f"creating a file in it: {exc.strerror}"
        return None
    else:
        with contextlib.suppress(OSError):
            probe.unlink()
    try:
        os.close(os.open(db_path, os.O_WRONLY))
    except OSError as exc:
        if exc.errno in READ_ONLY_ERRNOS:
            return f"opening {db_path.name} for writing: {exc.strerror}"
    return None


def _unusable(path: Path, exc: sqlite3.DatabaseError) -> Exception:
    """Only a file that is not a database at all is worth moving aside; a state dir that
    cannot be written is named as such (``StateDirReadOnly``), a damaged database, a full disk
    or a held lock is said as it is (``StateDBError``)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY):
        problem = write_problem(path)
        if problem is not None:
            return StateDirReadOnly(str(path.parent), reason=problem)
    if code != sqlite3.SQLITE_NOTADB:
        fault = state_db_fault(exc, path, None)
        if fault is not None:
            return fault
    return UsageError(
        f"{path} is not a usable wf_magic state database ({exc}). Move it aside, or point "
        "--db or WF_MAGIC_HOME at another directory."
    )
