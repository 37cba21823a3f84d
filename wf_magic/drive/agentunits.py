"""What an agent unit's request carries beyond its rendered input: the session a continued loop
resumes (with its worktree and usage so far), the run's remaining cost allowance, and what its
bridge uses: the journal of its calls, the budgets each call asks (the run's and its sweep's)
and the endpoint limiters."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..spec.plan import PlanStep
from ..store.records import AttemptRow
from .budget import BridgedCeilings, Budget, CallAsk, SharedBudget
from .context import DriveContext, RunState
from .limiter import LIMITERS, Limiter, ceiling_of, pacing_of
from .units import UnitPlan


def prior_session(
    ctx: DriveContext, step: PlanStep, unit: UnitPlan, history: Sequence[AttemptRow]
) -> dict[str, Any] | None:
    """The session loop n+1 of a ``session: continue`` step resumes: the latest attempt of an
    earlier loop of this unit that journaled a session id (None: nothing to continue)."""
    if step.agent is None or step.agent.session != "continue" or unit.loop <= 1:
        return None
    earlier = [a for a in history if a.loop < unit.loop and a.session_id and a.phase == "work"]
    if not earlier:
        return None
    prior = earlier[-1]
    facts = ctx.store.agent_facts(prior.dispatch_id) or {}
    worktree = facts.get("worktree") or {}
    return {
        "session_id": prior.session_id,
        "dispatch_id": prior.dispatch_id,
        "worktree": worktree.get("path"),
        "usage_total": facts.get("usage_total") or [0, 0],
    }


def agent_request(
    ctx: DriveContext | None, unit: UnitPlan, resume: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The ``UnitRequest.agent`` of ``unit`` (None for other kinds)."""
    agent = unit.agent
    if agent is None:
        return None
    out = dict(agent)
    if resume is not None:
        out["resume"] = resume
    if ctx is not None:
        out["calls"] = ctx.store  # the bridge journals each model call as it finishes
        out["limits"] = BridgeLimits(ctx)  # its upstream calls share the endpoint limiters
        shared = ctx.options.shared_budget
        if _binds(ctx.budget) or (shared is not None and _binds(shared)):
            out["allowance"] = CallAllowance(ctx.budget, shared, sweep_id=ctx.options.payer)
        left = [
            limit - used
            for limit, used in (
                (ctx.budget.spec.max_cost, ctx.budget.cost),
                (shared.max_cost if shared else None, shared.cost if shared else 0.0),
            )
            if limit is not None
        ]
        if left:  # Claude's own cap: the second line of defence
            out["max_cost"] = max(0.0, min(left))
    return out


def _binds(budget: BridgedCeilings) -> bool:
    return any(limit is not None for limit in budget.ceilings())


class CallAllowance:
    """The run's (and its sweep's) ``max_tokens``/``max_cost`` as the bridge asks before each
    model call: the charged totals plus what every agent's bridged calls spent and the drive
    has not charged yet (this attempt's own included); a call waits while the calls in flight
    may spend what is left (``drive/budget.BridgedCeilings``).

    Asked on the bridges' event-loop thread (in-memory sums under each budget's lock, no
    I/O); spends are added from the journal's executor threads and settled by the drive.
    """

    def __init__(
        self, budget: Budget, shared: SharedBudget | None = None, *, sweep_id: str | None = None
    ) -> None:
        self.budget = budget
        self.shared = shared
        self.sweep_id = sweep_id

    def _budgets(self) -> list[BridgedCeilings]:
        return [self.budget] if self.shared is None else [self.budget, self.shared]

    def admit(
        self, *, run_id: str, unit_id: str, dispatch_id: str, tokens: int, cost: float, call: int
    ) -> str | bool:
        """May call number ``call`` of attempt ``dispatch_id`` go upstream now, the attempt
        having spent ``tokens`` and ``cost`` so far? True: it goes (counted in flight until
        :meth:`left`); False: wait and ask again; else the one-line ``Budget exceeded …``."""
        asks = [b.ask_call(dispatch_id, tokens=tokens, cost=cost) for b in self._budgets()]
        for budget, ask in zip(self._budgets(), asks, strict=True):
            if ask.verdict == "refuse":
                return self._refused(budget, ask, run_id=run_id, unit_id=unit_id, call=call)
        if any(ask.verdict == "wait" for ask in asks):
            return False
        for budget in self._budgets():
            budget.forward_call()
        return True

    def refusal(
        self,
        *,
        run_id: str,
        unit_id: str,
        tokens: int,
        cost: float,
        call: int,
        dispatch_id: str = "",
    ) -> str | None:
        """The ``Budget exceeded …`` line when the spend so far has reached a ceiling (None:
        none reached; nothing is counted)."""
        for budget in self._budgets():
            ask = budget.ask_call(dispatch_id, tokens=tokens, cost=cost)
            if ask.verdict == "refuse":
                return self._refused(budget, ask, run_id=run_id, unit_id=unit_id, call=call)
        return None

    def spent(self, *, dispatch_id: str, tokens: int, cost: float | None, ok: bool) -> None:
        """A call of ``dispatch_id`` finished: its spend counts until the attempt is charged."""
        for budget in self._budgets():
            budget.call_spent(dispatch_id, tokens=tokens, cost=cost, ok=ok)

    def left(self) -> None:
        """A call :meth:`admit` let go ended."""
        for budget in self._budgets():
            budget.call_left()

    def _refused(
        self, budget: BridgedCeilings, ask: CallAsk, *, run_id: str, unit_id: str, call: int
    ) -> str:
        ceiling = ask.ceiling or "max_tokens"
        said = f"{ceiling} used {ask.used:g} of {ask.limit:g}; call {call} of unit {unit_id} "
        said += "was refused by the bridge and the agent stopped."
        if budget is self.budget:
            return (
                f"Budget exceeded in run {run_id}: {said} Raise budget.{ceiling} and start a "
                "new run (--new), or fork this one."
            )
        if self.shared is not None:  # the sweep's ceiling: its settle names it
            self.shared.reach(ceiling)
        sweep = self.sweep_id or "its sweep"
        return (
            f"Budget exceeded in sweep {sweep}: {said} `wf sweep-resume {sweep} "
            f"--{ceiling.replace('_', '-')} N` sets a new ceiling."
        )


