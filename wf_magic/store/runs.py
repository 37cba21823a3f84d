"""SQL for runs and steps: create, read, status writes, stop requests, gc."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

from .journal import append_event_txn
from .records import RunRow, StepRow, from_row

_RUN_COLS = ", ".join(RunRow.__dataclass_fields__)


def insert_run_txn(
    conn: sqlite3.Connection, run: RunRow, steps: Sequence[tuple[str, int, str, int]]
) -> None:
    """Insert a run and its step rows (``(step_id, position, kind, max_loops)``)."""
    marks = ", ".join("?" for _ in RunRow.__dataclass_fields__)
    conn.execute(
        f"INSERT INTO runs ({_RUN_COLS}) VALUES ({marks})",
        [getattr(run, f) for f in RunRow.__dataclass_fields__],
    )
    conn.executemany(
        "INSERT INTO steps (run_id, step_id, position, kind, status, loop, max_loops, updated_at)"
        " VALUES (?, ?, ?, ?, 'pending', 1, ?, ?)",
        [(run.run_id, sid, pos, kind, loops, run.created_at) for sid, pos, kind, loops in steps],
    )
    append_event_txn(
        conn,
        run.run_id,
        "run_created",
        data={
            "workflow": run.workflow,
            "plan_hash": run.plan_hash,
            "parent_run_id": run.parent_run_id,
            "forked_from": run.forked_from,
        },
    )


def create_run_txn(
    conn: sqlite3.Connection,
    run: RunRow,
    steps: Sequence[tuple[str, int, str, int]],
    *,
    supersede: str | None,
) -> None:
    """Insert a run, first abandoning ``supersede`` (so the scope never has two unfinished)."""
    if supersede is not None:
        set_run_status_txn(conn, supersede, "abandoned", reason=f"superseded by {run.run_id}")
    insert_run_txn(conn, run, steps)


def get_run(conn: sqlite3.Connection, run_id: str) -> RunRow | None:
    """The run ``run_id`` or None."""
    row = conn.execute(f"SELECT {_RUN_COLS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return from_row(RunRow, row) if row else None


def find_run_prefix(conn: sqlite3.Connection, prefix: str) -> list[str]:
    """Run ids starting with ``prefix`` (for friendly lookups)."""
    rows = conn.execute(
        "SELECT run_id FROM runs WHERE run_id LIKE ? ORDER BY created_at LIMIT 5",
        (prefix.replace("%", "") + "%",),
    )
    return [r[0] for r in rows]


def latest_in_scope(conn: sqlite3.Connection, scope_key: str) -> RunRow | None:
    """The newest root run of a scope that is not abandoned."""
    row = conn.execute(
        f"SELECT {_RUN_COLS} FROM runs WHERE scope_key = ? AND parent_run_id IS NULL"
        " AND status != 'abandoned' ORDER BY created_at DESC, rowid DESC LIMIT 1",
        (scope_key,),
    ).fetchone()
    return from_row(RunRow, row) if row else None


def list_runs(
    conn: sqlite3.Connection, *, include_children: bool = False, limit: int | None = None
) -> list[RunRow]:
    """Runs, newest first."""
    where = "" if include_children else "WHERE parent_run_id IS NULL"
    lim = f" LIMIT {int(limit)}" if limit else ""
    rows = conn.execute(f"SELECT {_RUN_COLS} FROM runs {where} ORDER BY created_at DESC{lim}")
    return [from_row(RunRow, r) for r in rows]


def child_run(conn: sqlite3.Connection, parent_run_id: str, invocation_key: str) -> RunRow | None:
    """The child run published for ``(parent_run_id, invocation_key)``, if any."""
    row = conn.execute(
        f"SELECT {_RUN_COLS} FROM runs WHERE parent_run_id = ? AND invocation_key = ?",
        (parent_run_id, invocation_key),
    ).fetchone()
    return from_row(RunRow, row) if row else None


def set_run_status_txn(
    conn: sqlite3.Connection,
    run_id: str,
    status: str,
    *,
    reason: str | None = None,
    result_json: str | None = None,
) -> None:
    """Write a run's status (and result when completed), with a ``run_status`` event."""
    now = time.time()
    finished = now if status in ("completed", "failed", "abandoned") else None
    conn.execute(
        "UPDATE runs SET status = ?, status_reason = ?, updated_at = ?, finished_at = ?,"
        " result_json = COALESCE(?, result_json) WHERE run_id = ?",
        (status, reason, now, finished, result_json, run_id),
    )
    append_event_txn(conn, run_id, "run_status", data={"status": status, "reason": reason})


