"""SQL that writes the append-only attempt journal (reservations, finishes, terminal
attempts, kept inputs) and the other events; ``journal_reads.py`` reads them."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .records import AttemptRow, AttemptStatus, Phase


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
    tokens_in: int | None = 0
    """None: the server reported no count (NULL: unknown)."""
    tokens_out: int | None = 0
    cost: float | None = None
    model: str | None = None
    session_id: str | None = None
    charged_tokens: int | None = None
    """What the run budget charged for an attempt whose usage is unknown (the known count
    plus the tokens it was offered), kept in its ``unit_finished`` event so a resumed budget
    charges it again; None when both counts are known (they are charged)."""
    agent_json: str | None = None
    """An agent attempt's facts (JSON, redacted), kept in ``agent_facts``."""
    finished_at: float | None = None
    """When the unit finished (a deferred finish commits later); None: at the write."""
    price_source: str | None = None
    """Where ``cost`` came from (``runners/pricing.py``); kept in the ``unit_finished`` event."""


def known_tokens(tokens_in: int | None, tokens_out: int | None) -> int | None:
    """``tokens_in + tokens_out``; None when either count is unknown."""
    return None if tokens_in is None or tokens_out is None else tokens_in + tokens_out


def reserve_attempts_txn(
    conn: sqlite3.Connection, keys: Sequence[tuple[UnitKey, bool]]
) -> list[AttemptRow]:
    """Reserve each ``(key, charged)`` in order, in the caller's transaction."""
    return [reserve_attempt_txn(conn, key, charged=charged) for key, charged in keys]


def finish_attempt_txn(conn: sqlite3.Connection, attempt: AttemptRow, finish: Finish) -> bool:
    """Finish a running attempt; False (and nothing written) when it was already finished."""
    return bool(queue_finish_txn(conn, attempt, finish).rowcount > 0)


def queue_finish_txn(
    conn: sqlite3.Connection, attempt: AttemptRow, finish: Finish, *, bump: bool = True
) -> Any:
    """Finish a running attempt without asking whether it was (nothing is written when it
    was already finished); the cursor of the update, whose ``rowcount`` says.

    The attempt row carries its ``unit_finished`` event: its id (``finished_seq``) and its data
    (``finish_data``, the JSON the event had when it was a row of its own). ``bump=False``:
    the event counter is left for the events appended next to bump (``FINISHED_COUNT``).
    """
    now = finish.finished_at or time.time()
    data = {
        "status": finish.status,
        "attempt": attempt.attempt,
        "tokens": known_tokens(finish.tokens_in, finish.tokens_out),
        **({"charged_tokens": finish.charged_tokens} if finish.charged_tokens is not None else {}),
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
    if bump:
        conn.execute(_BUMP_SEQ + _FINISHED_NOW, (attempt.dispatch_id,))
    return cur


FINISHED_COUNT = (
    "(SELECT COUNT(*) FROM attempts WHERE dispatch_id = ? AND finished_seq = journal_seq.n + 1)"
)
"""1 (SQL, bound to a dispatch id, inside a statement over ``journal_seq``) right after
``queue_finish_txn(bump=False)`` finished that attempt: it holds the next event id, which
the counter does not count yet; 0 otherwise (it was finished already, nothing written)."""


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
