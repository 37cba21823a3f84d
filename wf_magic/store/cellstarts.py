"""Many rows in few statements: multi-row inserts, a batch of events, and a batch of sweep
cells' fresh runs started in one transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .inlists import in_chunks
from .journal import FINISHED_COUNT
from .records import RunRow, StepRow

PARAMS_PER_STATEMENT = 30_000 if sqlite3.sqlite_version_info >= (3, 32, 0) else 900
"""Host parameters bound per multi-row statement: under SQLite's limit (32 766 since 3.32,
999 before) and PostgreSQL's (65 535)."""


def insert_rows_txn(
    conn: sqlite3.Connection,
    head: str,
    rows: Sequence[Sequence[Any]],
    *,
    row_sql: str | None = None,
) -> None:
    """``head`` (``INSERT INTO t (a, b)``) with ``VALUES`` of many ``rows`` per statement.

    ``row_sql``: one row's values as SQL (``(?, ?)`` by default): ``{n}`` in it is the
    row's 1-based position in its statement (an event id's offset).
    """
    if not rows:
        return
    width = len(rows[0])
    per = max(1, PARAMS_PER_STATEMENT // max(1, width))
    template = row_sql or "(" + ", ".join("?" * width) + ")"
    for start in range(0, len(rows), per):
        chunk = rows[start : start + per]
        values = ", ".join(template.format(n=n) for n in range(1, len(chunk) + 1))
        conn.execute(f"{head} VALUES {values}", [v for row in chunk for v in row])


@dataclass(frozen=True, slots=True)
class Event:
    """One ``event_log`` row to append (its id: the next of ``journal_seq``)."""

    run_id: str
    kind: str
    at: float
    data: Any = None
    step_id: str | None = None


def append_events_txn(
    conn: sqlite3.Connection, events: Sequence[Event], *, after_finish: str | None = None
) -> None:
    """Append ``events`` in order, ids following ``journal_seq``, in two statements per
    chunk (the insert, then one bump of the counter) where one each costs two.

    ``after_finish``: the dispatch id of an attempt just finished without bumping the counter
    (``queue_finish_txn(bump=False)``): its event holds the next id when the finish wrote,
    so these follow it, and the one bump counts it too.
    """
    if not events:
        return
    finished = "0" if after_finish is None else FINISHED_COUNT
    lead = () if after_finish is None else (after_finish,)
    per = PARAMS_PER_STATEMENT // 6
    for start in range(0, len(events), per):
        chunk = events[start : start + per]
        insert_rows_txn(
            conn,
            "INSERT INTO event_log (event_id, run_id, at, kind, step_id, data_json)",
            [
                (
                    *lead,
                    e.run_id,
                    e.at,
                    e.kind,
                    e.step_id,
                    None if e.data is None else json.dumps(e.data, sort_keys=True, default=str),
                )
                for e in chunk
            ],
            row_sql=f"((SELECT n + {{n}} + {finished} FROM journal_seq), ?, ?, ?, ?, ?)",
        )
        # After the first bump the finish is counted: FINISHED_COUNT reads 0 from then on.
        conn.execute(f"UPDATE journal_seq SET n = n + ? + {finished}", (len(chunk), *lead))


@dataclass(frozen=True, slots=True)
class CellStart:
    """A sweep cell's fresh run to insert: its row (``plan_json`` kept in ``plans``) and its
    step rows ``(step_id, position, kind, max_loops)``."""

    cell_index: int
    run: RunRow
    steps: Sequence[tuple[str, int, str, int]]

    def step_rows(self) -> list[StepRow]:
        """The step rows as the insert writes them (all pending, loop 1)."""
        return [
            StepRow(
                run_id=self.run.run_id,
                step_id=step_id,
                position=position,
                kind=kind,  # type: ignore[arg-type]
                status="pending",
                loop=1,
                max_loops=max_loops,
                note=None,
                output_json=None,
                updated_at=self.run.created_at,
            )
            for step_id, position, kind, max_loops in self.steps
        ]


def start_cells_txn(
    conn: sqlite3.Connection, sweep_id: str, starts: Sequence[CellStart]
) -> list[int]:
    """Insert the runs of ``starts`` whose scope has no run yet (none but abandoned ones),
    their step rows, ``run_created`` events and cell links; the cell indexes started.

    A scope that has a run (another user's too), or that an earlier start of the batch
    takes, is left to a start of its own (``lifecycle.start``: continue, supersede or a run
    beside another user's), as is every cell when the batch's run ids collide.
    """
    taken: set[str] = set()
    scopes = sorted({s.run.scope_key for s in starts})
    for chunk, marks in in_chunks(scopes):
        taken.update(
            r[0]
            for r in conn.execute(
                f"SELECT DISTINCT scope_key FROM runs WHERE scope_key IN ({marks})"
                " AND parent_run_id IS NULL AND status != 'abandoned'",
                list(chunk),
            )
        )
    kept: list[CellStart] = []
    for start in starts:
        if start.run.scope_key not in taken:
            taken.add(start.run.scope_key)
            kept.append(start)
    if len({s.run.run_id for s in kept}) < len(kept):
        return []
    if not kept:
        return []
    plans = {s.run.plan_hash: s.run for s in kept}
    insert_rows_txn(
        conn,
        "INSERT OR IGNORE INTO plans (plan_hash, plan_json, created_at)",
        [(h, r.plan_json, r.created_at) for h, r in plans.items()],
    )
    fields = list(RunRow.__dataclass_fields__)
    insert_rows_txn(
        conn,
        f"INSERT INTO runs ({', '.join(fields)})",
        [[("" if f == "plan_json" else getattr(s.run, f)) for f in fields] for s in kept],
    )
    insert_rows_txn(
        conn,
        "INSERT INTO steps (run_id, step_id, position, kind, status, loop, max_loops, updated_at)",
        [
            (s.run.run_id, sid, pos, kind, loops, s.run.created_at)
            for s in kept
            for sid, pos, kind, loops in s.steps
        ],
        row_sql="(?, ?, ?, ?, 'pending', 1, ?, ?)",
    )
    append_events_txn(
        conn,
        [
            Event(
                s.run.run_id,
                "run_created",
                s.run.created_at,
                {
                    "workflow": s.run.workflow,
                    "plan_hash": s.run.plan_hash,
                    "parent_run_id": None,
                    "forked_from": None,
                },
            )
            for s in kept
        ],
    )
    link_cells_txn(conn, sweep_id, [(s.cell_index, s.run.run_id) for s in kept])
    return [s.cell_index for s in kept]


def link_cells_txn(
    conn: sqlite3.Connection, sweep_id: str, links: Sequence[tuple[int, str]]
) -> None:
    """Record each cell's run, ``(cell_index, run_id)``, a few hundred per statement."""
    per = PARAMS_PER_STATEMENT // 3
    for start in range(0, len(links), per):
        chunk = links[start : start + per]
        cases = " ".join("WHEN ? THEN ?" for _ in chunk)
        marks = ", ".join("?" * len(chunk))
        conn.execute(
            f"UPDATE sweep_cells SET run_id = CASE cell_index {cases} END, note = NULL"
            f" WHERE sweep_id = ? AND cell_index IN ({marks})",
            [v for pair in chunk for v in pair] + [sweep_id] + [i for i, _ in chunk],
        )


def unstart_cells_txn(conn: sqlite3.Connection, sweep_id: str, run_ids: Sequence[str]) -> None:
    """Take back batch-started runs that were never driven (no attempt, still ``active``):
    their cells have no run again, as if their batch had not reached them."""
    for chunk, marks in in_chunks(list(run_ids)):
        idle = [
            r[0]
            for r in conn.execute(
                f"SELECT run_id FROM runs WHERE run_id IN ({marks}) AND status = 'active'"
                " AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = runs.run_id)",
                list(chunk),
            )
        ]
        if not idle:
            continue
        marks = ", ".join("?" * len(idle))
        conn.execute(
            f"UPDATE sweep_cells SET run_id = NULL WHERE sweep_id = ? AND run_id IN ({marks})",
            [sweep_id, *idle],
        )
        conn.execute(f"DELETE FROM runs WHERE run_id IN ({marks})", idle)  # cascades
