"""Steps → units: map expansion, rendered inputs, the gate feedback block and input hashes."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .hashing import hash_value
from .spec.plan import Plan, PlanStep
from .spec.templates import TemplateError, evaluate, references, render_text

MAX_MAP_UNITS = 10_000


class StepInputError(Exception):
    """A step's inputs cannot be built (template error, bad map value); fails the step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Feedback:
    """A gate rejection carried into the next loop."""

    loop: int
    """The loop that was rejected."""
    feedback: str
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitPlan:
    """One unit of one loop, fully resolved: what to send and how to recognise it again."""

    step_id: str
    unit_id: str
    kind: str
    phase: str
    loop: int
    item_index: int | None
    item: Any
    runner: str
    model: str | None
    input: dict[str, Any]
    input_hash: str
    prompt: str | None = None
    argv: tuple[str, ...] | None = None
    target: str | None = None
    kwargs: dict[str, Any] | None = None
    charged: bool = True
    cacheable: bool = True


def template_context(
    params: Mapping[str, Any],
    outputs: Mapping[str, Any],
    *,
    item: Any = None,
    index: int | None = None,
    feedback: Feedback | None = None,
) -> dict[str, Any]:
    """The names in scope of a template: params, steps.<id>.output, item/index, gate."""
    return {
        "params": params,
        "steps": {sid: {"output": out} for sid, out in outputs.items()},
        "item": item,
        "index": index,
        "gate": {
            "feedback": feedback.feedback if feedback else "",
            "missing": list(feedback.missing) if feedback else [],
            "loop": (feedback.loop + 1) if feedback else 1,
        },
    }


@functools.lru_cache(maxsize=1024)
def _places_feedback(prompt: str) -> bool:
    """Whether the template itself places ``gate.feedback`` or ``gate.missing``."""
    return "gate" in references(prompt).names and bool(
        re.search(r"gate\s*(?:\.\s*|\[\s*['\"])(?:feedback|missing)\b", prompt)
    )


def feedback_block(feedback: Feedback) -> str:
    """The "Gate feedback" block appended to every prompt of a re-executed loop."""
    lines = [f"\n\nGate feedback (loop {feedback.loop} was rejected):", feedback.feedback.strip()]
    if feedback.missing:
        lines.append("Missing:")
        lines.extend(f"- {m}" for m in feedback.missing)
    return "\n".join(lines)


def expand_items(
    step: PlanStep, params: Mapping[str, Any], outputs: Mapping[str, Any]
) -> list[Any] | None:
    """The map items of ``step`` (None when it is not a map step).

    Raises:
        StepInputError: the map template fails or yields no list, or too many items.
    """
    if step.map is None:
        return None
    try:
        value = evaluate(step.map, template_context(params, outputs))
    except TemplateError as exc:
        raise StepInputError(f"map template failed: {exc}") from exc
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise StepInputError(
            f"map must evaluate to a list (got {type(value).__name__}: {str(value)[:80]!r})"
        )
    if len(value) > MAX_MAP_UNITS:
        raise StepInputError(
            f"map expands to {len(value)} units, more than the bound of "
            f"{MAX_MAP_UNITS}; split the list or pre-aggregate it"
        )
    return value


def build_units(
    plan: Plan,
    step: PlanStep,
    *,
    params: Mapping[str, Any],
    outputs: Mapping[str, Any],
    loop: int,
    feedback: Feedback | None,
) -> list[UnitPlan]:
    """The work units of ``step`` at ``loop``.

    Raises:
        StepInputError: a template cannot be rendered.
    """
    items = expand_items(step, params, outputs)
    pairs: list[tuple[int | None, Any]] = (
        [(None, None)] if items is None else list(enumerate(items))
    )
    return [
        _unit(plan, step, idx, item, params=params, outputs=outputs, loop=loop, feedback=feedback)
        for idx, item in pairs
    ]


def _unit(
    plan: Plan,
    step: PlanStep,
    idx: int | None,
    item: Any,
    *,
    params: Mapping[str, Any],
    outputs: Mapping[str, Any],
    loop: int,
    feedback: Feedback | None,
) -> UnitPlan:
    unit_id = step.id if idx is None else f"{step.id}[{idx}]"
    ctx = template_context(params, outputs, item=item, index=idx, feedback=feedback)
    model = step.model
    fb = {"feedback": feedback.feedback, "missing": list(feedback.missing)} if feedback else None
    fields: dict[str, Any] = {}
    resolved: dict[str, Any] = {"kind": step.kind, "model": model, "item": item, "feedback": fb}
    try:
        if step.kind == "prompt":
            prompt = render_text(step.prompt or "", ctx)
            if feedback and not _places_feedback(step.prompt):
                prompt += feedback_block(feedback)
            fields["prompt"] = prompt
            resolved["prompt"] = prompt
            resolved["output"] = step.output
        elif step.kind == "exec":
            fields["argv"] = tuple(step.argv or ())
            resolved.update(argv=list(step.argv or ()), pass_env=step.pass_env)
        elif step.kind == "python":
            kwargs = _bindings(step, ctx, item, idx)
            fields.update(target=step.target, kwargs=kwargs)
            resolved.update(target=step.target, target_hash=step.target_hash, kwargs=kwargs)
        elif step.kind == "workflow":
            kwargs = _bindings(step, ctx, None, None)
            child = plan.children[step.workflow or ""]
            fields.update(target=step.workflow, kwargs=kwargs)
            resolved.update(
                target=step.workflow,
                child_plan_hash=hash_value(child.model_dump(mode="json")),
                kwargs=kwargs,
            )
        elif step.kind == "route":
            value = render_text(step.route.on if step.route else "", ctx).strip()
            fields["kwargs"] = {"value": value}
            resolved["value"] = value
    except TemplateError as exc:
        raise StepInputError(f"unit {unit_id}: template failed: {exc}") from exc
    input_hash = hash_value(resolved)
    return UnitPlan(
        step_id=step.id,
        unit_id=unit_id,
        kind=step.kind,
        phase="work",
        loop=loop,
        item_index=idx,
        item=item,
        runner=step.runner,
        model=model,
        input=resolved,
        input_hash=input_hash,
        charged=step.kind not in ("workflow", "route"),
        cacheable=step.cache and step.kind not in ("route",),
        **fields,
    )


def _bindings(step: PlanStep, ctx: Mapping[str, Any], item: Any, idx: int | None) -> dict[str, Any]:
    if step.bindings is None:
        return {} if idx is None else {"item": item}
    return {k: _eval_deep(v, ctx) for k, v in step.bindings.items()}


def _eval_deep(value: Any, ctx: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return evaluate(value, ctx)
    if isinstance(value, dict):
        return {k: _eval_deep(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [_eval_deep(v, ctx) for v in value]
    return value
