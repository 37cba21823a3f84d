"""The one gate spine: ``complete_step`` is the only writer of a step's status.

It turns a loop's work into the step's fate — route selection, output validation, the
completion gate — writes the step row, and derives the run's status from the step rows.
Writes happen only when something changed, so re-driving a stuck run writes nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import BudgetExceeded
from ..gates.judge import schema_errors, schema_requirement
from ..gates.verdict import GateWaiting, Judged, Verdict, Waiting
from ..hashing import canonical_json
from ..spec.plan import Plan, PlanStep
from ..store.records import RunStatus, StepRow, StepStatus
from . import itemgates, judging
from .context import DriveContext, RunState
from .units import Feedback, UnitPlan

_MISSING = object()

StepFate = Literal["completed", "failed", "skipped", "blocked", "loop"]
"""A step's fate after one loop: a step status, or ``loop`` (re-execute with feedback)."""


@dataclass(slots=True, kw_only=True)
class LoopWork:
    """What one loop's units produced (filled in by dispatch, judged by the spine)."""

    outputs: list[Any] = field(default_factory=list)
    """One output per unit in unit order (``None`` for a failed one)."""
    failures: dict[str, str] = field(default_factory=dict)
    """unit_id → failure message of units that failed for good."""
    budget_error: str | None = None
    blocked: str | None = None
    """Why a unit cannot finish now (a blocked child run)."""
    input_error: str | None = None
    """The step's inputs could not be built (template, map value)."""
    stopped: bool = False
    """A stop arrived before every unit had an outcome."""
    dispatched: int = 0
    executed_failure: bool = False
    """A failed unit really ran (so a run-level retry could succeed)."""

    @classmethod
    def empty(cls, units: int) -> LoopWork:
        """Work for ``units`` units of which none has an outcome yet."""
        return cls(outputs=[_MISSING] * units)

    @property
    def is_complete(self) -> bool:
        """Whether every unit has an output or a recorded failure."""
        return all(o is not _MISSING for o in self.outputs)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    """The step's fate after one loop."""

    status: StepFate
    output: Any = None
    note: str | None = None
    feedback: Feedback | None = None
    run_failed: bool = False
    hard_stop: bool = False
    """A budget stop: fails the run whatever the step's ``on_error``."""
    retryable: bool = False
    """A unit failure a run-level retry (``max_retries``) may re-open the run for."""


def complete_step(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    *,
    loop: int,
    units: Sequence[UnitPlan],
    work: LoopWork,
    items: itemgates.ItemLoops | None = None,
) -> StepOutcome:
    """Decide and record a step's status after one loop of work.

    ``items`` carries a per-item gate's state across loops (updated when a loop is decided).
    """
    outcome = _decide(ctx, state, step, loop=loop, units=units, work=work, items=items)
    if outcome.status == "loop":
        # A rejected loop is replayed from the journal; the row is written when the next
        # loop dispatches (start_loop), so re-driving a finished gate writes nothing.
        return outcome
    output_json = canonical_json(outcome.output) if outcome.output is not None else None
    _write_step(
        ctx,
        state,
        step,
        status=outcome.status,
        loop=loop,
        note=outcome.note,
        output_json=output_json,
        stops_run=outcome.status == "failed" and outcome.hard_stop,
    )
    return outcome


def skip_step(ctx: DriveContext, state: RunState, step: PlanStep, note: str) -> StepOutcome:
    """Record a step skipped by a route (through the spine, like every status)."""
    _write_step(ctx, state, step, status="skipped", loop=1, note=note, output_json=None)
    return StepOutcome(status="skipped", note=note)


def start_loop(ctx: DriveContext, state: RunState, step: PlanStep, loop: int) -> None:
    """Record that ``step`` is pending at ``loop`` (a no-op when it already is)."""
    _write_step(ctx, state, step, status="pending", loop=loop, note=None, output_json=None)


