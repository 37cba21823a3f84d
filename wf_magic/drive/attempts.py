"""Journal one unit's attempts for a drive: reserve, finish, reuse, abandon — with their events."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from ..errors import RunnerError
from ..runners.base import UnitResult
from ..spec.plan import PlanStep
from ..store.journal import Finish, UnitKey, known_tokens
from ..store.records import AttemptRow, Phase
from .agentunits import facts_json, report_warnings, settle_bridged
from .context import DriveContext, RunState
from .units import UnitPlan

TRACEBACK_CHARS = 8_000
"""How much of a failed python step's traceback its attempt keeps (the newest frames)."""
ABANDONED = "abandoned: the driver stopped mid-unit and the unit's input has changed since"


def unit_key(
    state: RunState,
    unit: UnitPlan,
    *,
    unit_id: str | None = None,
    phase: Phase = "work",
    runner: str | None = None,
    model: str | None = None,
    input_hash: str | None = None,
) -> UnitKey:
    """The journal key of ``unit``, carrying its resolved input (redacted) to be kept."""
    return UnitKey(
        run_id=state.run_id,
        workflow=state.plan.name,
        step_id=unit.step_id,
        unit_id=unit_id or unit.unit_id,
        phase=phase,
        loop=unit.loop,
        item_index=unit.item_index,
        runner=runner or unit.runner,
        model=model if runner else unit.model,
        input_hash=input_hash or unit.input_hash,
        input_json=unit.rendered.hashed.kept_json,  # redacted: see sealing.InputHasher
    )


def attempts_by_unit(
    ctx: DriveContext, state: RunState, step_id: str
) -> dict[str, list[AttemptRow]]:
    """A step's attempts grouped by unit, in journal order."""
    out: dict[str, list[AttemptRow]] = {}
    for a in ctx.store.attempts_of(state.run_id, step_id):
        out.setdefault(a.unit_id, []).append(a)
    return out


def reserve_many(ctx: DriveContext, state: RunState, units: Sequence[UnitPlan]) -> list[AttemptRow]:
    """New ``running`` attempts of ``units`` in one transaction (with any deferred finishes).

    The caller has checked the budget and counted each charged unit (``Budget.charge_unit``)
    as it took it into the batch, so the next unit's check sees it.
    """
    rows = ctx.store.reserve_attempts(
        [(unit_key(state, u), u.charged) for u in units], payer=ctx.options.payer
    )
    # Fewer rows than units: the sweep's ceiling, counted in the reservation (the caller
    # hands the rest back).
    for unit, attempt in zip(units[: len(rows)], rows, strict=True):
        ctx.emit(
            "unit_started",
            run_id=state.run_id,
            step_id=unit.step_id,
            unit_id=unit.unit_id,
            dispatch_id=attempt.dispatch_id,
            attempt=attempt.attempt,
            loop=unit.loop,
        )
    return rows


def finish_ok(
    ctx: DriveContext,
    state: RunState,
    attempt: AttemptRow,
    result: UnitResult,
    output_json: str,
    *,
    defer: bool = False,
    offer: int | None = None,
) -> None:
    """Journal a succeeded attempt whose output is ``output_json`` (redacted, bounded).

    ``offer``: the tokens the run budget offered the attempt (``UnitRequest.max_tokens``),
    charged in place of a count the server did not report (``unknown_usage_charge``).
    """
    cost, price_source = priced(state, attempt.runner, result)
    finish_with(
        ctx,
        state,
        attempt,
        Finish(
            status="succeeded",
            output_json=output_json,
            tokens_in=_count(result.tokens_in),
            tokens_out=_count(result.tokens_out),
            charged_tokens=unknown_usage_charge(result.tokens_in, result.tokens_out, offer),
            cost=cost,
            model=result.model,
            session_id=result.session_id,
            agent_json=facts_json(state.redactor.redact_value(result.facts)),
            finished_at=time.time(),
            price_source=price_source,
        ),
        defer=defer,
    )


def unknown_usage_charge(
    tokens_in: int | None, tokens_out: int | None, offer: int | None
) -> int | None:
    """What the run budget charges an attempt whose server reported no count (None when
    both counts are known: those are charged).

    The count stays NULL in the journal; the budget charges the known count plus the tokens
    the attempt was offered (``request.max_tokens``, the most its answer could use), so a
    ``max_tokens`` ceiling still holds. Under no token ceiling there is no offer: nothing
    beyond the known count is charged. The prompt's own unreported count is not bounded by
    the offer and is not charged.
    """
    if tokens_in is not None and tokens_out is not None:
        return None
    return (tokens_in or 0) + (tokens_out or 0) + (offer or 0)


