"""Per-run budget ceilings, seeded from the journal so a resumed run does not restart at zero,
and the spend of agents' bridged model calls not charged yet, which every call's check counts."""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass, field
from typing import Literal

from ..errors import BudgetExceeded
from ..spec.models import BudgetSpec
from ..spec.plan import Plan
from ..store import Store
from ..store.records import RunRow


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAsk:
    """A budget's answer to one model call an agent's bridge would forward."""

    verdict: Literal["go", "wait", "refuse"]
    """- ``go``: forward it (count it with ``forward_call`` once every budget said go).
    - ``wait``: the calls in flight may spend what is left; ask again when one ended.
    - ``refuse``: the spend has reached ``ceiling``."""
    ceiling: str | None = None
    used: float = 0.0
    limit: float = 0.0


GO = CallAsk(verdict="go")
WAIT = CallAsk(verdict="wait")


@dataclass(slots=True)
class BridgedSpend:
    """What agents' bridges spent that the drive has not charged yet: each attempt's finished
    model calls (by dispatch id) until its finish charges them, and the calls forwarded now.
    Guarded by its budget's lock."""

    by_attempt: dict[str, tuple[int, float]] = field(default_factory=dict)
    forwarding: int = 0
    """Calls forwarded upstream whose spend is not known yet."""
    largest: tuple[int, float] | None = None
    """The largest finished call's tokens and cost: what each call in flight is assumed to
    spend (None before a call finished: then a call waits for those in flight)."""

    def others(self, dispatch_id: str) -> tuple[int, float]:
        """The spend of every attempt but ``dispatch_id`` (whose caller counts its own)."""
        tokens, cost = 0, 0.0
        for other, (t, c) in self.by_attempt.items():
            if other != dispatch_id:
                tokens, cost = tokens + t, cost + c
        return tokens, cost


class BridgedCeilings:
    """The per-call check of a budget with ``max_tokens``/``max_cost`` ceilings, shared by the
    run's :class:`Budget` and the sweep's :class:`SharedBudget`.

    A call is refused once the charged totals plus every attempt's uncharged bridged calls
    (``bridged``) have reached a ceiling; while other calls are in flight it goes only when
    they, each counted at the size of the largest call so far, leave room for it, else it
    waits. So with calls of one size a ceiling is passed by less than one call however many
    agents spend at once.
    """

    __slots__ = ()
    _lock: threading.Lock
    bridged: BridgedSpend
    tokens: int
    cost: float

    def ceilings(self) -> tuple[int | None, float | None]:
        """(max_tokens, max_cost)."""
        raise NotImplementedError

    def ask_call(self, dispatch_id: str, *, tokens: int, cost: float) -> CallAsk:
        """May one more call of attempt ``dispatch_id`` go, the attempt having spent ``tokens``
        and ``cost`` so far (its calls not charged yet)? Nothing is counted."""
        max_tokens, max_cost = self.ceilings()
        if max_tokens is None and max_cost is None:
            return GO
        with self._lock:
            spend = self.bridged
            other_t, other_c = spend.others(dispatch_id)
            used_t = self.tokens + other_t + max(0, tokens)
            used_c = self.cost + other_c + charged_cost(cost)
            for ceiling, used, limit in (
                ("max_tokens", used_t, max_tokens),
                ("max_cost", used_c, max_cost),
            ):
                if limit is not None and used >= limit:
                    return CallAsk(verdict="refuse", ceiling=ceiling, used=used, limit=limit)
            if spend.forwarding == 0:
                return GO
            if spend.largest is None:
                return WAIT
            each_t, each_c = spend.largest
            if max_tokens is not None and used_t + spend.forwarding * each_t >= max_tokens:
                return WAIT
            if max_cost is not None and used_c + spend.forwarding * each_c >= max_cost:
                return WAIT
            return GO

    def forward_call(self) -> None:
        """A call every budget let go is forwarded: counted in flight until ``call_left``."""
        with self._lock:
            self.bridged.forwarding += 1

    def call_left(self) -> None:
        """A forwarded call ended (its spend handed to ``call_spent`` first, if it had any)."""
        with self._lock:
            self.bridged.forwarding = max(0, self.bridged.forwarding - 1)

    def call_spent(self, dispatch_id: str, *, tokens: int, cost: float | None, ok: bool) -> None:
        """Add a finished call's spend to its attempt's, until ``settle`` (its charge)."""
        spent_t, spent_c = max(0, tokens), charged_cost(cost)
        with self._lock:
            spend = self.bridged
            t, c = spend.by_attempt.get(dispatch_id, (0, 0.0))
            spend.by_attempt[dispatch_id] = (t + spent_t, min(c + spent_c, sys.float_info.max))
            if ok:
                t0, c0 = spend.largest or (0, 0.0)
                spend.largest = (max(t0, spent_t), max(c0, spent_c))

    def settle(self, dispatch_id: str) -> None:
        """Forget an attempt's bridged spend: its finish has just charged it."""
        with self._lock:
            self.bridged.by_attempt.pop(dispatch_id, None)