def _decide(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    *,
    loop: int,
    units: Sequence[UnitPlan],
    work: LoopWork,
    items: itemgates.ItemLoops | None = None,
) -> StepOutcome:
    if work.input_error:
        return _failed(step, work.input_error)
    if work.budget_error:
        return StepOutcome(status="failed", note=work.budget_error, run_failed=True, hard_stop=True)
    if work.blocked:
        return StepOutcome(status="blocked", note=work.blocked)
    partial: str | None = None
    if work.failures:
        if not (step.on_error == "continue" and step.map is not None):
            return _unit_failures(step, units, work)
        # A tolerant map goes on with the items that succeeded: its artifact still passes the
        # reduce, the schema and the gate (a failed item never lets work through unjudged).
        partial = _partial_note(units, work)
    if step.kind == "route":
        return _route(step, work.outputs[0])
    failures = work.failures
    ok = (
        [i for i, u in enumerate(units) if u.unit_id not in failures]
        if failures
        else list(range(len(units)))
    )
    if step.gate is not None and step.gate.per_item and items is not None:
        return _with_note(_per_item(ctx, state, step, loop, units, work, ok, items), partial)
    artifact = _reduce(step, work.outputs, ok=ok)
    if isinstance(artifact, StepOutcome):
        return _with_note(artifact, partial)
    if step.output is not None:
        errors = schema_errors(
            step.output, [work.outputs[i] for i in ok], unit_ids=[units[i].unit_id for i in ok]
        )
        if errors:
            return _with_note(
                _schema_rejected(ctx, state, step, loop=loop, artifact=artifact, errors=errors),
                partial,
            )
    if step.gate is None:
        return StepOutcome(status="completed", output=artifact, note=partial)
    try:
        verdict = judging.obtain_verdict(
            ctx, state, step, loop=loop, artifact=artifact, unit_count=len(units)
        )
    except BudgetExceeded as exc:  # a charged judge would pass a ceiling: stop as a unit would
        ctx.emit("warning", run_id=state.run_id, step_id=step.id, message=str(exc))
        return StepOutcome(status="failed", note=str(exc), run_failed=True, hard_stop=True)
    if isinstance(verdict, GateWaiting):
        return StepOutcome(status="blocked", note=verdict.reason, output=verdict.waiting.to_json())
    return _with_note(_judged(step, loop=loop, artifact=artifact, judged=verdict), partial)


def _per_item(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    loop: int,
    units: Sequence[UnitPlan],
    work: LoopWork,
    ok: list[int],
    items: itemgates.ItemLoops,
) -> StepOutcome:
    """A per-item gate's fate for this loop (drive/itemgates.py); the reduce runs once every
    item passed."""
    try:
        fate = itemgates.decide(
            ctx, state, step, loop=loop, units=units, outputs=work.outputs, ok=ok, items=items
        )
    except BudgetExceeded as exc:  # a charged judge would pass a ceiling: stop as a unit would
        ctx.emit("warning", run_id=state.run_id, step_id=step.id, message=str(exc))
        return StepOutcome(status="failed", note=str(exc), run_failed=True, hard_stop=True)
    if fate.status == "loop":
        return StepOutcome(status="loop", note=fate.note, feedback=fate.feedback)
    if fate.status in ("blocked", "exhausted"):
        return StepOutcome(status="blocked", note=fate.note, output=fate.output)
    artifact = _reduce(step, work.outputs, ok=ok)
    if isinstance(artifact, StepOutcome):
        return artifact
    return StepOutcome(status="completed", output=artifact, note=fate.note)


def _with_note(outcome: StepOutcome, extra: str | None) -> StepOutcome:
    """``outcome`` with ``extra`` appended to its note (a tolerant map's failures)."""
    if not extra or outcome.status in ("loop", "blocked"):
        return outcome
    note = f"{outcome.note}; {extra}" if outcome.note else extra
    return StepOutcome(
        status=outcome.status,
        output=outcome.output,
        note=note,
        feedback=outcome.feedback,
        run_failed=outcome.run_failed,
        retryable=outcome.retryable,
    )


def _partial_note(units: Sequence[UnitPlan], work: LoopWork) -> str:
    failed = [u.unit_id for u in units if u.unit_id in work.failures]
    first = failed[0]
    return f"{len(failed)} of {len(units)} units failed; first: {first}: {work.failures[first]}"


def _failed(step: PlanStep, note: str) -> StepOutcome:
    return StepOutcome(status="failed", note=note, run_failed=step.on_error == "fail")


def _unit_failures(step: PlanStep, units: Sequence[UnitPlan], work: LoopWork) -> StepOutcome:
    failed = [u.unit_id for u in units if u.unit_id in work.failures] or list(work.failures)
    first_id, count = failed[0], len(failed)
    note = f"unit {first_id} failed: {work.failures[first_id]}" + (
        f" (+{count - 1} more)" if count > 1 else ""
    )
    outcome = _failed(step, note)
    return StepOutcome(
        status=outcome.status,
        note=outcome.note,
        run_failed=outcome.run_failed,
        retryable=work.executed_failure,
    )


def _route(step: PlanStep, result: Any) -> StepOutcome:
    if not isinstance(result, dict) or "selected" not in result:
        return _failed(step, f"route result is malformed: {result!r}")
    return StepOutcome(
        status="completed",
        output=result,
        note=f"selected {result['selected']!r} (case {result['case']!r})",
    )


