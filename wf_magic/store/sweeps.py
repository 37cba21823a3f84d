"""SQL for sweeps: the sweep rows, their cells, what each cell's run paid, the sweep's use."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from .cellstarts import insert_rows_txn
from .derived import BUDGET_TOKENS
from .records import AttemptRow, from_row

SweepStatus = Literal["running", "completed", "stopped", "failed"]
"""Where a sweep stands:

- ``running``: cells are owed (being driven now, or by the next ``sweep-resume``).
- ``completed``: every cell's run completed.
- ``stopped``: the sweep's budget stopped it (``status_reason`` names the ceiling), or an
  interrupt did (``status_reason`` starts ``interrupted``); resumable either way.
- ``failed``: every cell settled and at least one is failed, blocked or was skipped.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRow:
    """A row of ``sweeps``: the definition (and the plan, once) of one sweep."""

    sweep_id: str
    workflow: str
    source: str
    plan_json: str
    plan_hash: str
    definition_json: str
    """Canonical JSON of ``{"grid": …, "rows": […], "repeat": n}``."""
    definition_hash: str
    budget_json: str
    """The sweep's ceilings (``max_units`` / ``max_tokens`` / ``max_cost``), JSON."""
    sweep_key: str | None
    status: SweepStatus
    status_reason: str | None
    cells: int
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepCellRow:
    """A row of ``sweep_cells``, with what its run reports (None until it has a run)."""

    cell_index: int
    point_json: str
    row_index: int | None
    repeat: int
    params_json: str
    run_id: str | None
    note: str | None
    run_status: str | None
    status_reason: str | None
    result_json: str | None
    run_created_at: float | None
    run_finished_at: float | None
    units_paid: int
    tokens_paid: int
    cost_paid: float
    tokens_original: int
    cost_original: float

    @property
    def status(self) -> str:
        """What the cell reads as: its run's status; ``pending`` before it has a run;
        ``deleted`` once ``wf gc`` deleted its run (a cell names its run from the run's own
        insert on, so a named run that is missing was deleted)."""
        if self.run_status is not None:
            return self.run_status
        return "pending" if self.run_id is None else "deleted"


@dataclass(frozen=True, slots=True, kw_only=True)
class CellSpec:
    """A cell to insert: its index, grid point, row, repeat and the params of its run."""

    cell_index: int
    point_json: str
    row_index: int | None
    repeat: int
    params_json: str


_SWEEP_COLUMNS = (
    "sweep_id, workflow, source, plan_json, plan_hash, definition_json, definition_hash,"
    " budget_json, sweep_key, status, status_reason, cells, created_at, updated_at"
)


def get_sweep(conn: sqlite3.Connection, sweep_id: str) -> SweepRow | None:
    """The sweep ``sweep_id`` (None when there is none)."""
    row = conn.execute(
        f"SELECT {_SWEEP_COLUMNS} FROM sweeps WHERE sweep_id = ?", (sweep_id,)
    ).fetchone()
    return from_row(SweepRow, row) if row is not None else None


def sweep_by_key(conn: sqlite3.Connection, key: str) -> SweepRow | None:
    """The sweep launched with ``key``, if any."""
    row = conn.execute(
        f"SELECT {_SWEEP_COLUMNS} FROM sweeps WHERE sweep_key = ?", (key,)
    ).fetchone()
    return from_row(SweepRow, row) if row is not None else None


def find_sweep_prefix(conn: sqlite3.Connection, prefix: str, *, limit: int) -> list[str]:
    """Sweep ids starting with ``prefix``."""
    rows = conn.execute(
        "SELECT sweep_id FROM sweeps WHERE sweep_id >= ? AND sweep_id < ? ORDER BY sweep_id"
        " LIMIT ?",
        (prefix, prefix + "\uffff", limit),
    ).fetchall()
    return [str(r[0]) for r in rows]


def list_sweeps(conn: sqlite3.Connection) -> list[SweepRow]:
    """Every sweep, newest first."""
    rows = conn.execute(
        f"SELECT {_SWEEP_COLUMNS} FROM sweeps ORDER BY created_at DESC, sweep_id"
    ).fetchall()
    return [from_row(SweepRow, r) for r in rows]


def create_sweep_txn(conn: sqlite3.Connection, row: SweepRow, cells: list[CellSpec]) -> None:
    """Insert a sweep and all its cells (one transaction: a sweep never lacks cells); nothing
    when another driver of the same definition inserted it first."""
    if conn.execute("SELECT 1 FROM sweeps WHERE sweep_id = ?", (row.sweep_id,)).fetchone():
        return
    conn.execute(
        f"INSERT INTO sweeps ({_SWEEP_COLUMNS}) VALUES ({', '.join('?' * 14)})",
        tuple(getattr(row, name.strip()) for name in _SWEEP_COLUMNS.split(",")),
    )
    insert_rows_txn(  # a few hundred cells per statement
        conn,
        "INSERT INTO sweep_cells (sweep_id, cell_index, point_json, row_index, repeat,"
        " params_json)",
        [
            (row.sweep_id, c.cell_index, c.point_json, c.row_index, c.repeat, c.params_json)
            for c in cells
        ],
    )


