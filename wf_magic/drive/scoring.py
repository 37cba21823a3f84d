"""Scores of a drive: a completed step's scores as journaled units ``<step>.score:<name>``
(``[i]`` per map item), found in the run, reused from another run, or measured now.

A score records, it never gates: it runs once its step completed (after the step's gate
accepted), and a failed score unit is journaled as failed without failing the step or the
run; the next drive of the run measures it again.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import BudgetExceeded, RunnerError
from ..gates.scorers import (
    ScoreError,
    ScoreValue,
    parse_rubric_reply,
    python_score,
    rubric_prompt,
    rubric_schema,
    score_contains,
    score_equals,
    score_json_schema,
    score_regex,
)
from ..hashing import canonical_json
from ..runners import functions
from ..runners.function import FunctionRunner, call_with_timeout, own_traceback
from ..runners.identity import runner_identity
from ..spec.plan import Plan, PlanScore, PlanStep
from ..store.journal import Finish, UnitKey
from ..store.records import AttemptRow
from ..templates import TemplateError, render_text
from . import attempts, interrupts, outcomes
from .context import DriveContext, RunState
from .endpoints import judge_in_place
from .units import StepInputError, expand_items, template_context

_DONE = ("succeeded", "reused")
_TEXT_FIELDS = ("equals", "contains", "regex", "rubric")


def score_unit_id(step_id: str, name: str, item: int | None = None) -> str:
    """``<step>.score:<name>``, or ``<step>.score:<name>[<item>]`` for one map item's score."""
    base = f"{step_id}.score:{name}"
    return base if item is None else f"{base}[{item}]"


def has_scores(plan: Plan) -> bool:
    """Whether any step of ``plan`` carries a score (a completed run's owed scores are
    measured when it is driven again)."""
    return any(step.score for step in plan.steps)


def score_step(ctx: DriveContext, state: RunState, step: PlanStep, output: Any) -> None:
    """Measure each score of the completed ``step`` that the run does not hold yet.

    ``output`` is the step's output; a map step's items are scored one by one, each from its
    newest work attempt when that succeeded (or was reused): a per-item gate's accepted
    items keep the output of the loop that last executed them.
    """
    if not step.score:
        return
    targets = _targets(ctx, state, step, output)
    for score in step.score:
        unit_ids = [score_unit_id(step.id, score.name, item) for item, _, _ in targets]
        done = {
            (a.unit_id, a.input_hash)
            for a in ctx.store.attempts_of_units(state.run_id, unit_ids)
            if a.status in _DONE
        }
        for target in targets:
            try:
                _score_one(ctx, state, step, score, target, done=done)
            except BudgetExceeded as exc:
                # A charged judge would pass a ceiling: the score stays owed (journaled as a
                # warning, so `wf events` says why it has no value), the step is done.
                message = f"score not measured: {exc}"
                ctx.store.record_event(
                    state.run_id, "warning", step_id=step.id, data={"message": message}
                )
                ctx.emit("warning", run_id=state.run_id, step_id=step.id, message=message)
                return


def _targets(
    ctx: DriveContext, state: RunState, step: PlanStep, output: Any
) -> list[tuple[int | None, Any, Any]]:
    """(item index, map item, output) of each output ``step``'s scores measure."""
    if step.map is None:
        return [(None, None, output)]
    try:
        items = expand_items(step, state.params, state.outputs) or []
    except StepInputError:
        items = []
    newest: dict[int, AttemptRow] = {}
    for a in ctx.store.attempts_of(state.run_id, step.id):
        if a.phase == "work" and a.item_index is not None:
            newest[a.item_index] = a  # journal order: a later attempt wins
    out: list[tuple[int | None, Any, Any]] = []
    for index in sorted(newest):
        if newest[index].status not in _DONE:
            continue  # the item failed in the end (a tolerant map): nothing to score
        text = newest[index].output_json
        item = items[index] if index < len(items) else None
        out.append((index, item, json.loads(text) if text else None))
    return out


