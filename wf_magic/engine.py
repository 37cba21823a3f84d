"""The Engine facade: start, drive, resume, approve, reject, abandon, fork, stop, gc, frames."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import integrity
from .budget import Budget
from .decisions import decide
from .errors import (
    PlanVersionError,
    UsageError,
)
from .events import Event, EventBus, Observer
from .frame_methods import FrameMethods
from .locking import RunLock, is_locked
from .redact import Redactor
from .runners.base import UnitResult
from .runrows import RunRef, new_run_id, run_ref, run_row, scope_key
from .spec.freeze import Workflow, load_workflow
from .spec.params import resolve_params
from .spec.plan import Plan, PlanStep
from .store import journal as jsql
from .store import runs as run_sql
from .store.db import DB_FILENAME, default_state_dir, immediate, open_state_db
from .store.records import AttemptRow, RunRow, StepRow

if TYPE_CHECKING:
    from .drive import Driver, DriveStats
    from .run import Run
    from .units import UnitPlan

T = TypeVar("T")


class Engine(FrameMethods):
    """Everything wf_magic does, as plain Python; the CLI and the magics are thin shells.

    Args:
        state_dir: where ``state.db`` and the run locks live (default ``$WF_MAGIC_HOME`` or
            ``./.wf_magic``).
        namespace: where bare ``python:`` targets are looked up (a notebook's namespace).
        library: child workflow sources by name.
        durability: ``normal`` (WAL, synchronous=NORMAL) or ``full`` (synchronous=FULL).
        max_concurrency: a cap on map units in flight (the plan's own cap also applies).
        executor: a ``concurrent.futures.Executor`` that runs units (e.g. a Dask client's).
    """

    def __init__(
        self,
        state_dir: str | Path | None = None,
        *,
        namespace: Mapping[str, Any] | None = None,
        library: Mapping[str, str] | None = None,
        durability: str = "normal",
        max_concurrency: int | None = None,
        executor: Executor | None = None,
    ):
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.db_path = self.state_dir / DB_FILENAME
        self.lock_dir = self.state_dir / "locks"
        self.namespace = namespace
        self.library: dict[str, str] = dict(library or {})
        self.durability = durability
        self.max_concurrency = max_concurrency
        self.executor = executor
        self.bus = EventBus()
        self.redactor = Redactor.from_environ()
        self._conn: sqlite3.Connection | None = None
        self._db_lock = threading.RLock()

    # -- storage ----------------------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        """The engine's connection (opened and migrated on first use)."""
        with self._db_lock:
            if self._conn is None:
                self._conn = open_state_db(self.db_path, durability=self.durability)
            return self._conn

    def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in one BEGIN IMMEDIATE transaction."""
        with self._db_lock:
            with immediate(self.conn) as conn:
                return fn(conn)

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` for reading."""
        with self._db_lock:
            return fn(self.conn)

    def close(self) -> None:
        """Close the database connection."""
        with self._db_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- events -----------------------------------------------------------------------------
    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Receive engine events in-process; returns an unsubscribe function."""
        return self.bus.subscribe(observer)

    def emit(
        self,
        kind: str,
        *,
        run_id: str,
        step_id: str | None = None,
        unit_id: str | None = None,
        **data: Any,
    ) -> None:
        """Deliver an event to observers (no-op when nobody listens)."""
        if self.bus.has_observers:
            self.bus.emit(
                Event(kind=kind, run_id=run_id, step_id=step_id, unit_id=unit_id, data=data)
            )

    # -- workflows and runs -----------------------------------------------------------------
    def load(self, source: str | Path, *, source_name: str | None = None) -> Workflow:
        """Freeze a workflow source (text or path) with this engine's library and namespace."""
        wf = load_workflow(
            source, library=self.library, namespace=self.namespace, source_name=source_name
        )
        self.library.setdefault(wf.name, wf.source)
        return wf

    def get_run(self, run_id: RunRef) -> RunRow:
        """The run row of ``run_id`` (an id or a ``Run`` handle).

        Raises:
            UsageError: no such run (close matches are suggested).
        """
        run_id = run_ref(run_id)
        row = self.read(lambda c: run_sql.get_run(c, run_id))
        if row is None:
            near = self.read(lambda c: run_sql.find_run_prefix(c, run_id))
            hint = f" Did you mean {', '.join(near)}?" if near else " `wf list` shows the runs."
            raise UsageError(f"No run {run_id!r} in {self.db_path}.{hint}", run_id=run_id)
        return row

    def resolve_run_id(self, run_id: RunRef) -> str:
        """The full id of ``run_id``: an id, a unique prefix of one, or a ``Run`` handle."""
        run_id = run_ref(run_id)
        if self.read(lambda c: run_sql.get_run(c, run_id)) is not None:
            return run_id
        near = self.read(lambda c: run_sql.find_run_prefix(c, run_id))
        if len(near) == 1:
            return near[0]
        return self.get_run(run_id).run_id

    def start(
        self,
        workflow: Workflow | str | Path,
        *,
        params: Mapping[str, Any] | None = None,
        new: bool = False,
        no_cache: bool = False,
        params_from_strings: bool = False,
    ) -> Run:
        """Find or create the run a (re-)run of ``workflow`` should drive (DESIGN.md §4).

        Nothing is dispatched; :meth:`drive` does that.

        Returns:
            A ``Run`` handle with ``created`` (False: an unchanged source found its scope's
            existing run) and ``warnings`` (e.g. which run a changed source superseded).

        Raises:
            DefinitionError: the source is invalid.
            UsageError: params are undeclared or invalid.
            RunLockHeld: the run to supersede is being driven.
        """
        wf = workflow if isinstance(workflow, Workflow) else self.load(workflow)
        resolved = resolve_params(wf.plan, params, from_strings=params_from_strings)
        scope = scope_key(wf.name, resolved)
        latest = self.read(lambda c: run_sql.latest_in_scope(c, scope))
        warnings: list[str] = []
        if latest is not None and not new and latest.plan_hash == wf.plan_hash:
            if latest.source_hash != wf.source_hash:
                warnings.append(
                    "the source changed only in ways that do not change the plan; "
                    f"continuing run {latest.run_id}"
                )
            return self._handle(latest.run_id, created=False, warnings=warnings)
        if latest is None or latest.status not in ("active", "blocked", "failed"):
            run_id = self.create_run(wf, resolved, scope=scope, use_cache=not no_cache)
            return self._handle(run_id, created=True, warnings=warnings)
        # Supersede under the old run's lock, in the same transaction as the new run's insert:
        # a driven run is refused (RunLockHeld) and nothing is half-written.
        run_id = new_run_id()
        with RunLock(self.lock_dir, latest.run_id):
            self.create_run(
                wf,
                resolved,
                scope=scope,
                use_cache=not no_cache,
                run_id=run_id,
                supersede=latest.run_id,
            )
        self.emit(
            "run_status", run_id=latest.run_id, status="abandoned", reason=f"superseded by {run_id}"
        )
        warnings.append(
            f"run {latest.run_id} was unfinished and is now abandoned (superseded by {run_id})"
        )
        return self._handle(run_id, created=True, warnings=warnings)

    def _handle(self, run_id: str, *, created: bool, warnings: list[str]) -> Run:
        from .run import Run

        handle = Run(self, run_id, created=created)
        handle.warnings.extend(warnings)
        return handle

    def create_run(
        self,
        wf: Workflow,
        params: dict[str, Any],
        *,
        run_id: str | None = None,
        supersede: str | None = None,
        **fields: Any,
    ) -> str:
        """Insert a new run of ``wf`` (``fields`` as :func:`wf_magic.runrows.run_row` takes).

        With ``supersede``, that run is abandoned in the same transaction.
        """
        run_id = run_id or new_run_id()
        row = run_row(wf, params, run_id=run_id, **fields)
        steps = [(s.id, i, s.kind, s.max_loops) for i, s in enumerate(wf.plan.steps)]

        def txn(conn: sqlite3.Connection) -> None:
            run_sql.insert_run_txn(conn, row, steps)
            if supersede is not None:
                run_sql.set_run_status_txn(
                    conn, supersede, "abandoned", reason=f"superseded by {run_id}"
                )

        self.write(txn)
        return run_id

    def set_run_status(
        self, run_id: str, status: str, *, reason: str | None = None, result_json: str | None = None
    ) -> None:
        """Write a run's status (the driver's run-state derivation and explicit verbs)."""
        self.write(
            lambda c: run_sql.set_run_status_txn(
                c, run_id, status, reason=reason, result_json=result_json
            )
        )
        self.emit("run_status", run_id=run_id, status=status, reason=reason)

    def run(
        self,
        source: Workflow | str | Path,
        *,
        params: Mapping[str, Any] | None = None,
        new: bool = False,
        no_cache: bool = False,
        max_steps: int | None = None,
        signal: threading.Event | None = None,
        params_from_strings: bool = False,
        max_retries: int = 0,
    ) -> Run:
        """Start (or find) the run for ``source`` and drive it; see :meth:`start`, :meth:`drive`."""
        wf = source if isinstance(source, Workflow) else self.load(source)
        started = self.start(
            wf,
            params=params,
            new=new,
            no_cache=no_cache,
            params_from_strings=params_from_strings,
        )
        handle = self.drive(
            started, max_steps=max_steps, signal=signal, max_retries=max_retries, live_source=wf
        )
        handle.warnings[:0] = started.warnings
        handle.created = started.created
        return handle

    # -- driving ----------------------------------------------------------------------------
    def drive(
        self,
        run_id: RunRef,
        *,
        max_steps: int | None = None,
        signal: threading.Event | None = None,
        max_concurrency: int | None = None,
        executor: Executor | None = None,
        live_source: Workflow | None = None,
        max_retries: int = 0,
    ) -> Run:
        """Drive a run until it completes, blocks, fails or is stopped.

        The run lock is taken before the plan is read; the plan hash and params hash are
        verified before anything is dispatched. With ``max_retries`` a run that failed on a
        unit that really ran is re-opened and its failed step retried, up to that many times
        (never after a gate outcome, a budget stop, a stop/abort or a unit that ran nothing).

        Raises:
            RunLockHeld: another driver holds the run.
            PlanIntegrityError: the stored plan or params were edited.
            PlanVersionError: the plan was written by a newer wf_magic.
        """
        from .drive import DriveOptions
        from .run import Run

        for label, value, low in (
            ("max_steps", max_steps, 1),
            ("max_concurrency", max_concurrency, 1),
            ("max_retries", max_retries, 0),
        ):
            if value is not None and value < low:
                raise UsageError(f"{label} must be >= {low} (got {value})")

        options = DriveOptions(
            max_steps=max_steps,
            signal=signal,
            max_concurrency=max_concurrency or self.max_concurrency,
            executor=executor or self.executor,
        )
        run_id = self.resolve_run_id(run_id)
        with RunLock(self.lock_dir, run_id):
            run = self.get_run(run_id)
            warnings = integrity.drift_warnings(run, live_source)
            stats = self._drive_locked(run, options, budget=None, depth=0)
            retries = 0
            while (
                retries < max_retries
                and stats.retryable_failure
                and stats.stopped_by is None
                and self.get_run(run_id).status == "failed"
            ):
                retries += 1
                warnings.append(
                    f"run-level retry {retries}/{max_retries} after: "
                    f"{self.get_run(run_id).status_reason}"
                )
                stats = self._drive_locked(self.get_run(run_id), options, budget=None, depth=0)
        handle = Run(self, run_id, stats=stats)
        handle.warnings.extend(warnings)
        return handle

    resume = drive

    def verified_plan(self, run: RunRow) -> tuple[Plan, dict[str, Any]]:
        """Decode a run's plan and params after checking their hashes and plan_version.

        An older plan this version cannot decode abandons the run (with how to start afresh).

        Raises:
            PlanIntegrityError: a hash mismatch (nothing is dispatched).
            PlanVersionError: a newer plan_version (left untouched) or an undecodable one.
        """
        try:
            return integrity.verify(run)
        except integrity.UndecodablePlan as exc:
            if run.status not in ("completed", "abandoned"):
                self.set_run_status(run.run_id, "abandoned", reason=exc.reason)
            raise PlanVersionError(
                f"Run {run.run_id}: {exc.reason}. The run was abandoned.", run_id=run.run_id
            ) from None

    def _drive_locked(
        self, run: RunRow, options: Any, *, budget: Budget | None, depth: int
    ) -> DriveStats:
        from .drive import Driver, DriveStats

        plan, params = self.verified_plan(run)
        if run.status in ("completed", "abandoned"):
            return DriveStats()
        if run.stop_requested and run.parent_run_id is None:
            self.write(lambda c: run_sql.set_stop_requested(c, run.run_id, False))
        # A failed run is re-opened in effect, not in a write: its status changes only if the
        # drive gets further, so re-driving a run that fails the same way writes nothing.
        reopened = run.status == "failed"
        if budget is None:
            budget = self._seed_budget(run, plan)
        driver = Driver(
            self, run, plan, params, budget=budget, options=options, depth=depth, reopened=reopened
        )
        full = plan.execution.durability == "full" and self.durability != "full"
        if full:  # this plan asked for power-loss safety: synchronous=FULL while it drives
            self.read(lambda c: c.execute("PRAGMA synchronous = FULL"))
        try:
            return driver.drive()
        finally:
            if full:
                self.read(lambda c: c.execute("PRAGMA synchronous = NORMAL"))

    def _seed_budget(self, run: RunRow, plan: Plan) -> Budget:
        root_plan = plan
        if run.root_run_id != run.run_id:
            root_plan = Plan.model_validate_json(self.get_run(run.root_run_id).plan_json)
        units, tokens, cost = self.read(lambda c: jsql.budget_usage(c, run.root_run_id))
        return Budget(
            root_run_id=run.root_run_id,
            spec=root_plan.budget,
            units=units,
            tokens=tokens,
            cost=cost,
        )

    def drive_child(
        self, driver: Driver, step: PlanStep, unit: UnitPlan, attempt: AttemptRow
    ) -> UnitResult:
        """Publish (once) and drive the child run of a ``workflow:`` unit (see children.py)."""
        from .children import drive_child

        return drive_child(self, driver, step, unit)

    def drive_locked(
        self, run: RunRow, options: Any, *, budget: Budget | None, depth: int
    ) -> DriveStats:
        """Drive ``run`` whose lock the caller holds (a child shares its root's budget)."""
        return self._drive_locked(run, options, budget=budget, depth=depth)

    # -- verbs ------------------------------------------------------------------------------
    def status(self, run_id: RunRef) -> Run:
        """A handle on the run (status, steps, result, frames)."""
        from .run import Run

        return Run(self, self.resolve_run_id(run_id))

    def list_runs(
        self, *, include_children: bool = False, limit: int | None = None
    ) -> list[RunRow]:
        """Runs, newest first."""
        return self.read(
            lambda c: run_sql.list_runs(c, include_children=include_children, limit=limit)
        )

    def steps(self, run_id: RunRef) -> list[StepRow]:
        """The step rows of a run, in plan order."""
        rid = run_ref(run_id)
        return self.read(lambda c: run_sql.steps_of(c, rid))

    def attempts(self, run_id: RunRef) -> list[AttemptRow]:
        """The journal of a run, in order."""
        rid = run_ref(run_id)
        return self.read(lambda c: jsql.attempts_of(c, rid))

    def abandon(self, run_id: RunRef, *, reason: str = "abandoned by user") -> None:
        """Give up a run (refused while another driver holds it, or once it completed).

        Raises:
            RunLockHeld: the run is being driven.
            UsageError: the run already completed.
        """
        run_id = self.resolve_run_id(run_id)
        with RunLock(self.lock_dir, run_id):
            run = self.get_run(run_id)
            if run.status == "completed":
                raise UsageError(
                    f"Run {run_id} completed; there is nothing to abandon.", run_id=run_id
                )
            if run.status != "abandoned":
                self.set_run_status(run_id, "abandoned", reason=reason)

    def fork(self, run_id: RunRef, *, from_step: str) -> Run:
        """A new run with the same frozen plan reusing every result before ``from_step``.

        The fork is created, not driven: pass it to :meth:`drive`. An unfinished source is
        superseded by the fork (one unfinished run per scope).

        Raises:
            UsageError: ``from_step`` is not a step of the run's plan.
            RunLockHeld: the unfinished source is being driven.
        """
        source = self.get_run(self.resolve_run_id(run_id))
        plan, params = self.verified_plan(source)
        ids = [s.id for s in plan.steps]
        if from_step not in ids:
            raise UsageError(
                f"Run {source.run_id} has no step {from_step!r}; steps: {ids}", run_id=source.run_id
            )
        wf = Workflow(
            name=plan.name,
            source="",
            source_hash=source.source_hash,
            source_path=source.source_path,
            plan=plan,
            plan_json=source.plan_json,
            plan_hash=source.plan_hash,
        )
        run_id = new_run_id()
        unfinished = source.status in ("active", "blocked", "failed")
        with RunLock(self.lock_dir, source.run_id) if unfinished else contextlib.nullcontext():
            self.create_run(
                wf,
                params,
                run_id=run_id,
                supersede=source.run_id if unfinished else None,
                scope=source.scope_key,
                use_cache=True,
                forked_from=source,
                fork_step=from_step,
            )
        warnings = (
            [f"run {source.run_id} was unfinished and is now abandoned (superseded by {run_id})"]
            if unfinished
            else []
        )
        return self._handle(run_id, created=True, warnings=warnings)

    def approve(
        self, run_id: RunRef, step_id: str, *, feedback: str | None = None, loop: int | None = None
    ) -> int:
        """Record a person's approval of a blocked gate; the next drive continues the run.

        Returns:
            The loop the decision was recorded for.

        Raises:
            GateDecisionRefused: the step is not waiting (or not at ``loop``), or was decided.
        """
        return decide(
            self, run_id, step_id, complete=True, feedback=feedback or "", missing=(), loop=loop
        )

    def reject(
        self,
        run_id: RunRef,
        step_id: str,
        *,
        feedback: str,
        missing: tuple[str, ...] | list[str] = (),
        loop: int | None = None,
    ) -> int:
        """Record a person's rejection; the next drive re-executes the step with the feedback.

        Raises:
            GateDecisionRefused: the step is not waiting (or not at ``loop``), or was decided.
            UsageError: no feedback was given.
        """
        if not feedback or not feedback.strip():
            raise UsageError("a rejection needs feedback: say what to change (--feedback TEXT)")
        return decide(
            self,
            run_id,
            step_id,
            complete=False,
            feedback=feedback,
            missing=tuple(missing),
            loop=loop,
        )

    def stop(self, run_id: RunRef) -> None:
        """Ask the run's driver (anywhere) to stop gracefully between units."""
        run = self.get_run(self.resolve_run_id(run_id))
        self.write(lambda c: run_sql.set_stop_requested(c, run.root_run_id, True))

    def is_driving(self, run_id: RunRef) -> bool:
        """Whether a driver holds the run now."""
        return is_locked(self.lock_dir, run_ref(run_id))

    def gc(self, *, older_than_s: float) -> list[str]:
        """Delete finished root runs (and their children) older than the retention.

        Live runs (active/blocked) and runs held by a driver are never deleted.
        """
        if older_than_s < 0:
            raise UsageError("gc retention must be >= 0 seconds")
        cutoff = time.time() - older_than_s
        deleted = []
        for run_id in self.read(lambda c: run_sql.finished_runs_before(c, cutoff)):
            if is_locked(self.lock_dir, run_id):
                continue
            self.write(functools.partial(run_sql.delete_run_tree_txn, run_id=run_id))
            deleted.append(run_id)
        return deleted