def settle_bridged(ctx: DriveContext, dispatch_id: str) -> None:
    """An attempt's finish charged its calls: they stop counting as bridged spend (so nothing
    is counted twice)."""
    ctx.budget.settle(dispatch_id)
    if ctx.options.shared_budget is not None:
        ctx.options.shared_budget.settle(dispatch_id)


class BridgeLimits:
    """The endpoint limiters as an agent's bridge uses them (``bridge/attempt.LimitsFor``)."""

    def __init__(self, ctx: DriveContext) -> None:
        self.ctx = ctx

    def limits(
        self,
        endpoint: str,
        identity: Mapping[str, Any],
        *,
        options: Mapping[str, Any] | None = None,
        model: str | None = None,
    ) -> _EndpointLimits:
        """The endpoint's limiter, its ceiling and pacing from the harness's ``limits:`` for
        ``model`` (or ``*``), as a model runner's are (``drive/endpoints.py``)."""
        section = options or {}
        limiter = LIMITERS.get(
            endpoint, max_limit=ceiling_of(section, model), pacing=pacing_of(section, model)
        )
        return _EndpointLimits(self.ctx, limiter, identity)


class _EndpointLimits:
    """One endpoint's limiter, journaling its refusals under one attempt."""

    def __init__(self, ctx: DriveContext, limiter: Limiter, identity: Mapping[str, Any]):
        self.ctx, self.limiter, self.identity = ctx, limiter, dict(identity)

    def acquire(self) -> float:
        return self.limiter.try_acquire()

    def release(self, *, ok: bool, tokens: int = 0) -> None:
        self.limiter.release(ok=ok, tokens=tokens)

    def throttled(self, retry_after_s: float | None, cause: str) -> float:
        """Pause the endpoint and journal one ``throttled`` event (the CLI never sees it)."""
        wait_s = self.limiter.throttle(retry_after_s)
        data = {"endpoint": self.limiter.endpoint, "wait_s": round(wait_s, 3), "cause": cause}
        who = self.identity
        self.ctx.store.record_event(
            who["run_id"],
            "throttled",
            step_id=who["step_id"],
            unit_id=who["unit_id"],
            dispatch_id=who["dispatch_id"],
            data=data,
        )
        self.ctx.emit(
            "throttled",
            run_id=who["run_id"],
            step_id=who["step_id"],
            unit_id=who["unit_id"],
            **data,
        )
        return wait_s


def facts_json(facts: Any) -> str | None:
    """An attempt's agent facts as journaled JSON (None when there are none)."""
    if not facts:
        return None
    return json.dumps(facts, sort_keys=True, default=str)


def report_warnings(
    ctx: DriveContext, state: RunState, attempt: AttemptRow, agent_json: str | None
) -> None:
    """Journal one ``warning`` event per number the agent's CLI reported and the runner
    refused (a negative or non-finite cost, a token count that is no count), on the success
    and the failure path alike; and one ``warning`` (reason ``bridge``) when the harness's
    model calls could not be bridged, and one (reason ``replay``) per replayed call whose
    request differed from the recording."""
    if not agent_json or not any(
        f'"{k}"' in agent_json for k in ("warnings", "bridge_off", "replay_warnings")
    ):
        return
    facts = json.loads(agent_json)
    warnings = facts.get("warnings")
    said = [
        (str(m), "reported_usage") for m in (warnings[:10] if isinstance(warnings, list) else [])
    ]
    if facts.get("bridge_off"):  # the harness's login cannot be bridged: said once a run
        said.append((str(facts["bridge_off"]), "bridge"))
    replayed = facts.get("replay_warnings")
    said += [(str(m), "replay") for m in (replayed[:10] if isinstance(replayed, list) else [])]
    for message, reason in said:
        data = {"message": message, "reason": reason}
        ctx.store.record_event(
            state.run_id,
            "warning",
            step_id=attempt.step_id,
            unit_id=attempt.unit_id,
            dispatch_id=attempt.dispatch_id,
            data=data,
        )
        ctx.emit("warning", run_id=state.run_id, step_id=attempt.step_id, message=str(message))


def cancel_agents(
    ctx: DriveContext, state: RunState, units: Sequence[tuple[UnitPlan, AttemptRow]]
) -> None:
    """End the process groups of the agent units in flight (a Stop, an interrupt): their
    attempts fail transient, so a later drive runs them again."""
    for unit, attempt in units:
        if unit.kind != "agent":
            continue
        runner = state.runner(ctx, unit.runner)
        cancel = getattr(runner, "cancel", None)
        if cancel is not None:
            cancel(attempt.dispatch_id)
