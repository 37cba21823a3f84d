"""Per-run budget ceilings, seeded from the journal so a resumed run does not restart at zero."""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass, field

from ..errors import BudgetExceeded
from ..spec.models import BudgetSpec
from ..spec.plan import Plan
from ..store import Store
from ..store.records import RunRow


@dataclass(slots=True)
class Budget:
    """Running totals of charged attempts against a root run's ceilings."""

    root_run_id: str
    spec: BudgetSpec
    units: int = 0
    tokens: int = 0
    cost: float = 0.0
    _offered: int = field(default=0, repr=False, compare=False)
    _unpriced: set[str] = field(default_factory=set, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

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
class SharedBudget:
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
