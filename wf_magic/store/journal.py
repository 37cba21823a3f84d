"""SQL for the append-only attempt journal, the unit projection and events."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import UsageError
from .plans import plan_of
from .records import AttemptRow, AttemptStatus, BudgetUse, EventRow, Phase, from_row

_ATTEMPT_COLS = ", ".join(AttemptRow.__dataclass_fields__)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitKey:
    """Identity and resolved input of one unit attempt about to be journaled."""

    run_id: str
    workflow: str
    step_id: str
    unit_id: str
    phase: Phase
    loop: int
    item_index: int | None
    runner: str
    model: str | None
    input_hash: str
    input_json: str | None = None
    """The resolved input (redacted canonical JSON) kept once per ``input_hash`` in ``inputs``."""


def new_dispatch_id() -> str:
    """A fresh dispatch id: 32 hex chars, time-ordered (a microsecond clock, then 72 random bits).

    Ids that grow with time append to the end of the ``dispatch_id`` index instead of landing
    on a random page of it (a uuid4 dirtied a different index page per attempt); the random
    tail keeps them unique across processes.
    """
    return f"{time.time_ns() // 1000:014x}{secrets.token_hex(9)}"


NEXT_SEQ = "(SELECT n + 1 FROM journal_seq)"
"""The next event id (SQL): one counter for ``event_log`` rows and the unit events derived
from attempts (``derived.UNIT_EVENTS_VIEW``), so ids follow commit order across both.
Writers are serialised (``BEGIN IMMEDIATE``; the advisory lock on PostgreSQL), so reading it
and bumping it in one transaction never hands one id out twice."""
_BUMP_SEQ = "UPDATE journal_seq SET n = n + 1"


def append_event_txn(
    conn: sqlite3.Connection,
    run_id: str,
    kind: str,
    *,
    step_id: str | None = None,
    unit_id: str | None = None,
    dispatch_id: str | None = None,
    data: Any = None,
    at: float | None = None,
) -> None:
    """Append one event row to ``event_log`` (``at``: when it happened; None: now), its id
    the next of ``journal_seq``."""
    conn.execute(
        "INSERT INTO event_log (event_id, run_id, at, kind, step_id, unit_id, dispatch_id,"
        f" data_json) VALUES ({NEXT_SEQ}, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id,
            at or time.time(),
            kind,
            step_id,
            unit_id,
            dispatch_id,
            None if data is None else _event_json(data),
        ),
    )
    conn.execute(_BUMP_SEQ)


def _event_json(data: Any) -> str:
    """An event's data as stored: canonical JSON (sorted keys), anything else as its text."""
    return json.dumps(data, sort_keys=True, default=str)


def _keep_input_txn(conn: sqlite3.Connection, key: UnitKey, now: float) -> None:
    """Keep the unit's input once per hash (content-addressed: runs and loops share a copy)."""
    if key.input_json is not None:
        conn.execute(
            "INSERT OR IGNORE INTO inputs (input_hash, input_json, created_at) VALUES (?, ?, ?)",
            (key.input_hash, key.input_json, now),
        )


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
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
        rows = conn.execute(
            f"SELECT input_hash, input_json FROM inputs WHERE input_hash IN ({marks})", chunk
        )
        out.update((str(h), str(j)) for h, j in rows)
    return out


_NEXT_ATTEMPT = (
    "(SELECT COALESCE(MAX(b.attempt), 0) + 1 FROM attempts b WHERE b.run_id = ? AND b.unit_id = ?)"
)
"""The next attempt number of a unit (SQL, bound to its run and unit id): folded into the
insert, so journaling an attempt is one statement (one round trip on PostgreSQL), not a read
and then a write."""
_KEY_COLUMNS = (
    "run_id, workflow, step_id, unit_id, dispatch_id, phase, loop, item_index, runner, model,"
    " input_hash, charged, attempt"
).split(", ")
"""What every new attempt binds first, in this order: its key and dispatch id, then its
number (``_NEXT_ATTEMPT``, bound to the run and unit ids)."""
_OUTCOME_COLUMNS = (
    "status, tokens_in, tokens_out, cost, saved_tokens, reused_from, session_id, output_json,"
    " failure, transient"
).split(", ")


def _insert_attempt_sql(columns: Sequence[str], values: Sequence[str]) -> str:
    """``INSERT INTO attempts`` of ``columns`` with ``values`` (SQL), returning the key and
    number it was given."""
    return (
        f"INSERT INTO attempts ({', '.join(columns)}) VALUES ({', '.join(values)})"
        " RETURNING attempt_pk, attempt"
    )


