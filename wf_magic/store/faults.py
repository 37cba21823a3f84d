"""Translates SQLite failures of the state database into ``StateDBError`` (one line, what next)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ..errors import StateDBError, StateDBFault

_FAULTS: dict[int, StateDBFault] = {
    sqlite3.SQLITE_FULL: "full",
    sqlite3.SQLITE_BUSY: "busy",
    sqlite3.SQLITE_LOCKED: "busy",
    sqlite3.SQLITE_READONLY: "readonly",
    sqlite3.SQLITE_IOERR: "io",
    sqlite3.SQLITE_CORRUPT: "damaged",
    sqlite3.SQLITE_NOTADB: "damaged",
}


def state_db_fault(exc: sqlite3.Error, db_path: Path, run_id: str | None) -> StateDBError | None:
    """The ``StateDBError`` for ``exc``, or None when it is not a fault of the database itself.

    Constraint violations (``IntegrityError``) and misuse stay as they are: they are ours to
    handle or bugs, not something a person can fix on disk.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    fault = _FAULTS.get(code & 0xFF) if isinstance(code, int) else None
    if fault is None:
        return None
    integrity = integrity_summary(db_path) if fault == "damaged" else None
    return StateDBError(
        fault, detail=str(exc), db_path=str(db_path), run_id=run_id, integrity=integrity
    )


_PG_FAULTS: dict[str, StateDBFault] = {
    "08": "unreachable",  # connection exception
    "57": "unreachable",  # operator intervention: admin shutdown, pg_terminate_backend
    "53": "full",  # insufficient resources (disk full, out of memory, too many connections)
    "40": "busy",  # serialization failure, deadlock
    "55": "busy",  # lock not available
    "25": "busy",  # a transaction that cannot go on (read-only, aborted)
    "42": "unreadable",  # the schema is not what this version expects
    "XX": "damaged",  # internal error, data corrupted
    "42501": "readonly",  # permission denied (insufficient privilege): the role's grants
}


def pg_fault(exc: sqlite3.Error, where: str, run_id: str | None) -> StateDBError | None:
    """The ``StateDBError`` for a PostgreSQL failure (store/pgconn.py wraps psycopg's errors
    in sqlite3's classes, keeping the SQLSTATE), or None for a refused write (a constraint) or
    a misuse of the API."""
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError):
        return None
    sqlstate = getattr(exc, "sqlstate", None) or ""
    fault = _PG_FAULTS.get(sqlstate) or _PG_FAULTS.get(sqlstate[:2])
    if fault is None and isinstance(exc, sqlite3.OperationalError):
        fault = "unreachable"
    if fault is None:
        return None
    detail = " ".join(str(exc).split()) or type(exc).__name__
    return StateDBError(fault, detail=detail, db_path=where, run_id=run_id)


def is_state_db_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite reporting on the database (not a misuse of the API by a bug:
    ``ProgrammingError``, ``InterfaceError``), so that advice about state.db applies."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.ProgrammingError)


def integrity_summary(db_path: Path) -> str:
    """``PRAGMA integrity_check`` in one line: ``ok``, or its first problem and how many."""
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)
        try:
            rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check(20)")]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return f"could not run ({exc})"
    if rows == ["ok"]:
        return "ok"
    more = f" (+{len(rows) - 1} more)" if len(rows) > 1 else ""
    return " ".join(rows[0].split()) + more


def unreadable_row(db_path: Path, run_id: str, what: str) -> StateDBError:
    """A row wf_magic cannot read (``what`` names it): damaged pages when ``integrity_check``
    finds any, else a hand edit."""
    integrity = integrity_summary(db_path)
    fault: StateDBFault = "unreadable" if integrity == "ok" else "damaged"
    return StateDBError(
        fault,
        detail=what,
        db_path=str(db_path),
        run_id=run_id,
        integrity=integrity,  # "ok" too: the file is sound, the row is what is wrong
    )
