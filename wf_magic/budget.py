"""Per-run budget ceilings, seeded from the journal so a resumed run does not restart at zero."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .errors import BudgetExceeded
from .spec.models import BudgetSpec


@dataclass(slots=True)
class Budget:
    """Running totals of charged attempts against a root run's ceilings."""

    root_run_id: str
    spec: BudgetSpec
    units: int = 0
    tokens: int = 0
    cost: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def check(self, *, run_id: str, step_id: str, unit_id: str) -> None:
        """Raise ``BudgetExceeded`` when dispatching one more unit would pass a ceiling."""
        spec = self.spec
        with self._lock:
            if spec.max_units is not None and self.units + 1 > spec.max_units:
                raise BudgetExceeded(
                    run_id=run_id,
                    step_id=step_id,
                    unit_id=unit_id,
                    ceiling="max_units",
                    used=self.units,
                    limit=spec.max_units,
                )
            if spec.max_tokens is not None and self.tokens >= spec.max_tokens:
                raise BudgetExceeded(
                    run_id=run_id,
                    step_id=step_id,
                    unit_id=unit_id,
                    ceiling="max_tokens",
                    used=self.tokens,
                    limit=spec.max_tokens,
                )
            if spec.max_cost is not None and self.cost >= spec.max_cost:
                raise BudgetExceeded(
                    run_id=run_id,
                    step_id=step_id,
                    unit_id=unit_id,
                    ceiling="max_cost",
                    used=self.cost,
                    limit=spec.max_cost,
                )

    def charge_unit(self) -> None:
        """Count one dispatch attempt (at reservation)."""
        with self._lock:
            self.units += 1

    def charge_usage(self, tokens: int, cost: float | None) -> None:
        """Add a finished attempt's tokens and cost."""
        with self._lock:
            self.tokens += tokens
            self.cost += cost or 0.0

    def tokens_left(self) -> int | None:
        """Tokens a runner may still spend (None: no token ceiling)."""
        if self.spec.max_tokens is None:
            return None
        return max(0, self.spec.max_tokens - self.tokens)
