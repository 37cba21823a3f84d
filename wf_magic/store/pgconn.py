"""A PostgreSQL connection (psycopg 3, sync) that the Store's named queries use as they use sqlite3.

The Store's SQL is written once, in the portable subset both databases read the same way; this
module is the one place where what differs is said:

- placeholders (``?`` and ``:name`` become ``%s`` and ``%(name)s``; a literal ``%`` is doubled);
- ``BEGIN IMMEDIATE`` (one writer at a time, as SQLite has it) becomes ``BEGIN`` followed by a
  transaction-level advisory lock on the state's schema: writers queue exactly as they do on
  SQLite, across processes and hosts, so every read-then-write the Store does in one write
  transaction (find-or-create a scope's run, a launch key, a child's publication) is as atomic
  here as there;
- ``INSERT OR IGNORE`` / ``INSERT OR REPLACE`` become ``ON CONFLICT`` clauses (the conflict
  target of each table is in ``_PRIMARY_KEYS``); an insert whose caller needs the key the
  database assigned says ``RETURNING`` itself, as it does on SQLite;
- ``group_concat`` / ``json_group_array`` / ``total`` become ``string_agg`` / ``json_agg`` /
  ``coalesce(sum(…), 0.0)``; ``json_extract`` and ``json_valid`` are functions the schema
  defines (store/pgschema.py).

Nothing here is prepared server-side (``prepare_threshold=None``), so a connection works behind
PgBouncer's transaction pooling. Errors come out as sqlite3's DB-API classes (subclasses that
keep the SQLSTATE), so the Store's handling of a refused write or a lost database is written
once. Rows support ``row[0]``, ``row["name"]`` and ``keys()`` as ``sqlite3.Row`` does, and a
``numeric`` (what ``sum`` of integers is in PostgreSQL) comes back as an int or a float.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from typing import Any

_PRIMARY_KEYS = {
    "agent_facts": ("dispatch_id",),
    "inputs": ("input_hash",),
    "loop_contexts": ("run_id", "step_id", "loop", "which"),
    "library_cache": ("url",),
}
"""The conflict target of ``INSERT OR REPLACE`` into each table."""

_INSERT = re.compile(r"^\s*INSERT\s+(?:OR\s+(IGNORE|REPLACE)\s+)?INTO\s+(\w+)", re.IGNORECASE)
_WORD_CALLS = {"group_concat": "string_agg"}


class PgError(sqlite3.DatabaseError):
    """A PostgreSQL error; ``sqlstate`` is its five-character code."""

    sqlstate: str | None = None


class PgIntegrityError(sqlite3.IntegrityError):
    """A constraint refused a write (unique, foreign key, check, an append-only trigger)."""

    sqlstate: str | None = None


class PgOperationalError(sqlite3.OperationalError):
    """The server could not be reached, went away or refused the session."""

    sqlstate: str | None = None


class PgProgrammingError(sqlite3.ProgrammingError):
    """The SQL or its parameters were wrong (a bug, never the user's)."""

    sqlstate: str | None = None


def _wrap(exc: BaseException) -> sqlite3.Error:
    import psycopg

    sqlstate = getattr(exc, "sqlstate", None)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cls: type[sqlite3.Error]
    if isinstance(exc, psycopg.IntegrityError) or (sqlstate or "").startswith("23"):
        cls = PgIntegrityError
    elif sqlstate == "42501":  # permission denied: the role's grants, not a bug of ours
        cls = PgError
    elif isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        cls = PgOperationalError
    elif isinstance(exc, psycopg.ProgrammingError):
        cls = PgProgrammingError
    else:
        cls = PgError
    out = cls(message)
    out.sqlstate = sqlstate
    return out


# -- translation -------------------------------------------------------------------------


def _split(sql: str) -> list[tuple[bool, str]]:
    """``sql`` as (is_code, text) pieces: string literals and quoted names are not code."""
    pieces: list[tuple[bool, str]] = []
    i, start, n = 0, 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"":
            if i > start:
                pieces.append((True, sql[start:i]))
            j = i + 1
            while j < n:
                if sql[j] == ch:
                    if j + 1 < n and sql[j + 1] == ch:  # a doubled quote inside
                        j += 2
                        continue
                    break
                j += 1
            pieces.append((False, sql[i : j + 1]))
            i = start = j + 1
            continue
        i += 1
    if start < n:
        pieces.append((True, sql[start:]))
    return pieces


_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def _placeholders(code: str) -> str:
    code = code.replace("%", "%%").replace("?", "%s")
    return _NAMED.sub(r"%(\1)s", code)


def _rewrite_call(sql: str, name: str, template: str) -> str:
    """Replace each ``name(args)`` call (case-insensitive, parentheses matched) by ``template``
    with ``{}`` standing for ``args``."""
    pattern = re.compile(rf"\b{name}\s*\(", re.IGNORECASE)
    out, pos = [], 0
    while (m := pattern.search(sql, pos)) is not None:
        depth, j = 1, m.end()
        while j < len(sql) and depth:
            depth += {"(": 1, ")": -1}.get(sql[j], 0)
            j += 1
        out.append(sql[pos : m.start()])
        out.append(template.format(sql[m.end() : j - 1]))
        pos = j
    out.append(sql[pos:])
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """The PostgreSQL text of ``sql``."""
    stripped = sql.strip()
    if re.fullmatch(r"BEGIN\s+IMMEDIATE", stripped, re.IGNORECASE):
        return "BEGIN"
    suffix = ""
    match = _INSERT.match(sql)
    if match is not None:
        how, table = (match.group(1) or "").upper(), match.group(2)
        sql = sql[: match.start()] + f"INSERT INTO {table}" + sql[match.end() :]
        if how == "IGNORE":
            suffix = " ON CONFLICT DO NOTHING"
        elif how == "REPLACE":
            keys = _PRIMARY_KEYS[table]
            columns = re.search(rf"INTO\s+{table}\s*\(([^)]*)\)", sql, re.IGNORECASE)
            names = [c.strip() for c in columns.group(1).split(",")] if columns else []
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in names if c not in keys)
            suffix = f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
    pieces = []
    for is_code, text in _split(sql.rstrip().rstrip(";")):
        if is_code:
            text = _placeholders(text)
            for old, new in _WORD_CALLS.items():
                text = re.sub(rf"\b{old}\s*\(", f"{new}(", text, flags=re.IGNORECASE)
        pieces.append(text)
    out = "".join(pieces)
    # Aggregates whose argument must be wrapped (matched parentheses, after the split: a
    # literal inside the call was kept as it was, and the rewrite leaves it alone).
    out = _rewrite_call(out, "json_group_array", "coalesce(json_agg({})::text, '[]')")
    out = _rewrite_call(out, "total", "coalesce(sum({}), 0.0)")
    return out + suffix


