"""The ``calls`` table: one row per model call an agent attempt made through the bridge."""

from __future__ import annotations

import json
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


@dataclass(frozen=True, slots=True, kw_only=True)
class CallBody:
    """What one bridged call sent and got back (``bridge/tape.py``): redacted, capped, no
    header. A truncated response cannot be replayed."""

    method: str
    path: str
    """The API path after the bridge's secret (``/v1/messages?beta=true``)."""
    tools: list[str] | None
    """The tool names the request offered (None: not a JSON request)."""
    request: str | None
    request_truncated: bool
    status: int | None
    """The HTTP status the CLI received (None: no answer came from upstream)."""
    content_type: str | None
    response: str | None
    """The answer's bytes as the CLI received them (SSE or JSON), as UTF-8 text."""
    response_truncated: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedCall:
    """A journaled call with its body: a line of ``wf export-cassette``."""

    step_id: str
    unit_id: str
    attempt: int
    call: int
    model: str | None
    status: str
    body: CallBody


def insert_call_txn(conn: sqlite3.Connection, row: CallRow, body: CallBody | None = None) -> int:
    """Journal ``row`` (and its ``body``) as the next call of its dispatch; its number."""
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
    if body is not None:
        conn.execute(
            "INSERT INTO call_bodies (run_id, dispatch_id, call, method, path, tools, request,"
            " request_truncated, status, content_type, response, response_truncated)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.run_id,
                row.dispatch_id,
                number,
                body.method,
                body.path,
                None if body.tools is None else json.dumps(body.tools),
                body.request,
                int(body.request_truncated),
                body.status,
                body.content_type,
                body.response,
                int(body.response_truncated),
            ),
        )
    return number


def recorded_calls_txn(conn: sqlite3.Connection, run_id: str) -> list[RecordedCall]:
    """The calls with a body of ``run_id`` and its child runs, attempt by attempt, in call
    order."""
    rows = conn.execute(
        "SELECT c.step_id, c.unit_id, c.attempt, c.call, c.model, c.status, b.method, b.path,"
        " b.tools, b.request, b.request_truncated, b.status, b.content_type, b.response,"
        " b.response_truncated FROM calls c JOIN call_bodies b"
        " ON b.dispatch_id = c.dispatch_id AND b.call = c.call"
        " WHERE c.run_id IN (SELECT run_id FROM runs WHERE run_id = ? OR root_run_id = ?)"
        " ORDER BY c.step_id, c.unit_id, c.attempt, c.call",
        (run_id, run_id),
    ).fetchall()
    return [
        RecordedCall(
            step_id=str(r[0]),
            unit_id=str(r[1]),
            attempt=int(r[2]),
            call=int(r[3]),
            model=None if r[4] is None else str(r[4]),
            status=str(r[5]),
            body=CallBody(
                method=str(r[6]),
                path=str(r[7]),
                tools=None if r[8] is None else [str(t) for t in json.loads(r[8])],
                request=None if r[9] is None else str(r[9]),
                request_truncated=bool(r[10]),
                status=None if r[11] is None else int(r[11]),
                content_type=None if r[12] is None else str(r[12]),
                response=None if r[13] is None else str(r[13]),
                response_truncated=bool(r[14]),
            ),
        )
        for r in rows
    ]


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
