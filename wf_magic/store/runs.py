"""SQL for runs and steps: create, read, status writes, stop requests, gc, launch keys; and
how a run's params are shown (secret ones masked)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..hashing import canonical_json
from ..redact import is_secret_key, mask_text
from ..sealing import is_seal
from .inlists import in_chunks
from .journal import append_event_txn
from .plans import plan_of
from .records import RunRow, StepRow, from_row
from .sweeps import keep_sweep_charges_txn

_INSERT_COLS = ", ".join(RunRow.__dataclass_fields__)


def run_columns(alias: str = "runs") -> str:
    """The ``RunRow`` columns of ``alias`` for a SELECT, its plan read from ``plans`` when the
    row keeps none of its own (a sweep cell's: ``shared_plan``)."""
    return ", ".join(
        f"{plan_of(alias)} AS plan_json" if c == "plan_json" else f"{alias}.{c}"
        for c in RunRow.__dataclass_fields__
    )


_RUN_COLS = run_columns()


def insert_run_txn(
    conn: sqlite3.Connection,
    run: RunRow,
    steps: Sequence[tuple[str, int, str, int]],
    *,
    shared_plan: bool = False,
) -> None:
    """Insert a run and its step rows (``(step_id, position, kind, max_loops)``).

    ``shared_plan``: the plan is kept once per plan hash in ``plans`` and the run row holds
    none of its own (``''``): a sweep's thousands of cells share their few plans.
    """
    marks = ", ".join("?" for _ in RunRow.__dataclass_fields__)
    values = [getattr(run, f) for f in RunRow.__dataclass_fields__]
    if shared_plan:
        conn.execute(
            "INSERT OR IGNORE INTO plans (plan_hash, plan_json, created_at) VALUES (?, ?, ?)",
            (run.plan_hash, run.plan_json, run.created_at),
        )
        values[list(RunRow.__dataclass_fields__).index("plan_json")] = ""
    conn.execute(f"INSERT INTO runs ({_INSERT_COLS}) VALUES ({marks})", values)
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
    shared_plan: bool = False,
) -> None:
    """Insert a run, first superseding ``supersede`` and abandoning its unfinished descendants
    (so the scope never has two unfinished runs, and no child outlives its parent).

    An active or blocked run is abandoned ("superseded by <run>"); a failed one keeps its
    status and reason, so its failure stays visible, and a ``run_superseded`` event names the
    run that took its place (see :func:`superseded_by`).
    """
    if supersede is not None:
        old = conn.execute("SELECT status FROM runs WHERE run_id = ?", (supersede,)).fetchone()
        failed = old is not None and old[0] == "failed"
        if failed:  # it keeps its status and reason: its failure stays visible
            append_event_txn(conn, supersede, "run_superseded", data={"by": run.run_id})
        abandon_tree_txn(conn, supersede, reason=f"superseded by {run.run_id}", own=not failed)
    insert_run_txn(conn, run, steps, shared_plan=shared_plan)


UNFINISHED = ("active", "blocked", "failed")
"""The run statuses abandoning a run ends (its own, and its descendants')."""
LIVE = ("active", "blocked")
"""The statuses of a run that may still move on its own (gc never deletes a tree with one)."""


def descendants(conn: sqlite3.Connection, run_id: str) -> list[RunRow]:
    """Every run below ``run_id`` (children, their children, ...), oldest first."""
    cols = run_columns("r")
    rows = conn.execute(
        "WITH RECURSIVE below(run_id) AS (SELECT run_id FROM runs WHERE parent_run_id = ?"
        " UNION SELECT r.run_id FROM runs r JOIN below b ON r.parent_run_id = b.run_id)"
        f" SELECT {cols} FROM runs r JOIN below b ON r.run_id = b.run_id"
        " ORDER BY r.created_at, r.rowid",
        (run_id,),
    )
    return [from_row(RunRow, r) for r in rows]