# -- rows ---------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


class Row(tuple):  # type: ignore[type-arg]
    """A result row read like ``sqlite3.Row``: by position, by column name, and ``keys()``."""

    __slots__ = ()
    _names: tuple[str, ...] = ()

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self._names.index(key))
            except ValueError:
                raise IndexError(f"No item with that key: {key!r}") from None
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


@functools.lru_cache(maxsize=512)
def _row_class(names: tuple[str, ...]) -> type[Row]:
    return type("Row", (Row,), {"__slots__": (), "_names": names})


class Cursor:
    """The results of one statement: ``fetchone``, ``fetchall``, iteration, ``rowcount``."""

    def __init__(self, rows: list[Row], rowcount: int):
        self._rows = rows
        self._pos = 0
        self.rowcount = rowcount

    def fetchone(self) -> Row | None:
        if self._pos >= len(self._rows):
            return None
        row = self._rows[self._pos]
        self._pos += 1
        return row

    def fetchall(self) -> list[Row]:
        rows, self._pos = self._rows[self._pos :], len(self._rows)
        return rows

    def fetchmany(self, size: int = 1) -> list[Row]:
        rows = self._rows[self._pos : self._pos + size]
        self._pos += len(rows)
        return rows

    def __iter__(self) -> Iterator[Row]:
        while (row := self.fetchone()) is not None:
            yield row

    @property
    def description(self) -> list[tuple[Any, ...]] | None:
        if not self._rows:
            return None
        return [(name, None, None, None, None, None, None) for name in self._rows[0]._names]


_DEFERRABLE = re.compile(
    r"^\s*(?:(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(event_log|journal_seq|inputs|attempts|"
    r"steps|loop_contexts|agent_facts)\b(?!.*\bRETURNING\b)|SELECT\s+wf_fence\s*\()",
    re.IGNORECASE | re.DOTALL,
)
"""Statements whose outcome no caller inspects at once: writes without ``RETURNING``, and the
lease fence (which fails the transaction instead of answering). Inside a write transaction
they are sent with the next statement that returns rows, or with the COMMIT (one round
trip)."""


class _Pending:
    """A deferred write's result, filled in when the batch carrying it is sent."""

    __slots__ = ("rowcount",)

    def __init__(self) -> None:
        self.rowcount = -1


class _LazyCursor(Cursor):
    """The cursor of a deferred write: asking for its rowcount sends the batch first."""

    def __init__(self, conn: PgConnection, pending: _Pending):
        super().__init__([], -1)
        self._conn = conn
        self._pending = pending

    @property
    def rowcount(self) -> int:
        self._conn._flush()
        return self._pending.rowcount

    @rowcount.setter
    def rowcount(self, value: int) -> None:
        pass