_KEY_VALUES = ["?"] * (len(_KEY_COLUMNS) - 1) + [_NEXT_ATTEMPT]
_RESERVE_SQL = _insert_attempt_sql(
    [*_KEY_COLUMNS, "status", "started_at", "started_seq"],
    [*_KEY_VALUES, "'running'", "?", NEXT_SEQ],
)
"""A reservation: status ``running``, its ``unit_started`` event at the next event id; its
outcome columns keep their defaults until it finishes."""
_TERMINAL_SQL = _insert_attempt_sql(
    [*_KEY_COLUMNS, *_OUTCOME_COLUMNS, "started_at", "finished_at"],
    [*_KEY_VALUES, *["?"] * len(_OUTCOME_COLUMNS), "?", "?"],
)
"""An attempt terminal at once (a reuse, a recorded verdict): its outcome is written with it,
and its one event is an ``event_log`` row, not a derived one."""
_FINISH_SQL = (
    "UPDATE attempts SET status = ?, output_json = ?, failure = ?, transient = ?,"
    " tokens_in = ?, tokens_out = ?, cost = ?, model = COALESCE(?, model), session_id = ?,"
    f" finished_at = ?, finish_data = ?, finished_seq = {NEXT_SEQ}"
    " WHERE dispatch_id = ? AND status = 'running'"
)
_FINISHED_NOW = (
    f" WHERE EXISTS (SELECT 1 FROM attempts WHERE dispatch_id = ? AND finished_seq = {NEXT_SEQ})"
)
"""True (SQL, bound to a dispatch id) right after ``_FINISH_SQL`` finished that attempt: it
holds the next event id, not yet bumped. The writes that follow a finish are conditioned on
it instead of on the update's row count, so on PostgreSQL none of them waits for a reply: the
finish goes out with the transaction's next read or its COMMIT."""


def reserve_attempt_txn(conn: sqlite3.Connection, key: UnitKey, *, charged: bool) -> AttemptRow:
    """Insert a ``running`` attempt with a fresh dispatch_id (its ``unit_started`` event)."""
    return _journal_attempt_txn(conn, key, None, charged=charged)


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish:
    """The outcome written onto a running attempt."""

    status: Literal["succeeded", "failed", "reused"]
    output_json: str | None = None
    failure: str | None = None
    transient: bool | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float | None = None
    model: str | None = None
    session_id: str | None = None
    agent_json: str | None = None
    """An agent attempt's facts (JSON, redacted), kept in ``agent_facts``."""
    finished_at: float | None = None
    """When the unit finished (a deferred finish commits later); None: at the write."""
    price_source: str | None = None
    """Where ``cost`` came from (``runners/pricing.py``); kept in the ``unit_finished`` event."""


def reserve_attempts_txn(
    conn: sqlite3.Connection, keys: Sequence[tuple[UnitKey, bool]]
) -> list[AttemptRow]:
    """Reserve each ``(key, charged)`` in order, in the caller's transaction."""
    return [reserve_attempt_txn(conn, key, charged=charged) for key, charged in keys]


def finish_attempt_txn(conn: sqlite3.Connection, attempt: AttemptRow, finish: Finish) -> bool:
    """Finish a running attempt; False (and nothing written) when it was already finished."""
    return bool(queue_finish_txn(conn, attempt, finish).rowcount > 0)


def queue_finish_txn(conn: sqlite3.Connection, attempt: AttemptRow, finish: Finish) -> Any:
    """Finish a running attempt without asking whether it was (nothing is written when it
    was already finished); the cursor of the update, whose ``rowcount`` says.

    The attempt row carries its ``unit_finished`` event: its id (``finished_seq``) and its data
    (``finish_data``, the JSON the event had when it was a row of its own).
    """
    now = finish.finished_at or time.time()
    data = {
        "status": finish.status,
        "attempt": attempt.attempt,
        "tokens": finish.tokens_in + finish.tokens_out,
        "failure": finish.failure,
        "phase": attempt.phase,
        "loop": attempt.loop,
        **({"price_source": finish.price_source} if finish.price_source else {}),
    }
    cur = conn.execute(
        _FINISH_SQL,
        (
            finish.status,
            finish.output_json,
            finish.failure,
            None if finish.transient is None else int(finish.transient),
            finish.tokens_in,
            finish.tokens_out,
            finish.cost,
            finish.model,
            finish.session_id,
            now,
            _event_json(data),
            attempt.dispatch_id,
        ),
    )
    if finish.agent_json is not None:
        harness = str(json.loads(finish.agent_json).get("harness") or "")
        conn.execute(
            "INSERT OR REPLACE INTO agent_facts (dispatch_id, run_id, harness, facts_json)"
            " SELECT ?, ?, ?, ?" + _FINISHED_NOW,
            (attempt.dispatch_id, attempt.run_id, harness, finish.agent_json, attempt.dispatch_id),
        )
    conn.execute(_BUMP_SEQ + _FINISHED_NOW, (attempt.dispatch_id,))
    return cur


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