def _count(value: int | None) -> int | None:
    return None if value is None else int(value)


def priced(state: RunState, runner: str, result: UnitResult) -> tuple[float | None, str | None]:
    """``result``'s cost and its source: the runner's own, else its ``prices:``/``local:``
    options, else genai-prices (``runners/pricing.py``); (None, None) when unknown."""
    if result.cost is not None:
        return result.cost, result.price_source or "runner"
    unknown = result.tokens_in is None or result.tokens_out is None
    if unknown or result.tokens_estimated:
        return None, None  # no price is put on an unknown count
    if not result.model and not state.plan.runners.get(runner):
        return None, None
    from ..runners.pricing import attempt_cost

    return attempt_cost(
        runner=runner,
        options=state.plan.runners.get(runner),
        model=result.model,
        tokens_in=int(result.tokens_in or 0),
        tokens_out=int(result.tokens_out or 0),
        cache_read=int(result.cache_read_tokens),
        cache_write=int(result.cache_write_tokens),
        provider=result.provider,
    )


def finish_error(
    ctx: DriveContext,
    state: RunState,
    attempt: AttemptRow,
    exc: RunnerError,
    *,
    defer: bool = False,
    offer: int | None = None,
) -> str:
    """Journal a failed attempt; returns the (redacted) failure message.

    What it still cost (``RunnerError.cost``, e.g. a Claude run stopped by ``max_turns``) is
    journaled and charged to the budget like a succeeded attempt's.

    A failure's ``detail`` (a python step's traceback) is kept as the attempt's output,
    ``{"traceback": ...}``, redacted before it is clipped to ``TRACEBACK_CHARS``.
    """
    failure = state.redactor.redact(str(exc))
    detail = getattr(exc, "detail", None)
    output_json = None
    if detail:
        kept = state.redactor.redact(detail)
        if len(kept) > TRACEBACK_CHARS:
            cut = len(kept) - TRACEBACK_CHARS
            kept = f"… ({cut:,} characters cut)\n" + kept[-TRACEBACK_CHARS:]
        output_json = json.dumps({"traceback": kept})
    facts = state.redactor.redact_value(getattr(exc, "facts", None))  # an AgentError's
    cost = exc.cost  # what the failed attempt still spent, when its runner said
    finish_with(
        ctx,
        state,
        attempt,
        Finish(
            status="failed",
            output_json=output_json,
            failure=failure,
            transient=exc.transient,
            tokens_in=exc.tokens_in,
            tokens_out=exc.tokens_out,
            charged_tokens=unknown_usage_charge(exc.tokens_in, exc.tokens_out, offer),
            cost=cost,
            price_source=(exc.price_source or "runner") if cost is not None else None,
            session_id=facts.get("session_id") if facts else None,
            agent_json=facts_json(facts),
            finished_at=time.time(),
        ),
        defer=defer,
    )
    return failure


def finish_with(
    ctx: DriveContext,
    state: RunState,
    attempt: AttemptRow,
    finish: Finish,
    *,
    defer: bool = False,
) -> None:
    """Finish a running attempt with ``finish`` (charged usage, event).

    ``defer``: commit it with the driver's next write (``Store.defer_finish``, group commit).
    The attempt is this drive's own (reserved or reclaimed under the run lock), so nobody
    else can finish it first: its usage is charged at once.
    """
    if defer:
        ctx.store.defer_finish(attempt, finish)
        wrote = True
    else:
        wrote = ctx.store.finish_attempt(attempt, finish)
    used = known_tokens(finish.tokens_in, finish.tokens_out)
    if wrote and attempt.charged:
        charged = used if finish.charged_tokens is None else finish.charged_tokens
        ctx.budget.charge_usage(charged or 0, finish.cost)
        if ctx.options.shared_budget is not None:
            ctx.options.shared_budget.charge_usage(charged or 0, finish.cost)
        if finish.cost is None and used is not None and used > 0:
            _warn_unpriced(ctx, state, attempt, finish)
    if wrote:
        settle_bridged(ctx, attempt.dispatch_id)  # charged above: no longer counted in flight
        report_warnings(ctx, state, attempt, finish.agent_json)
    ctx.emit(
        "unit_finished",
        run_id=state.run_id,
        step_id=attempt.step_id,
        unit_id=attempt.unit_id,
        dispatch_id=attempt.dispatch_id,
        status=finish.status,
        tokens=used or 0,  # an unknown count shows as none used
        failure=finish.failure,
        phase=attempt.phase,
        loop=attempt.loop,
    )


