"""Gate judging for a drive: find a journaled verdict or ask the judge, and journal it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from . import spine
from .errors import RunnerError
from .gates import (
    VERDICT_SCHEMA,
    Verdict,
    VerdictError,
    artifact_summary,
    expr_verdict,
    judge_prompt,
    parse_verdict,
    render_criteria,
)
from .hashing import hash_value
from .runners.base import UnitRequest
from .spec.models import GateSpec
from .spec.plan import PlanStep
from .spec.templates import TemplateError
from .store import journal as jsql
from .store.records import AttemptRow
from .units import template_context

if TYPE_CHECKING:
    from .drive import Driver


def gate_unit_id(step_id: str, loop: int) -> str:
    """The unit id of a step's verdict at ``loop``: ``<step>.gate:l<loop>``."""
    return f"{step_id}.gate:l{loop}"


def gate_key(
    driver: Driver, step_id: str, loop: int, *, runner: str, model: str | None, input_hash: str
) -> jsql.UnitKey:
    """The journal key of a verdict unit ``<step>.gate:l<loop>``."""
    return jsql.UnitKey(
        run_id=driver.run.run_id,
        workflow=driver.plan.name,
        step_id=step_id,
        unit_id=gate_unit_id(step_id, loop),
        phase="gate",
        loop=loop,
        item_index=None,
        runner=runner,
        model=model,
        input_hash=input_hash,
    )


def obtain_verdict(
    driver: Driver, step: PlanStep, *, loop: int, artifact: Any, unit_count: int
) -> spine.Judged | spine.GateWaiting:
    """The verdict on this loop: the journaled one for this judge input, or a new judgement.

    A human gate with no recorded decision, and a judge that cannot answer, give
    ``GateWaiting`` (the step blocks; no loop is consumed).
    """
    gate = step.gate or GateSpec()
    summary = artifact_summary(artifact, unit_count=unit_count)
    try:
        criteria = render_criteria(gate.criteria, template_context(driver.params, driver.outputs))
    except TemplateError as exc:
        criteria = [f"(criteria failed to render: {exc})"]
    runner, model = _judge_runner(driver, step, gate)
    input_hash = hash_value(
        {
            "judge": gate.judge,
            "criteria": criteria,
            "summary": summary,
            "check": gate.check,
            "model": model,
        }
    )
    unit_id = gate_unit_id(step.id, loop)
    recorded = driver.engine.read(
        lambda c: jsql.find_in_run(
            c, run_id=driver.run.run_id, input_hash=input_hash, unit_id=unit_id
        )
    )
    if recorded is None:
        recorded = _reuse_verdict(driver, step, loop, runner, model, input_hash)
    if recorded is not None and recorded.output_json:
        verdict = Verdict.from_json(json.loads(recorded.output_json))
        return spine.Judged(verdict=verdict, input_hash=input_hash, summary=summary)
    if gate.judge == "human":
        return spine.GateWaiting(
            reason=f"waiting for a human verdict on loop {loop}",
            loop=loop,
            input_hash=input_hash,
            summary=summary,
            judge="human",
        )
    key = gate_key(driver, step.id, loop, runner=runner, model=model, input_hash=input_hash)
    try:
        if gate.judge == "expr":
            verdict = _judge_expr(driver, gate, key, criteria, artifact)
        else:
            verdict = _judge_llm(driver, step, key, criteria, summary)
    except (VerdictError, RunnerError) as exc:
        return spine.GateWaiting(
            reason=f"judge failed on loop {loop}: {driver.redactor.redact(str(exc))}; no loop "
            "was consumed. Fix the judge and resume to re-judge this work.",
            loop=loop,
            input_hash=input_hash,
            summary=summary,
            judge="failed",
        )
    driver.emit(
        "gate_verdict",
        step_id=step.id,
        unit_id=unit_id,
        loop=loop,
        complete=verdict.complete,
        feedback=verdict.feedback,
        missing=list(verdict.missing),
    )
    return spine.Judged(verdict=verdict, input_hash=input_hash, summary=summary)


def _reuse_verdict(
    driver: Driver, step: PlanStep, loop: int, runner: str, model: str | None, input_hash: str
) -> AttemptRow | None:
    """A verdict this run may take instead of judging again, journaled as ``reused``.

    A fork takes every verdict of its prefix from its source run (a person's too: it is the
    same history). Otherwise llm/expr verdicts on the same judge input are reused across runs
    like work units (cache permitting); a person's decision never is.
    """
    unit_id = gate_unit_id(step.id, loop)
    run = driver.run
    source: AttemptRow | None = None
    if run.forked_from and run.fork_step and not driver.reexecutes(step):
        forked_from = run.forked_from
        source = driver.engine.read(
            lambda c: jsql.find_in_run(
                c, run_id=forked_from, input_hash=input_hash, unit_id=unit_id
            )
        )
    elif run.use_cache and step.cache and runner != "human" and not run.fork_step:
        source = driver.engine.read(
            lambda c: jsql.find_reusable(
                c,
                workflow=driver.plan.name,
                unit_id=unit_id,
                input_hash=input_hash,
                runner=runner,
                exclude_run_id=run.run_id,
                phase="gate",
            )
        )
    if source is None:
        return None
    driver.stats.reused += 1
    driver.stats.saved_tokens += source.tokens_in + source.tokens_out + source.saved_tokens
    key = gate_key(driver, step.id, loop, runner=source.runner, model=model, input_hash=input_hash)
    finish = jsql.Finish(status="reused", output_json=source.output_json, model=source.model)
    saved = source.tokens_in + source.tokens_out + source.saved_tokens
    row: AttemptRow = driver.store_write(
        lambda c: jsql.record_terminal_attempt_txn(
            c,
            key,
            finish,
            reused_from=source.reused_from or source.dispatch_id,
            saved_tokens=saved,
            event="unit_reused",
        )
    )
    return row


