"""The drive loop: next step → units → budget → dispatch → spine, over a run's frozen plan."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import dispatch, judging, spine
from .budget import Budget
from .errors import RunnerError
from .gates import Verdict
from .hashing import canonical_json
from .redact import is_secret_key
from .runners.base import Runner, RunnerContext, UnitResult
from .runners.registry import runner_factory
from .spec.plan import Plan, PlanStep
from .store import journal as jsql
from .store import runs as run_sql
from .store.records import AttemptRow, RunRow, StepRow
from .units import StepInputError, UnitPlan, build_units

if TYPE_CHECKING:
    from .engine import Engine

STOP_POLL_S = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class DriveOptions:
    """How one drive behaves."""

    max_steps: int | None = None
    signal: threading.Event | None = None
    max_concurrency: int | None = None
    executor: Executor | None = None


@dataclass(slots=True, kw_only=True)
class DriveStats:
    """What one drive did (shown by the CLI and the widgets)."""

    dispatched: int = 0
    reused: int = 0
    saved_tokens: int = 0
    steps_finished: int = 0
    stopped_by: str | None = None
    """None, ``max_steps``, ``signal``, ``stop_request`` or ``interrupt``."""
    retryable_failure: bool = False
    """The run failed on a unit that really ran (run-level retries may re-open it)."""
    warnings: list[str] = field(default_factory=list)


class RunnerPool:
    """Runners of one plan, created on first use and closed together on every exit path."""

    def __init__(self, engine: Engine, plan: Plan, *, source_dir: str | None = None):
        self.engine = engine
        self.plan = plan
        self.source_dir = source_dir
        self.runners: dict[str, Runner] = {}
        self.lock = threading.Lock()

    def get(self, name: str) -> Runner:
        with self.lock:
            if name not in self.runners:
                options = dict(self.plan.runners.get(name, {}))
                kind = str(options.pop("type", name))
                factory = runner_factory(kind)
                if factory is None:
                    raise RunnerError(f"unknown runner {kind!r}")
                self.runners[name] = factory(
                    RunnerContext(
                        name=name,
                        options=options,
                        state_dir=str(self.engine.state_dir),
                        workflow=self.plan.name,
                        namespace=self.engine.namespace,
                        source_dir=self.source_dir,
                    )
                )
            return self.runners[name]

    def close(self) -> None:
        with self.lock:
            runners, self.runners = list(self.runners.values()), {}
        for runner in runners:
            try:
                runner.close()
            except Exception:  # closing must go on for the others
                import logging

                logging.getLogger("wf_magic").exception("closing a runner failed")


class Driver:
    """Drives one run (its lock held by the caller) until done, blocked, failed or stopped."""

    def __init__(
        self,
        engine: Engine,
        run: RunRow,
        plan: Plan,
        params: dict[str, Any],
        *,
        budget: Budget,
        options: DriveOptions,
        depth: int = 0,
        reopened: bool = False,
    ):
        self.engine = engine
        self.run = run
        self.plan = plan
        self.params = params
        self.budget = budget
        self.options = options
        self.depth = depth
        self.reopened = reopened
        """The run had failed and this drive re-opened it: unit retries start afresh."""
        self.stats = DriveStats()
        self.step_rows: dict[str, StepRow] = {}
        self.outputs: dict[str, Any] = {}
        self.pool = RunnerPool(
            engine, plan, source_dir=str(Path(run.source_path).parent) if run.source_path else None
        )
        self.redactor = engine.redactor.with_secrets(
            v for k, v in params.items() if isinstance(v, str) and is_secret_key(k)
        )
        self._pool_executor: Executor | None = None
        self._last_stop_poll = 0.0
        self._fork_index = (
            next(i for i, s in enumerate(plan.steps) if s.id == run.fork_step)
            if run.fork_step
            else None
        )

    # -- plumbing ---------------------------------------------------------------------------
    def store_write(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(conn)`` inside one BEGIN IMMEDIATE transaction."""
        return self.engine.write(fn)

    def emit(
        self, kind: str, *, step_id: str | None = None, unit_id: str | None = None, **data: Any
    ) -> None:
        self.engine.emit(kind, run_id=self.run.run_id, step_id=step_id, unit_id=unit_id, **data)

    def runner(self, name: str) -> Runner:
        return self.pool.get(name)

    def executor_for(self, step: PlanStep) -> tuple[Executor, int]:
        limit = self.plan.execution.max_concurrency
        if self.options.max_concurrency is not None:
            limit = min(limit, self.options.max_concurrency)
        if step.map is None:
            limit = 1
        if self.options.executor is not None:
            return self.options.executor, max(1, limit)
        if limit <= 1:
            return dispatch.InlineExecutor(), 1
        if self._pool_executor is None:
            self._pool_executor = ThreadPoolExecutor(
                max_workers=limit, thread_name_prefix="wf-unit"
            )
        return self._pool_executor, limit

    def should_stop(self) -> bool:
        if self.options.signal is not None and self.options.signal.is_set():
            self.stats.stopped_by = "signal"
            return True
        now = time.monotonic()
        if now - self._last_stop_poll >= STOP_POLL_S:
            self._last_stop_poll = now
            if self.engine.read(lambda c: run_sql.is_stop_requested(c, self.run.root_run_id)):
                self.stats.stopped_by = "stop_request"
                return True
        return False

    # -- the step loop ----------------------------------------------------------------------
    def drive(self) -> DriveStats:
        """Walk the plan from the first unfinished step; always closes runners and pools."""
        try:
            self._walk()
        except KeyboardInterrupt:
            self.stats.stopped_by = "interrupt"
            raise
        finally:
            self.pool.close()
            if self._pool_executor is not None:
                self._pool_executor.shutdown(wait=True, cancel_futures=True)
        return self.stats

    def _walk(self) -> None:
        self.step_rows = {
            r.step_id: r for r in self.engine.read(lambda c: run_sql.steps_of(c, self.run.run_id))
        }
        for step in self.plan.steps:
            row = self.step_rows[step.id]
            if self._settled(step, row):
                continue
            if self.should_stop():
                return
            skip_note = self._route_skip(step)
            if skip_note is not None:
                spine.skip_step(self, step, skip_note)
                self.outputs[step.id] = None
                self._sync_run_status()
                continue
            self.emit("step_started", step_id=step.id)
            outcome = self._run_step(step)
            self._sync_run_status()
            if outcome is None:
                return  # stopped mid-step: the step is owed to the next drive
            if outcome.status in ("completed", "skipped") or (
                outcome.status == "failed"
                and step.on_error == "continue"
                and not outcome.run_failed
            ):
                self.outputs[step.id] = outcome.output if outcome.status == "completed" else None
                self.stats.steps_finished += 1
                if self.options.max_steps and self.stats.steps_finished >= self.options.max_steps:
                    if any(self.step_rows[s.id].status == "pending" for s in self.plan.steps):
                        self.stats.stopped_by = "max_steps"
                    return
                continue
            return

    def _settled(self, step: PlanStep, row: StepRow) -> bool:
        if row.status == "completed":
            self.outputs[step.id] = json.loads(row.output_json) if row.output_json else None
            return True
        if row.status == "skipped" or (
            row.status == "failed" and step.on_error == "continue" and not row.stops_run
        ):
            self.outputs[step.id] = None
            return True
        return False

    def _route_skip(self, step: PlanStep) -> str | None:
        notes: list[str] = []
        for router in self.plan.steps:
            if router.route is None or step.id not in router.route.cases.values():
                continue
            row = self.step_rows[router.id]
            if row.status == "completed" and row.output_json:
                decision = json.loads(row.output_json)
                if decision.get("selected") == step.id:
                    return None  # a completed router chose this step: protected
                notes.append(
                    f'Skipped by route: step "{router.id}" selected "{decision.get("case")}"'
                )
            elif row.status == "skipped":
                notes.append(f'Skipped by route: router step "{router.id}" was skipped')
            elif row.status == "failed":
                notes.append(f'Skipped by route: router step "{router.id}" failed')
        return notes[0] if notes else None

    def _run_step(self, step: PlanStep) -> spine.StepOutcome | None:
        loop, feedback = 1, None
        while True:
            try:
                units = build_units(
                    self.plan,
                    step,
                    params=self.params,
                    outputs=self.outputs,
                    loop=loop,
                    feedback=feedback,
                )
            except StepInputError as exc:
                return spine.complete_step(
                    self, step, loop=loop, units=[], work=spine.WorkOutcome(input_error=str(exc))
                )
            work = dispatch.run_units(self, step, units, judged=self._has_verdict(step, loop))
            self.stats.dispatched += work.dispatched
            if work.stopped and not dispatch.is_complete(work):
                return None
            outcome = spine.complete_step(
                self,
                step,
                loop=loop,
                units=units,
                work=spine.WorkOutcome(
                    outputs=work.outputs,
                    failures=work.failures,
                    budget_error=work.budget_error,
                    blocked=work.blocked,
                    executed_failure=work.executed_failure,
                ),
            )
            self.stats.retryable_failure = outcome.retryable and outcome.run_failed
            if outcome.status != "loop":
                return outcome
            self.emit(
                "gate_rejected",
                step_id=step.id,
                loop=loop,
                feedback=outcome.feedback.feedback if outcome.feedback else "",
                missing=list(outcome.feedback.missing) if outcome.feedback else [],
            )
            loop, feedback = loop + 1, outcome.feedback

    def _sync_run_status(self) -> None:
        status, reason = spine.derive_run_status(self.plan, self.step_rows)
        if status == "active" and self.run.status == "active":
            return
        result_json = None
        if status == "completed":
            result_json = canonical_json(spine.run_result(self.plan, self.step_rows))
        if (status, reason) == (self.run.status, self.run.status_reason):
            return
        self.engine.set_run_status(self.run.run_id, status, reason=reason, result_json=result_json)
        self.run = self.engine.get_run(self.run.run_id)

    # -- units ------------------------------------------------------------------------------
    def attempts_by_unit(self, step_id: str) -> dict[str, list[AttemptRow]]:
        out: dict[str, list[AttemptRow]] = {}
        for a in self.engine.read(lambda c: jsql.attempts_of(c, self.run.run_id, step_id)):
            out.setdefault(a.unit_id, []).append(a)
        return out

    def _has_verdict(self, step: PlanStep, loop: int) -> bool:
        if step.gate is None and step.output is None:
            return False
        unit_id = judging.gate_unit_id(step.id, loop)
        return any(a.status == "succeeded" for a in self.attempts_by_unit(step.id).get(unit_id, []))

    def before_dispatch(self, step: PlanStep, loop: int) -> None:
        spine.start_loop(self, step, loop)

    def _key(
        self,
        unit: UnitPlan,
        *,
        unit_id: str | None = None,
        phase: str = "work",
        runner: str | None = None,
        model: str | None = None,
        input_hash: str | None = None,
    ) -> jsql.UnitKey:
        return jsql.UnitKey(
            run_id=self.run.run_id,
            workflow=self.plan.name,
            step_id=unit.step_id,
            unit_id=unit_id or unit.unit_id,
            phase=phase,
            loop=unit.loop,
            item_index=unit.item_index,
            runner=runner or unit.runner,
            model=model if runner else unit.model,
            input_hash=input_hash or unit.input_hash,
        )

    def reserve(self, unit: UnitPlan) -> AttemptRow:
        attempt: AttemptRow = self.store_write(
            lambda c: jsql.reserve_attempt_txn(c, self._key(unit), charged=unit.charged)
        )
        if unit.charged:
            self.budget.charge_unit()
        self.emit(
            "unit_started",
            step_id=unit.step_id,
            unit_id=unit.unit_id,
            dispatch_id=attempt.dispatch_id,
            attempt=attempt.attempt,
            loop=unit.loop,
        )
        return attempt

    def finish_ok(self, attempt: AttemptRow, result: UnitResult) -> Any:
        output = self.redactor.redact_value(result.output)
        finish = jsql.Finish(
            status="succeeded",
            output_json=json.dumps(output),
            tokens_in=int(result.tokens_in),
            tokens_out=int(result.tokens_out),
            cost=result.cost,
            model=result.model,
            session_id=result.session_id,
        )
        self.finish_with(attempt, finish)
        return output

    def finish_error(self, attempt: AttemptRow, exc: RunnerError) -> str:
        failure = self.redactor.redact(str(exc))
        finish = jsql.Finish(
            status="failed",
            failure=failure,
            transient=exc.transient,
            tokens_in=exc.tokens_in,
            tokens_out=exc.tokens_out,
        )
        self.finish_with(attempt, finish)
        return failure

    def finish_with(self, attempt: AttemptRow, finish: jsql.Finish) -> None:
        """Finish a running attempt with ``finish`` (charged usage, event)."""
        wrote = self.store_write(lambda c: jsql.finish_attempt_txn(c, attempt, finish))
        if wrote and attempt.charged:
            self.budget.charge_usage(finish.tokens_in + finish.tokens_out, finish.cost)
        self.emit(
            "unit_finished",
            step_id=attempt.step_id,
            unit_id=attempt.unit_id,
            dispatch_id=attempt.dispatch_id,
            status=finish.status,
            tokens=finish.tokens_in + finish.tokens_out,
            failure=finish.failure,
            phase=attempt.phase,
            loop=attempt.loop,
        )

    def abandon_attempt(self, attempt: AttemptRow) -> None:
        self.finish_with(
            attempt,
            jsql.Finish(
                status="failed",
                failure="abandoned: the driver stopped mid-unit and the unit's input "
                "has changed since",
            ),
        )

    def reexecutes(self, step: PlanStep) -> bool:
        """Whether this run is a fork and ``step`` is at or after its fork step."""
        if self._fork_index is None:
            return False
        return [s.id for s in self.plan.steps].index(step.id) >= self._fork_index

    def try_reuse(self, step: PlanStep, unit: UnitPlan) -> AttemptRow | None:
        source = self._reuse_source(step, unit)
        if source is None:
            return None
        saved = source.tokens_in + source.tokens_out + source.saved_tokens
        origin = source.reused_from or source.dispatch_id
        finish = jsql.Finish(status="reused", output_json=source.output_json, model=source.model)
        row: AttemptRow = self.store_write(
            lambda c: jsql.record_terminal_attempt_txn(
                c,
                self._key(unit),
                finish,
                reused_from=origin,
                saved_tokens=saved,
                event="unit_reused",
            )
        )
        self.stats.reused += 1
        self.stats.saved_tokens += saved
        self.emit(
            "unit_reused",
            step_id=step.id,
            unit_id=unit.unit_id,
            saved_tokens=saved,
            reused_from=origin,
        )
        return row

    def _reuse_source(self, step: PlanStep, unit: UnitPlan) -> AttemptRow | None:
        if self._fork_index is not None:
            if self.reexecutes(step) or self.run.forked_from is None:
                return None
            forked_from = self.run.forked_from
            return self.engine.read(
                lambda c: jsql.find_in_run(
                    c, run_id=forked_from, input_hash=unit.input_hash, unit_id=unit.unit_id
                )
            )
        if not (unit.cacheable and self.run.use_cache):
            return None
        return self.engine.read(
            lambda c: jsql.find_reusable(
                c,
                workflow=self.plan.name,
                input_hash=unit.input_hash,
                runner=unit.runner,
                exclude_run_id=self.run.run_id,
            )
        )

    def run_inline(self, step: PlanStep, unit: UnitPlan, attempt: AttemptRow) -> UnitResult:
        """Route decisions and child workflows run in the driver thread."""
        if unit.kind == "route":
            return _route_decision(step, unit)
        return self.engine.drive_child(self, step, unit, attempt)

    # -- gates (wf_magic.judging does the work) ----------------------------------------------
    def obtain_verdict(
        self, step: PlanStep, *, loop: int, artifact: Any, unit_count: int
    ) -> spine.Judged | spine.GateWaiting:
        """The gate's verdict on this loop: from the journal, or by asking the judge now."""
        return judging.obtain_verdict(
            self, step, loop=loop, artifact=artifact, unit_count=unit_count
        )

    def record_verdict(self, step: PlanStep, *, loop: int, artifact: Any, verdict: Verdict) -> None:
        """Journal a schema verdict (once per loop and artifact)."""
        judging.record_schema_verdict(self, step, loop=loop, artifact=artifact, verdict=verdict)


def _route_decision(step: PlanStep, unit: UnitPlan) -> UnitResult:
    route = step.route
    if route is None:
        raise RunnerError(f"step {step.id} is not a route step")
    value = str((unit.kwargs or {}).get("value", ""))
    if value in route.cases:
        case = value
    elif "default" in route.cases:
        case = "default"
    else:
        raise RunnerError(
            f"route value {value!r} matches no case {sorted(route.cases)} and "
            "there is no default; add a case or a default"
        )
    return UnitResult(output={"value": value, "case": case, "selected": route.cases[case]})
