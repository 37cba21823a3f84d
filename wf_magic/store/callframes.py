"""The frame of the ``calls`` table (store/calls.py): one typed row per bridged model call."""

from __future__ import annotations

import sqlite3

import pandas as pd

from .frames import _CONVERT, _Kind

CALL_COLUMNS: tuple[tuple[str, _Kind], ...] = (
    ("run", "str"),
    ("step", "str"),
    ("unit", "str"),
    ("dispatch_id", "str"),
    ("attempt", "int"),
    ("call", "int"),
    ("model", "str"),
    ("status", "str"),
    ("tokens_in", "int"),
    ("tokens_out", "int"),
    ("cache_read", "int"),
    ("cache_write", "int"),
    ("cost", "float"),
    ("latency_s", "float"),
    ("started_at", "time"),
    ("error", "str"),
    ("price_source", "str"),
)
"""The columns of :func:`calls_frame`, in order, with their kinds."""
_SQL_NAMES = {"run": "run_id", "step": "step_id", "unit": "unit_id"}


def calls_frame(
    conn: sqlite3.Connection, run_id: str, *, unit_id: str | None = None
) -> pd.DataFrame:
    """One row per model call of ``run_id`` (of one unit), in the order they were made.

    Columns (:data:`CALL_COLUMNS`): run, step, unit, dispatch_id, attempt, call (1, 2, … per
    attempt), model, status (``ok`` / ``error``), tokens_in (the cache reads and writes
    included), tokens_out, cache_read, cache_write, cost (<NaN> when no price is known),
    latency_s, started_at (UTC), error, and last price_source (where the cost came from).
    """
    names = ", ".join(_SQL_NAMES.get(name, name) for name, _ in CALL_COLUMNS)
    where, args = "run_id = ?", [run_id]
    if unit_id is not None:
        where, args = where + " AND unit_id = ?", [*args, unit_id]
    rows = conn.execute(
        f"SELECT {names} FROM calls WHERE {where} ORDER BY started_at, dispatch_id, call",  # noqa: S608
        args,
    ).fetchall()
    grid = pd.DataFrame.from_records(
        [tuple(r) for r in rows], columns=[n for n, _ in CALL_COLUMNS]
    ).to_numpy(dtype=object)
    out = {
        name: _CONVERT[kind](grid[:, i] if len(rows) else grid.reshape(0, len(CALL_COLUMNS))[:, i])
        for i, (name, kind) in enumerate(CALL_COLUMNS)
    }
    return pd.DataFrame(out)
