"""Gate judging for a drive: find a journaled verdict or ask the judge, and journal it."""

from __future__ import annotations

import json
from typing import Any

from ..errors import RunnerError
from ..gates.judge import (
    artifact_summary,
    expr_verdict,
    judge_prompt,
    parse_verdict,
    render_criteria,
)
from ..gates.verdict import (
    VERDICT_SCHEMA,
    GateWaiting,
    Judged,
    Verdict,
    VerdictError,
    Waiting,
    gate_item_unit_id,
    gate_unit_id,
)
from ..hashing import canonical_json, hash_value
from ..runners.identity import runner_identity
from ..sealing import InputHash
from ..spec.models import GateSpec
from ..spec.plan import PlanStep
from ..store.journal import Finish, UnitKey
from ..store.records import AttemptRow
from ..templates import TemplateError, references
from . import attempts, interrupts, outcomes
from .context import DriveContext, RunState
from .endpoints import judge_in_place
from .units import template_context


def gate_key(
    state: RunState,
    step_id: str,
    loop: int,
    *,
    runner: str,
    model: str | None,
    input_hash: str,
    judge_input: dict[str, Any] | None = None,
    item: int | None = None,
) -> UnitKey:
    """The journal key of a verdict unit ``<step>.gate:l<loop>`` (with the judge's input), or
    ``<step>.gate:l<loop>[<item>]`` for one item of a per-item gate."""
    kept = None if judge_input is None else canonical_json(state.redactor.redact_value(judge_input))
    return UnitKey(
        run_id=state.run_id,
        workflow=state.plan.name,
        step_id=step_id,
        unit_id=verdict_unit_id(step_id, loop, item),
        phase="gate",
        loop=loop,
        item_index=item,
        runner=runner,
        model=model,
        input_hash=input_hash,
        input_json=kept,
    )


def verdict_unit_id(step_id: str, loop: int, item: int | None) -> str:
    """``<step>.gate:l<loop>``, or ``<step>.gate:l<loop>[<item>]`` for one item's verdict."""
    return gate_unit_id(step_id, loop) if item is None else gate_item_unit_id(step_id, loop, item)


def obtain_verdict(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    *,
    loop: int,
    artifact: Any,
    unit_count: int,
    item: int | None = None,
) -> Judged | GateWaiting:
    """The verdict on this loop: the journaled one for this judge input, or a new judgement.

    ``item`` names the map item a per-item gate judges alone (``artifact`` is its output).
    A human gate with no recorded decision, and a judge that cannot answer, give
    ``GateWaiting`` (the step blocks; no loop is consumed).
    """
    gate = step.gate or GateSpec()
    summary = artifact_summary(artifact, unit_count=unit_count)
    runner, model = _judge_runner(state, step, gate)
    try:
        criteria = render_criteria(gate.criteria, template_context(state.params, state.outputs))
    except TemplateError as exc:
        # A judge that cannot read its criteria cannot judge (DESIGN §3.6): the step blocks.
        return _criteria_failed(
            ctx,
            state,
            step,
            loop=loop,
            summary=summary,
            runner=runner,
            model=model,
            exc=exc,
            item=item,
        )
    hashed: dict[str, Any] = {
        "judge": gate.judge,
        "criteria": criteria,
        "summary": summary,
        "check": gate.check,
        "model": model,
    }
    older: dict[str, Any] = {}
    if gate.judge == "expr" and gate.check:
        read = _params_read(state, gate.check)
        if read is not None:
            # The check reads params: two runs with other values must not share a verdict.
            hashed["params_read"] = read.hash
            older["params_read"] = read.legacy or read.hash
    settings = runner_identity(state.plan.runners, runner) if gate.judge == "llm" else {}
    hashed, hashes = _gate_hashes(state, hashed, settings, older=older)
    input_hash = hashes[0]
    judge_input = dict(hashed)  # what is kept: the hashed input, plus what an LLM judge reads
    label = step.id if item is None else f"{step.id}[{item}]"
    if gate.judge == "llm":
        judge_input["prompt"] = judge_prompt(label, criteria, summary)
    unit_id = verdict_unit_id(step.id, loop, item)
    recorded = _find_in_run(ctx, state.run_id, hashes, unit_id)
    if recorded is None:
        recorded = _reuse_verdict(
            ctx, state, step, loop, runner, model, hashes, judge_input, item=item
        )
    if recorded is not None and recorded.output_json:
        verdict = Verdict.from_json(json.loads(recorded.output_json))
        return Judged(verdict=verdict, input_hash=input_hash, summary=summary)
    if gate.judge == "human":
        return GateWaiting(
            reason=f"waiting for a human verdict on loop {loop}",
            waiting=Waiting(loop=loop, input_hash=input_hash, summary=summary, judge="human"),
        )
    key = gate_key(
        state,
        step.id,
        loop,
        runner=runner,
        model=model,
        input_hash=input_hash,
        judge_input=judge_input,
        item=item,
    )
    try:
        if gate.judge == "expr":
            verdict = _judge_expr(ctx, state, gate, key, criteria, artifact)
        else:
            verdict = _judge_llm(ctx, state, step, key, criteria, summary, label=label)
    except (VerdictError, RunnerError) as exc:
        return GateWaiting(
            reason=f"judge failed on loop {loop}: {state.redactor.redact(str(exc))}; no loop "
            "was consumed. Fix the judge and resume to re-judge this work.",
            waiting=Waiting(loop=loop, input_hash=input_hash, summary=summary, judge="failed"),
        )
    _announce(ctx, state, step.id, loop, verdict, item=item)
    return Judged(verdict=verdict, input_hash=input_hash, summary=summary)


