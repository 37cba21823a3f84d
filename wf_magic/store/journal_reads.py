"""SQL that reads the attempt journal: a run's attempts and inputs, reuse lookups, agent
facts, budget use and events. The writes are ``journal.py``'s."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..errors import UsageError
from .derived import BUDGET_TOKENS
from .inlists import in_chunks
from .plans import plan_of
from .records import AttemptRow, BudgetUse, EventRow, from_row

_ATTEMPT_COLS = ", ".join(AttemptRow.__dataclass_fields__)


def input_of(conn: sqlite3.Connection, input_hash: str) -> str | None:
    """The journaled input (JSON text) of ``input_hash``; None when it was never recorded."""
    row = conn.execute(
        "SELECT input_json FROM inputs WHERE input_hash = ?", (input_hash,)
    ).fetchone()
    return None if row is None else str(row[0])


def price_source_of(conn: sqlite3.Connection, run_id: str, dispatch_id: str) -> str | None:
    """Where the cost of attempt ``dispatch_id`` came from, as its finish recorded it (the
    data of its ``unit_finished`` event); None when it was not priced (or finished before
    prices had sources)."""
    row = conn.execute(
        "SELECT json_extract(finish_data, '$.price_source') FROM attempts WHERE run_id = ?"
        " AND dispatch_id = ? AND json_valid(finish_data)",
        (run_id, dispatch_id),
    ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def inputs_of(conn: sqlite3.Connection, input_hashes: set[str]) -> dict[str, str]:
    """input_hash → input JSON text for the given hashes that were recorded."""
    wanted = sorted(input_hashes)
    out: dict[str, str] = {}
    for chunk, marks in in_chunks(wanted):
        rows = conn.execute(
            f"SELECT input_hash, input_json FROM inputs WHERE input_hash IN ({marks})", chunk
        )
        out.update((str(h), str(j)) for h, j in rows)
    return out


def agent_facts(conn: sqlite3.Connection, dispatch_id: str) -> str | None:
    """The facts JSON of one agent attempt (None when it has none)."""
    row = conn.execute(
        "SELECT facts_json FROM agent_facts WHERE dispatch_id = ?", (dispatch_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def agent_facts_of_run(conn: sqlite3.Connection, run_id: str) -> list[tuple[str, str]]:
    """(dispatch id, facts JSON) of a run's agent attempts, in journal order."""
    rows = conn.execute(
        "SELECT f.dispatch_id, f.facts_json FROM agent_facts f"
        " JOIN attempts a ON a.dispatch_id = f.dispatch_id"
        " WHERE f.run_id = ? ORDER BY a.attempt_pk",
        (run_id,),
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def attempts_of(
    conn: sqlite3.Connection, run_id: str, step_id: str | None = None
) -> list[AttemptRow]:
    """A run's attempts (optionally of one step), in journal order."""
    if step_id is None:
        rows = conn.execute(
            f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE run_id = ? ORDER BY attempt_pk", (run_id,)
        )
    else:
        rows = conn.execute(
            f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE run_id = ? AND"
            " step_id = ? ORDER BY attempt_pk",
            (run_id, step_id),
        )
    return [from_row(AttemptRow, r) for r in rows]


def done_outputs(conn: sqlite3.Connection, run_id: str, step_id: str) -> dict[str, dict[str, Any]]:
    """unit_id → input_hash → output JSON of the newest succeeded/reused attempt of each.

    Resume reads only these three columns, never whole attempt rows: the rows stay in
    SQLite's C code until they land in two dicts (later attempts overwrite earlier ones).
    """
    out: dict[str, dict[str, Any]] = {}
    for unit_id, input_hash, output_json in conn.execute(
        "SELECT unit_id, input_hash, output_json FROM attempts WHERE run_id = ? AND step_id = ?"
        " AND status IN ('succeeded', 'reused') ORDER BY attempt_pk",
        (run_id, step_id),
    ):
        out.setdefault(unit_id, {})[input_hash] = output_json
    return out


def attempts_of_units(
    conn: sqlite3.Connection, run_id: str, unit_ids: list[str]
) -> list[AttemptRow]:
    """The attempts of the given units of a run, in journal order."""
    out: list[AttemptRow] = []
    for chunk, marks in in_chunks(unit_ids):
        rows = conn.execute(
            f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE run_id = ? AND unit_id IN ({marks})"
            " ORDER BY attempt_pk",
            (run_id, *chunk),
        )
        out.extend(from_row(AttemptRow, r) for r in rows)
    out.sort(key=lambda a: a.attempt_pk)
    return out


def find_reusable(
    conn: sqlite3.Connection,
    *,
    workflow: str,
    input_hash: str,
    runner: str,
    exclude_run_id: str,
    phase: str = "work",
    unit_id: str | None = None,
) -> AttemptRow | None:
    """The newest succeeded attempt of another run of ``workflow`` with the same input.

    The requested model is part of ``input_hash`` (the ``model`` column holds the model that
    answered, so it is not compared). Verdicts (``phase="gate"``) also match ``unit_id``, the
    loop they judged; callers never look up a person's verdict (runner ``human``).
    """
    row = conn.execute(
        f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE workflow = ? AND input_hash = ? AND"
        " status = 'succeeded' AND runner = ? AND run_id != ? AND phase = ?"
        " AND (? IS NULL OR unit_id = ?) ORDER BY attempt_pk DESC LIMIT 1",
        (workflow, input_hash, runner, exclude_run_id, phase, unit_id, unit_id),
    ).fetchone()
    return from_row(AttemptRow, row) if row else None


def find_reusable_many(
    conn: sqlite3.Connection, *, workflow: str, input_hashes: Sequence[str], exclude_run_id: str
) -> dict[tuple[str, str], AttemptRow]:
    """``find_reusable`` of many work units at once: (input_hash, runner) → the newest
    succeeded work attempt of another run of ``workflow`` with that input and runner.

    One statement per 500 hashes instead of one per unit: a loop's lookups cost one round
    trip on PostgreSQL, not one per unit.
    """
    wanted = sorted(set(input_hashes))
    out: dict[tuple[str, str], AttemptRow] = {}
    for chunk, marks in in_chunks(wanted):
        rows = conn.execute(
            f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE workflow = ? AND input_hash IN ({marks})"
            " AND status = 'succeeded' AND run_id != ? AND phase = 'work' ORDER BY attempt_pk",
            (workflow, *chunk, exclude_run_id),
        )
        for r in rows:
            row = from_row(AttemptRow, r)
            out[(row.input_hash, row.runner)] = row  # later (newer) rows win
    return out


def find_in_run(
    conn: sqlite3.Connection, *, run_id: str, input_hash: str, unit_id: str
) -> AttemptRow | None:
    """The newest succeeded/reused attempt of ``unit_id`` in ``run_id`` with that input."""
    return _newest(conn, run_id, unit_id, input_hash, ("succeeded", "reused"))


def attempt_by_dispatch(conn: sqlite3.Connection, dispatch_id: str) -> AttemptRow | None:
    """The attempt with ``dispatch_id`` (the source a reused attempt points at), if any."""
    row = conn.execute(
        f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE dispatch_id = ?", (dispatch_id,)
    ).fetchone()
    return from_row(AttemptRow, row) if row else None


def latest_verdict(
    conn: sqlite3.Connection, *, run_id: str, unit_id: str, input_hash: str
) -> AttemptRow | None:
    """The newest succeeded verdict attempt of a gate unit for one judge input."""
    return _newest(conn, run_id, unit_id, input_hash, ("succeeded",))


def _newest(
    conn: sqlite3.Connection,
    run_id: str,
    unit_id: str,
    input_hash: str,
    statuses: tuple[str, ...],
) -> AttemptRow | None:
    marks = ", ".join("?" for _ in statuses)
    row = conn.execute(
        f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE run_id = ? AND unit_id = ? AND"
        f" input_hash = ? AND status IN ({marks}) ORDER BY attempt_pk DESC LIMIT 1",
        (run_id, unit_id, input_hash, *statuses),
    ).fetchone()
    return from_row(AttemptRow, row) if row else None


def budget_usage(conn: sqlite3.Connection, root_run_id: str) -> tuple[int, int, float]:
    """(charged attempts, their tokens, their cost) over a root run and its descendants."""
    row = conn.execute(
        f"SELECT COUNT(*), COALESCE(SUM({BUDGET_TOKENS}), 0), COALESCE(SUM(a.cost), 0)"
        " FROM attempts a JOIN runs r ON r.run_id = a.run_id"
        " WHERE r.root_run_id = ? AND a.charged = 1",
        (root_run_id,),
    ).fetchone()
    return int(row[0]), int(row[1]), float(row[2])


def budget_use(conn: sqlite3.Connection, run_id: str) -> BudgetUse:
    """Charged use of ``run_id``'s root tree against the root's ceilings (the one definition).

    Raises:
        UsageError: no run ``run_id`` is in the state database.
    """
    row = conn.execute(
        f"SELECT root.run_id, {plan_of('root')} FROM runs AS run"
        " JOIN runs AS root ON root.run_id = run.root_run_id WHERE run.run_id = ?",
        (run_id,),
    ).fetchone()
    if row is None:
        raise UsageError(f"No run {run_id} in this state database; `wf list` shows the runs.")
    spec = _budget_spec(row[1])
    units, tokens, cost = budget_usage(conn, str(row[0]))
    return BudgetUse(
        units=units,
        tokens=tokens,
        cost=cost,
        max_units=spec.get("max_units"),
        max_tokens=spec.get("max_tokens"),
        max_cost=spec.get("max_cost"),
    )


def _budget_spec(plan_json: str) -> dict[str, Any]:
    """The plan's budget ceilings, read without decoding the plan: one that is not shaped as
    a plan (hand-edited; the drive refuses it) has none, so read verbs still show its use."""
    try:
        spec = json.loads(plan_json).get("budget")
    except (ValueError, AttributeError):
        return {}
    return spec if isinstance(spec, dict) else {}


def events_after(
    conn: sqlite3.Connection, run_id: str, after_id: int = 0, limit: int = 10_000
) -> list[EventRow]:
    """Events of ``run_id`` with id greater than ``after_id`` (for watch/tail)."""
    rows = conn.execute(
        "SELECT event_id, run_id, at, kind, step_id, unit_id, dispatch_id, data_json FROM events"
        " WHERE run_id = ? AND event_id > ? ORDER BY event_id LIMIT ?",
        (run_id, after_id, limit),
    )
    return [from_row(EventRow, r) for r in rows]
