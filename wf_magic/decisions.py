"""Human gate decisions: compare-and-set against what the run is waiting for, then journal."""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING, Any

from .errors import GateDecisionRefused
from .gates import Verdict
from .store import journal as jsql
from .store import runs as run_sql
from .store.records import AttemptRow

if TYPE_CHECKING:
    from .engine import Engine
    from .runrows import RunRef


def decide(
    engine: Engine,
    run_id: RunRef,
    step_id: str,
    *,
    complete: bool,
    feedback: str,
    missing: tuple[str, ...],
    loop: int | None,
) -> int:
    """Record a person's verdict on a blocked gate and tell observers; returns the loop."""
    rid = engine.resolve_run_id(run_id)
    workflow = engine.get_run(rid).workflow
    verdict = Verdict(complete=complete, feedback=feedback, missing=missing, judge="human")
    decided_loop = engine.write(
        lambda c: record_human_verdict_txn(
            c, rid, step_id, workflow=workflow, verdict=verdict, loop=loop
        )
    )
    engine.emit(
        "gate_verdict",
        run_id=rid,
        step_id=step_id,
        loop=decided_loop,
        complete=complete,
        feedback=feedback,
        missing=list(missing),
        judge="human",
    )
    return decided_loop


def record_human_verdict_txn(
    conn: sqlite3.Connection,
    run_id: str,
    step_id: str,
    *,
    workflow: str,
    verdict: Verdict,
    loop: int | None,
) -> int:
    """Journal a person's verdict on the loop ``step_id`` waits on (inside one transaction).

    Returns:
        The loop decided.

    Raises:
        GateDecisionRefused: nothing waits, another loop waits (``loop`` is stale), or the
            loop was already decided; nothing is recorded.
    """
    row = next((s for s in run_sql.steps_of(conn, run_id) if s.step_id == step_id), None)
    if row is None:
        raise GateDecisionRefused(f"Run {run_id} has no step {step_id!r}.", run_id=run_id)
    waiting = (
        json.loads(row.output_json or "{}").get("waiting") if row.status == "blocked" else None
    )
    if not waiting:
        why = f": {row.note}" if row.status == "blocked" and row.note else ""
        raise GateDecisionRefused(
            f"Run {run_id} step {step_id} is not waiting for a decision (status "
            f"{row.status}{why}); nothing was recorded.",
            run_id=run_id,
            step_id=step_id,
        )
    if loop is not None and loop != waiting["loop"]:
        raise GateDecisionRefused(
            f"Run {run_id} step {step_id} waits on loop {waiting['loop']}, not loop "
            f"{loop} (a button from an older output?); nothing was recorded.",
            run_id=run_id,
            step_id=step_id,
        )
    unit_id = f"{step_id}.gate:l{waiting['loop']}"
    latest = jsql.latest_verdict(
        conn, run_id=run_id, unit_id=unit_id, input_hash=waiting["input_hash"]
    )
    refusal = _refusal(run_id, step_id, waiting, verdict.complete, latest)
    if refusal:
        raise GateDecisionRefused(refusal, run_id=run_id, step_id=step_id)
    key = jsql.UnitKey(
        run_id=run_id,
        workflow=workflow,
        step_id=step_id,
        unit_id=unit_id,
        phase="gate",
        loop=int(waiting["loop"]),
        item_index=None,
        runner="human",
        model=None,
        input_hash=waiting["input_hash"],
    )
    finish = jsql.Finish(status="succeeded", output_json=json.dumps(verdict.to_json()))
    jsql.record_terminal_attempt_txn(conn, key, finish, event="human_verdict")
    return int(waiting["loop"])


def _refusal(
    run_id: str,
    step_id: str,
    waiting: dict[str, Any],
    complete: bool,
    latest: AttemptRow | None,
) -> str | None:
    """Why a human decision must not be recorded now (None: record it)."""
    where = f"Run {run_id} step {step_id} loop {waiting['loop']}"
    by_human = latest is not None and latest.runner == "human"
    if waiting.get("judge") == "exhausted":
        if not complete:
            return (
                f"{where}: the gate is already exhausted; approve the last artifact, "
                "abandon the run, or fork it. Nothing was recorded."
            )
        approved = (
            by_human
            and latest is not None
            and json.loads(latest.output_json or "{}").get("complete")
        )
        return f"{where} was already approved; resume the run to continue." if approved else None
    if by_human:
        return f"{where} was already decided; resume the run to act on that decision."
    return None
