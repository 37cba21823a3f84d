"""The drive loop: next step → units → dispatch → spine, over a run's frozen plan.

``drive_run(ctx, run)`` drives one run whose lock the caller holds; a ``workflow:`` unit
drives its child run through the same function with ``ctx.child(redactor)``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..errors import RunLockHeld, RunnerError
from ..gates.verdict import gate_item_unit_id, gate_unit_id
from ..hashing import canonical_json
from ..runners.base import UnitResult
from ..spec.plan import Plan, PlanStep
from ..store.records import AttemptRow, RunRow, StepRow
from . import children, dispatch, scoring, spine
from .context import DriveContext, DriveStats, RunState
from .integrity import verified_plan
from .itemgates import ItemLoops
from .units import StepInputError, UnitPlan, build_units


def drive_run(
    ctx: DriveContext,
    run: RunRow,
    *,
    plan: Plan | None = None,
    step_rows: Sequence[StepRow] | None = None,
    flush: bool = True,
) -> DriveStats:
    """Drive ``run`` (its lock held by the caller) until done, blocked, failed or stopped.

    ``step_rows``: the run's step rows as the caller just read them under the lock (read
    here otherwise). ``flush=False``: the writes this drive deferred are left to the next
    write transaction; the caller keeps the run's lock until they commit.

    Raises:
        PlanIntegrityError: the stored plan or params were edited.
        PlanVersionError: the plan was frozen by a newer wf_magic, or cannot be decoded.
    """
    verified, params = verified_plan(ctx.store, ctx.bus, run)
    plan = plan or verified
    if run.status == "abandoned" or (run.status == "completed" and not scoring.has_scores(plan)):
        return DriveStats()  # a completed run with scores is walked: its owed scores are measured
    if run.stop_requested and run.parent_run_id is None:
        ctx.store.set_stop_requested(run.run_id, False)
    # A failed run is re-opened in effect, not in a write: its status changes only if the
    # drive gets further, so re-driving a run that fails the same way writes nothing.
    state = RunState.begin(ctx, run, plan, params)
    durable = ctx.store.synchronous_full(plan.execution.durability == "full")
    # Every text this drive writes for the run is redacted with the run's own redactor.
    with durable, ctx.store.scrubber.driving(run.run_id, state.redactor):
        interrupted = False
        try:
            _walk(ctx, state, step_rows)
            if flush:
                ctx.store.flush(state.run_id)  # nothing this drive journaled is left waiting
        except KeyboardInterrupt:
            state.stats.stopped_by = "interrupt"
            interrupted = True
            raise
        finally:
            state.executors.shutdown(wait=not interrupted)
    return state.stats


def _walk(ctx: DriveContext, state: RunState, rows: Sequence[StepRow] | None = None) -> None:
    if rows is None:
        rows = ctx.store.steps_of(state.run_id)
    state.step_rows = {r.step_id: r for r in rows}
    routers = _routers_by_target(state.plan)
    for step in state.plan.steps:
        if _settled(state, step, state.step_rows[step.id]):
            if step.score and state.step_rows[step.id].status == "completed":
                scoring.score_step(ctx, state, step, state.outputs[step.id])
            continue
        if state.should_stop(ctx):
            return
        skip_note = _route_skip(state, routers.get(step.id, ()), step)
        if skip_note is not None:
            spine.skip_step(ctx, state, step, skip_note)
            state.outputs[step.id] = None
            _sync_run_status(ctx, state, step)
            continue
        ctx.emit("step_started", run_id=state.run_id, step_id=step.id)
        outcome = _run_step(ctx, state, step)
        if outcome is not None and outcome.status == "completed" and step.score:
            # Scored before the run's status is synced: a run is completed with its scores.
            scoring.score_step(ctx, state, step, outcome.output)
        _sync_run_status(ctx, state, step)
        if outcome is None:
            return  # stopped mid-step: the step is owed to the next drive
        if not _finished(step, outcome):
            return
        state.outputs[step.id] = outcome.output if outcome.status == "completed" else None
        state.stats.steps_finished += 1
        max_steps = ctx.options.max_steps
        if max_steps and state.stats.steps_finished >= max_steps:
            if any(state.step_rows[s.id].status == "pending" for s in state.plan.steps):
                state.stats.stopped_by = "max_steps"
            return
    if state.plan.steps:
        # Every step is settled. A driver killed between the last step's write and the run's
        # status write left the run active with nothing owed: the walk above settled every
        # step without syncing, so the run's status is derived here (a no-op otherwise).
        _sync_run_status(ctx, state, state.plan.steps[-1])


def _finished(step: PlanStep, outcome: spine.StepOutcome) -> bool:
    """Whether the walk goes on past ``step`` after ``outcome``."""
    if outcome.status in ("completed", "skipped"):
        return True
    return outcome.status == "failed" and step.on_error == "continue" and not outcome.run_failed


def _settled(state: RunState, step: PlanStep, row: StepRow) -> bool:
    if row.status == "completed":
        state.outputs[step.id] = json.loads(row.output_json) if row.output_json else None
        return True
    if row.status == "skipped" or (
        row.status == "failed" and step.on_error == "continue" and not row.stops_run
    ):
        state.outputs[step.id] = None
        return True
    return False


def _routers_by_target(plan: Plan) -> dict[str, list[PlanStep]]:
    """Step id → the route steps that can select it, in plan order (built once per drive)."""
    out: dict[str, list[PlanStep]] = {}
    for router in plan.steps:
        if router.route is not None:
            for target in dict.fromkeys(router.route.cases.values()):
                out.setdefault(target, []).append(router)
    return out


def _route_skip(state: RunState, routers: Sequence[PlanStep], step: PlanStep) -> str | None:
    notes: list[str] = []
    for router in routers:
        row = state.step_rows[router.id]
        if row.status == "completed" and row.output_json:
            decision = json.loads(row.output_json)
            if decision.get("selected") == step.id:
                return None  # a completed router chose this step: protected
            notes.append(f'Skipped by route: step "{router.id}" selected "{decision.get("case")}"')
        elif row.status == "skipped":
            notes.append(f'Skipped by route: router step "{router.id}" was skipped')
        elif row.status == "failed":
            notes.append(f'Skipped by route: router step "{router.id}" failed')
    return notes[0] if notes else None


def _run_step(ctx: DriveContext, state: RunState, step: PlanStep) -> spine.StepOutcome | None:
    loop, feedback = 1, None
    per_item = step.gate is not None and step.gate.per_item and step.map is not None
    items = ItemLoops() if per_item else None
    while True:
        try:
            units = build_units(
                state.plan,
                step,
                params=state.params,
                outputs=state.outputs,
                loop=loop,
                feedback=feedback,
                redact=state.redactor.redact,
                item_feedback=items.feedback if items is not None else None,
                hasher=state.hasher,
            )
        except StepInputError as exc:
            work = spine.LoopWork(input_error=str(exc))
            return spine.complete_step(ctx, state, step, loop=loop, units=[], work=work)

        def inline(step: PlanStep, unit: UnitPlan, attempt: AttemptRow) -> UnitResult:
            return _run_inline(ctx, state, step, unit)

        judged = _has_verdict(ctx, state, step, loop, len(units) if per_item else None)
        work = dispatch.run_units(ctx, state, step, units, inline=inline, judged=judged)
        state.stats.dispatched += work.dispatched
        if work.stopped and not work.is_complete:
            return None
        outcome = spine.complete_step(
            ctx, state, step, loop=loop, units=units, work=work, items=items
        )
        state.stats.retryable_failure = outcome.retryable and outcome.run_failed
        if outcome.status != "loop":
            return outcome
        ctx.emit(
            "gate_rejected",
            run_id=state.run_id,
            step_id=step.id,
            loop=loop,
            feedback=outcome.feedback.feedback if outcome.feedback else "",
            missing=list(outcome.feedback.missing) if outcome.feedback else [],
        )
        # A per-item gate's items carry their own feedback (items.feedback); the step none.
        loop, feedback = loop + 1, None if per_item else outcome.feedback


def _sync_run_status(ctx: DriveContext, state: RunState, step: PlanStep) -> None:
    run = state.run
    if run.status == "active" and _still_active(state, step):
        return
    status, reason = spine.derive_run_status(state.plan, state.step_rows)
    if status == "active" and run.status == "active":
        return
    if (status, reason) == (run.status, run.status_reason):
        return
    result_json = None
    if status == "completed":
        result_json = canonical_json(spine.run_result(state.plan, state.step_rows))
    state.run = ctx.store.run_with_status(
        run, status, reason=reason, result_json=result_json, defer=spine.defers_writes(ctx)
    )
    ctx.emit("run_status", run_id=run.run_id, status=status, reason=reason)


def _still_active(state: RunState, step: PlanStep) -> bool:
    """Whether an active run stays active after ``step`` settled, without a scan of the plan.

    The walk settles steps in plan order and syncs the run after each, so an active run has
    no blocked or run-failing row before ``step``; ``step`` completed or was skipped (neither
    blocks nor fails the run) and the next step is still pending (so the run is not done).
    """
    if state.step_rows[step.id].status not in ("completed", "skipped"):
        return False
    position = state.positions[step.id] + 1
    steps = state.plan.steps
    return position < len(steps) and state.step_rows[steps[position].id].status == "pending"


def _has_verdict(
    ctx: DriveContext, state: RunState, step: PlanStep, loop: int, items: int | None = None
) -> bool:
    """Whether ``loop`` of ``step`` has a journaled verdict (on any of its ``items`` when the
    gate judges them one by one)."""
    if step.gate is None and step.output is None:
        return False
    unit_ids = [gate_unit_id(step.id, loop)]
    if items is not None:
        unit_ids += [gate_item_unit_id(step.id, loop, i) for i in range(items)]
    verdicts = ctx.store.attempts_of_units(state.run_id, unit_ids)
    return any(a.status == "succeeded" for a in verdicts)


def _run_inline(ctx: DriveContext, state: RunState, step: PlanStep, unit: UnitPlan) -> UnitResult:
    """Route decisions and child workflows run in the driver thread."""
    if unit.kind == "route":
        return _route_decision(step, unit)
    child = children.publish(ctx, state, step, unit)
    try:
        lock = ctx.store.run_lock(child.run_id).acquire()
    except RunLockHeld as exc:
        raise children.ChildLockHeld(state.run_id, step.id, exc) from None
    with lock:
        drive_run(ctx.child(state.redactor), ctx.store.get_run(child.run_id) or child)
    return children.child_result(ctx.store, ctx.store.get_run(child.run_id) or child)


def _route_decision(step: PlanStep, unit: UnitPlan) -> UnitResult:
    route = step.route
    if route is None:
        raise RunnerError(f"step {step.id} is not a route step")
    value = str((unit.kwargs or {}).get("value", ""))
    if value in route.cases:
        case = value
    elif "default" in route.cases:
        case = "default"
    else:
        raise RunnerError(
            f"route value {value!r} matches no case {sorted(route.cases)} and "
            "there is no default; add a case or a default"
        )
    return UnitResult(output={"value": value, "case": case, "selected": route.cases[case]})
