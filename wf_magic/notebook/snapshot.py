"""Read one run's state from the journal into a plain snapshot the run view draws."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..display import (
    ArtifactUnit,
    Rejection,
    TokenSplit,
    gate_rejections,
    result_text,
    unit_counts,
    unit_total,
)
from ..drive.units import template_context
from ..gates.judge import render_criteria
from ..gates.verdict import Waiting as GateWaiting
from ..gates.verdict import gate_unit_id
from ..spec.plan import Plan
from ..store.records import BudgetUse
from ..templates import TemplateError

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
    decided: str | None = None
    """``approved``/``rejected`` when a person's verdict on this loop is already journaled
    (from code, another view, the CLI) and the run has not been driven on since."""
    criteria: tuple[str, ...] = ()
    """The gate's criteria, rendered as the judge saw them."""
    units: tuple[ArtifactUnit, ...] = ()
    """The artifact waited on, one entry per unit, with the previous loop's output."""
    since: float | None = None
    """When the gate began waiting (the step's last work or verdict finished)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepState:
    """One step row of the view."""

    step_id: str
    kind: str
    status: str
    done: int
    """Work units of the current loop with a succeeded or reused attempt."""
    running: int
    """Attempts of the current loop in flight (work units or the gate's judge)."""
    failed: int
    """Work units of the current loop whose latest attempt failed."""
    total: int | None
    """Work units of the step (None while its map input is not known yet)."""
    tokens: int
    """Paid tokens: the step's charged attempts (what the budget counts)."""
    judge_tokens: int
    """Tokens the gate's judge spent outside the budget (uncharged gate attempts)."""
    saved_tokens: int
    """What the step's reused answers first cost."""
    elapsed_s: float | None
    """Wall time of the step's attempts, without the time spent waiting for a person."""
    waited_s: float
    """Time the step spent waiting for a person's decision (decided loops, and the open one)."""
    started_at: float | None
    """When the step's first attempt started (the live clock counts from it)."""
    waiting_since: float | None = None
    """Set while the step waits for a person: the waiting clock counts from it."""
    loop: int
    max_loops: int
    has_gate: bool
    note: str | None

    @property
    def token_split(self) -> TokenSplit:
        """The step's tokens in the one labelling (paid · reused · judge)."""
        return TokenSplit(paid=self.tokens, reused=self.saved_tokens, judge=self.judge_tokens)


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
    created_at: float
    taken_at: float

    @property
    def tokens(self) -> TokenSplit:
        """The run's own tokens: paid, reused (what it first cost) and judge, over its steps."""
        total = TokenSplit()
        for s in self.steps:
            total += s.token_split
        return total

    @property
    def units(self) -> tuple[int, int, int, int]:
        """(done, running, failed, total) work units over every step (a total owed counts 0)."""
        return (
            sum(s.done for s in self.steps),
            sum(s.running for s in self.steps),
            sum(s.failed for s in self.steps),
            sum(s.total or 0 for s in self.steps),
        )


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
        # Only a blocked run waits: an abandoned one (given up, superseded by a fork) keeps
        # its blocked step row, but nobody can decide it any more.
        waiting = _waiting(step_rows, attempts) if row.status == "blocked" else None
        if waiting is not None:
            waiting = self._review(waiting, step_rows, by_step.get(waiting.step_id, []))
        steps = tuple(
            self._step_state(s, by_step.get(s.step_id, []), step_rows, now, waiting)
            for s in step_rows
        )
        reused = [a for a in attempts if a.status == "reused"]
        return RunSnapshot(
            run_id=row.run_id,
            workflow=row.workflow,
            status=row.status,
            reason=row.status_reason,
            steps=steps,
            rejections=tuple(gate_rejections(attempts)),
            waiting=waiting,
            budget=self.engine.store.budget_use(self.run_id),
            reused=len(reused),
            saved_tokens=sum(a.saved_tokens for a in reused),
            result=result_text(row.result_json) if row.status == "completed" else None,
            created_at=row.created_at,
            taken_at=now,
        )

    def _step_state(
        self,
        step: StepRow,
        attempts: list[AttemptRow],
        rows: list[StepRow],
        now: float,
        waiting: Waiting | None,
    ) -> StepState:
        done, seen = unit_counts(step, attempts)
        total = seen if step.status == "skipped" else self._total(step, rows)
        if total is None and seen:
            total = seen
        started = [a.started_at for a in attempts]
        ends = [a.finished_at or now for a in attempts]
        latest = _latest_work(step, attempts)
        waited = _waited_s(attempts)
        since = (
            waiting.since
            if waiting is not None and waiting.step_id == step.step_id and not waiting.decided
            else None
        )
        return StepState(
            step_id=step.step_id,
            kind=step.kind,
            status=step.status,
            done=done,
            running=sum(
                a.status == "running" for a in attempts if a.loop == step.loop and a.phase == "gate"
            )
            + sum(a.status == "running" for a in latest),
            failed=sum(a.status == "failed" for a in latest),
            total=total,
            # An unknown count (NULL) adds nothing: sums skip it.
            tokens=sum((a.tokens_in or 0) + (a.tokens_out or 0) for a in attempts if a.charged),
            judge_tokens=sum(
                (a.tokens_in or 0) + (a.tokens_out or 0)
                for a in attempts
                if a.phase == "gate" and not a.charged
            ),
            saved_tokens=sum(a.saved_tokens for a in attempts if a.status == "reused"),
            elapsed_s=max(0.0, max(ends) - min(started) - waited) if started else None,
            waited_s=waited,
            started_at=min(started) if started else None,
            waiting_since=since,
            loop=step.loop,
            max_loops=step.max_loops,
            has_gate=self.plan.step(step.step_id).gate is not None,
            note=step.note,
        )

    def _review(self, waiting: Waiting, rows: list[StepRow], attempts: list[AttemptRow]) -> Waiting:
        """The waiting gate with what a person reviews: its criteria and the artifact's units."""
        step = self.plan.step(waiting.step_id)
        outputs = {
            r.step_id: json.loads(r.output_json) if r.output_json else None
            for r in rows
            if r.status in ("completed", "skipped")
        }
        try:
            criteria = render_criteria(
                step.gate.criteria if step.gate else [], template_context(self.params, outputs)
            )
        except TemplateError:
            criteria = list(step.gate.criteria if step.gate else [])  # as written
        current = _outputs_of_loop(attempts, waiting.loop)
        previous = _outputs_of_loop(attempts, waiting.loop - 1) if waiting.loop > 1 else {}
        units = tuple(
            ArtifactUnit(
                unit_id=unit_id,
                output=output,
                previous=previous.get(unit_id),
                has_previous=unit_id in previous,
            )
            for unit_id, output in current.items()
        )
        finished = [a.finished_at for a in attempts if a.finished_at is not None]
        return dataclasses.replace(
            waiting,
            criteria=tuple(criteria),
            units=units,
            since=max(finished) if finished else None,
        )

    def _total(self, step: StepRow, rows: list[StepRow]) -> int | None:
        if step.step_id in self._totals:
            return self._totals[step.step_id]
        total = unit_total(self.plan.step(step.step_id), self.params, rows)
        if total is not None:  # a map's expansion never changes once known
            self._totals[step.step_id] = total
        return total


def _outputs_of_loop(attempts: list[AttemptRow], loop: int) -> dict[str, Any]:
    """Each work unit's output in ``loop`` (its latest succeeded or reused attempt), in unit
    order (a map's items by index)."""
    found: dict[str, AttemptRow] = {}
    for a in attempts:
        if a.phase == "work" and a.loop == loop and a.status in ("succeeded", "reused"):
            found[a.unit_id] = a
    ordered = sorted(found.values(), key=lambda a: (a.item_index is None, a.item_index or 0))
    return {a.unit_id: json.loads(a.output_json) if a.output_json else None for a in ordered}


def _waited_s(attempts: list[AttemptRow]) -> float:
    """Seconds the step waited for a person: before each journaled human verdict, the gap
    since the step's previous attempt finished."""
    waited = 0.0
    last_end: float | None = None
    for a in sorted(attempts, key=lambda a: a.started_at):
        if a.runner == "human" and last_end is not None:
            waited += max(0.0, a.started_at - last_end)
        if a.finished_at is not None:
            last_end = a.finished_at if last_end is None else max(last_end, a.finished_at)
    return waited


def _latest_work(step: StepRow, attempts: list[AttemptRow]) -> list[AttemptRow]:
    """The latest attempt of each work unit of the step's current loop."""
    latest: dict[str, AttemptRow] = {}
    for a in attempts:
        if a.phase == "work":
            latest[a.unit_id] = a
    return [a for a in latest.values() if a.loop == step.loop]


def _waiting(rows: list[StepRow], attempts: list[AttemptRow]) -> Waiting | None:
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
                decided=_decided(row.step_id, waiting, attempts),
            )
    return None


def _decided(step_id: str, waiting: GateWaiting, attempts: list[AttemptRow]) -> str | None:
    """How a person already decided the loop a gate waits on (None: still open)."""
    unit_id = gate_unit_id(step_id, waiting.loop)
    verdict = None
    for a in attempts:
        if (
            a.unit_id == unit_id
            and a.runner == "human"
            and a.status == "succeeded"
            and a.input_hash == waiting.input_hash
        ):
            verdict = json.loads(a.output_json or "{}")
    if not isinstance(verdict, dict):
        return None
    if waiting.judge == "exhausted" and not verdict.get("complete"):
        # The person's rejection of the last loop is what exhausted the gate: it still waits
        # for approve, abandon or fork (an exhausted LLM gate's own verdict is no person's).
        return None
    return "approved" if verdict.get("complete") else "rejected"