def _judge_runner(driver: Driver, step: PlanStep, gate: GateSpec) -> tuple[str, str | None]:
    if gate.judge in ("expr", "human"):
        return gate.judge, None
    default = step.runner if step.kind == "prompt" else driver.plan.runner
    return gate.runner or default, gate.model or step.model


def _judge_expr(
    driver: Driver, gate: GateSpec, key: jsql.UnitKey, criteria: list[str], artifact: Any
) -> Verdict:
    try:
        verdict = expr_verdict(
            gate.check or "", output=artifact, params=driver.params, criteria=criteria
        )
    except VerdictError as exc:
        attempt = driver.store_write(lambda c: jsql.reserve_attempt_txn(c, key, charged=False))
        driver.finish_error(attempt, RunnerError(str(exc)))
        raise
    _record(driver, key, verdict)
    return verdict


def _judge_llm(
    driver: Driver, step: PlanStep, key: jsql.UnitKey, criteria: list[str], summary: str
) -> Verdict:
    attempt = _reclaim_or_reserve(driver, key)
    request = UnitRequest(
        run_id=driver.run.run_id,
        step_id=step.id,
        unit_id=key.unit_id,
        dispatch_id=attempt.dispatch_id,
        input_hash=key.input_hash,
        attempt=attempt.attempt,
        kind="judge",
        prompt=judge_prompt(step.id, criteria, summary),
        model=key.model,
        output_schema=VERDICT_SCHEMA,
        timeout_s=step.timeout_s,
    )
    try:
        result = driver.runner(key.runner).run(request)
        verdict = parse_verdict(result.output)
    except RunnerError as exc:
        driver.finish_error(attempt, exc)
        raise
    except VerdictError as exc:
        driver.finish_error(attempt, RunnerError(str(exc)))
        raise
    driver.finish_with(
        attempt,
        jsql.Finish(
            status="succeeded",
            output_json=json.dumps(verdict.to_json()),
            tokens_in=result.tokens_in,
            tokens_out=result.tokens_out,
            cost=result.cost,
            model=result.model,
        ),
    )
    return verdict


def _reclaim_or_reserve(driver: Driver, key: jsql.UnitKey) -> AttemptRow:
    """The judge attempt a dead driver left running for this input, else a new one."""
    latest = driver.attempts_by_unit(key.step_id).get(key.unit_id, [])
    if latest and latest[-1].status == "running" and latest[-1].input_hash == key.input_hash:
        return latest[-1]
    attempt: AttemptRow = driver.store_write(
        lambda c: jsql.reserve_attempt_txn(c, key, charged=False)
    )
    return attempt


def _record(driver: Driver, key: jsql.UnitKey, verdict: Verdict) -> None:
    finish = jsql.Finish(status="succeeded", output_json=json.dumps(verdict.to_json()))
    driver.store_write(lambda c: jsql.record_terminal_attempt_txn(c, key, finish))
    driver.emit(
        "unit_finished",
        step_id=key.step_id,
        unit_id=key.unit_id,
        status="succeeded",
        phase="gate",
        loop=key.loop,
        tokens=0,
    )


def record_schema_verdict(
    driver: Driver, step: PlanStep, *, loop: int, artifact: Any, verdict: Verdict
) -> None:
    """Journal a schema rejection as the loop's verdict (once per loop and artifact)."""
    count = len(artifact) if isinstance(artifact, list) and step.map else 1
    summary = artifact_summary(artifact, unit_count=count)
    input_hash = hash_value({"judge": "schema", "summary": summary, "schema": step.output})
    unit_id = gate_unit_id(step.id, loop)
    existing = driver.engine.read(
        lambda c: jsql.find_in_run(
            c, run_id=driver.run.run_id, input_hash=input_hash, unit_id=unit_id
        )
    )
    if existing is None:
        _record(
            driver,
            gate_key(driver, step.id, loop, runner="schema", model=None, input_hash=input_hash),
            verdict,
        )
    driver.emit(
        "gate_verdict",
        step_id=step.id,
        unit_id=unit_id,
        loop=loop,
        complete=False,
        feedback=verdict.feedback,
        missing=list(verdict.missing),
    )
