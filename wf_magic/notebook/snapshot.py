"""Read one run's state from the journal into a plain snapshot the run view draws."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..display import Rejection, gate_rejections, result_text, unit_counts, unit_total
from ..gates.verdict import Waiting as GateWaiting
from ..spec.plan import Plan
from ..store.records import BudgetUse

if TYPE_CHECKING:
    from ..engine import Engine
    from ..store.records import AttemptRow, StepRow


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """A blocked gate a person can decide (human gate, exhausted gate or failed judge)."""

    step_id: str
    loop: int
    judge: str
    """``human``, ``exhausted`` or ``failed``."""
    summary: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StepState:
    """One step row of the view."""

    step_id: str
    kind: str
    status: str
    done: int
    """Work units of the current loop with a succeeded or reused attempt."""
    total: int | None
    """Work units of the step (None while its map input is not known yet)."""
    tokens: int
    saved_tokens: int
    elapsed_s: float | None
    loop: int
    max_loops: int
    has_gate: bool
    note: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSnapshot:
    """Everything the run view shows, read in one go."""

    run_id: str
    workflow: str
    status: str
    reason: str | None
    steps: tuple[StepState, ...]
    rejections: tuple[Rejection, ...]
    waiting: Waiting | None
    budget: BudgetUse
    reused: int
    saved_tokens: int
    result: str | None
    """A completed run's result, clipped for display."""
    taken_at: float


class SnapshotReader:
    """Takes snapshots of one run; caches what cannot change (the plan, map sizes)."""

    def __init__(self, engine: Engine, run_id: str):
        self.engine = engine
        self.run_id = run_id
        row = engine.get_run(run_id)
        self.plan = Plan.model_validate_json(row.plan_json)
        self.params: dict[str, Any] = json.loads(row.params_json)
        self._totals: dict[str, int] = {}

    def take(self) -> RunSnapshot:
        """Read the run, its steps and its journal now."""
        row = self.engine.get_run(self.run_id)
        step_rows = self.engine.steps(self.run_id)
        attempts = self.engine.attempts(self.run_id)
        by_step: dict[str, list[AttemptRow]] = {}
        for a in attempts:
            by_step.setdefault(a.step_id, []).append(a)
        now = time.time()
        steps = tuple(
            self._step_state(s, by_step.get(s.step_id, []), step_rows, now) for s in step_rows
        )
        reused = [a for a in attempts if a.status == "reused"]
        return RunSnapshot(
            run_id=row.run_id,
            workflow=row.workflow,
            status=row.status,
            reason=row.status_reason,
            steps=steps,
            rejections=tuple(gate_rejections(attempts)),
            waiting=_waiting(step_rows),
            budget=self.engine.store.budget_use(self.run_id),
            reused=len(reused),
            saved_tokens=sum(a.saved_tokens for a in reused),
            result=result_text(row.result_json) if row.status == "completed" else None,
            taken_at=now,
        )

    def _step_state(
        self, step: StepRow, attempts: list[AttemptRow], rows: list[StepRow], now: float
    ) -> StepState:
        done, seen = unit_counts(step, attempts)
        total = seen if step.status == "skipped" else self._total(step, rows)
        if total is None and seen:
            total = seen
        started = [a.started_at for a in attempts]
        ends = [a.finished_at or now for a in attempts]
        return StepState(
            step_id=step.step_id,
            kind=step.kind,
            status=step.status,
            done=done,
            total=total,
            tokens=sum(a.tokens_in + a.tokens_out for a in attempts),
            saved_tokens=sum(a.saved_tokens for a in attempts if a.status == "reused"),
            elapsed_s=(max(ends) - min(started)) if started else None,
            loop=step.loop,
            max_loops=step.max_loops,
            has_gate=self.plan.step(step.step_id).gate is not None,
            note=step.note,
        )

    def _total(self, step: StepRow, rows: list[StepRow]) -> int | None:
        if step.step_id in self._totals:
            return self._totals[step.step_id]
        total = unit_total(self.plan.step(step.step_id), self.params, rows)
        if total is not None:  # a map's expansion never changes once known
            self._totals[step.step_id] = total
        return total


def _waiting(rows: list[StepRow]) -> Waiting | None:
    for row in rows:
        if row.status != "blocked" or not row.output_json:
            continue
        waiting = GateWaiting.from_json(json.loads(row.output_json))
        if waiting is not None:
            return Waiting(
                step_id=row.step_id,
                loop=waiting.loop,
                judge=waiting.judge,
                summary=waiting.summary,
            )
    return None
