"""Steps → units: map expansion, rendered inputs, the gate feedback block and input hashes."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..hashing import hash_value
from ..spec.kinds import KINDS, UnitSource
from ..spec.plan import Plan, PlanStep
from ..templates import TemplateError, evaluate, references

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


class StepOutputs(dict[str, Any]):
    """Step id → output, keeping the ``steps`` scope of templates up to date as it is written.

    Building ``{id: {"output": out}}`` afresh for every unit cost O(steps) per unit: O(n²)
    over a long plan and O(steps × units) over a map. Writes go through ``__setitem__``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.scope: dict[str, dict[str, Any]] = {}

    def __setitem__(self, step_id: str, output: Any) -> None:
        super().__setitem__(step_id, output)
        self.scope[step_id] = {"output": output}


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
        "steps": (
            outputs.scope
            if isinstance(outputs, StepOutputs)
            else {sid: {"output": out} for sid, out in outputs.items()}
        ),
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
    kind = KINDS[step.kind]
    block = None
    if feedback and step.kind == "prompt" and not _places_feedback(step.prompt or ""):
        block = feedback_block(feedback)
    source = UnitSource(
        plan=plan, step=step, context=ctx, item=item, index=idx, feedback_block=block
    )
    try:
        fields, resolved_kind = kind.build(source)
    except TemplateError as exc:
        raise StepInputError(f"unit {unit_id}: template failed: {exc}") from exc
    resolved: dict[str, Any] = {"kind": step.kind, "model": model, "item": item, "feedback": fb}
    resolved.update(resolved_kind)
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
        charged=kind.charged,
        cacheable=step.cache and kind.cacheable,
        **fields,
    )