def set_sweep_status_txn(
    conn: sqlite3.Connection,
    sweep_id: str,
    status: SweepStatus,
    reason: str | None,
    budget_json: str | None = None,
) -> None:
    """Write a sweep's status (and, when given, its new ceilings)."""
    conn.execute(
        "UPDATE sweeps SET status = ?, status_reason = ?, updated_at = ?,"
        " budget_json = COALESCE(?, budget_json) WHERE sweep_id = ?",
        (status, reason, time.time(), budget_json, sweep_id),
    )


def set_cell_run_txn(
    conn: sqlite3.Connection, sweep_id: str, cell_index: int, run_id: str, note: str | None
) -> None:
    """Record the run a cell settled on (and a note: why it was skipped, say)."""
    conn.execute(
        "UPDATE sweep_cells SET run_id = ?, note = ? WHERE sweep_id = ? AND cell_index = ?",
        (run_id, note, sweep_id, cell_index),
    )


# Per cell: its run's fields, and the charged attempts of the run's tree. "Paid" counts the
# attempts this sweep paid (``sweep_charges``, written at reservation); "original" counts
# every charged attempt plus what reused attempts cost where they were first paid.
_CELLS = """
WITH tree AS (
    SELECT c.cell_index, r.run_id FROM sweep_cells c
    JOIN runs r ON r.root_run_id = c.run_id
    WHERE c.sweep_id = :sweep
),
paid AS (
    SELECT t.cell_index,
        SUM(CASE WHEN sc.sweep_id IS NOT NULL THEN 1 ELSE 0 END) AS units,
        SUM(CASE WHEN sc.sweep_id IS NOT NULL THEN a.tokens_in + a.tokens_out ELSE 0 END)
            AS tokens,
        SUM(CASE WHEN sc.sweep_id IS NOT NULL THEN COALESCE(a.cost, 0) ELSE 0 END) AS cost,
        SUM(CASE WHEN a.charged = 1 THEN a.tokens_in + a.tokens_out ELSE 0 END
            + CASE WHEN a.status = 'reused' THEN a.saved_tokens ELSE 0 END) AS tokens_original,
        SUM(CASE WHEN a.charged = 1 THEN COALESCE(a.cost, 0)
            WHEN a.status = 'reused' THEN COALESCE(o.cost, 0) ELSE 0 END) AS cost_original
    FROM tree t JOIN attempts a ON a.run_id = t.run_id
    LEFT JOIN sweep_charges sc ON sc.dispatch_id = a.dispatch_id AND sc.sweep_id = :sweep
    LEFT JOIN attempts o ON a.status = 'reused' AND o.dispatch_id = a.reused_from
    GROUP BY t.cell_index
)
SELECT c.cell_index, c.point_json, c.row_index, c.repeat, c.params_json, c.run_id, c.note,
    r.status AS run_status, r.status_reason, r.result_json, r.created_at AS run_created_at,
    r.finished_at AS run_finished_at,
    COALESCE(p.units, 0) AS units_paid, COALESCE(p.tokens, 0) AS tokens_paid,
    COALESCE(p.cost, 0.0) AS cost_paid, COALESCE(p.tokens_original, 0) AS tokens_original,
    COALESCE(p.cost_original, 0.0) AS cost_original
FROM sweep_cells c
LEFT JOIN runs r ON r.run_id = c.run_id
LEFT JOIN paid p ON p.cell_index = c.cell_index
WHERE c.sweep_id = :sweep
ORDER BY c.cell_index
"""


def sweep_cells(conn: sqlite3.Connection, sweep_id: str) -> list[SweepCellRow]:
    """Every cell of ``sweep_id`` with its run's status, result and what this sweep paid."""
    rows = conn.execute(_CELLS, {"sweep": sweep_id}).fetchall()
    return [_typed(from_row(SweepCellRow, r)) for r in rows]


def _typed(row: SweepCellRow) -> SweepCellRow:
    """``row`` with its sums as the types it declares: a SUM of integer zeros (attempts of no
    known cost) is the integer 0 in SQL, which would make a frame's ``cost_paid`` an integer
    column in one sweep and a float column in another."""
    return replace(
        row,
        units_paid=int(row.units_paid),
        tokens_paid=int(row.tokens_paid),
        tokens_original=int(row.tokens_original),
        cost_paid=float(row.cost_paid),
        cost_original=float(row.cost_original),
    )


