"""SQL for the run listing: the newest runs and sweeps (a sweep's cells as one entry), the count
of the rest, each listed sweep's cells counted by status, and one sweep's cells."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from .inlists import in_chunks
from .records import RunRow, from_row
from .runs import run_columns
from .sweeps import SweepRow, get_sweep

CELL_STATUSES: tuple[str, ...] = (
    "completed",
    "failed",
    "blocked",
    "active",
    "abandoned",
    "pending",
    "deleted",
)
"""What a sweep cell reads as, in the order a listing counts them: its run's status, or

- ``pending``: the cell has no run yet;
- ``deleted``: its run was deleted by ``wf gc`` (the cell still names it).
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepEntry:
    """A sweep as one entry of a listing: its row and its cells counted by status."""

    sweep: SweepRow
    counts: tuple[tuple[str, int], ...]
    """(status, cells) in :data:`CELL_STATUSES` order, statuses without cells left out."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CellEntry:
    """A sweep cell as one entry of a listing: its run (None when it has none any more)."""

    cell_index: int
    workflow: str
    """The sweep's workflow."""
    params_json: str
    run_id: str | None
    run: RunRow | None
    status: str
    """Its run's status, ``pending`` or ``deleted`` (:data:`CELL_STATUSES`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunListing:
    """A page of a listing, newest first, and how many entries it holds in all."""

    entries: tuple[RunRow | SweepEntry | CellEntry, ...]
    runs: int
    """Runs (or cells, when listing a sweep) the listing holds, shown or not."""
    sweeps: int
    """Sweeps the listing holds, shown or not (0 when listing a sweep's cells)."""

    @property
    def older_runs(self) -> int:
        """Runs (or cells) left out of this page."""
        shown = sum(not isinstance(e, SweepEntry) for e in self.entries)
        return self.runs - shown

    @property
    def older_sweeps(self) -> int:
        """Sweeps left out of this page."""
        return self.sweeps - sum(isinstance(e, SweepEntry) for e in self.entries)


def run_listing(
    conn: sqlite3.Connection,
    *,
    limit: int | None,
    include_children: bool = False,
    group_sweeps: bool = True,
    owner: str | None = None,
) -> RunListing:
    """The newest ``limit`` entries (None: all): runs and, with ``group_sweeps``, sweeps whose
    cells' runs (and their children) are left out of the runs; ``owner``: only that user's runs
    and nobody's, and the sweeps none of whose cells' runs is another user's."""
    run_where, run_args = _run_filter(include_children, group_sweeps, owner)
    sweep_where, sweep_args = _sweep_filter(owner)
    lim = f" LIMIT {int(limit)}" if limit is not None else ""
    if group_sweeps:
        page = conn.execute(
            "SELECT kind, id FROM ("
            f" SELECT 'run' AS kind, run_id AS id, created_at FROM runs WHERE {run_where}"
            " UNION ALL"
            f" SELECT 'sweep' AS kind, sweep_id AS id, created_at FROM sweeps WHERE {sweep_where}"
            f") entries ORDER BY created_at DESC, id DESC{lim}",
            (*run_args, *sweep_args),
        ).fetchall()
        sweeps = int(
            conn.execute(f"SELECT COUNT(*) FROM sweeps WHERE {sweep_where}", sweep_args).fetchone()[
                0
            ]
        )
    else:
        page = conn.execute(
            f"SELECT 'run' AS kind, run_id AS id FROM runs WHERE {run_where}"
            f" ORDER BY created_at DESC, run_id DESC{lim}",
            run_args,
        ).fetchall()
        sweeps = 0
    runs = int(conn.execute(f"SELECT COUNT(*) FROM runs WHERE {run_where}", run_args).fetchone()[0])
    run_rows = _runs_by_id(conn, [str(r[1]) for r in page if r[0] == "run"])
    sweep_rows = _sweeps_by_id(conn, [str(r[1]) for r in page if r[0] == "sweep"])
    counts = sweep_cell_counts(conn, list(sweep_rows))
    entries: list[RunRow | SweepEntry | CellEntry] = [
        run_rows[str(i)]
        if kind == "run"
        else SweepEntry(sweep=sweep_rows[str(i)], counts=counts.get(str(i), ()))
        for kind, i in page
    ]
    return RunListing(entries=tuple(entries), runs=runs, sweeps=sweeps)


def cell_listing(conn: sqlite3.Connection, sweep_id: str, *, limit: int | None) -> RunListing:
    """The newest ``limit`` cells of ``sweep_id`` (None: all): cells with runs newest first,
    then the cells without one (deleted, pending) by index."""
    lim = f" LIMIT {int(limit)}" if limit is not None else ""
    page = conn.execute(
        "SELECT c.cell_index, c.params_json, c.run_id FROM sweep_cells c"
        " LEFT JOIN runs r ON r.run_id = c.run_id WHERE c.sweep_id = ?"
        f" ORDER BY CASE WHEN r.run_id IS NULL THEN 1 ELSE 0 END, r.created_at DESC,"
        f" c.cell_index{lim}",
        (sweep_id,),
    ).fetchall()
    total = conn.execute("SELECT COUNT(*) FROM sweep_cells WHERE sweep_id = ?", (sweep_id,))
    sweep = get_sweep(conn, sweep_id)
    workflow = sweep.workflow if sweep is not None else ""
    run_rows = _runs_by_id(conn, [str(r[2]) for r in page if r[2] is not None])
    entries = []
    for index, params_json, run_id in page:
        run = run_rows.get(run_id) if run_id is not None else None
        status = run.status if run is not None else "pending" if run_id is None else "deleted"
        entries.append(
            CellEntry(
                cell_index=int(index),
                workflow=workflow,
                params_json=str(params_json),
                run_id=run_id,
                run=run,
                status=status,
            )
        )
    return RunListing(entries=tuple(entries), runs=int(total.fetchone()[0]), sweeps=0)


def sweep_cell_counts(
    conn: sqlite3.Connection, sweep_ids: Sequence[str]
) -> dict[str, tuple[tuple[str, int], ...]]:
    """Per sweep of ``sweep_ids``, its cells counted by status (:data:`CELL_STATUSES` order;
    a status no known one: after them, by name)."""
    found: dict[str, dict[str, int]] = {}
    for chunk, marks in in_chunks(list(sweep_ids)):
        rows = conn.execute(
            "SELECT c.sweep_id, CASE WHEN c.run_id IS NULL THEN 'pending'"
            " WHEN r.run_id IS NULL THEN 'deleted' ELSE r.status END AS cell_status,"
            " COUNT(*) FROM sweep_cells c LEFT JOIN runs r ON r.run_id = c.run_id"
            f" WHERE c.sweep_id IN ({marks}) GROUP BY c.sweep_id, cell_status",
            tuple(chunk),
        ).fetchall()
        for sweep_id, status, cells in rows:
            found.setdefault(str(sweep_id), {})[str(status)] = int(cells)
    order = {s: i for i, s in enumerate(CELL_STATUSES)}
    return {
        sid: tuple(sorted(by.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
        for sid, by in found.items()
    }


def _run_filter(
    include_children: bool, group_sweeps: bool, owner: str | None
) -> tuple[str, tuple[str, ...]]:
    where = [] if include_children else ["parent_run_id IS NULL"]
    if group_sweeps:  # a cell's run, and every run below one, is its sweep's
        where.append("NOT EXISTS (SELECT 1 FROM sweep_cells c WHERE c.run_id = runs.root_run_id)")
    args: tuple[str, ...] = ()
    if owner is not None:
        where.append("(owner = ? OR owner IS NULL)")
        args = (owner,)
    return " AND ".join(where) or "1 = 1", args


def _sweep_filter(owner: str | None) -> tuple[str, tuple[str, ...]]:
    if owner is None:
        return "1 = 1", ()
    return (
        "NOT EXISTS (SELECT 1 FROM sweep_cells c JOIN runs r ON r.run_id = c.run_id"
        " WHERE c.sweep_id = sweeps.sweep_id AND r.owner IS NOT NULL AND r.owner <> ?)",
        (owner,),
    )


def _runs_by_id(conn: sqlite3.Connection, run_ids: list[str]) -> dict[str, RunRow]:
    out: dict[str, RunRow] = {}
    for chunk, marks in in_chunks(run_ids):
        for row in conn.execute(
            f"SELECT {run_columns()} FROM runs WHERE run_id IN ({marks})", tuple(chunk)
        ):
            run = from_row(RunRow, row)
            out[run.run_id] = run
    return out


def _sweeps_by_id(conn: sqlite3.Connection, sweep_ids: list[str]) -> dict[str, SweepRow]:
    found = (get_sweep(conn, sweep_id) for sweep_id in sweep_ids)  # a page: at most a few
    return {row.sweep_id: row for row in found if row is not None}