def _score_one(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    score: PlanScore,
    target: tuple[int | None, Any, Any],
    *,
    done: set[tuple[str, str]],
) -> None:
    """Measure one score unit unless the run holds it for this input (or another run does)."""
    item, item_value, output = target
    unit_id = score_unit_id(step.id, score.name, item)
    hashed, error = _score_input(state, step, score, target)
    hashed_input = state.hasher.hash_value(hashed)
    if any((unit_id, h) in done for h in hashed_input.hashes):
        return
    kept = json.loads(hashed_input.kept_json)
    label = step.id if item is None else f"{step.id}[{item}]"
    if score.judge is not None and error is None:
        kept["prompt"] = rubric_prompt(label, kept["rubric"], _scale(score), kept["output"])
    runner, model = _runner_of(step, score)
    key = UnitKey(
        run_id=state.run_id,
        workflow=state.plan.name,
        step_id=step.id,
        unit_id=unit_id,
        phase="score",
        loop=_loop(state, step),
        item_index=item,
        runner=runner,
        model=model,
        input_hash=hashed_input.hash,
        input_json=canonical_json(kept),
    )
    if error is not None:
        _fail(ctx, state, _open(ctx, state, key), RunnerError(error))
    elif _reuse(ctx, state, step, key):
        return
    elif score.judge is not None:
        _judge(ctx, state, step, score, key, label=label, rendered=hashed)
    elif score.python is not None:
        _python(ctx, state, step, score, key, output=output, item=item, item_value=item_value)
    else:
        _measure(ctx, state, score, key, hashed)


def _score_input(
    state: RunState, step: PlanStep, score: PlanScore, target: tuple[int | None, Any, Any]
) -> tuple[dict[str, Any], str | None]:
    """What a score unit's value depends on (its input, hashed), and the error of a template
    that failed to render (then the input holds the templates and that error)."""
    item, item_value, output = target
    hashed: dict[str, Any] = {"scorer": score.kind, "output": output}
    context = template_context(state.params, state.outputs, item=item_value, index=item)
    try:
        hashed.update(_rendered(score, context))
    except TemplateError as exc:
        error = f"{_template_field(score)} failed to render: {exc}"
        hashed.update({k: getattr(score, k) for k in _TEXT_FIELDS if getattr(score, k)})
        return {**hashed, "error": error}, error
    if score.judge is not None:
        hashed["model"] = _runner_of(step, score)[1]
        settings = runner_identity(state.plan.runners, _runner_of(step, score)[0])
        if settings:
            hashed["runner"] = settings  # a judge's answer-changing settings
    if score.python is not None:
        # The function is handed params and the map item too: another run's value is its
        # own only when they are the same (a hash: a secret param is not kept in the input).
        hashed["params_hash"] = state.hasher.hash_value(state.params).hash
        hashed.update(item=item_value, index=item)
    return hashed, None


def _rendered(score: PlanScore, context: dict[str, Any]) -> dict[str, Any]:
    """The score's fields as its input holds them: its templates rendered (TemplateError)."""
    out: dict[str, Any] = {}
    for key in _TEXT_FIELDS:
        value = getattr(score, key)
        if value is not None:
            out[key] = render_text(value, context) if isinstance(value, str) else value
    if score.ignore_case:
        out["ignore_case"] = True
    if score.json_schema is not None:
        out["json_schema"] = score.json_schema
    if score.judge is not None:
        out["scale"] = list(_scale(score))
    if score.python is not None:
        out.update(python=score.python, target_hash=score.target_hash)
    return out


def _template_field(score: PlanScore) -> str:
    return next((k for k in _TEXT_FIELDS if isinstance(getattr(score, k), str)), score.kind)


def _scale(score: PlanScore) -> tuple[float, float]:
    return score.scale or (0.0, 1.0)


def _runner_of(step: PlanStep, score: PlanScore) -> tuple[str, str | None]:
    """The runner column and model of a score unit: an llm judge's by the gate rule (a prompt
    step's judge falls back to the step's model), else the scorer's name."""
    if score.judge is None:
        return score.kind, None
    runner = score.runner or step.runner
    if step.kind == "prompt":
        return runner, score.model or step.model
    return runner, score.model


def _loop(state: RunState, step: PlanStep) -> int:
    row = state.step_rows.get(step.id)
    return row.loop if row is not None else 1


