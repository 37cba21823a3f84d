"""Human gate decisions: compare-and-set against what the gate waits on, then journal."""

from __future__ import annotations

import json
from collections.abc import Callable

from ..errors import GateDecisionRefused, clip
from ..store import Store
from ..store.journal import Finish, UnitKey
from ..store.records import AttemptRow, RunRow, StepRow
from .verdict import Verdict, Waiting, gate_unit_id


def record_human_verdict(
    store: Store,
    run_id: str,
    step_id: str,
    *,
    workflow: str,
    verdict: Verdict,
    loop: int | None,
) -> int:
    """Journal a person's verdict on the loop ``step_id`` waits on, in one transaction.

    Returns:
        The loop decided.

    Raises:
        GateDecisionRefused: the run is not ``blocked`` (active, completed, failed,
            abandoned), nothing waits, another loop waits (``loop`` is stale), or the loop was
            already decided; nothing is recorded.
    """

    def check_run(run: RunRow | None) -> None:
        _check_blocked(run_id, step_id, run)

    def decide(row: StepRow | None, latest: Callable[[str, str], AttemptRow | None]) -> UnitKey:
        waiting = _waiting_on(run_id, step_id, row, loop)
        unit_id = gate_unit_id(step_id, waiting.loop)
        refusal = _refusal(
            run_id, step_id, waiting, verdict.complete, latest(unit_id, waiting.input_hash)
        )
        if refusal:
            raise GateDecisionRefused(refusal, run_id=run_id, step_id=step_id)
        return UnitKey(
            run_id=run_id,
            workflow=workflow,
            step_id=step_id,
            unit_id=unit_id,
            phase="gate",
            loop=waiting.loop,
            item_index=None,
            runner="human",
            model=None,
            input_hash=waiting.input_hash,
            # What the person was shown (a human gate's input is otherwise never journaled).
            input_json=json.dumps({"judge": "human", "summary": waiting.summary}),
        )

    finish = Finish(status="succeeded", output_json=json.dumps(verdict.to_json()))
    return store.record_decision(run_id, step_id, decide, finish, check_run=check_run).loop


_NOT_BLOCKED = {
    "active": "the run is active, not blocked on a gate",
    "completed": "the run completed; there is nothing left to decide",
    "failed": "the run failed{why}; `wf resume {run_id}` re-opens it",
    "abandoned": (
        "the run was abandoned{why}; `wf fork {run_id} --from STEP` continues its work in a new run"
    ),
}
"""Why a decision on a run in each status other than ``blocked`` is refused."""


def _check_blocked(run_id: str, step_id: str, run: RunRow | None) -> None:
    """Refuse a decision unless the run is ``blocked`` (compare-and-set on the run row)."""
    if run is None:
        raise GateDecisionRefused(f"No run {run_id!r}; nothing was recorded.", run_id=run_id)
    if run.status == "blocked":
        return
    why = f" ({clip(run.status_reason, 200)})" if run.status_reason else ""
    text = _NOT_BLOCKED.get(run.status, "the run is {status}").format(
        why=why, run_id=run_id, status=run.status
    )
    raise GateDecisionRefused(
        f"Run {run_id} step {step_id} is not waiting for a decision (status {run.status}): "
        f"{text}; nothing was recorded.",
        run_id=run_id,
        step_id=step_id,
    )


def _waiting_on(run_id: str, step_id: str, row: StepRow | None, loop: int | None) -> Waiting:
    """What the step waits on, or why no decision can be taken for it."""
    if row is None:
        raise GateDecisionRefused(f"Run {run_id} has no step {step_id!r}.", run_id=run_id)
    waiting = (
        Waiting.from_json(json.loads(row.output_json or "{}")) if row.status == "blocked" else None
    )
    if waiting is None:
        why = f": {row.note}" if row.status == "blocked" and row.note else ""
        raise GateDecisionRefused(
            f"Run {run_id} step {step_id} is not waiting for a decision (status "
            f"{row.status}{why}); nothing was recorded.",
            run_id=run_id,
            step_id=step_id,
        )
    if loop is not None and loop != waiting.loop:
        raise GateDecisionRefused(
            f"Run {run_id} step {step_id} waits on loop {waiting.loop}, not loop "
            f"{loop} (a button from an older output?); nothing was recorded.",
            run_id=run_id,
            step_id=step_id,
        )
    return waiting


def _refusal(
    run_id: str,
    step_id: str,
    waiting: Waiting,
    complete: bool,
    latest: AttemptRow | None,
) -> str | None:
    """Why a human decision must not be recorded now (None: record it)."""
    where = f"Run {run_id} step {step_id} loop {waiting.loop}"
    by_human = latest is not None and latest.runner == "human"
    if waiting.judge == "exhausted":
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