def abandon_tree_txn(
    conn: sqlite3.Connection, run_id: str, *, reason: str, own: bool = True
) -> list[str]:
    """Abandon ``run_id`` and each unfinished run below it, re-reading every status here.

    A descendant is abandoned with the reason "parent run <id> was abandoned". Returns the
    run ids abandoned (``run_id`` first when it was unfinished). ``own=False``: only those
    below it (a superseded failed run keeps its own status).
    """
    done = []
    row = get_run(conn, run_id) if own else None
    if row is not None and row.status in UNFINISHED:
        set_run_status_txn(conn, run_id, "abandoned", reason=reason)
        done.append(run_id)
    for child in descendants(conn, run_id):
        if child.status in UNFINISHED:
            why = f"parent run {child.parent_run_id} was abandoned"
            set_run_status_txn(conn, child.run_id, "abandoned", reason=why)
            done.append(child.run_id)
    return done


def superseded_by(conn: sqlite3.Connection, run_id: str) -> str | None:
    """The run that superseded the failed run ``run_id`` (None when none did)."""
    row = conn.execute(
        "SELECT data_json FROM events WHERE run_id = ? AND kind = 'run_superseded'"
        " ORDER BY event_id DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    if row is None:
        return None
    by = json.loads(row[0]).get("by")
    return str(by) if by else None


def get_run(conn: sqlite3.Connection, run_id: str) -> RunRow | None:
    """The run ``run_id`` or None."""
    row = conn.execute(f"SELECT {_RUN_COLS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return from_row(RunRow, row) if row else None


_STEP_COLS = tuple(StepRow.__dataclass_fields__)


_FIRST_ROW = "(s.position IS NULL OR s.position = m.first_position)"
_DRIVE_VIEW = (
    "SELECT "
    + ", ".join(
        f"CASE WHEN {_FIRST_ROW} THEN {plan_of('runs') if c == 'plan_json' else 'runs.' + c}"
        f" END AS {c}"
        for c in RunRow.__dataclass_fields__
    )
    + ", "
    + ", ".join(f"s.{c} AS step_{c}" for c in _STEP_COLS)
    + ", EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = runs.run_id) AS has_attempts"
    " FROM runs LEFT JOIN steps s ON s.run_id = runs.run_id"
    " CROSS JOIN (SELECT MIN(position) AS first_position FROM steps WHERE run_id = ?) m"
    " WHERE runs.run_id = ? ORDER BY s.position"
)
"""The run's columns on its first row only (a 10 000-step run's plan is not copied onto each
of its step rows), its step rows, and whether it has an attempt."""


def drive_view(conn: sqlite3.Connection, run_id: str) -> tuple[RunRow | None, list[StepRow], bool]:
    """(the run, its step rows in plan order, whether it has any attempt) in one read: what
    a drive looks at first, under the run's lock."""
    rows = conn.execute(_DRIVE_VIEW, (run_id, run_id)).fetchall()
    if not rows:
        return None, [], False
    step_rows = [
        StepRow(**{c: r[f"step_{c}"] for c in _STEP_COLS})
        for r in rows
        if r["step_step_id"] is not None
    ]
    return from_row(RunRow, rows[0]), step_rows, bool(rows[0]["has_attempts"])


def find_run_prefix(conn: sqlite3.Connection, prefix: str, *, limit: int = 5) -> list[str]:
    """Run ids starting with ``prefix`` (for friendly lookups), oldest first."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    rows = conn.execute(
        "SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\' ORDER BY created_at LIMIT ?",
        (escaped + "%", int(limit)),
    )
    return [r[0] for r in rows]


def latest_of_workflow(conn: sqlite3.Connection, workflow: str) -> str | None:
    """The id of the newest root run of the workflow named ``workflow``, if any."""
    row = conn.execute(
        "SELECT run_id FROM runs WHERE workflow = ? AND parent_run_id IS NULL"
        " ORDER BY created_at DESC, rowid DESC LIMIT 1",
        (workflow,),
    ).fetchone()
    return row[0] if row else None


def latest_in_scope(
    conn: sqlite3.Connection, scope_key: str, *, owner: str | None = None
) -> RunRow | None:
    """The newest root run of a scope that is not abandoned; with ``owner``, the newest that
    user may change (theirs or nobody's): another user's run is never continued or superseded.
    """
    mine = " AND (owner = ? OR owner IS NULL)" if owner is not None else ""
    row = conn.execute(
        f"SELECT {_RUN_COLS} FROM runs WHERE scope_key = ? AND parent_run_id IS NULL"
        f" AND status != 'abandoned'{mine} ORDER BY created_at DESC, rowid DESC LIMIT 1",
        (scope_key, owner) if owner is not None else (scope_key,),
    ).fetchone()
    return from_row(RunRow, row) if row else None


def list_runs(
    conn: sqlite3.Connection,
    *,
    include_children: bool = False,
    limit: int | None = None,
    owner: str | None = None,
) -> list[RunRow]:
    """Runs, newest first; with ``owner``, only the runs that user may change (their own and
    nobody's)."""
    where = [] if include_children else ["parent_run_id IS NULL"]
    if owner is not None:
        where.append("(owner = ? OR owner IS NULL)")
    sql_where = f"WHERE {' AND '.join(where)}" if where else ""
    lim = f" LIMIT {int(limit)}" if limit else ""
    rows = conn.execute(
        f"SELECT {_RUN_COLS} FROM runs {sql_where} ORDER BY created_at DESC{lim}",
        (owner,) if owner is not None else (),
    )
    return [from_row(RunRow, r) for r in rows]


def child_run(conn: sqlite3.Connection, parent_run_id: str, invocation_key: str) -> RunRow | None:
    """The child run published for ``(parent_run_id, invocation_key)``, if any."""
    row = conn.execute(
        f"SELECT {_RUN_COLS} FROM runs WHERE parent_run_id = ? AND invocation_key = ?",
        (parent_run_id, invocation_key),
    ).fetchone()
    return from_row(RunRow, row) if row else None


def child_runs(conn: sqlite3.Connection, parent_run_id: str) -> list[RunRow]:
    """The child runs ``parent_run_id`` published, oldest first."""
    rows = conn.execute(
        f"SELECT {_RUN_COLS} FROM runs WHERE parent_run_id = ? ORDER BY created_at, run_id",
        (parent_run_id,),
    )
    return [from_row(RunRow, r) for r in rows]


FINISHED_STATUSES = ("completed", "failed", "abandoned")
"""The run statuses that stamp ``finished_at``."""


def set_run_status_txn(
    conn: sqlite3.Connection,
    run_id: str,
    status: str,
    *,
    reason: str | None = None,
    result_json: str | None = None,
    now: float | None = None,
) -> None:
    """Write a run's status (and result when completed), with a ``run_status`` event.

    ``now``: the time to stamp (default: the clock now).
    """
    now = time.time() if now is None else now
    update_run_status_txn(conn, run_id, status, reason=reason, result_json=result_json, now=now)
    append_event_txn(conn, run_id, "run_status", data={"status": status, "reason": reason})


def update_run_status_txn(
    conn: sqlite3.Connection,
    run_id: str,
    status: str,
    *,
    reason: str | None,
    result_json: str | None,
    now: float,
) -> None:
    """The row's part of :func:`set_run_status_txn` (its event is the caller's)."""
    finished = now if status in FINISHED_STATUSES else None
    conn.execute(
        "UPDATE runs SET status = ?, status_reason = ?, updated_at = ?, finished_at = ?,"
        " result_json = COALESCE(?, result_json) WHERE run_id = ?",
        (status, reason, now, finished, result_json, run_id),
    )


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
    update_step_txn(
        conn,
        run_id,
        step_id,
        status=status,
        loop=loop,
        note=note,
        output_json=output_json,
        stops_run=stops_run,
        now=time.time(),
    )
    append_event_txn(
        conn,
        run_id,
        "step_status",
        step_id=step_id,
        data={"status": status, "loop": loop, "note": note},
    )


def update_step_txn(
    conn: sqlite3.Connection,
    run_id: str,
    step_id: str,
    *,
    status: str,
    loop: int,
    note: str | None,
    output_json: str | None,
    stops_run: bool,
    now: float,
) -> None:
    """The row's part of :func:`write_step_txn` (its event is the caller's)."""
    conn.execute(
        "UPDATE steps SET status = ?, loop = ?, note = ?, output_json = ?, updated_at = ?,"
        " stops_run = ? WHERE run_id = ? AND step_id = ?",
        (status, loop, note, output_json, now, int(stops_run), run_id, step_id),
    )


def adopt_tree_txn(
    conn: sqlite3.Connection, run_id: str, *, adopter: str, previous: str | None
) -> list[str]:
    """Make ``adopter`` the owner of ``run_id`` and of each run below it that ``previous`` owned
    (or nobody did), each with a ``run_adopted`` event naming the adopter and the run's
    previous owner; returns the run ids adopted (``run_id`` first).

    Compare-and-set on ``run_id``'s owner: when it is no longer ``previous`` (adopted by
    someone else meanwhile) nothing is written and the list is empty.
    """
    row = get_run(conn, run_id)
    if row is None or row.owner != previous:
        return []
    family = [row, *(r for r in descendants(conn, run_id) if r.owner in (previous, None))]
    now = time.time()
    for each in family:
        conn.execute(
            "UPDATE runs SET owner = ?, updated_at = ? WHERE run_id = ?",
            (adopter, now, each.run_id),
        )
        data = {"adopter": adopter, "previous_owner": each.owner}
        append_event_txn(conn, each.run_id, "run_adopted", data=data)
    return [r.run_id for r in family]


def set_stop_requested(conn: sqlite3.Connection, run_id: str, value: bool) -> None:
    """Ask the run's driver to stop between units (or clear the request)."""
    conn.execute("UPDATE runs SET stop_requested = ? WHERE run_id = ?", (int(value), run_id))


def is_stop_requested(conn: sqlite3.Connection, run_id: str) -> bool:
    """Whether a stop was requested for ``run_id``."""
    row = conn.execute("SELECT stop_requested FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return bool(row and row[0])


FINISHED = ("completed", "failed", "abandoned")
"""The run statuses gc may delete."""


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
    plans = [
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT plan_hash FROM runs WHERE root_run_id = ? AND plan_json = ''",
            (run_id,),
        )
    ]
    conn.execute("DELETE FROM runs WHERE root_run_id = ? AND run_id != ?", (run_id, run_id))
    conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
    # A shared plan goes with the last run that reads it.
    for plan_hash in plans:
        conn.execute(
            "DELETE FROM plans WHERE plan_hash = ? AND NOT EXISTS (SELECT 1 FROM runs"
            " WHERE runs.plan_hash = plans.plan_hash AND runs.plan_json = '')",
            (plan_hash,),
        )
    # Inputs are shared by hash across runs: drop the tree's own that nothing refers to now.
    for chunk, marks in in_chunks(hashes):
        conn.execute(
            f"DELETE FROM inputs WHERE input_hash IN ({marks}) AND input_hash NOT IN"
            f" (SELECT input_hash FROM attempts WHERE input_hash IN ({marks}))",
            (*chunk, *chunk),
        )


def delete_finished_tree_txn(
    conn: sqlite3.Connection, run_id: str, cutoff: float, statuses: Sequence[str] = FINISHED
) -> list[str]:
    """Delete a root run and its descendants if it is *still* of ``statuses`` before ``cutoff``,
    keeping one receipt per deleted run (:func:`insert_receipts_txn`).

    The status is re-read inside the caller's transaction: a ``failed`` run resumed (re-opened)
    since it was listed is left alone, and so is a tree with a live member (an ``active`` or
    ``blocked`` child, left by a parent abandoned before abandoning cascaded). Returns the
    deleted run ids (root first; empty when nothing was deleted).
    """
    wanted = [s for s in statuses if s in FINISHED]
    marks = ", ".join("?" for _ in wanted) or "NULL"
    row = conn.execute(
        f"SELECT 1 FROM runs WHERE run_id = ? AND parent_run_id IS NULL AND status IN ({marks})"
        " AND COALESCE(finished_at, updated_at) < ? AND NOT EXISTS (SELECT 1 FROM runs m"
        " WHERE m.root_run_id = runs.run_id AND m.status IN ('active', 'blocked'))",
        (run_id, *wanted, cutoff),
    ).fetchone()
    if row is None:
        return []
    insert_receipts_txn(conn, run_id)
    keep_sweep_charges_txn(conn, run_id)
    tree = [
        r[0]
        for r in conn.execute(
            "SELECT run_id FROM runs WHERE root_run_id = ? AND run_id != ? ORDER BY created_at",
            (run_id, run_id),
        )
    ]
    delete_run_tree_txn(conn, run_id)
    return [run_id, *tree]


RECEIPT_ROW_COLUMNS = (
    "run_id", "workflow", "status", "status_reason", "parent_run_id", "root_run_id",
    "forked_from", "fork_step", "scope_key", "params_json", "plan_hash", "plan_version",
    "source_path", "use_cache", "created_at", "updated_at", "finished_at", "owner",
)  # fmt: skip
"""The columns a receipt copies from its run row (all but the plan and the result)."""
_OF_RUN = "FROM attempts a WHERE a.run_id = r.run_id"
RUN_TOTALS: tuple[tuple[str, str], ...] = (
    ("units", f"SELECT COUNT(DISTINCT a.unit_id) {_OF_RUN} AND a.phase = 'work'"),
    ("dispatched", f"SELECT COUNT(*) {_OF_RUN} AND a.charged = 1"),
    ("tokens_in", f"SELECT COALESCE(SUM(a.tokens_in), 0) {_OF_RUN}"),
    ("tokens_out", f"SELECT COALESCE(SUM(a.tokens_out), 0) {_OF_RUN}"),
    ("cost", f"SELECT SUM(a.cost) {_OF_RUN}"),
    ("saved_tokens", f"SELECT COALESCE(SUM(a.saved_tokens), 0) {_OF_RUN}"),
)
"""A run's journal totals as (column, scalar subquery over the run ``r``): work units, charged
dispatches (the budget's units), tokens in/out, cost (NULL when no runner reported one) and
tokens saved by reuse. Receipts freeze them at gc; ``runs(include_deleted=True)`` computes
them for live runs with the same SQL."""


def insert_receipts_txn(conn: sqlite3.Connection, root_run_id: str) -> None:
    """Write a receipt for every run of the tree of ``root_run_id`` (before it is deleted)."""
    copied = ", ".join(RECEIPT_ROW_COLUMNS)
    totals = ", ".join(name for name, _ in RUN_TOTALS)
    selects = ", ".join(f"({sql})" for _, sql in RUN_TOTALS)
    conn.execute(
        f"INSERT INTO run_receipts ({copied}, {totals}, deleted_at)"
        f" SELECT {', '.join('r.' + c for c in RECEIPT_ROW_COLUMNS)}, {selects}, ?"
        " FROM runs r WHERE r.root_run_id = ?",
        (time.time(), root_run_id),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchKey:
    """A row of ``launch_keys``: the run a caller's key launched, and the request it carried."""

    key: str
    run_id: str
    plan_hash: str
    params_hash: str
    created_at: float


def launch_key(conn: sqlite3.Connection, key: str) -> LaunchKey | None:
    """The launch key ``key``, or None when no start has used it (or its run was gc'd)."""
    row = conn.execute(
        "SELECT key, run_id, plan_hash, params_hash, created_at FROM launch_keys WHERE key = ?",
        (key,),
    ).fetchone()
    return from_row(LaunchKey, row) if row else None


def insert_launch_key_txn(conn: sqlite3.Connection, key: str, run: RunRow) -> None:
    """Record that ``key`` launched ``run`` (the primary key refuses a second writer)."""
    conn.execute(
        "INSERT INTO launch_keys (key, run_id, plan_hash, params_hash, created_at)"
        " VALUES (?, ?, ?, ?, ?)",
        (key, run.run_id, run.plan_hash, run.params_hash, time.time()),
    )


PARAMS_TEXT_CHARS = 80
"""The longest one-line params text (``wf list``, ``wf status``); longer is clipped with …."""


def masked(value: Any) -> Any:
    """``value`` with the value under every secret-looking key (``api_key``, ...) and every
    sealed value as ``***``, and a credential shape inside any text (a URL's password or
    ``?api_key=``, ``password=…``) masked as the journal masks it."""
    if is_seal(value):
        return "***"
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {k: "***" if is_secret_key(str(k)) else masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def masked_params(params_json: str) -> dict[str, Any]:
    """A run's params for showing: secret-looking ones (at any depth) masked as ``***``."""
    return dict(masked(json.loads(params_json)))


def params_text(params_json: str) -> str:
    """A run's params as one line, ``k=v`` sorted by key (strings bare, the rest JSON), masked.

    Two scopes of one workflow differ exactly in this line.
    """
    shown = masked_params(params_json)
    text = " ".join(
        f"{k}={v if isinstance(v, str) else canonical_json(v)}" for k, v in sorted(shown.items())
    )
    if len(text) > PARAMS_TEXT_CHARS:
        text = text[: PARAMS_TEXT_CHARS - 1] + "…"
    return text
