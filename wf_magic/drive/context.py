"""What a drive is given (DriveContext) and what it keeps per run (RunState), never the Engine."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agents.registry import harness_runner_factory
from ..bus import EventBus
from ..errors import RunnerError
from ..redact import Redactor, secret_strings
from ..runners.base import Runner, RunnerContext
from ..runners.registry import runner_factory
from ..sealing import InputHasher, unseal
from ..spec.plan import Plan, PlanStep
from ..store import Store
from ..store.records import RunRow, StepRow
from .budget import Budget, SharedBudget
from .executors import UnitExecutors, UnitSlots
from .units import StepOutputs

STOP_POLL_S = 0.2
_log = logging.getLogger("wf_magic")


@dataclass(frozen=True, slots=True, kw_only=True)
class DriveOptions:
    """How one drive behaves."""

    max_steps: int | None = None
    signal: threading.Event | None = None
    max_concurrency: int | None = None
    executor: Executor | None = None
    secrets: dict[str, Any] = field(default_factory=dict, repr=False)
    """Seal → value of the secret params the caller handed to this drive, plus those of the
    child runs it publishes (never stored)."""
    shared_budget: SharedBudget | None = None
    """Ceilings shared with other runs (a sweep's): a charged unit they refuse is not
    dispatched and the drive stops, leaving the run resumable (``stopped_by='shared_budget'``)."""
    payer: str | None = None
    """The sweep that pays this drive's charged attempts: recorded with each reservation
    (``sweep_charges``), so what a sweep paid is its own attempts, never another's."""
    unit_slots: UnitSlots | None = None
    """Units in flight shared with other runs (a sweep's ``max_concurrency``): a unit is
    reserved only once it holds a slot."""
    lone_units_inline: bool = False
    """A step's lone unit runs in the driving thread even with ``executor`` set: a sweep
    drives each cell on a thread of its own pool, so handing a cell's one unit to another
    thread of it only adds a hand-off (a map's units still go to ``executor``)."""


@dataclass(slots=True, kw_only=True)
class DriveStats:
    """What one drive did (shown by the CLI and the widgets)."""

    dispatched: int = 0
    reused: int = 0
    saved_tokens: int = 0
    steps_finished: int = 0
    stopped_by: str | None = None
    """None, ``max_steps``, ``signal``, ``stop_request``, ``interrupt`` or ``shared_budget``
    (a sweep's ceiling refused a dispatch; the run stays active)."""
    retryable_failure: bool = False
    """The run failed on a unit that really ran (run-level retries may re-open it)."""


class RunnerPool:
    """Runners of a drive (its children's too), built on first use and closed together."""

    def __init__(
        self,
        *,
        state_dir: Path,
        namespace: Mapping[str, Any] | None,
        journal: str | None = None,
    ):
        self.state_dir = state_dir
        self.namespace = namespace
        self.journal = journal
        """The state's ``postgresql://`` URL when the journal is not ``state_dir``'s file."""
        self._runners: dict[tuple[str, str | None, str], Runner] = {}
        self._lock = threading.Lock()

    def get(self, plan: Plan, name: str, *, source_dir: str | None) -> Runner:
        """The runner ``name`` of ``plan`` (its options from ``plan.runners``).

        Raises:
            RunnerError: no runner of that type is registered.
        """
        key = (plan.name, source_dir, name)
        with self._lock:
            if key not in self._runners:
                options = dict(plan.runners.get(name, {}))
                kind = str(options.pop("type", name))
                factory = runner_factory(kind) or harness_runner_factory(kind)
                if factory is None:
                    raise RunnerError(f"unknown runner {kind!r}")
                self._runners[key] = factory(
                    RunnerContext(
                        name=name,
                        options=options,
                        state_dir=str(self.state_dir),
                        workflow=plan.name,
                        namespace=self.namespace,
                        source_dir=source_dir,
                        journal=self.journal,
                    )
                )
            return self._runners[key]

    def close(self) -> None:
        """Close every runner built so far (a failing close never stops the others)."""
        with self._lock:
            runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            try:
                runner.close()
            except Exception:  # closing must go on for the others
                _log.exception("closing a runner failed")


@dataclass(frozen=True, slots=True, kw_only=True)
class DriveContext:
    """The narrow set of things a drive uses: a child drive gets the same with ``depth + 1``."""

    store: Store
    bus: EventBus
    runners: RunnerPool
    budget: Budget
    redactor: Redactor
    options: DriveOptions
    depth: int = 0

    def child(self, redactor: Redactor) -> DriveContext:
        """The context of a child workflow's drive (same budget, runners and options).

        ``redactor`` is the parent run's: a secret the parent hands to its child (``with:``)
        stays masked in everything the child journals, whatever the child calls it.
        """
        return dataclasses.replace(self, depth=self.depth + 1, redactor=redactor)

    def emit(
        self,
        kind: str,
        *,
        run_id: str,
        step_id: str | None = None,
        unit_id: str | None = None,
        **data: Any,
    ) -> None:
        """Deliver an event to observers (nothing is built when nobody listens).

        Its texts are redacted like the journal's (the run's redactor, see store/scrub.py):
        a progress line on a terminal or a widget shows what the journal keeps.
        """
        if not self.bus.has_observers:
            return
        data = self.store.scrubber.redactor(run_id).redact_value(data)
        self.bus.notify(kind, run_id=run_id, step_id=step_id, unit_id=unit_id, **data)


@dataclass(slots=True, kw_only=True)
class RunState:
    """One run's drive in progress: its row, plan, step rows, outputs so far and stats."""

    run: RunRow
    plan: Plan
    params: dict[str, Any]
    redactor: Redactor
    hasher: InputHasher
    """Hashes what the drive journals redacted (unit and judge inputs): keyed when secret."""
    executors: UnitExecutors
    reopened: bool = False
    """The run had failed and this drive re-opened it: unit retries start afresh."""
    stats: DriveStats = field(default_factory=DriveStats)
    step_rows: dict[str, StepRow] = field(default_factory=dict)
    outputs: StepOutputs = field(default_factory=StepOutputs)
    fork_index: int | None = None
    positions: dict[str, int] = field(default_factory=dict)
    """Step id → its index in the plan (looked up per unit, so never a list scan)."""
    last_stop_poll: float = 0.0

    @classmethod
    def begin(cls, ctx: DriveContext, run: RunRow, plan: Plan, params: dict[str, Any]) -> RunState:
        """The state a drive of ``run`` starts from."""
        positions = {s.id: i for i, s in enumerate(plan.steps)}
        fork_index = positions[run.fork_step] if run.fork_step else None
        params = unseal(params, ctx.options.secrets, run_id=run.run_id)  # values never stored
        redactor = ctx.redactor.with_secrets(
            [
                *secret_strings(params),
                *secret_strings(list(ctx.options.secrets.values()), secret=True),
                *_agent_env_values(plan),
            ]
        )
        return cls(
            run=run,
            plan=plan,
            params=params,
            redactor=redactor,
            hasher=InputHasher(redactor, state_dir=ctx.store.state_dir),
            executors=UnitExecutors(
                plan_limit=plan.execution.max_concurrency,
                cap=ctx.options.max_concurrency,
                external=ctx.options.executor,
                lone_inline=ctx.options.lone_units_inline,
            ),
            reopened=run.status == "failed",
            fork_index=fork_index,
            positions=positions,
        )

    @property
    def run_id(self) -> str:
        """The run being driven."""
        return self.run.run_id

    @property
    def source_dir(self) -> str | None:
        """The folder of the run's source file (where bare ``python:`` modules live)."""
        return str(Path(self.run.source_path).parent) if self.run.source_path else None

    def runner(self, ctx: DriveContext, name: str) -> Runner:
        """This run's runner ``name``."""
        return ctx.runners.get(self.plan, name, source_dir=self.source_dir)

    def reexecutes(self, step: PlanStep) -> bool:
        """Whether this run is a fork and ``step`` is at or after its fork step."""
        if self.fork_index is None:
            return False
        return self.positions[step.id] >= self.fork_index

    def should_stop(self, ctx: DriveContext) -> bool:
        """A signal or a stop request (polled at most every ``STOP_POLL_S``) ends the drive."""
        signal = ctx.options.signal
        if signal is not None and signal.is_set():
            self.stats.stopped_by = "signal"
            return True
        now = time.monotonic()
        if now - self.last_stop_poll >= STOP_POLL_S:
            self.last_stop_poll = now
            if ctx.store.is_stop_requested(self.run.root_run_id):
                self.stats.stopped_by = "stop_request"
                return True
        return False


def _agent_env_values(plan: Plan) -> list[str]:
    """The values of the variables agent steps pass through (``pass_env``): an agent may echo
    them anywhere, so they are masked wherever they would be journaled."""
    names = {n for step in plan.steps if step.kind == "agent" for n in step.pass_env}
    return [os.environ[n] for n in sorted(names) if n in os.environ]