def unpriced_warning(*, model: str, runner: str, unit_id: str, tokens: int) -> str:
    """The warning that ``max_cost`` cannot count a model's attempts (their cost is unknown)."""
    return (
        f"cost is unknown for model {model} (runner {runner}), so max_cost cannot count it: "
        f"unit {unit_id} used {tokens:,} tokens at no known price. Give the price "
        f"(runners.{runner}.prices), declare the runner local (local: true), or install "
        "genai-prices (wf_magic[prices])."
    )


def _warn_unpriced(ctx: DriveContext, state: RunState, attempt: AttemptRow, finish: Finish) -> None:
    """Warn once per model and drive that a charged attempt's cost is unknown under a
    ``max_cost`` ceiling: unpriced attempts add nothing to it, so it would never bind."""
    shared = ctx.options.shared_budget
    if ctx.budget.spec.max_cost is None and (shared is None or shared.max_cost is None):
        return
    model = finish.model or attempt.model or "(none)"
    if not ctx.budget.first_unpriced(f"{attempt.runner}:{model}"):
        return
    message = unpriced_warning(
        model=model,
        runner=attempt.runner,
        unit_id=attempt.unit_id,
        tokens=known_tokens(finish.tokens_in, finish.tokens_out) or 0,
    )
    data = {"message": message, "reason": "cost_unknown", "model": model, "runner": attempt.runner}
    ctx.store.record_event(
        state.run_id,
        "warning",
        step_id=attempt.step_id,
        unit_id=attempt.unit_id,
        dispatch_id=attempt.dispatch_id,
        data=data,
    )
    ctx.emit("warning", run_id=state.run_id, step_id=attempt.step_id, message=message)


def abandon(ctx: DriveContext, state: RunState, attempt: AttemptRow) -> None:
    """Fail an attempt a dead driver left running whose unit's input has changed since."""
    finish_with(ctx, state, attempt, Finish(status="failed", failure=ABANDONED))


def record_reuse(
    ctx: DriveContext, state: RunState, key: UnitKey, source: AttemptRow, *, notify: bool = True
) -> AttemptRow:
    """Journal ``key`` as ``reused`` from ``source`` (zero tokens charged; savings counted)."""
    saved = (known_tokens(source.tokens_in, source.tokens_out) or 0) + source.saved_tokens
    origin = source.reused_from or source.dispatch_id
    row = ctx.store.record_terminal_attempt(
        key,
        Finish(status="reused", output_json=source.output_json, model=source.model),
        reused_from=origin,
        saved_tokens=saved,
        event="unit_reused",
    )
    state.stats.reused += 1
    state.stats.saved_tokens += saved
    if not notify:
        return row
    ctx.emit(
        "unit_reused",
        run_id=state.run_id,
        step_id=key.step_id,
        unit_id=key.unit_id,
        saved_tokens=saved,
        reused_from=origin,
    )
    return row


def try_reuse(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    unit: UnitPlan,
    found: dict[tuple[str, str], AttemptRow],
) -> AttemptRow | None:
    """Answer ``unit`` from its fork source or an earlier run, journaled ``reused`` (or None).

    ``found``: the loop's earlier-run sources, looked up at once (``reuse_sources``).
    """
    source = _reuse_source(ctx, state, step, unit, found)
    if source is None:
        return None
    return record_reuse(ctx, state, unit_key(state, unit), source)


def reuse_sources(
    ctx: DriveContext, state: RunState, units: Sequence[UnitPlan]
) -> dict[tuple[str, str], AttemptRow]:
    """The earlier-run sources of a loop's ``units`` in one read, by (input_hash, runner);
    none where they are not looked up that way (a fork reads its source run per unit)."""
    hashes = [h for unit in units if unit.cacheable for h in unit.input_hashes]
    if state.fork_index is not None or not state.run.use_cache or not hashes:
        return {}
    return ctx.store.find_reusable_many(
        workflow=state.plan.name, input_hashes=hashes, exclude_run_id=state.run.run_id
    )


def _reuse_source(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    unit: UnitPlan,
    found: dict[tuple[str, str], AttemptRow],
) -> AttemptRow | None:
    run = state.run
    if state.fork_index is not None:
        if state.reexecutes(step) or run.forked_from is None:
            return None
        for input_hash in unit.input_hashes:  # the plain hash an older wf_magic journaled too
            source = ctx.store.find_in_run(
                run_id=run.forked_from, input_hash=input_hash, unit_id=unit.unit_id
            )
            if source is not None:
                return source
        return None
    if not (unit.cacheable and run.use_cache):
        return None
    return next(
        (found[(h, unit.runner)] for h in unit.input_hashes if (h, unit.runner) in found), None
    )
