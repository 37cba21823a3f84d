"""SQL for resuming one loop of a step: its done outputs in one read, its recorded context.

A resume of a 10 000-unit map must not read the journal row by row into Python objects:
``loop_outputs`` hands back the succeeded outputs of a loop's units as two JSON arrays built
inside SQLite. A map step's loop records the context hash it dispatches under (see
``LoopUnits.context_hash``), so a resume can tell whether those outputs answer the units'
current inputs without rendering them.

The records are rows of ``loop_contexts`` (migration ``m009_loop_contexts``), deleted with
their run: ``first``, the context the loop's first attempt was dispatched under, and
``mixed``, present once the loop has also been dispatched under another context. Both are
written once and never updated.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Literal

from .dialect import pick
from .inlists import in_chunks


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopOutputs:
    """The succeeded (or reused) work attempts of one loop of a map step, as JSON arrays."""

    indexes_json: str
    """A JSON array of item indexes, in the same order as ``outputs_json``."""
    outputs_json: str
    """A JSON array of their outputs (``null`` for an attempt without one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopContext:
    """What the journal records about the contexts one loop of a map step dispatched under."""

    first: str | None
    """The context hash of its first dispatch (None: none recorded)."""
    mixed: bool
    """It was dispatched under another context too: its attempts answer nothing unrendered."""


def loop_context(conn: sqlite3.Connection, run_id: str, step_id: str, loop: int) -> LoopContext:
    """The recorded context of ``step_id`` at ``loop`` of ``run_id``."""
    rows = dict(
        conn.execute(
            "SELECT which, context_hash FROM loop_contexts"
            " WHERE run_id = ? AND step_id = ? AND loop = ?",
            (run_id, step_id, loop),
        ).fetchall()
    )
    context = rows.get("first")
    return LoopContext(first=None if context is None else str(context), mixed="mixed" in rows)


def record_loop_context_txn(
    conn: sqlite3.Connection, run_id: str, step_id: str, *, loop: int, context_hash: str | None
) -> Literal["first", "mixed", "none"]:
    """Record that ``step_id`` at ``loop`` is about to dispatch under ``context_hash``.

    The first context is kept only while the loop has no work attempt (checked in this
    transaction): it then vouches for every attempt the loop will have. Dispatching under any
    other context after it marks the loop mixed for good. A loop first dispatched without a
    record (before this existed, or under no provable context) never gets one.
    """
    recorded = loop_context(conn, run_id, step_id, loop)
    if recorded.first is None:
        if context_hash is None or _has_attempt(conn, run_id, step_id, loop):
            return "none"
        which: Literal["first", "mixed"] = "first"
        value = context_hash
    elif recorded.first != context_hash and not recorded.mixed:
        which, value = "mixed", context_hash or "unprovable"
    else:
        return "none"
    conn.execute(
        "INSERT OR IGNORE INTO loop_contexts (run_id, step_id, loop, which, context_hash,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, step_id, loop, which, value, time.time()),
    )
    return which


def _has_attempt(conn: sqlite3.Connection, run_id: str, step_id: str, loop: int) -> bool:
    # Every attempt of the run is looked at, whatever its unit id: this check is what lets
    # the first record vouch for the loop, so it does not lean on how unit ids are spelled.
    row = conn.execute(
        "SELECT 1 FROM attempts WHERE run_id = ? AND step_id = ? AND loop = ?"
        " AND phase = 'work' LIMIT 1",
        (run_id, step_id, loop),
    ).fetchone()
    return row is not None


def _map_unit_ids(step_id: str) -> tuple[str, str]:
    """The bounds of the unit ids of a map step (``s[0]``, ``s[1]``, ...): an index range."""
    return f"{step_id}[", f"{step_id}\\"


def loop_outputs(
    conn: sqlite3.Connection, run_id: str, step_id: str, loop: int, *, grouped: bool = False
) -> LoopOutputs:
    """The succeeded or reused work attempts of ``step_id`` at ``loop``: every one, or with
    ``grouped`` only the newest of each unit (a unit has one unless something re-ran it).

    Both arrays come from one aggregate pass, so their orders agree (whatever that order is).
    """
    rows = (
        " FROM attempts WHERE run_id = ? AND unit_id >= ? AND unit_id < ? AND step_id = ?"
        " AND loop = ? AND phase = 'work' AND status IN ('succeeded', 'reused')"
    )
    if grouped:
        rows = pick(
            conn,
            sqlite=f" FROM (SELECT item_index, output_json, max(attempt_pk){rows}"
            " GROUP BY unit_id)",
            postgresql=f" FROM (SELECT DISTINCT ON (unit_id) item_index, output_json{rows}"
            " ORDER BY unit_id, attempt_pk DESC) AS latest",
        )
    row = conn.execute(
        "SELECT json_group_array(item_index),"
        f" '[' || coalesce(group_concat(coalesce(output_json, 'null'), ','), '') || ']'{rows}",
        (run_id, *_map_unit_ids(step_id), step_id, loop),
    ).fetchone()
    return LoopOutputs(indexes_json=str(row[0]), outputs_json=str(row[1]))


def done_outputs_of_units(
    conn: sqlite3.Connection, run_id: str, unit_ids: list[str]
) -> dict[str, dict[str, str | None]]:
    """unit_id → input_hash → output JSON of the newest succeeded/reused attempt of a few units."""
    out: dict[str, dict[str, str | None]] = {}
    for chunk, marks in in_chunks(unit_ids):
        rows = conn.execute(
            "SELECT unit_id, input_hash, output_json FROM attempts WHERE run_id = ?"
            f" AND unit_id IN ({marks}) AND phase = 'work' AND status IN ('succeeded', 'reused')"
            " ORDER BY attempt_pk",
            (run_id, *chunk),
        )
        for unit_id, input_hash, output_json in rows:
            out.setdefault(unit_id, {})[input_hash] = output_json
    return out