def _reuse(ctx: DriveContext, state: RunState, step: PlanStep, key: UnitKey) -> bool:
    """Take the score this run may have instead of measuring it, journaled as ``reused``: a
    fork's from its source run (before the fork step: the same history), else another run's
    with this input (cache permitting)."""
    run = state.run
    if run.forked_from and run.fork_step and not state.reexecutes(step):
        source = ctx.store.find_in_run(
            run_id=run.forked_from, input_hash=key.input_hash, unit_id=key.unit_id
        )
    elif run.use_cache:
        source = ctx.store.find_reusable(
            workflow=state.plan.name,
            unit_id=key.unit_id,
            input_hash=key.input_hash,
            runner=key.runner,
            exclude_run_id=state.run_id,
            phase="score",
        )
    else:
        source = None
    if source is None:
        return False
    attempts.record_reuse(ctx, state, key, source)
    return True


def _open(ctx: DriveContext, state: RunState, key: UnitKey, *, charged: bool = False) -> AttemptRow:
    """The attempt a dead driver left running for this input, else a new one (a charged
    judge checked against the budget and counted first)."""
    latest = ctx.store.attempts_of_units(state.run_id, [key.unit_id])
    if latest and latest[-1].status == "running" and latest[-1].input_hash == key.input_hash:
        return latest[-1]
    if charged:
        ctx.budget.check(run_id=state.run_id, step_id=key.step_id, unit_id=key.unit_id)
        ctx.budget.charge_unit()
    return ctx.store.reserve_attempt(key, charged=charged, payer=ctx.options.payer)


def _fail(ctx: DriveContext, state: RunState, attempt: AttemptRow, exc: RunnerError) -> None:
    shown = attempts.finish_error(ctx, state, attempt, exc)
    ctx.emit(
        "warning",
        run_id=state.run_id,
        step_id=attempt.step_id,
        message=f"score {attempt.unit_id} failed: {shown}; it is measured again on resume",
    )


def _kept(ctx: DriveContext, state: RunState, value: ScoreValue) -> str:
    """The score's output as journaled (redacted)."""
    return ctx.store.scrubber.json_text(state.run_id, json.dumps(value.to_json())) or "{}"


def _measure(
    ctx: DriveContext, state: RunState, score: PlanScore, key: UnitKey, rendered: dict[str, Any]
) -> None:
    """A built-in scorer without a runner (equals, contains, regex, json_schema)."""
    output = rendered["output"]
    try:
        if score.equals is not None:
            value = score_equals(output, rendered["equals"], ignore_case=score.ignore_case)
        elif score.contains is not None:
            value = score_contains(output, rendered["contains"], ignore_case=score.ignore_case)
        elif score.regex is not None:
            value = score_regex(output, rendered["regex"])
        else:
            value = score_json_schema(output, score.json_schema or {})
    except ScoreError as exc:
        _fail(ctx, state, _open(ctx, state, key), RunnerError(str(exc)))
        return
    ctx.store.record_terminal_attempt(
        key, Finish(status="succeeded", output_json=_kept(ctx, state, value))
    )
    ctx.emit(
        "unit_finished",
        run_id=state.run_id,
        step_id=key.step_id,
        unit_id=key.unit_id,
        status="succeeded",
        phase="score",
        loop=key.loop,
        tokens=0,
    )


def _is_charged(state: RunState, score: PlanScore) -> bool:
    return state.plan.budget.charge_judges if score.charged is None else score.charged


def _judge(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    score: PlanScore,
    key: UnitKey,
    *,
    label: str,
    rendered: dict[str, Any],
) -> None:
    """An ``llm`` scorer: the judge rates the output on the rubric; its reply read strictly."""
    attempt = _open(ctx, state, key, charged=_is_charged(state, score))
    scale = _scale(score)
    seen = interrupts.delivered()
    try:
        result = judge_in_place(
            ctx,
            state,
            step,
            key,
            attempt,
            kind="prompt",
            prompt=rubric_prompt(label, rendered["rubric"], scale, rendered["output"]),
            output_schema=rubric_schema(scale),
        )
    except BaseException as exc:
        # Whatever the judge did, its attempt ends failed and the run goes on.
        if interrupts.is_real_interrupt(exc, seen):
            raise
        _fail(ctx, state, attempt, _failure(state, exc))
        return
    cost, price_source = attempts.priced(state, key.runner, result)
    try:
        value = parse_rubric_reply(state.redactor.redact_value(result.output), scale)
    except ScoreError as exc:
        # The call was answered: the failed unit keeps what the answer cost.
        spent = RunnerError(
            str(exc),
            tokens_in=result.tokens_in,
            tokens_out=result.tokens_out,
            cost=cost,
            price_source=price_source,
        )
        _fail(ctx, state, attempt, _failure(state, spent))
        return
    attempts.finish_with(
        ctx,
        state,
        attempt,
        Finish(
            status="succeeded",
            output_json=_kept(ctx, state, value),
            tokens_in=result.tokens_in,
            tokens_out=result.tokens_out,
            cost=cost,
            model=result.model,
            price_source=price_source,
        ),
    )