def _params_read(state: RunState, check: str) -> InputHash | None:
    """The hash of the params an ``expr`` check reads (None when it reads none).

    A hash rather than the values, so a secret param the check compares against is not kept
    in the journaled judge input; keyed when they hold a secret, so it is no oracle either.
    """
    try:
        refs = references(check, expression=True)
    except TemplateError:
        return None  # the check fails when judged; that failure is journaled there
    if "params" not in refs.names:
        return None
    params = state.params
    names = sorted(params) if refs.params_dynamic else sorted(refs.params & set(params))
    return state.hasher.hash_value({name: params[name] for name in names})


def _gate_hashes(
    state: RunState,
    hashed: dict[str, Any],
    settings: dict[str, Any],
    *,
    older: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A judge's input with the runner ``settings`` it is judged under, and its hashes.

    The hashes are its input hash (``sealing.InputHasher``: keyed when the input holds a
    secret), then the plain hash an older wf_magic journaled for it when that differs: its
    verdicts are still found. ``older`` holds the fields that wf_magic hashed otherwise.
    """
    content = state.hasher.hash_value(hashed)
    before = {**hashed, **(older or {})}
    if settings:
        # The judge runner's answer-changing settings (a scripted rule, a judge's model)
        # are part of the verdict's identity; ``content_hash`` lets ``replay`` find it.
        hashed = {**hashed, "runner": settings, "content_hash": content.hash}
        before = {**before, "runner": settings, "content_hash": hash_value(before)}
        content = state.hasher.hash_value(hashed)
    legacy = hash_value(before)
    return hashed, (content.hash,) if legacy == content.hash else (content.hash, legacy)


def _find_in_run(
    ctx: DriveContext, run_id: str, hashes: tuple[str, ...], unit_id: str
) -> AttemptRow | None:
    """The newest succeeded/reused attempt of ``unit_id`` in ``run_id`` under one of
    ``hashes`` (its input hash first)."""
    for input_hash in hashes:
        found = ctx.store.find_in_run(run_id=run_id, input_hash=input_hash, unit_id=unit_id)
        if found is not None:
            return found
    return None


def _criteria_failed(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    *,
    loop: int,
    summary: str,
    runner: str,
    model: str | None,
    exc: TemplateError,
    item: int | None = None,
) -> Judged | GateWaiting:
    """The gate's criteria failed to render for this run's values: no judge is asked.

    The failure is journaled as a failed attempt of the gate unit and the step blocks without
    consuming a loop; a person may still decide the loop (``wf approve``), and that decision
    is found here on the next drive.
    """
    gate = step.gate or GateSpec()
    failure = RunnerError(f"criteria failed to render: {exc}")
    hashed = {
        "judge": gate.judge,
        "criteria": list(gate.criteria),
        "criteria_error": str(exc),
        "summary": summary,
        "check": gate.check,
        "model": model,
    }
    hashes = state.hasher.hash_value(hashed).hashes
    input_hash = hashes[0]
    unit_id = verdict_unit_id(step.id, loop, item)
    recorded = _find_in_run(ctx, state.run_id, hashes, unit_id)
    if recorded is not None and recorded.output_json:
        verdict = Verdict.from_json(json.loads(recorded.output_json))
        return Judged(verdict=verdict, input_hash=input_hash, summary=summary)
    key = gate_key(
        state,
        step.id,
        loop,
        runner=runner,
        model=model,
        input_hash=input_hash,
        judge_input=hashed,
        item=item,
    )
    attempt = ctx.store.reserve_attempt(key, charged=False)
    shown = attempts.finish_error(ctx, state, attempt, failure)
    return GateWaiting(
        reason=f"judge failed on loop {loop}: {shown}; no loop was consumed. The criteria are "
        "frozen in the plan: fix them and start afresh (`--new`), or decide the step by hand "
        "(`wf approve` / `wf reject`).",
        waiting=Waiting(loop=loop, input_hash=input_hash, summary=summary, judge="failed"),
    )


def _reuse_verdict(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    loop: int,
    runner: str,
    model: str | None,
    hashes: tuple[str, ...],
    judge_input: dict[str, Any],
    *,
    item: int | None = None,
) -> AttemptRow | None:
    """A verdict this run may take instead of judging again, journaled as ``reused``.

    A fork takes every verdict of its prefix from its source run (a person's too: it is the
    same history). Otherwise llm/expr verdicts on the same judge input are reused across runs
    like work units (cache permitting); a person's decision never is.
    """
    unit_id = verdict_unit_id(step.id, loop, item)
    run = state.run
    source: AttemptRow | None = None
    if run.forked_from and run.fork_step and not state.reexecutes(step):
        source = _find_in_run(ctx, run.forked_from, hashes, unit_id)
    elif run.use_cache and step.cache and runner != "human" and not run.fork_step:
        for input_hash in hashes:
            source = ctx.store.find_reusable(
                workflow=state.plan.name,
                unit_id=unit_id,
                input_hash=input_hash,
                runner=runner,
                exclude_run_id=run.run_id,
                phase="gate",
            )
            if source is not None:
                break
    if source is None:
        return None
    key = gate_key(
        state,
        step.id,
        loop,
        runner=source.runner,
        model=model,
        input_hash=hashes[0],
        judge_input=judge_input,
        item=item,
    )
    return attempts.record_reuse(ctx, state, key, source, notify=False)


def _judge_runner(state: RunState, step: PlanStep, gate: GateSpec) -> tuple[str, str | None]:
    """The runner and model of the step's judge (the rule of ``spec/models_resolve.judge_runner``).

    A prompt step's judge falls back to the step's model, as it runs on the step's runner by
    default. Any other kind's judge runs on the workflow's runner, so the step's model (an
    agent's ``claude-sonnet-4-5``, an exec step's nothing) is no model for it: its model is
    ``gate.model``, else unset so the judge runner's own ``model`` option applies.
    """
    if gate.judge in ("expr", "human"):
        return gate.judge, None
    if step.kind == "prompt":
        return gate.runner or step.runner, gate.model or step.model
    return gate.runner or state.plan.runner, gate.model


def _judge_expr(
    ctx: DriveContext,
    state: RunState,
    gate: GateSpec,
    key: UnitKey,
    criteria: list[str],
    artifact: Any,
) -> Verdict:
    try:
        verdict = expr_verdict(
            gate.check or "", output=artifact, params=state.params, criteria=criteria
        )
    except Exception as exc:
        failure = _judge_failure(exc)
        attempt = ctx.store.reserve_attempt(key, charged=False)
        attempts.finish_error(ctx, state, attempt, failure)
        if failure is exc:
            raise
        raise failure from exc
    return _record(ctx, state, key, verdict)


def judge_is_charged(state: RunState, gate: GateSpec) -> bool:
    """Whether this gate's judge calls count against the budget (``gate.charged`` wins)."""
    if gate.judge != "llm":
        return False
    return state.plan.budget.charge_judges if gate.charged is None else gate.charged