def sweep_usage(conn: sqlite3.Connection, sweep_id: str) -> tuple[int, int, float]:
    """(charged attempts, tokens, cost) this sweep paid (its ``sweep_charges``, and what runs
    gc deleted had paid: ``sweep_charges_kept``)."""
    row = conn.execute(
        f"SELECT COUNT(*), COALESCE(SUM({BUDGET_TOKENS}), 0), COALESCE(SUM(a.cost), 0)"
        " FROM sweep_charges sc JOIN attempts a ON a.dispatch_id = sc.dispatch_id"
        " WHERE sc.sweep_id = ?",
        (sweep_id,),
    ).fetchone()
    kept = _kept_usage(conn, sweep_id)
    return int(row[0]) + kept[0], int(row[1]) + kept[1], float(row[2]) + kept[2]


def _kept_usage(conn: sqlite3.Connection, sweep_id: str) -> tuple[int, int, float]:
    row = conn.execute(
        "SELECT COALESCE(SUM(units), 0), COALESCE(SUM(tokens), 0), COALESCE(SUM(cost), 0)"
        " FROM sweep_charges_kept WHERE sweep_id = ?",
        (sweep_id,),
    ).fetchone()
    return int(row[0]), int(row[1]), float(row[2])


def keep_sweep_charges_txn(conn: sqlite3.Connection, root_run_id: str) -> None:
    """Before gc deletes the tree of ``root_run_id``: keep what each sweep paid through its
    runs (their charges go with them), so the sweep's ceiling and ``paid`` still count it."""
    conn.execute(
        "INSERT INTO sweep_charges_kept (sweep_id, run_id, units, tokens, cost)"
        f" SELECT sc.sweep_id, sc.run_id, COUNT(*), COALESCE(SUM({BUDGET_TOKENS}), 0),"
        " COALESCE(SUM(a.cost), 0)"
        " FROM sweep_charges sc JOIN attempts a ON a.dispatch_id = sc.dispatch_id"
        " JOIN runs r ON r.run_id = sc.run_id WHERE r.root_run_id = ?"
        " GROUP BY sc.sweep_id, sc.run_id",
        (root_run_id,),
    )


def sweep_rescores(conn: sqlite3.Connection, sweep_id: str) -> set[str]:
    """The runs of ``sweep_id``'s cells with a score unit whose every attempt failed: a
    drive of the run measures it again, so such a cell is still owed that."""
    rows = conn.execute(
        "SELECT DISTINCT a.run_id FROM attempts a JOIN sweep_cells c ON c.run_id = a.run_id"
        " WHERE c.sweep_id = ? AND a.phase = 'score' AND a.status = 'failed'"
        " AND NOT EXISTS (SELECT 1 FROM attempts b WHERE b.run_id = a.run_id"
        " AND b.unit_id = a.unit_id AND b.status IN ('succeeded', 'reused', 'running'))",
        (sweep_id,),
    ).fetchall()
    return {str(r[0]) for r in rows}


def sweep_flow(conn: sqlite3.Connection, sweep_id: str) -> tuple[int, list[tuple[float, str]]]:
    """(attempts running in the sweep's cells, (at, data_json) of each ``throttled`` event)."""
    running = conn.execute(
        "SELECT COUNT(*) FROM attempts a JOIN sweep_cells c ON c.run_id = a.run_id"
        " WHERE c.sweep_id = ? AND a.status = 'running'",
        (sweep_id,),
    ).fetchone()
    throttles = conn.execute(
        "SELECT e.at, e.data_json FROM events e JOIN sweep_cells c ON c.run_id = e.run_id"
        " WHERE c.sweep_id = ? AND e.kind = 'throttled'",
        (sweep_id,),
    ).fetchall()
    return int(running[0]), [(float(at), str(data or "")) for at, data in throttles]


def fitting_txn(conn: sqlite3.Connection, sweep_id: str, keys: Sequence[tuple[Any, bool]]) -> int:
    """How many of a batch's ``(key, charged)`` reservations, in order, fit ``sweep_id``'s
    ceilings, counted from what the sweep paid as committed when this transaction began.

    Called in the reservation's transaction (the database's one writer at a time), so every
    driver of the sweep (two ``wf sweep`` processes, a sweep and its ``sweep-resume``) counts
    the others' reservations: ``max_units`` 13 is 13 however many take cells. Tokens and cost
    are known only when a unit finishes: none is reserved once they are reached.
    """
    row = conn.execute("SELECT budget_json FROM sweeps WHERE sweep_id = ?", (sweep_id,)).fetchone()
    ceilings = json.loads(row[0]) if row is not None and row[0] else {}
    max_units = ceilings.get("max_units")
    max_tokens, max_cost = ceilings.get("max_tokens"), ceilings.get("max_cost")
    if max_units is None and max_tokens is None and max_cost is None:
        return len(keys)
    if max_tokens is None and max_cost is None:
        found = conn.execute(
            "SELECT COUNT(*) FROM sweep_charges WHERE sweep_id = ?", (sweep_id,)
        ).fetchone()
        units, tokens, cost = int(found[0]) + _kept_usage(conn, sweep_id)[0], 0, 0.0
    else:
        units, tokens, cost = sweep_usage(conn, sweep_id)
    if (max_tokens is not None and tokens >= max_tokens) or (
        max_cost is not None and cost >= max_cost
    ):
        room = 0
    else:
        room = len(keys) if max_units is None else max(0, int(max_units) - units)
    for fitting, (_key, charged) in enumerate(keys):
        if charged:
            if room == 0:
                return fitting
            room -= 1
    return len(keys)