def _reduce(step: PlanStep, outputs: list[Any], *, ok: list[int]) -> Any:
    """The step's artifact: the single output, all outputs in item order, or the vote.

    ``ok`` indexes the units that succeeded; a failed item (``on_error: continue``) is ``None``
    in a collected list and casts no vote.
    """
    if step.map is None:
        return outputs[0]
    if step.reduce == "collect":
        return outputs
    if not ok:
        return _failed(
            step,
            "vote over an empty map has no majority"
            if not outputs
            else "vote has no outputs: every unit failed",
        )
    counts = Counter(canonical_json(outputs[i]) for i in ok)
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return _failed(
            step,
            f"vote tied ({ranked[0][1]} votes each for the top outputs); "
            "add items or use reduce: collect",
        )
    return json.loads(ranked[0][0])


def _schema_rejected(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    *,
    loop: int,
    artifact: Any,
    errors: list[str],
) -> StepOutcome:
    feedback = (
        "The output does not match the required schema: "
        + "; ".join(errors[:20])
        + f". Required: {schema_requirement(step.output or {})}."
    )
    verdict = Verdict(complete=False, feedback=feedback, missing=tuple(errors[:20]), judge="schema")
    verdict = judging.record_schema_verdict(
        ctx, state, step, loop=loop, artifact=artifact, verdict=verdict
    )
    if loop < step.max_loops:
        return StepOutcome(
            status="loop",
            note=verdict.feedback,
            feedback=Feedback(loop=loop, feedback=verdict.feedback, missing=verdict.missing),
        )
    return _failed(step, f"output failed its schema after {loop} loop(s): " + "; ".join(errors))


def _judged(step: PlanStep, *, loop: int, artifact: Any, judged: Judged) -> StepOutcome:
    verdict = judged.verdict
    if verdict.complete:
        note = f"gate passed at loop {loop}/{step.max_loops} ({verdict.judge})"
        if verdict.feedback:
            note += f": {verdict.feedback}"
        return StepOutcome(status="completed", output=artifact, note=note)
    fb = Feedback(loop=loop, feedback=verdict.feedback, missing=verdict.missing)
    if loop < step.max_loops:
        return StepOutcome(
            status="loop", note=f"loop {loop} rejected: {verdict.feedback}", feedback=fb
        )
    waiting = Waiting(
        loop=loop, input_hash=judged.input_hash, summary=judged.summary, judge="exhausted"
    ).to_json()
    return StepOutcome(
        status="blocked",
        output=waiting,
        note=f"gate exhausted after {loop} loop(s); last feedback: {verdict.feedback}"
        + (f" (missing: {', '.join(verdict.missing)})" if verdict.missing else ""),
    )


def defers_writes(ctx: DriveContext) -> bool:
    """Whether this drive's step and run status writes wait for its next write transaction
    (``Store.defer_write``): a sweep cell's (a drive with a payer), so its last step, its
    run's status and its unit's finish commit as one transaction, at the drive's end flush
    at the latest. Every read of the run, and its next reservation, commits them first."""
    return ctx.options.payer is not None


def _write_step(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    *,
    status: StepStatus,
    loop: int,
    note: str | None,
    output_json: str | None,
    stops_run: bool = False,
) -> None:
    # Redacted as the Store will write them, so a re-drive compares like with like.
    scrub = ctx.store.scrubber
    note, output_json = scrub.text(state.run_id, note), scrub.json_text(state.run_id, output_json)
    current = state.step_rows[step.id]
    if (
        current.status,
        current.loop,
        current.note,
        current.output_json,
        bool(current.stops_run),
    ) == (status, loop, note, output_json, stops_run):
        return
    ctx.store.write_step(
        state.run_id,
        step.id,
        status=status,
        loop=loop,
        note=note,
        output_json=output_json,
        stops_run=stops_run,
        defer=defers_writes(ctx),
    )
    state.step_rows[step.id] = StepRow(
        run_id=current.run_id,
        step_id=current.step_id,
        position=current.position,
        kind=current.kind,
        status=status,
        loop=loop,
        max_loops=current.max_loops,
        note=note,
        output_json=output_json,
        updated_at=current.updated_at,
        stops_run=int(stops_run),
    )
    ctx.emit(
        "step_status", run_id=state.run_id, step_id=step.id, status=status, loop=loop, note=note
    )


def derive_run_status(plan: Plan, rows: dict[str, StepRow]) -> tuple[RunStatus, str | None]:
    """The run status implied by its step rows, with the reason shown to users."""
    for step in plan.steps:
        row = rows[step.id]
        if row.status == "blocked":
            return "blocked", f"step {step.id}: {row.note}"
        if row.status == "failed" and (step.on_error == "fail" or row.stops_run):
            return "failed", f"step {step.id}: {row.note}"
    if all(rows[s.id].status in ("completed", "skipped", "failed") for s in plan.steps):
        return "completed", None
    return "active", None


def run_result(plan: Plan, rows: dict[str, StepRow]) -> Any:
    """A completed run's result: the output of its last completed step."""
    for step in reversed(plan.steps):
        row = rows[step.id]
        if row.status == "completed" and row.output_json is not None:
            return json.loads(row.output_json)
    return None