def _judge_llm(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    key: UnitKey,
    criteria: list[str],
    summary: str,
    *,
    label: str,
) -> Verdict:
    charged = judge_is_charged(state, step.gate or GateSpec())
    attempt = _reclaim_or_reserve(ctx, state, key, charged=charged)
    seen = interrupts.delivered()
    try:
        # Redacted before parsing: an unparsable reply is quoted, clipped, in the failure.
        result = judge_in_place(
            ctx,
            state,
            step,
            key,
            attempt,
            kind="judge",
            prompt=judge_prompt(label, criteria, summary),
            output_schema=VERDICT_SCHEMA,
        )
        verdict, kept = as_journaled(
            ctx, state, parse_verdict(state.redactor.redact_value(result.output))
        )
    except BaseException as exc:
        # Whatever the judge raised, its attempt ends failed and the step blocks: a judge
        # bug (its own SystemExit too) never leaves the attempt running or kills the drive.
        if interrupts.is_real_interrupt(exc, seen):
            raise
        failure = outcomes.unit_failure(
            _judge_failure(exc) if isinstance(exc, Exception) else exc,
            redact=state.redactor.redact,
        )
        attempts.finish_error(ctx, state, attempt, failure)
        if failure is exc:
            raise
        raise failure from exc
    cost, price_source = attempts.priced(state, key.runner, result)
    attempts.finish_with(
        ctx,
        state,
        attempt,
        Finish(
            status="succeeded",
            output_json=kept,
            tokens_in=result.tokens_in,
            tokens_out=result.tokens_out,
            cost=cost,
            model=result.model,
            price_source=price_source,
        ),
    )
    return verdict


