"""A drive as the facade asks for it: under the run's lock, with a fresh context and runners,
and run-level retries of a run that failed on a unit that really ran."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..bus import EventBus
from ..errors import StateDBError, UsageError
from ..locking import RunLock
from ..redact import Redactor
from ..spec.plan import Plan
from ..spec.workflow import Workflow
from ..store import Store
from ..store.leases import RunLease
from ..store.records import RunRow, StepRow
from . import interrupts
from .budget import seed_budget
from .context import DriveContext, DriveOptions, DriveStats, RunnerPool
from .integrity import drift_warnings, verified_plan
from .loop import drive_run


@dataclass(frozen=True, slots=True)
class FreshRun:
    """A run this driver just inserted, with its lock when taken before the insert (then
    nobody drove it since: ``run`` and ``steps`` are as written, its journal empty)."""

    run: RunRow
    steps: list[StepRow]
    lock: RunLock | RunLease | None = None


def drive_locked_run(
    store: Store,
    bus: EventBus,
    run_id: str,
    *,
    options: DriveOptions,
    redactor: Redactor,
    namespace: Mapping[str, Any] | None,
    max_retries: int = 0,
    live_source: Workflow | None = None,
    runners: RunnerPool | None = None,
    carry: bool = False,
    fresh: FreshRun | None = None,
) -> tuple[DriveStats, list[str]]:
    """Take the run's lock and drive it; returns the last drive's stats and the warnings.

    ``runners``: a pool shared by several drives (a sweep's cells), left open; by default
    each drive builds its own and closes it. ``carry``: the drive's last writes (a sweep
    cell's finish, step and run status) are left to the next write transaction (the next
    cell's reservation), and the run's lock is held until they commit
    (``Store.release_after_flush``): nobody else drives the run before they are durable.
    ``fresh``: the run as its driver inserted it; held by that driver since (``fresh.lock``),
    it is driven without a read of its row, steps or journal.

    Raises:
        RunLockHeld: another driver holds the run.
        PlanIntegrityError: the stored plan or params were edited.
        PlanVersionError: the plan was written by a newer wf_magic.
        StateDBError: the state database failed (full, locked, damaged); the run stays
            resumable, nothing half-written.
    """
    try:
        # In the main thread, count the interrupts delivered, so a unit's own
        # KeyboardInterrupt fails its attempt while a real one stops the drive.
        with interrupts.watching(), contextlib.ExitStack() as held:
            held_since_insert = fresh is not None and fresh.lock is not None
            lock = fresh.lock if fresh is not None and fresh.lock is not None else None
            if lock is None:
                lock = store.run_lock(run_id).acquire()
            held.callback(lock.release)
            if fresh is not None and held_since_insert:
                run, rows, has_attempts = fresh.run, list(fresh.steps), False
            else:
                # The run, its steps and whether it has any attempt, in one read: a run
                # without one has no journal to read until it writes some.
                found, rows, has_attempts = store.drive_view(run_id)
                if found is None:  # deleted between resolving the id and taking the lock
                    raise UsageError(f"No run {run_id!r} in {store.where}.", run_id=run_id)
                run = found
            warnings = drift_warnings(run, live_source)
            drive = _Drive(
                store, bus, options=options, redactor=redactor, namespace=namespace, runners=runners
            )
            with store.fresh_drive(run_id, fresh=not has_attempts):
                stats = drive.once(run, rows, flush=not (carry and max_retries == 0))
            retries = 0
            while retries < max_retries and stats.retryable_failure and stats.stopped_by is None:
                run = _row(store, run_id)
                if run.status != "failed":
                    break
                retries += 1
                warnings.append(
                    f"run-level retry {retries}/{max_retries} after: {run.status_reason}"
                )
                stats = drive.once(run)
            if carry:
                held.pop_all()
                store.release_after_flush(run_id, lock.release)
    except StateDBError as exc:  # a read that named no run (a frame, a lookup): name this one
        raise exc.for_run(run_id) from exc.__cause__
    return stats, warnings


class _Drive:
    """Builds a fresh context (budget seeded from the journal, new runner pool) per drive."""

    def __init__(
        self,
        store: Store,
        bus: EventBus,
        *,
        options: DriveOptions,
        redactor: Redactor,
        namespace: Mapping[str, Any] | None,
        runners: RunnerPool | None = None,
    ):
        self.store, self.bus, self.options = store, bus, options
        self.redactor, self.namespace = redactor, namespace
        self.shared_runners = runners

    def once(
        self, run: RunRow, rows: list[StepRow] | None = None, *, flush: bool = True
    ) -> DriveStats:
        """Drive ``run`` once; ``rows``: its step rows as just read under the lock;
        ``flush=False``: its deferred writes are left to the next write transaction."""
        plan, _ = verified_plan(self.store, self.bus, run)
        rows = _check_step_rows(self.store, run, plan, rows)
        ctx = DriveContext(
            store=self.store,
            bus=self.bus,
            runners=self.shared_runners
            or RunnerPool(
                state_dir=self.store.state_dir,
                namespace=self.namespace,
                journal=self.store.journal_url,
            ),
            budget=seed_budget(self.store, run, plan),
            redactor=self.redactor,
            options=self.options,
        )
        try:
            return drive_run(ctx, run, plan=plan, step_rows=rows, flush=flush)
        finally:
            if ctx.runners is not self.shared_runners:
                ctx.runners.close()


def _check_step_rows(
    store: Store, run: RunRow, plan: Plan, rows: list[StepRow] | None = None
) -> list[StepRow]:
    """The run's step rows (read here unless given), refused (before anything dispatches)
    when edited by hand into nonsense."""
    if rows is None:
        rows = store.steps_of(run.run_id)
    have = {r.step_id for r in rows}
    missing = [s.id for s in plan.steps if s.id not in have]
    if missing:
        raise store.unreadable(
            run.run_id, f"step row(s) {missing} are missing from its steps table"
        )
    for row in rows:
        try:
            if row.output_json is not None:
                json.loads(row.output_json)
        except ValueError:
            raise store.unreadable(
                run.run_id, f"step {row.step_id}'s stored output_json is not valid JSON"
            ) from None
    return rows


def _row(store: Store, run_id: str) -> RunRow:
    row = store.get_run(run_id)
    if row is None:  # deleted between resolving the id and taking the lock
        raise UsageError(f"No run {run_id!r} in {store.where}.", run_id=run_id)
    return row