@dataclass(slots=True)
class Budget(BridgedCeilings):
    """Running totals of charged attempts against a root run's ceilings."""

    root_run_id: str
    spec: BudgetSpec
    units: int = 0
    tokens: int = 0
    cost: float = 0.0
    _offered: int = field(default=0, repr=False, compare=False)
    _unpriced: set[str] = field(default_factory=set, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    bridged: BridgedSpend = field(default_factory=BridgedSpend, repr=False, compare=False)

    def ceilings(self) -> tuple[int | None, float | None]:
        return self.spec.max_tokens, self.spec.max_cost

    def first_unpriced(self, model: str) -> bool:
        """Whether ``model`` (``runner:model``) is met unpriced for the first time in this
        drive: the warning that ``max_cost`` cannot count it is given once per model."""
        with self._lock:
            if model in self._unpriced:
                return False
            self._unpriced.add(model)
            return True

    def check(self, *, run_id: str, step_id: str, unit_id: str) -> None:
        """Raise ``BudgetExceeded`` when dispatching one more unit would pass a ceiling."""
        spec = self.spec
        with self._lock:
            # max_units: one more attempt must fit; tokens/cost: nothing left means no dispatch.
            checks = (
                ("max_units", self.units + 1, self.units, spec.max_units),
                ("max_tokens", self.tokens, self.tokens, spec.max_tokens),
                ("max_cost", self.cost, self.cost, spec.max_cost),
            )
            for ceiling, would_be, used, limit in checks:
                if limit is not None and (
                    would_be > limit if ceiling == "max_units" else would_be >= limit
                ):
                    raise BudgetExceeded(
                        run_id=run_id,
                        step_id=step_id,
                        unit_id=unit_id,
                        ceiling=ceiling,
                        used=used,
                        limit=limit,
                    )

    def charge_unit(self) -> None:
        """Count one dispatch attempt (at reservation)."""
        with self._lock:
            self.units += 1

    def charge_usage(self, tokens: int, cost: float | None) -> None:
        """Add a finished attempt's tokens and cost (a report never lowers a total)."""
        with self._lock:
            self.tokens += max(0, tokens)
            # Clamped, not overflowed: two huge finite reports must not add up to inf.
            self.cost = min(self.cost + charged_cost(cost), sys.float_info.max)

    def offer(self, *, slots: int) -> int | None:
        """Reserve a share of the unspent tokens for one unit about to be dispatched.

        The share is what is neither spent nor offered to units in flight, split over the
        free dispatch ``slots``; the offers together never pass the ceiling, so concurrent
        units that honour their offer cannot overshoot it. None: no token ceiling.
        """
        if self.spec.max_tokens is None:
            return None
        with self._lock:
            free = max(0, self.spec.max_tokens - self.tokens - self._offered)
            share = max(free // max(1, slots), min(free, 1))
            self._offered += share
            return share

    def release(self, offer: int | None) -> None:
        """Return a finished unit's offer (its real usage is charged separately)."""
        if offer:
            with self._lock:
                self._offered -= offer


def charged_cost(cost: float | None) -> float:
    """What ``cost`` adds to a budget: 0 unless a finite positive number (a negative or NaN
    report must never give headroom)."""
    return cost if cost is not None and math.isfinite(cost) and cost > 0 else 0.0


def seed_budget(store: Store, run: RunRow, plan: Plan) -> Budget:
    """The budget of ``run``'s root: its ceilings, and what the journal already charged."""
    spec = plan.budget
    if run.root_run_id != run.run_id:
        root = store.get_run(run.root_run_id)
        spec = Plan.model_validate_json(root.plan_json).budget if root else spec
    if spec.max_units is None and spec.max_tokens is None and spec.max_cost is None:
        # No ceiling to check: the counts would never be read (a resume of a big run skips
        # a scan of its whole journal).
        units, tokens, cost = 0, 0, 0.0
    else:
        units, tokens, cost = store.budget_usage(run.root_run_id)
    return Budget(root_run_id=run.root_run_id, spec=spec, units=units, tokens=tokens, cost=cost)


@dataclass(slots=True)
class SharedBudget(BridgedCeilings):
    """Ceilings over several runs driven at once (a sweep's cells), checked before each
    charged dispatch of any of them; seeded by the caller from the journal.

    Every check happens at reservation, under one lock, so ``max_units`` is exact; tokens
    and cost are known only when a unit finishes, so they overshoot by at most what the
    units already reserved (in flight) use.
    """

    max_units: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    units: int = 0
    tokens: int = 0
    cost: float = 0.0
    reached: str | None = None
    """The first ceiling that refused a dispatch (``max_units`` / ``max_tokens`` / ``max_cost``)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    bridged: BridgedSpend = field(default_factory=BridgedSpend, repr=False, compare=False)

    def ceilings(self) -> tuple[int | None, float | None]:
        return self.max_tokens, self.max_cost

    def try_charge(self) -> bool:
        """Count one more charged dispatch if it fits every ceiling; False (and ``reached``
        set) when it does not."""
        with self._lock:
            ceiling = self._passed()
            if ceiling is not None:
                self.reached = self.reached or ceiling
                return False
            self.units += 1
            return True

    def reach(self, ceiling: str) -> None:
        """Note that ``ceiling`` stopped a charged attempt (an agent's call refused mid-agent)."""
        with self._lock:
            self.reached = self.reached or ceiling

    def _passed(self) -> str | None:
        if self.max_units is not None and self.units + 1 > self.max_units:
            return "max_units"
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return "max_tokens"
        if self.max_cost is not None and self.cost >= self.max_cost:
            return "max_cost"
        return None

    def charge_usage(self, tokens: int, cost: float | None) -> None:
        """Add a finished attempt's tokens and cost (a report never lowers a total)."""
        with self._lock:
            self.tokens += max(0, tokens)
            # Clamped, not overflowed: two huge finite reports must not add up to inf.
            self.cost = min(self.cost + charged_cost(cost), sys.float_info.max)