def _judge_failure(exc: Exception) -> RunnerError:
    """The failure journaled for a judge that raised ``exc`` (worded like a work unit's)."""
    if isinstance(exc, RunnerError):
        return exc
    if isinstance(exc, VerdictError):
        return RunnerError(str(exc))
    return RunnerError(f"runner raised {type(exc).__name__}: {exc}")


def _reclaim_or_reserve(
    ctx: DriveContext, state: RunState, key: UnitKey, *, charged: bool = False
) -> AttemptRow:
    """The judge attempt a dead driver left running for this input, else a new one.

    A charged judge is checked against the budget and counted like a work unit first; a
    reclaimed attempt was counted when it was reserved.
    """
    latest = ctx.store.attempts_of_units(state.run_id, [key.unit_id])
    if latest and latest[-1].status == "running" and latest[-1].input_hash == key.input_hash:
        return latest[-1]
    if charged:
        ctx.budget.check(run_id=state.run_id, step_id=key.step_id, unit_id=key.unit_id)
        ctx.budget.charge_unit()
    return ctx.store.reserve_attempt(key, charged=charged, payer=ctx.options.payer)


def as_journaled(ctx: DriveContext, state: RunState, verdict: Verdict) -> tuple[Verdict, str]:
    """``verdict`` as the journal keeps it (redacted), and that JSON.

    The drive goes on with this one, not the judge's own: its feedback enters the next loop's
    prompts and input hashes, which a resume rebuilds from the journaled verdict.
    """
    kept = ctx.store.scrubber.json_text(state.run_id, json.dumps(verdict.to_json())) or "{}"
    return Verdict.from_json(json.loads(kept)), kept


def _record(ctx: DriveContext, state: RunState, key: UnitKey, verdict: Verdict) -> Verdict:
    """Journal a verdict reached without a runner (expr, schema); returns it as journaled."""
    verdict, kept = as_journaled(ctx, state, verdict)
    ctx.store.record_terminal_attempt(key, Finish(status="succeeded", output_json=kept))
    ctx.emit(
        "unit_finished",
        run_id=state.run_id,
        step_id=key.step_id,
        unit_id=key.unit_id,
        status="succeeded",
        phase="gate",
        loop=key.loop,
        tokens=0,
    )
    return verdict


def record_schema_verdict(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    *,
    loop: int,
    artifact: Any,
    verdict: Verdict,
    item: int | None = None,
) -> Verdict:
    """Journal a schema rejection as the loop's verdict (once per loop and artifact), or as
    one item's verdict of a per-item gate; returns it as journaled."""
    count = len(artifact) if isinstance(artifact, list) and step.map and item is None else 1
    summary = artifact_summary(artifact, unit_count=count)
    hashed = {"judge": "schema", "summary": summary, "schema": step.output}
    hashes = state.hasher.hash_value(hashed).hashes
    input_hash = hashes[0]
    unit_id = verdict_unit_id(step.id, loop, item)
    existing = _find_in_run(ctx, state.run_id, hashes, unit_id)
    if existing is None:
        key = gate_key(
            state,
            step.id,
            loop,
            runner="schema",
            model=None,
            input_hash=input_hash,
            judge_input=hashed,
            item=item,
        )
        verdict = _record(ctx, state, key, verdict)
    else:
        verdict, _ = as_journaled(ctx, state, verdict)
    _announce(ctx, state, step.id, loop, verdict, item=item)
    return verdict


def step_decision(
    ctx: DriveContext, state: RunState, step: PlanStep, *, loop: int, input_hash: str
) -> Verdict | None:
    """A person's decision on the whole step at ``loop`` (``<step>.gate:l<loop>``) for the
    artifact ``input_hash`` names: how an exhausted or failed per-item gate is approved."""
    unit_id = gate_unit_id(step.id, loop)
    recorded = ctx.store.find_in_run(run_id=state.run_id, input_hash=input_hash, unit_id=unit_id)
    if recorded is None or not recorded.output_json:
        return None
    return Verdict.from_json(json.loads(recorded.output_json))


def _announce(
    ctx: DriveContext,
    state: RunState,
    step_id: str,
    loop: int,
    verdict: Verdict,
    *,
    item: int | None = None,
) -> None:
    """Tell observers the verdict on ``step_id`` (or one of its items) at ``loop``."""
    ctx.emit(
        "gate_verdict",
        run_id=state.run_id,
        step_id=step_id,
        unit_id=verdict_unit_id(step_id, loop, item),
        loop=loop,
        complete=verdict.complete,
        feedback=verdict.feedback,
        missing=list(verdict.missing),
    )