class PgConnection:
    """One psycopg connection, in autocommit mode, speaking the Store's SQL (see the module).

    Inside a write transaction, statements are batched to save round trips (each one is a
    network round trip, where SQLite's are function calls): ``BEGIN`` and its advisory lock,
    and the writes no caller inspects at once (``_DEFERRABLE``), wait and go out together
    with the next statement whose rows are read, or with the ``COMMIT``. A deferred write that
    fails makes the batch fail: the transaction rolls back whole, as it would have anyway.

    Args:
        raw: an open ``psycopg.Connection`` (autocommit, client-side binding, no server-side
            prepares).
        lock_key: the advisory lock every write transaction takes (one per state schema).
    """

    dialect = "postgresql"

    def __init__(self, raw: Any, lock_key: int):
        self.raw = raw
        self.lock_key = lock_key
        # A Store dropped without close() (a Run handle read after its Engine closed) closes
        # its connections when collected, as sqlite3's are, instead of leaking them.
        weakref.finalize(self, raw.close)
        self.row_factory = None  # accepted and ignored (the rows are always ``Row``)
        self._lock = threading.RLock()
        self._queue: list[tuple[str, _Pending | None]] = []
        self._began = False
        """A BEGIN was asked for (sent, or waiting in the queue) and not yet ended."""

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return self._began or self.raw.info.transaction_status in (
            TransactionStatus.INTRANS,
            TransactionStatus.INERROR,
            TransactionStatus.ACTIVE,
        )

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Cursor:
        text = translate(sql)
        with self._lock:
            try:
                if text == "BEGIN":  # with the writers' lock; sent with what comes next
                    self._queue = [(f"BEGIN; SELECT pg_advisory_xact_lock({self.lock_key})", None)]
                    self._began = True
                    return Cursor([], -1)
                upper = text.lstrip()[:8].upper()
                if upper.startswith(("COMMIT", "ROLLBACK")):
                    return self._end(upper.startswith("COMMIT"))
                if self._began and _DEFERRABLE.match(text):
                    pending = _Pending()
                    self._queue.append((self._render(text, params), pending))
                    return _LazyCursor(self, pending)
                if self._queue:
                    self._queue.append((self._render(text, params), None))
                    cur = self._send()
                else:
                    cur = self.raw.execute(text, params if params else None)
                rows = self._rows(cur)
            except Exception as exc:
                self._queue = []
                if _is_psycopg_error(exc):
                    raise _wrap(exc) from exc
                raise
        return Cursor(rows, cur.rowcount)

    def _render(self, text: str, params: Sequence[Any] | dict[str, Any]) -> str:
        if not params:
            return text.replace("%%", "%")
        from psycopg import ClientCursor

        return ClientCursor(self.raw).mogrify(text, params)

    def _send(self) -> Any:
        """Send the queue as one multi-statement query; the last statement's cursor is
        returned (positioned on its result), each deferred write's rowcount filled in."""
        batch, self._queue = self._queue, []
        cur = self.raw.execute("; ".join(text for text, _ in batch))
        # The results come in statement order, one each; the BEGIN line holds two.
        for index, (text, pending) in enumerate(batch):
            if text.startswith("BEGIN; "):
                cur.nextset()  # past BEGIN's result to the lock's
            if pending is not None:
                pending.rowcount = cur.rowcount
            if index < len(batch) - 1:
                cur.nextset()
        return cur

    def _flush(self) -> None:
        with self._lock:
            if self._queue:
                try:
                    self._send()
                except Exception as exc:
                    self._queue = []
                    if _is_psycopg_error(exc):
                        raise _wrap(exc) from exc
                    raise

    def _end(self, commit: bool) -> Cursor:
        """COMMIT with whatever waits (one round trip), or ROLLBACK dropping it."""
        began, self._began = self._began, False
        if commit:
            if self._queue:
                self._queue.append(("COMMIT", None))
                self._send()
            else:
                self.raw.execute("COMMIT")
            return Cursor([], -1)
        sent = not (self._queue and self._queue[0][0].startswith("BEGIN; "))
        self._queue = []
        if sent or not began:
            self.raw.execute("ROLLBACK")
        return Cursor([], -1)

    def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> Cursor:
        text = translate(sql)
        with self._lock:
            try:
                self._flush()
                with self.raw.cursor() as cur:
                    cur.executemany(text, list(seq))
                    count = cur.rowcount
            except Exception as exc:
                self._queue = []
                if _is_psycopg_error(exc):
                    raise _wrap(exc) from exc
                raise
        return Cursor([], count)

    def cursor(self) -> _CursorShim:
        """A cursor as ``sqlite3.Connection.cursor()`` gives one (execute, then fetch)."""
        return _CursorShim(self)

    @staticmethod
    def _rows(cur: Any) -> list[Row]:
        if cur.description is None:
            return []
        cls = _row_class(tuple(col.name for col in cur.description))
        return [cls(_plain(v) for v in values) for values in cur.fetchall()]

    def close(self) -> None:
        with self._lock:
            self.raw.close()

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed)


class _CursorShim:
    row_factory: Any = None

    def __init__(self, conn: PgConnection):
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Cursor:
        return self._conn.execute(sql, params)

    def close(self) -> None:
        pass


def _is_psycopg_error(exc: BaseException) -> bool:
    import psycopg

    return isinstance(exc, psycopg.Error)


def wrap_error(exc: BaseException) -> sqlite3.Error:
    """A psycopg error as the Store's DB-API class (see the module)."""
    return _wrap(exc)