def charge_if_unbounded_txn(
    conn: sqlite3.Connection, sweep_id: str, attempts: list[AttemptRow]
) -> bool:
    """Record that ``sweep_id`` pays these charged attempts, if it has no ceilings (then any
    reservation fits; checked by each insert in this transaction). False, with nothing
    recorded for the rest, when it has some: the caller rolls back and counts what fits."""
    for a in attempts:
        if not a.charged:
            continue
        cur = conn.execute(
            "INSERT OR IGNORE INTO sweep_charges (dispatch_id, sweep_id, run_id) SELECT ?, ?, ?"
            " WHERE EXISTS (SELECT 1 FROM sweeps WHERE sweep_id = ? AND budget_json = ?)",
            (a.dispatch_id, sweep_id, a.run_id, sweep_id, NO_CEILINGS),
        )
        if cur.rowcount != 1:
            return False
    return True


NO_CEILINGS = "{}"
"""The ``budget_json`` of a sweep without ceilings (``canonical_json({})``)."""


def record_charges_txn(conn: sqlite3.Connection, sweep_id: str, attempts: list[AttemptRow]) -> None:
    """Record that ``sweep_id`` pays these charged attempts (in their reservation's
    transaction)."""
    conn.executemany(
        "INSERT OR IGNORE INTO sweep_charges (dispatch_id, sweep_id, run_id) VALUES (?, ?, ?)",
        [(a.dispatch_id, sweep_id, a.run_id) for a in attempts if a.charged],
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CellStepRow:
    """One step of a cell's run: its status and the loop it reached (gate columns)."""

    cell_index: int
    step_id: str
    status: str
    loop: int


def sweep_cell_steps(
    conn: sqlite3.Connection, sweep_id: str, step_ids: list[str]
) -> list[CellStepRow]:
    """The rows of ``step_ids`` in every cell's run (cells without a run have none)."""
    if not step_ids:
        return []
    marks = ", ".join("?" * len(step_ids))
    rows = conn.execute(
        "SELECT c.cell_index, s.step_id, s.status, s.loop FROM sweep_cells c"
        " JOIN steps s ON s.run_id = c.run_id"
        f" WHERE c.sweep_id = ? AND s.step_id IN ({marks}) ORDER BY c.cell_index",
        (sweep_id, *step_ids),
    ).fetchall()
    return [from_row(CellStepRow, r) for r in rows]


@dataclass(frozen=True, slots=True, kw_only=True)
class CellItemsRow:
    """A per-item gate's verdicts in one cell's run: items judged and items accepted."""

    cell_index: int
    step_id: str
    items: int
    """Items with at least one verdict of their own."""
    passed: int
    """Items one of whose verdicts accepted them."""


def sweep_cell_items(
    conn: sqlite3.Connection, sweep_id: str, step_ids: list[str]
) -> list[CellItemsRow]:
    """Per cell and step of ``step_ids``, its per-item gate verdicts counted by item."""
    if not step_ids:
        return []
    marks = ", ".join("?" * len(step_ids))
    rows = conn.execute(
        "SELECT c.cell_index, a.step_id, COUNT(DISTINCT a.item_index),"
        " COUNT(DISTINCT CASE WHEN json_valid(a.output_json)"
        " AND json_type(a.output_json, '$.complete') = 'true' THEN a.item_index END)"
        " FROM sweep_cells c JOIN attempts a ON a.run_id = c.run_id"
        " WHERE c.sweep_id = ? AND a.phase = 'gate' AND a.item_index IS NOT NULL"
        f" AND a.status IN ('succeeded', 'reused') AND a.step_id IN ({marks})"
        " GROUP BY c.cell_index, a.step_id ORDER BY c.cell_index",
        (sweep_id, *step_ids),
    ).fetchall()
    return [CellItemsRow(cell_index=r[0], step_id=r[1], items=r[2], passed=r[3]) for r in rows]
