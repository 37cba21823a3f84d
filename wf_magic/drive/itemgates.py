"""Per-item gates: each map item's output judged alone, and only the rejected items looped.

A ``gate: {per_item: true}`` on a map step journals one verdict per item and loop
(``<step>.gate:l<loop>[<i>]``). An accepted item is judged no more: later loops render it as
it was when accepted (``ItemLoops.feedback`` keeps each item's own last rejection), so its
input hash is unchanged and its output is found in the journal, never re-dispatched or
re-charged. A rejected item is rendered with its own feedback and re-dispatched. Everything
here is rebuilt from the journal on a resume: the loops replay in order, finding each
verdict by its unit and input hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..gates.judge import artifact_summary, schema_errors, schema_requirement
from ..gates.verdict import GateWaiting, Verdict, Waiting
from ..spec.plan import PlanStep
from . import judging
from .context import DriveContext, RunState
from .units import Feedback, UnitPlan


@dataclass(slots=True)
class ItemLoops:
    """A per-item gate's state across the loops of one step walk."""

    feedback: dict[int, Feedback] = field(default_factory=dict)
    """Item index → the rejection it is rendered with (absent: never rejected)."""
    passed: set[int] = field(default_factory=set)
    """Items whose gate accepted them (judged no more)."""


ItemGateFate = Literal["passed", "loop", "exhausted", "blocked"]
"""A per-item gate's decision on one loop:

- ``passed``: every open item accepted (or a person approved the step).
- ``loop``: some items rejected with loops left; only they re-execute.
- ``exhausted``: items still rejected after ``max_loops``; the step blocks.
- ``blocked``: a judge could not answer for an item (no loop consumed).
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemFate:
    """What a per-item gate decided on one loop."""

    status: ItemGateFate
    note: str
    feedback: Feedback | None = None
    """The first rejected item's feedback (what the ``gate_rejected`` event carries)."""
    output: Any = None
    """A blocked step's ``{"waiting": …}`` output."""


def decide(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    *,
    loop: int,
    units: Sequence[UnitPlan],
    outputs: list[Any],
    ok: list[int],
    items: ItemLoops,
) -> ItemFate:
    """Judge the open items of ``loop`` (schema first, then the gate's judge), one by one.

    ``items`` is updated only when the loop is decided (not when the step blocks).

    Raises:
        BudgetExceeded: a charged judge would pass a ceiling.
    """
    gate = step.gate
    judge = gate.judge if gate is not None else "llm"
    summary = artifact_summary(outputs, unit_count=len(units))
    step_hash = state.hasher.hash_value({"judge": judge, "per_item": True, "summary": summary}).hash
    decided = judging.step_decision(ctx, state, step, loop=loop, input_hash=step_hash)
    open_items = [i for i in ok if i not in items.passed]
    if decided is not None and decided.complete:
        return ItemFate(status="passed", note=f"gate approved at loop {loop} ({decided.judge})")
    passed: list[int] = []
    rejected: dict[int, Verdict] = {}
    if decided is not None:  # a person rejected the loop: every open item re-executes
        rejected = dict.fromkeys(open_items, decided)
    else:
        waiting = _judge_each(ctx, state, step, loop, units, outputs, open_items, passed, rejected)
        if waiting is not None:
            blocked = Waiting(
                loop=loop, input_hash=step_hash, summary=summary, judge=waiting.waiting.judge
            )
            return ItemFate(status="blocked", note=waiting.reason, output=blocked.to_json())
    items.passed.update(passed)
    total = len(units)
    if not rejected:
        return ItemFate(
            status="passed",
            note=f"gate passed at loop {loop}/{step.max_loops} ({judge}): "
            f"{len(ok)} of {total} items passed",
        )
    first = next(iter(rejected.values()))
    failed_ids = ", ".join(units[i].unit_id for i in rejected)
    if loop < step.max_loops:
        for i, verdict in rejected.items():
            items.feedback[i] = Feedback(
                loop=loop, feedback=verdict.feedback, missing=verdict.missing
            )
        return ItemFate(
            status="loop",
            note=f"loop {loop} rejected {len(rejected)} of {total} items ({failed_ids}): "
            f"{first.feedback}",
            feedback=Feedback(loop=loop, feedback=first.feedback, missing=first.missing),
        )
    exhausted = Waiting(loop=loop, input_hash=step_hash, summary=summary, judge="exhausted")
    note = (
        f"gate exhausted after {loop} loop(s) on {len(rejected)} of {total} items "
        f"({failed_ids}); last feedback: {first.feedback}"
        + (f" (missing: {', '.join(first.missing)})" if first.missing else "")
    )
    return ItemFate(status="exhausted", note=note, output=exhausted.to_json())


def _judge_each(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    loop: int,
    units: Sequence[UnitPlan],
    outputs: list[Any],
    open_items: list[int],
    passed: list[int],
    rejected: dict[int, Verdict],
) -> GateWaiting | None:
    """Judge each open item into ``passed`` / ``rejected``; the first judge that could not
    answer (the others are still judged, so a resume re-asks only that one)."""
    schema = step.output
    waiting: GateWaiting | None = None
    for i in open_items:
        verdict: Verdict | None = None
        if schema is not None:
            errors = schema_errors(schema, [outputs[i]], unit_ids=[units[i].unit_id])
            if errors:
                verdict = judging.record_schema_verdict(
                    ctx,
                    state,
                    step,
                    loop=loop,
                    artifact=outputs[i],
                    verdict=_schema_verdict(schema, errors),
                    item=i,
                )
        if verdict is None:
            judged = judging.obtain_verdict(
                ctx, state, step, loop=loop, artifact=outputs[i], unit_count=1, item=i
            )
            if isinstance(judged, GateWaiting):
                waiting = waiting or judged
                continue
            verdict = judged.verdict
        if verdict.complete:
            passed.append(i)
        else:
            rejected[i] = verdict
    return waiting


def _schema_verdict(schema: dict[str, Any], errors: list[str]) -> Verdict:
    feedback = (
        "The output does not match the required schema: "
        + "; ".join(errors[:20])
        + f". Required: {schema_requirement(schema)}."
    )
    return Verdict(complete=False, feedback=feedback, missing=tuple(errors[:20]), judge="schema")
