"""The Run handle: status, steps, result, frames and rich display of one run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .spec.plan import Plan

if TYPE_CHECKING:
    import pandas as pd

    from .drive import DriveStats
    from .engine import Engine
    from .store.records import RunRow, StepRow

EXIT_CODES = {"completed": 0, "active": 0, "failed": 1, "blocked": 3, "abandoned": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetUse:
    """A run's charged use against its ceilings."""

    units: int
    tokens: int
    cost: float
    max_units: int | None
    max_tokens: int | None
    max_cost: float | None


class FrozenPlan:
    """A run's frozen plan with its hash; attributes are the plan's, display is a plan view."""

    def __init__(self, plan: Plan, *, plan_hash: str):
        self.model = plan
        self.plan_hash = plan_hash

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __repr__(self) -> str:
        from .display import plan_text

        return plan_text(self.model, plan_hash=self.plan_hash)

    def _repr_html_(self) -> str:
        from .display import plan_html

        return plan_html(self.model, plan_hash=self.plan_hash)


class Run:
    """A handle on one run. Properties read the state database afresh each time."""

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        *,
        stats: DriveStats | None = None,
        created: bool = False,
    ):
        self.engine = engine
        self.run_id = run_id
        self.stats = stats
        self.created = created
        """True when the call that returned this handle created the run."""
        self.warnings: list[str] = []

    # -- state ------------------------------------------------------------------------------
    @property
    def row(self) -> RunRow:
        """The run's database row."""
        return self.engine.get_run(self.run_id)

    @property
    def status(self) -> str:
        """``active``, ``blocked``, ``completed``, ``failed`` or ``abandoned``."""
        return self.row.status

    @property
    def reason(self) -> str | None:
        """Why the run is blocked, failed or abandoned."""
        return self.row.status_reason

    @property
    def workflow(self) -> str:
        """The workflow name."""
        return self.row.workflow

    @property
    def result(self) -> Any:
        """A completed run's result: its last completed step's output (else None)."""
        row = self.row
        return json.loads(row.result_json) if row.result_json else None

    @property
    def plan(self) -> FrozenPlan:
        """The frozen plan this run executes (renders as a table + Mermaid graph)."""
        row = self.row
        return FrozenPlan(Plan.model_validate_json(row.plan_json), plan_hash=row.plan_hash)

    @property
    def params(self) -> dict[str, Any]:
        """The run's params after defaults."""
        return dict(json.loads(self.row.params_json))

    @property
    def steps(self) -> list[StepRow]:
        """Step rows in plan order."""
        return self.engine.steps(self.run_id)

    def output(self, step_id: str) -> Any:
        """The output of a completed step (KeyError when it has none)."""
        for row in self.steps:
            if row.step_id == step_id and row.status == "completed" and row.output_json:
                return json.loads(row.output_json)
        raise KeyError(f"step {step_id!r} of run {self.run_id} has no output")

    @property
    def stopped_by(self) -> str | None:
        """Why the last drive through this handle stopped early, if it did."""
        return self.stats.stopped_by if self.stats else None

    @property
    def exit_code(self) -> int:
        """The CLI exit code of this run's state (0 done/stopped, 1 failed, 3 blocked)."""
        return EXIT_CODES.get(self.status, 1)

    def budget_use(self) -> BudgetUse:
        """Charged units/tokens/cost of this run's root against its ceilings."""
        from .store import journal as jsql

        row = self.row
        root = self.engine.get_run(row.root_run_id)
        spec = Plan.model_validate_json(root.plan_json).budget
        units, tokens, cost = self.engine.read(lambda c: jsql.budget_usage(c, row.root_run_id))
        return BudgetUse(
            units=units,
            tokens=tokens,
            cost=cost,
            max_units=spec.max_units,
            max_tokens=spec.max_tokens,
            max_cost=spec.max_cost,
        )

    # -- frames -----------------------------------------------------------------------------
    def journal(self) -> pd.DataFrame:
        """One row per attempt of this run."""
        return self.engine.journal(self.run_id)

    def tokens(self, by: str = "step") -> pd.DataFrame:
        """Token accounting of this run grouped ``by``."""
        return self.engine.tokens(self.run_id, by=by)

    def events(self) -> pd.DataFrame:
        """This run's events."""
        return self.engine.events(self.run_id)

    def budget(self) -> pd.DataFrame:
        """Used vs limit per ceiling."""
        return self.engine.budget(self.run_id)

    # -- display ----------------------------------------------------------------------------
    def __repr__(self) -> str:
        from .display import run_text

        return run_text(self)

    def _repr_html_(self) -> str:
        from .display import run_html

        return run_html(self)