def _failure(state: RunState, exc: BaseException) -> RunnerError:
    """The failure journaled for a scorer that raised ``exc`` (its own SystemExit too: a
    scorer's bug fails its unit, never the drive)."""
    if isinstance(exc, ScoreError):
        exc = RunnerError(str(exc))
    elif isinstance(exc, Exception) and not isinstance(exc, RunnerError):
        exc = RunnerError(f"scorer raised {type(exc).__name__}: {exc}")
    return outcomes.unit_failure(exc, redact=state.redactor.redact)


def _python(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    score: PlanScore,
    key: UnitKey,
    *,
    output: Any,
    item: int | None,
    item_value: Any,
) -> None:
    """A python scorer: the pinned callable on the output (its return value read)."""
    attempt = _open(ctx, state, key)
    target = score.python or ""
    seen = interrupts.delivered()
    try:
        fn = _resolve(ctx, state, target, score.target_hash)
        given = {"output": output, "params": state.params, "item": item_value, "index": item}
        returned = call_with_timeout(lambda: _call(fn, given, target), step.timeout_s, what=target)
        value = python_score(returned)
    except BaseException as exc:
        if interrupts.is_real_interrupt(exc, seen):
            raise
        _fail(ctx, state, attempt, _failure(state, exc))
        return
    attempts.finish_with(
        ctx, state, attempt, Finish(status="succeeded", output_json=_kept(ctx, state, value))
    )


def _resolve(
    ctx: DriveContext, state: RunState, target: str, pinned: str | None
) -> Callable[..., Any]:
    """The scorer's callable, as the python runner finds it; refused when its source changed."""
    runner = state.runner(ctx, "python")
    namespace = runner.namespace if isinstance(runner, FunctionRunner) else None
    source_dir = runner.source_dir if isinstance(runner, FunctionRunner) else None
    try:
        fn = functions.resolve(target, namespace, search_dir=source_dir)
    except functions.TargetError as exc:
        raise RunnerError(str(exc)) from exc
    current = functions.source_hash(fn)
    if pinned and current != pinned:
        raise RunnerError(
            f"python scorer {target!r} changed since this run's plan was frozen (source hash "
            f"{pinned[:12]} → {current[:12]}); run the workflow again to score with it"
        )
    return fn


def _positional(parameters: Mapping[str, inspect.Parameter]) -> str | None:
    """The name of the first parameter a positional argument fills, if any."""
    for name, p in parameters.items():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL):
            return name
    return None


def _call(fn: Callable[..., Any], given: dict[str, Any], target: str) -> Any:
    """``fn`` on the output, with ``params``, ``item`` and ``index`` when it takes them."""
    try:
        try:
            parameters = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return fn(given["output"])
        names: Sequence[str] = list(parameters)
        takes_all = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        first = _positional(parameters)
        # The output goes by name to ``output``, else to the first positional parameter,
        # whatever its name (``def f(answer, **kw)``).
        by_name = "output" in names or first is None
        taken = ("output",) if by_name else ("output", first)
        extra = {k: v for k, v in given.items() if k not in taken and (takes_all or k in names)}
        if by_name:
            return fn(output=given["output"], **extra)
        return fn(given["output"], **extra)
    except Exception as exc:
        raise RunnerError(
            f"{target} raised {type(exc).__name__}: {' '.join(str(exc).split())}",
            detail=own_traceback(exc),
        ) from exc
