"""A unit's model endpoint and its limiter; a refused call waited for and sent again.

A runner that calls a rate-limited provider names the endpoint a unit calls with an optional
method, ``limit_key(model) -> str | None`` (its base URL, the model and a digest of its key;
never the key). Units of runners without it (scripted, exec, python, agents) are not limited
here: nothing of theirs is refused by a provider's limiter.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..errors import RunnerError
from ..runners.base import UnitKind, UnitRequest, UnitResult
from ..spec.plan import PlanStep
from ..store.journal import UnitKey
from ..store.records import AttemptRow
from . import outcomes
from .context import DriveContext, RunState
from .limiter import LIMITERS, Limiter, ceiling_of, pacing_of
from .units import UnitPlan

MODEL_KINDS = frozenset({"prompt", "judge"})


def limiter_for(ctx: DriveContext, state: RunState, unit: UnitPlan) -> Limiter | None:
    """The limiter of the endpoint ``unit`` calls, or None when its runner names none."""
    if unit.kind not in MODEL_KINDS:
        return None
    try:
        runner = state.runner(ctx, unit.runner)
    except Exception:  # a runner that cannot be built fails at launch, with its message
        return None
    return _limiter_of(state, unit.runner, unit.model, runner)


def _limiter_of(state: RunState, name: str, model: str | None, runner: Any) -> Limiter | None:
    endpoint_of = getattr(runner, "limit_key", None)
    if not callable(endpoint_of):
        return None
    endpoint = endpoint_of(model)
    if not isinstance(endpoint, str) or not endpoint:
        return None
    options: Mapping[str, Any] = state.plan.runners.get(name, {})
    return LIMITERS.get(
        endpoint, max_limit=ceiling_of(options, model), pacing=pacing_of(options, model)
    )


def throttle_wait(
    ctx: DriveContext,
    state: RunState,
    limiter: Limiter,
    exc: RunnerError,
    *,
    step_id: str,
    unit_id: str,
    dispatch_id: str,
) -> float:
    """Pause the endpoint for a refusal and journal it once (a ``throttled`` event)."""
    wait_s = limiter.throttle(exc.retry_after_s)
    data = {
        "endpoint": limiter.endpoint,
        "wait_s": round(wait_s, 3),
        "cause": str(exc)[:300],
    }
    ctx.store.record_event(
        state.run_id,
        "throttled",
        step_id=step_id,
        unit_id=unit_id,
        dispatch_id=dispatch_id,
        data=data,
    )
    ctx.emit("throttled", run_id=state.run_id, step_id=step_id, unit_id=unit_id, **data)
    return wait_s


def call_in_place(
    ctx: DriveContext, state: RunState, request: UnitRequest, *, runner_name: str
) -> UnitResult:
    """Run ``request`` in this thread (a gate's judge), through its endpoint's limiter: a
    refused call waits for the endpoint's pause and goes out again, within the step's
    ``timeout``, as a work unit's does in the dispatcher."""
    runner = state.runner(ctx, runner_name)
    limiter = _limiter_of(state, runner_name, request.model, runner)
    if limiter is None:
        return runner.run(request)
    started = time.monotonic()
    while True:
        wait_s = limiter.try_acquire()
        if wait_s > 0:
            time.sleep(min(wait_s, 1.0))
            continue
        try:
            result = runner.run(request)
        except RunnerError as exc:
            if not exc.throttled:
                limiter.release(ok=True)
                raise
            limiter.release(ok=False)
            wait_s = throttle_wait(
                ctx,
                state,
                limiter,
                exc,
                step_id=request.step_id,
                unit_id=request.unit_id,
                dispatch_id=request.dispatch_id,
            )
            if throttled_too_long(started, wait_s, request.timeout_s):
                raise RunnerError(
                    f"timed out: throttled by the provider for longer than the step's "
                    f"timeout ({request.timeout_s:g}s); last refusal: {exc}",
                    transient=True,
                ) from exc
            time.sleep(wait_s)
            continue
        except BaseException:
            limiter.release(ok=True)
            raise
        limiter.release(ok=True, tokens=(result.tokens_in or 0) + (result.tokens_out or 0))
        return result


def judge_in_place(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    key: UnitKey,
    attempt: AttemptRow,
    *,
    kind: UnitKind,
    prompt: str,
    output_schema: Mapping[str, Any],
) -> UnitResult:
    """Ask a judge (a gate's verdict, an llm scorer's rating) for ``attempt`` of ``key`` in
    this thread, through its endpoint's limiter; the result checked like a work unit's
    (drive/outcomes.py) before anything of it is journaled."""
    request = UnitRequest(
        run_id=state.run_id,
        step_id=step.id,
        unit_id=key.unit_id,
        dispatch_id=attempt.dispatch_id,
        input_hash=key.input_hash,
        attempt=attempt.attempt,
        kind=kind,
        prompt=prompt,
        model=key.model,
        output_schema=output_schema,
        timeout_s=step.timeout_s,
    )
    return outcomes.checked_result(call_in_place(ctx, state, request, runner_name=key.runner))


def throttled_too_long(started: float, wait_s: float, timeout_s: float | None) -> bool:
    """Whether waiting ``wait_s`` more would keep a unit throttled past its step's timeout."""
    if timeout_s is None:
        return False
    return time.monotonic() + wait_s - started > timeout_s