def steps_of(conn: sqlite3.Connection, run_id: str) -> list[StepRow]:
    """The step rows of a run in plan order."""
    rows = conn.execute(
        "SELECT run_id, step_id, position, kind, status, loop, max_loops, note, output_json,"
        " updated_at, stops_run FROM steps WHERE run_id = ? ORDER BY position",
        (run_id,),
    )
    return [from_row(StepRow, r) for r in rows]


def write_step_txn(
    conn: sqlite3.Connection,
    run_id: str,
    step_id: str,
    *,
    status: str,
    loop: int,
    note: str | None,
    output_json: str | None,
    stops_run: bool = False,
) -> None:
    """Write a step's state (called only by the spine) with a ``step_status`` event."""
    conn.execute(
        "UPDATE steps SET status = ?, loop = ?, note = ?, output_json = ?, updated_at = ?,"
        " stops_run = ? WHERE run_id = ? AND step_id = ?",
        (status, loop, note, output_json, time.time(), int(stops_run), run_id, step_id),
    )
    append_event_txn(
        conn,
        run_id,
        "step_status",
        step_id=step_id,
        data={"status": status, "loop": loop, "note": note},
    )


def set_stop_requested(conn: sqlite3.Connection, run_id: str, value: bool) -> None:
    """Ask the run's driver to stop between units (or clear the request)."""
    conn.execute("UPDATE runs SET stop_requested = ? WHERE run_id = ?", (int(value), run_id))


def is_stop_requested(conn: sqlite3.Connection, run_id: str) -> bool:
    """Whether a stop was requested for ``run_id``."""
    row = conn.execute("SELECT stop_requested FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return bool(row and row[0])


def finished_runs_before(conn: sqlite3.Connection, cutoff: float) -> list[str]:
    """Root runs completed/failed/abandoned before ``cutoff`` (candidates for gc)."""
    rows = conn.execute(
        "SELECT run_id FROM runs WHERE parent_run_id IS NULL AND status IN"
        " ('completed','failed','abandoned') AND COALESCE(finished_at, updated_at) < ?",
        (cutoff,),
    )
    return [r[0] for r in rows]


def delete_run_tree_txn(conn: sqlite3.Connection, run_id: str) -> None:
    """Delete a finished root run and its descendants (cascades to its journal)."""
    hashes = [
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT input_hash FROM attempts WHERE run_id IN"
            " (SELECT run_id FROM runs WHERE root_run_id = ?)",
            (run_id,),
        )
    ]
    conn.execute("DELETE FROM runs WHERE root_run_id = ? AND run_id != ?", (run_id, run_id))
    conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
    # Inputs are shared by hash across runs: drop the tree's own that nothing refers to now.
    for start in range(0, len(hashes), 500):
        chunk = hashes[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
        conn.execute(
            f"DELETE FROM inputs WHERE input_hash IN ({marks}) AND input_hash NOT IN"
            f" (SELECT input_hash FROM attempts WHERE input_hash IN ({marks}))",
            (*chunk, *chunk),
        )


def delete_finished_tree_txn(conn: sqlite3.Connection, run_id: str, cutoff: float) -> list[str]:
    """Delete a root run and its descendants if it is *still* finished before ``cutoff``.

    The status is re-read inside the caller's transaction: a ``failed`` run resumed (re-opened)
    since it was listed is left alone. Returns the deleted run ids (root first; empty when
    nothing was deleted).
    """
    row = conn.execute(
        "SELECT 1 FROM runs WHERE run_id = ? AND parent_run_id IS NULL AND status IN"
        " ('completed','failed','abandoned') AND COALESCE(finished_at, updated_at) < ?",
        (run_id, cutoff),
    ).fetchone()
    if row is None:
        return []
    tree = [
        r[0]
        for r in conn.execute(
            "SELECT run_id FROM runs WHERE root_run_id = ? AND run_id != ? ORDER BY created_at",
            (run_id, run_id),
        )
    ]
    delete_run_tree_txn(conn, run_id)
    return [run_id, *tree]