def record_terminal_attempt_txn(
    conn: sqlite3.Connection,
    key: UnitKey,
    finish: Finish,
    *,
    charged: bool = False,
    reused_from: str | None = None,
    saved_tokens: int = 0,
    event: str = "unit_finished",
) -> AttemptRow:
    """Insert an attempt that is terminal at once (a reused result or a recorded verdict)."""
    return _journal_attempt_txn(
        conn,
        key,
        finish,
        charged=charged,
        event=event,
        reused_from=reused_from,
        saved_tokens=saved_tokens,
    )


def _journal_attempt_txn(
    conn: sqlite3.Connection,
    key: UnitKey,
    finish: Finish | None,
    *,
    charged: bool,
    event: str = "unit_finished",
    reused_from: str | None = None,
    saved_tokens: int = 0,
) -> AttemptRow:
    """Journal a new attempt of ``key``: ``running`` (``finish`` None; its event is derived)
    or terminal at once (with ``event`` in ``event_log``), its input kept, in the caller's
    transaction."""
    dispatch_id = new_dispatch_id()
    now = time.time()
    key_values = (
        key.run_id,
        key.workflow,
        key.step_id,
        key.unit_id,
        dispatch_id,
        key.phase,
        key.loop,
        key.item_index,
        key.runner,
        (finish.model if finish is not None else None) or key.model,
        key.input_hash,
        int(charged),
        key.run_id,
        key.unit_id,
    )
    if finish is None:
        row = conn.execute(_RESERVE_SQL, (*key_values, now)).fetchall()
    else:
        row = conn.execute(
            _TERMINAL_SQL,
            (
                *key_values,
                finish.status,
                finish.tokens_in,
                finish.tokens_out,
                finish.cost,
                saved_tokens,
                reused_from,
                finish.session_id,
                finish.output_json,
                finish.failure,
                None if finish.transient is None else int(finish.transient),
                now,
                now,
            ),
        ).fetchall()
    attempt_pk, number = int(row[0][0]), int(row[0][1])
    if finish is None:
        conn.execute(_BUMP_SEQ)
    _keep_input_txn(conn, key, now)
    if finish is not None:
        append_event_txn(
            conn,
            key.run_id,
            event,
            at=now,
            step_id=key.step_id,
            unit_id=key.unit_id,
            dispatch_id=dispatch_id,
            data={
                "attempt": number,
                "phase": key.phase,
                "loop": key.loop,
                "status": finish.status,
                "reused_from": reused_from,
                "saved_tokens": saved_tokens,
            },
        )
    return _row(
        key,
        attempt_pk=attempt_pk,
        attempt=number,
        dispatch_id=dispatch_id,
        charged=charged,
        started_at=now,
        status="running" if finish is None else finish.status,
        finish=finish or _NO_OUTCOME,
        finished_at=None if finish is None else now,
        saved_tokens=saved_tokens,
        reused_from=reused_from,
    )


_NO_OUTCOME = Finish(status="succeeded")
"""What a reserved attempt carries so far: no tokens, output or failure (status unused)."""


def _row(
    key: UnitKey,
    *,
    attempt_pk: int,
    attempt: int,
    dispatch_id: str,
    charged: bool,
    started_at: float,
    status: AttemptStatus,
    finish: Finish,
    finished_at: float | None,
    saved_tokens: int = 0,
    reused_from: str | None = None,
) -> AttemptRow:
    """The row just inserted for ``key``, built rather than read back."""
    return AttemptRow(
        attempt_pk=attempt_pk,
        run_id=key.run_id,
        workflow=key.workflow,
        step_id=key.step_id,
        unit_id=key.unit_id,
        attempt=attempt,
        dispatch_id=dispatch_id,
        phase=key.phase,
        loop=key.loop,
        item_index=key.item_index,
        runner=key.runner,
        model=finish.model or key.model,
        status=status,
        input_hash=key.input_hash,
        charged=int(charged),
        tokens_in=finish.tokens_in,
        tokens_out=finish.tokens_out,
        cost=finish.cost,
        saved_tokens=saved_tokens,
        reused_from=reused_from,
        session_id=finish.session_id,
        output_json=finish.output_json,
        failure=finish.failure,
        transient=None if finish.transient is None else int(finish.transient),
        started_at=started_at,
        finished_at=finished_at,
    )


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
    for start in range(0, len(unit_ids), 500):
        chunk = unit_ids[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
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
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
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
        "SELECT COUNT(*), COALESCE(SUM(a.tokens_in + a.tokens_out), 0), COALESCE(SUM(a.cost), 0)"
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
