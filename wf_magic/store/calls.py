"""The ``calls`` table: one row per model call an agent attempt made through the bridge."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRow:
    """One journaled model call (``call`` is its number within the attempt: 1, 2, …)."""

    run_id: str
    step_id: str
    unit_id: str
    dispatch_id: str
    attempt: int
    model: str | None
    status: str
    tokens_in: int
    tokens_out: int
    cache_read: int
    cache_write: int
    cost: float | None
    price_source: str | None
    latency_s: float
    started_at: float
    error: str | None
    call: int = 0
    """Assigned when journaled (the next number of its dispatch)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallTotals:
    """The sums over an attempt's journaled calls (``cost`` None when any call is unpriced)."""

    calls: int
    tokens_in: int
    tokens_out: int
    cost: float | None


def insert_call_txn(conn: sqlite3.Connection, row: CallRow) -> int:
    """Journal ``row`` as the next call of its dispatch; its number."""
    found = conn.execute(
        "SELECT COALESCE(MAX(call), 0) FROM calls WHERE dispatch_id = ?", (row.dispatch_id,)
    ).fetchone()
    number = int(found[0]) + 1
    conn.execute(
        "INSERT INTO calls (run_id, step_id, unit_id, dispatch_id, attempt, call, model, status,"
        " tokens_in, tokens_out, cache_read, cache_write, cost, price_source, latency_s,"
        " started_at, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            row.run_id,
            row.step_id,
            row.unit_id,
            row.dispatch_id,
            row.attempt,
            number,
            row.model,
            row.status,
            row.tokens_in,
            row.tokens_out,
            row.cache_read,
            row.cache_write,
            row.cost,
            row.price_source,
            row.latency_s,
            row.started_at,
            row.error,
        ),
    )
    return number


def call_totals_txn(conn: sqlite3.Connection, dispatch_id: str) -> CallTotals:
    """The sums over the journaled calls of ``dispatch_id``."""
    found = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(tokens_in), 0), COALESCE(SUM(tokens_out), 0),"
        " SUM(cost), SUM(CASE WHEN cost IS NULL AND tokens_in + tokens_out > 0 THEN 1 ELSE 0 END)"
        " FROM calls WHERE dispatch_id = ?",
        (dispatch_id,),
    ).fetchone()
    calls, unpriced = int(found[0]), int(found[4] or 0)
    cost = None if unpriced or found[3] is None else float(found[3])
    return CallTotals(
        calls=calls, tokens_in=int(found[1]), tokens_out=int(found[2]), cost=cost if calls else None
    )


_ROW_COLUMNS = (
    "run_id, step_id, unit_id, dispatch_id, attempt, call, model, status, tokens_in, tokens_out,"
    " cache_read, cache_write, cost, price_source, latency_s, started_at, error"
)


def calls_of_txn(conn: sqlite3.Connection, run_id: str) -> list[CallRow]:
    """The calls of ``run_id`` in the order they were made."""
    rows = conn.execute(
        f"SELECT {_ROW_COLUMNS} FROM calls WHERE run_id = ?"  # noqa: S608 - a constant
        " ORDER BY started_at, dispatch_id, call",
        (run_id,),
    ).fetchall()
    return [
        CallRow(
            run_id=str(r[0]),
            step_id=str(r[1]),
            unit_id=str(r[2]),
            dispatch_id=str(r[3]),
            attempt=int(r[4]),
            call=int(r[5]),
            model=None if r[6] is None else str(r[6]),
            status=str(r[7]),
            tokens_in=int(r[8]),
            tokens_out=int(r[9]),
            cache_read=int(r[10]),
            cache_write=int(r[11]),
            cost=None if r[12] is None else float(r[12]),
            price_source=None if r[13] is None else str(r[13]),
            latency_s=float(r[14]),
            started_at=float(r[15]),
            error=None if r[16] is None else str(r[16]),
        )
        for r in rows
    ]
