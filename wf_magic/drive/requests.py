"""The runner's request for one attempt of a unit: its input, environment and callbacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..runners.base import UnitRequest
from ..runners.process import minimal_env
from ..spec.plan import PlanStep
from ..store.records import AttemptRow
from .agentunits import agent_request
from .context import DriveContext, RunState
from .units import UnitPlan


def unit_request(
    state: RunState,
    step: PlanStep,
    unit: UnitPlan,
    attempt: AttemptRow,
    job_offer: int | None,
    *,
    ctx: DriveContext | None = None,
    resume_from: dict[str, Any] | None = None,
) -> UnitRequest:
    """The runner's request; ``ctx`` is given when the unit runs in this process, so a
    prompt unit somebody watches gets an ``on_text`` that emits ``unit_text`` events."""
    on_text: Callable[[str], None] | None = None
    if ctx is not None and unit.kind in ("prompt", "agent") and ctx.bus.has_observers:
        emit, redactor = ctx.emit, state.redactor

        def on_text(text: str) -> None:
            # Called from the worker thread; observers only poke throttles (bus.py).
            emit(
                "unit_text",
                run_id=state.run_id,
                step_id=step.id,
                unit_id=unit.unit_id,
                text=redactor.redact(text),
            )

    env: dict[str, str] = {}
    if unit.kind in ("exec", "agent"):
        item = (
            unit.item
            if isinstance(unit.item, str)
            else ("" if unit.item is None else json.dumps(unit.item))
        )
        env = minimal_env(
            step.pass_env,
            {
                "WF_RUN_ID": state.run_id,
                "WF_STEP_ID": step.id,
                "WF_UNIT_ID": unit.unit_id,
                "WF_DISPATCH_ID": attempt.dispatch_id,
                "WF_ITEM": item,
            },
        )
    return UnitRequest(
        run_id=state.run_id,
        step_id=step.id,
        unit_id=unit.unit_id,
        dispatch_id=attempt.dispatch_id,
        input_hash=unit.input_hash,
        attempt=attempt.attempt,
        kind=unit.kind if unit.kind in ("prompt", "exec", "python", "agent") else "prompt",  # type: ignore[arg-type]
        prompt=unit.prompt,
        argv=unit.argv,
        target=unit.target,
        kwargs=unit.kwargs,
        target_hash=step.target_hash,
        model=unit.model,
        output_schema=step.output,
        timeout_s=step.timeout_s,
        item=unit.item,
        index=unit.item_index,
        max_tokens=job_offer,
        options=step.options,
        env=env,
        agent=agent_request(ctx, unit, resume_from),
        on_text=on_text,
        redact=state.redactor.redact_value if unit.kind == "agent" else None,
    )
