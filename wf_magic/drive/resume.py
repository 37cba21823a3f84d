"""Resume one loop: fill in the outputs the journal already holds and list the units owed.

A unit is owed unless it has a succeeded attempt for its current ``input_hash`` (DESIGN.md
§3, invariant 4). Comparing hashes means rendering every unit, which for a 10 000-unit map
costs far more than the one unit a resume may owe. So a map step's loop records, before its
first attempt, the context hash it dispatches under (``LoopUnits.context_hash``: everything
rendering its units reads). While that is the only context ever recorded for the loop, every
work attempt of the loop was made for the input its unit has now, and a unit with a
succeeded attempt in the loop is done without being rendered. The rest (never tried, failed,
running, or answered in another loop) are rendered and compared as always. A loop that
dispatches under a second context (other params or step outputs, another wf_magic) is
marked mixed first, and is compared unit by unit from then on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..spec.plan import PlanStep
from ..store.resume import LoopContext
from .context import DriveContext, RunState
from .spine import LoopWork
from .units import LoopUnits, StepInputError, UnitPlan

OWED_LOOKUP_MAX = 500
"""Past this many units to compare, the step's done outputs are read with one scan."""


def settle(
    ctx: DriveContext, state: RunState, step: PlanStep, units: Sequence[UnitPlan], work: LoopWork
) -> list[int]:
    """Fill in ``work.outputs`` of the units already answered; the indexes of those owed.

    Every owed unit is rendered before this returns, so nothing is dispatched when a template
    fails: ``work.input_error`` is set instead and no unit is owed.
    """
    loop = units if isinstance(units, LoopUnits) and step.map is not None else None
    context = loop.context_hash if loop is not None else None
    recorded = None
    try:
        owed = None
        if loop is not None and context is not None:
            recorded = ctx.store.loop_context(state.run_id, step.id, loop.loop)
            if recorded.first == context and not recorded.mixed:
                owed = _settle_vouched(ctx, state, loop, work)
        if owed is None:
            owed = _compare(ctx, state, step, units, range(len(units)), work)
            if owed and loop is not None:
                _record(ctx, state, loop, context, recorded)
    except StepInputError as exc:
        work.input_error = str(exc)
        return []
    return owed


def _settle_vouched(
    ctx: DriveContext, state: RunState, loop: LoopUnits, work: LoopWork
) -> list[int] | None:
    """The loop's own succeeded attempts answer their units; the rest are compared.

    None when the journal's rows do not fit the units (then every unit is compared).
    """
    indexes, outputs = _loop_outputs(ctx, state, loop, grouped=False)
    count = len(loop)
    if len(set(indexes)) < len(indexes):  # a unit re-ran in this loop: its newest attempt
        indexes, outputs = _loop_outputs(ctx, state, loop, grouped=True)
    found: list[Any] = [_UNANSWERED] * count
    try:
        if indexes and (min(indexes) < 0 or max(indexes) >= count):
            return None
        for i, output in zip(indexes, outputs, strict=True):
            found[i] = output
    except TypeError:  # an index that is no int: a row edited by hand
        return None
    if len(indexes) == count:
        work.outputs[:] = found
        return []
    rest = []
    for i, output in enumerate(found):
        if output is _UNANSWERED:
            rest.append(i)
        else:
            work.outputs[i] = output
    return _compare(ctx, state, loop.step, loop, rest, work)


_UNANSWERED = object()


def _loop_outputs(
    ctx: DriveContext, state: RunState, loop: LoopUnits, *, grouped: bool
) -> tuple[list[Any], list[Any]]:
    rows = ctx.store.loop_outputs(state.run_id, loop.step.id, loop.loop, grouped=grouped)
    return json.loads(rows.indexes_json), json.loads(rows.outputs_json)


def _compare(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    units: Sequence[UnitPlan],
    indexes: range | list[int],
    work: LoopWork,
) -> list[int]:
    """Render the units at ``indexes``; those without a succeeded attempt for their input.

    Raises:
        StepInputError: a unit's template cannot be rendered.
    """
    for i in indexes:
        units[i].rendered  # noqa: B018 - every input first: a template error dispatches nothing
    if len(indexes) > OWED_LOOKUP_MAX:
        done = ctx.store.done_outputs(state.run_id, step.id)
    else:
        done = ctx.store.done_outputs_of_units(state.run_id, [units[i].unit_id for i in indexes])
    owed: list[int] = []
    for i in indexes:
        unit = units[i]
        outputs = done.get(unit.unit_id)
        # input_hashes: an older wf_magic journaled a secret-bearing input's plain hash.
        found = (
            None if outputs is None else next((h for h in unit.input_hashes if h in outputs), None)
        )
        if outputs is not None and found is not None:
            output_json = outputs[found]
            work.outputs[i] = None if output_json is None else json.loads(output_json)
        else:
            owed.append(i)
    return owed


def _record(
    ctx: DriveContext,
    state: RunState,
    loop: LoopUnits,
    context: str | None,
    recorded: LoopContext | None,
) -> None:
    """Record the context this drive dispatches the loop under, before it dispatches.

    The first context is kept only if the loop has no attempt yet (the store checks, in the
    same transaction); it then vouches for every attempt of the loop. Dispatching under
    another context after it leaves the loop mixed: compared unit by unit for good.
    """
    if recorded is None:
        recorded = ctx.store.loop_context(state.run_id, loop.step.id, loop.loop)
    if recorded.mixed or recorded.first == context or (recorded.first is None and not context):
        return  # nothing it could vouch for, or nothing new to say
    ctx.store.record_loop_context(state.run_id, loop.step.id, loop=loop.loop, context_hash=context)
