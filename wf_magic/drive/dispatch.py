"""Dispatch one loop's units: resume/reuse lookups, budget, reserve → run → finish, retries.

The driver thread is the only journal writer; executors (threads, Dask) only run units.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any

from ..errors import MAX_RETRY_AFTER_S, BudgetExceeded, RunLockHeld, RunnerError
from ..runners.base import UnitResult
from ..runners.orphans import reap_orphan
from ..spec.kinds import KINDS
from ..spec.plan import PlanStep
from ..store.records import AttemptRow
from . import attempts, outcomes, resume
from .agentunits import cancel_agents, prior_session
from .children import ChildBlocked, ChildBudgetStop
from .context import DriveContext, RunState
from .endpoints import MODEL_KINDS, limiter_for, throttle_wait, throttled_too_long
from .executors import InlineExecutor
from .interrupts import delivered, is_real_interrupt
from .limiter import Limiter
from .modelloop import has_arun, submit_arun
from .requests import unit_request
from .spine import LoopWork, start_loop
from .units import UnitPlan

MAX_OUTPUT_BYTES = outcomes.MAX_OUTPUT_BYTES
OWED_LOOKUP_MAX = 500
"""Past this many owed units, their history is read with one scan of the step instead."""
SLOT_WAIT_S = 0.01
"""How long a drive waits before asking again for a slot other drives hold (a sweep's)."""


@dataclass(slots=True)
class _Job:
    index: int
    unit: UnitPlan
    reclaimed: AttemptRow | None = None
    tries: int = 0
    not_before: float = 0.0
    offer: int | None = None
    """Tokens reserved for this dispatch (``UnitRequest.max_tokens``); released on finish."""
    resume: dict[str, Any] | None = None
    """The session an agent unit of a ``session: continue`` loop resumes (agentunits.py)."""
    limiter: Limiter | None = None
    """The endpoint limiter slot this dispatch holds (drive/limiter.py), until its outcome."""
    resend: bool = False
    """The provider refused the attempt (``reclaimed``): it is sent again, unchanged."""
    started: float = 0.0
    """When the current attempt was first sent (monotonic): throttling counts against the
    step's ``timeout``."""


InlineRun = Callable[[PlanStep, UnitPlan, AttemptRow], UnitResult]
"""Runs a unit in the driver thread (route decisions, child workflows): the loop's own."""


def run_units(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    units: Sequence[UnitPlan],
    *,
    inline: InlineRun,
    judged: bool = False,
) -> LoopWork:
    """Produce every unit's output for one loop, dispatching only what the journal lacks.

    ``judged`` says the loop already has a journaled verdict: it is rebuilt from the journal
    exactly as it was judged, so its tolerated failures (``on_error: continue``) stay failures.
    """
    work = LoopWork.empty(len(units))
    # Resume fills in what the journal already answers, rendering only the units it must
    # (drive/resume.py); whole attempt rows are read just for the units still owed.
    owed = resume.settle(ctx, state, step, units, work)
    history = _history(ctx, state, step, [units[i].unit_id for i in owed])
    found = attempts.reuse_sources(ctx, state, [units[i] for i in owed])
    jobs: deque[_Job] = deque()
    for i in owed:
        unit = units[i]
        history_of = history.get(unit.unit_id, [])
        latest = history_of[-1] if history_of else None
        same_input = [a for a in history_of if a.input_hash in unit.input_hashes]
        if judged and same_input and same_input[-1].status == "failed":
            work.outputs[i] = None
            work.failures[unit.unit_id] = same_input[-1].failure or "failed"
            continue
        reclaim = None
        if latest is not None and latest.status == "running":
            if latest.input_hash in unit.input_hashes:
                reclaim = latest  # the driver died mid-unit: same attempt, same dispatch_id
            else:
                attempts.abandon(ctx, state, latest)
        if reclaim is None:
            reused = attempts.try_reuse(ctx, state, step, unit, found)
            if reused is not None:
                work.outputs[i] = _load(reused.output_json)
                continue
        tries = 0 if state.reopened else _retry_streak(history_of, unit.input_hashes)
        resume_from = prior_session(ctx, step, unit, history_of) if step.agent else None
        jobs.append(_Job(index=i, unit=unit, reclaimed=reclaim, tries=tries, resume=resume_from))
    if jobs:
        _schedule(ctx, state, step, jobs, work, inline)
    return work


def _history(
    ctx: DriveContext, state: RunState, step: PlanStep, unit_ids: list[str]
) -> dict[str, list[AttemptRow]]:
    """The attempts of the owed units, grouped by unit, in journal order."""
    if not unit_ids:
        return {}
    if len(unit_ids) > OWED_LOOKUP_MAX:  # most of the step is owed: one scan of the step
        return attempts.attempts_by_unit(ctx, state, step.id)
    out: dict[str, list[AttemptRow]] = {}
    for a in ctx.store.attempts_of_units(state.run_id, unit_ids):
        out.setdefault(a.unit_id, []).append(a)
    return out


def _retry_streak(attempts: list[AttemptRow], input_hashes: tuple[str, ...]) -> int:
    """Transient failures that ended this unit's latest tries (a crash does not reset them)."""
    streak = 0
    for attempt in reversed(attempts):
        if attempt.input_hash not in input_hashes or attempt.status == "running":
            continue
        if attempt.status != "failed" or not attempt.transient:
            break
        streak += 1
    return streak


def _schedule(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    jobs: deque[_Job],
    work: LoopWork,
    inline: InlineRun,
) -> None:
    """Run ``jobs`` through the step's executor, at most ``limit`` in flight.

    Group commit: the units that can start together are reserved in one transaction, and a
    finished unit's finish is deferred into that same transaction (``Store.defer_finish``);
    the deferred finishes are flushed before the driver waits on work in flight, and the last
    ones commit with the step's write: every finish is durable no later than what depends on
    it (every read flushes first; drive_run flushes before it returns).
    """
    executor, limit = state.executors.for_step(
        is_map=step.map is not None, threaded=step.kind == "agent"
    )
    in_flight: dict[Future[UnitResult], tuple[_Job, AttemptRow]] = {}
    finished: SimpleQueue[Future[UnitResult]] = SimpleQueue()
    """Futures as they complete (a done-callback each): no per-wait scan of those in flight."""
    # Slots shared with other drives (a sweep's cells); never for inline units (a child
    # workflow's drive would wait on the slot its parent's unit holds).
    slots = None if KINDS[step.kind].runs_inline else ctx.options.unit_slots
    held = 0
    halt = False
    try:
        while jobs or in_flight:
            free = limit - len(in_flight) if jobs and not halt else 0
            if free > 0 and slots is not None:
                got = slots.take(free)
                held, free = held + got, got
                if not got and not in_flight:
                    if state.should_stop(ctx):
                        work.stopped = halt = True
                    time.sleep(SLOT_WAIT_S)  # every slot is another cell's: wait for one
                    continue
            if free > 0:
                for job, attempt in _start_batch(ctx, state, step, jobs, work, free, in_flight):
                    launched = _launch(ctx, state, step, job, attempt, work, executor, inline)
                    if launched is None:
                        ctx.budget.release(job.offer)
                        _drop_hold(job)
                        halt = halt or work.budget_error is not None or bool(work.blocked)
                        continue
                    in_flight[launched] = (job, attempt)
                    launched.add_done_callback(finished.put)
                halt = halt or work.stopped or work.budget_error is not None
                if slots is not None and held > len(in_flight):
                    slots.give(held - len(in_flight))  # taken but not launched
                    held = len(in_flight)
            if in_flight:
                ctx.store.flush(state.run_id)  # nothing finished may wait on what runs
                for future in _completed(finished, timeout=0.5):
                    job, attempt = in_flight.pop(future)
                    if slots is not None:
                        slots.give()
                        held -= 1
                    if not _finish(ctx, state, step, job, attempt, future, work, jobs):
                        halt = halt or step.on_error == "fail"
                if step.agent and not work.stopped and in_flight and state.should_stop(ctx):
                    work.stopped = halt = True  # an agent may run for long: end it now
                    cancel_agents(ctx, state, [(j.unit, a) for j, a in in_flight.values()])
            elif jobs and not halt:
                ctx.store.flush(state.run_id)
                time.sleep(min(0.05, max(0.0, jobs[0].not_before - time.monotonic())))
            elif halt:
                break
    except BaseException as exc:
        # An interrupt: let in-flight units finish and journal them, then stop. A second one
        # (the stop was asked already, or it lands while waiting) stops at once: a unit that
        # never returns must not hold the driver; what is still running is owed.
        at_once = not isinstance(exc, KeyboardInterrupt) or state.should_stop(ctx)
        # An agent's process group is ended first: it could run for half an hour.
        cancel_agents(ctx, state, [(j.unit, a) for j, a in in_flight.values()])
        for future, (job, attempt) in list(in_flight.items()):
            if not at_once:
                try:
                    future.result()
                except KeyboardInterrupt:
                    at_once = True
                except BaseException:  # noqa: S110 - journaled below
                    pass
            if future.done() and not future.cancelled():
                _finish(ctx, state, step, job, attempt, future, work, deque())
        ctx.store.flush(state.run_id)
        raise
    finally:
        if slots is not None:
            slots.give(held)
        for future, (job, _attempt) in in_flight.items():
            future.cancel()  # a call on the model loop stops (a thread's runs on, abandoned)
            _drop_hold(job)  # outcomes never seen (a stop at once): the limiter forgets them
    # The last finishes stay deferred: the step's own write carries them (complete_step), or
    # the next read or write, or the flush at the end of the drive (drive_run).


def _completed(
    finished: SimpleQueue[Future[UnitResult]], *, timeout: float
) -> list[Future[UnitResult]]:
    """The futures that completed: waits up to ``timeout`` for one, then takes all there are."""
    try:
        done = [finished.get(timeout=timeout)]
    except Empty:
        return []
    while True:
        try:
            done.append(finished.get_nowait())
        except Empty:
            return done


def _next_ready(jobs: deque[_Job]) -> _Job | None:
    now = time.monotonic()
    for _ in range(len(jobs)):
        job = jobs.popleft()
        if job.not_before <= now:
            return job
        jobs.append(job)
    return None


def _start_batch(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    jobs: deque[_Job],
    work: LoopWork,
    free: int,
    in_flight: dict[Future[UnitResult], tuple[_Job, AttemptRow]],
) -> list[tuple[_Job, AttemptRow]]:
    """Take up to ``free`` ready jobs and reserve the fresh ones in one transaction.

    A unit that runs inline (a route, a child workflow) goes alone: the units of a batch are
    all handed to the executor at once, so none sits reserved while another runs.
    """
    budget = ctx.budget
    batch: list[_Job] = []
    while len(batch) < free:
        if state.should_stop(ctx):
            work.stopped = True
            break
        job = _next_ready(jobs)
        if job is None:
            break
        inline = KINDS[job.unit.kind].runs_inline
        if inline and batch:
            jobs.appendleft(job)
            break
        if not inline and not _hold(ctx, state, job, jobs):
            break  # the endpoint's limiter says not yet: the job waits for it, queued
        job.offer = budget.offer(slots=free - len(batch))
        if job.offer == 0 and (in_flight or batch):
            # Every unspent token is promised to units in flight: wait for one.
            budget.release(job.offer)
            _drop_hold(job)
            jobs.appendleft(job)
            break
        if job.reclaimed is None and job.unit.charged:
            try:
                budget.check(run_id=state.run_id, step_id=step.id, unit_id=job.unit.unit_id)
            except BudgetExceeded as exc:
                budget.release(job.offer)
                _drop_hold(job)
                work.budget_error = str(exc)
                ctx.emit("warning", run_id=state.run_id, step_id=step.id, message=str(exc))
                break
            shared = ctx.options.shared_budget
            if shared is not None and not shared.try_charge():
                # The sweep's ceiling: not a failure of this run, which stays owed.
                budget.release(job.offer)
                _drop_hold(job)
                jobs.appendleft(job)
                work.stopped = True
                state.stats.stopped_by = "shared_budget"
                break
            budget.charge_unit()  # counted now, so the next unit of the batch sees it
        batch.append(job)
        if inline:
            break
    fresh = [job for job in batch if job.reclaimed is None]
    for job in fresh:
        start_loop(ctx, state, step, job.unit.loop)
    rows = attempts.reserve_many(ctx, state, [job.unit for job in fresh]) if fresh else []
    if len(rows) < len(fresh):  # another driver of the sweep took its last units meanwhile
        batch = _cut_to_sweep_ceiling(ctx, state, batch, fresh[len(rows) :], jobs, work)
    reserved = iter(rows)
    out: list[tuple[_Job, AttemptRow]] = []
    for job in batch:
        attempt = job.reclaimed
        job.reclaimed = None
        if attempt is None:
            attempt = next(reserved)
        elif job.resend:  # the provider refused it: the same attempt goes out again
            job.resend = False
        else:  # a reclaim writes nothing until its outcome: a re-stop stays a no-op
            ctx.emit(
                "unit_reclaimed",
                run_id=state.run_id,
                step_id=step.id,
                unit_id=job.unit.unit_id,
                dispatch_id=attempt.dispatch_id,
            )
            # An exec or agent unit of the dead driver may still run: stop its process group first.
            note = reap_orphan(ctx.runners.state_dir, attempt.dispatch_id)
            if note is not None:
                ctx.emit("warning", run_id=state.run_id, step_id=step.id, message=note)
        out.append((job, attempt))
    return out


def _cut_to_sweep_ceiling(
    ctx: DriveContext,
    state: RunState,
    batch: list[_Job],
    cut: list[_Job],
    jobs: deque[_Job],
    work: LoopWork,
) -> list[_Job]:
    """The batch without the jobs the sweep's ceiling left unreserved (checked again in the
    reservation's transaction, so two drivers of one sweep share it exactly); those go back
    to the queue, owed, and the drive stops as on the in-process check."""
    for job in reversed(cut):
        ctx.budget.release(job.offer)
        _drop_hold(job)
        jobs.appendleft(job)
    shared = ctx.options.shared_budget
    if shared is not None:
        shared.reached = shared.reached or "max_units"  # the sweep settles the real one
    work.stopped = True
    state.stats.stopped_by = "shared_budget"
    return [job for job in batch if all(job is not c for c in cut)]


def _launch(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    job: _Job,
    attempt: AttemptRow,
    work: LoopWork,
    executor: Executor,
    inline: InlineRun,
) -> Future[UnitResult] | None:
    """Hand a reserved (or reclaimed) unit to its executor; None when it stopped the loop."""
    unit = job.unit
    job.tries += 1
    work.dispatched += 1
    if not job.started:
        job.started = time.monotonic()
    if KINDS[unit.kind].runs_inline:
        ctx.store.flush()  # a child's drive or a route decision may read this loop's journal
        future: Future[UnitResult] = Future()
        seen = delivered()
        try:
            future.set_result(inline(step, unit, attempt))
        except RunLockHeld:
            # A child driven elsewhere: this unit stays owed (its attempt running, reclaimed
            # by the next drive) and the drive ends naming the holder (exit 75).
            raise
        except ChildBudgetStop as exc:
            # The child stays as it is (failed on the shared budget) and so does this unit's
            # attempt: a re-drive re-stops exactly the same way and writes nothing.
            work.budget_error = str(exc)
            return None
        except ChildBlocked as exc:
            if state.should_stop(ctx):
                work.stopped = True  # the child stopped for the same stop request
            else:
                work.blocked = str(exc)
            return None
        except BaseException as exc:
            if is_real_interrupt(exc, seen):
                raise
            future.set_exception(exc)
        return future
    request = unit_request(
        state,
        step,
        unit,
        attempt,
        job.offer,
        ctx=ctx if isinstance(executor, ThreadPoolExecutor | InlineExecutor) else None,
        resume_from=job.resume,
    )
    seen = delivered()
    try:
        runner = state.runner(ctx, unit.runner)
    except BaseException as exc:  # a runner that cannot be built fails the attempt
        if is_real_interrupt(exc, seen):
            raise
        failed: Future[UnitResult] = Future()
        failed.set_exception(
            exc
            if isinstance(exc, RunnerError)
            else RunnerError(
                f"runner {unit.runner!r} could not be created: "
                f"{outcomes.unit_failure(exc, redact=state.redactor.redact)}",
                executed=False,
            )
        )
        return failed
    if (
        unit.kind in MODEL_KINDS
        and isinstance(executor, ThreadPoolExecutor | InlineExecutor)
        and has_arun(runner)
    ):
        return submit_arun(runner, request)  # a coroutine on the model loop, no thread
    return executor.submit(runner.run, request)


def _finish(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    job: _Job,
    attempt: AttemptRow,
    future: Future[UnitResult],
    work: LoopWork,
    jobs: deque[_Job],
) -> bool:
    """Journal a finished unit; returns False when it failed for good."""
    offer, job.offer = job.offer, None
    ctx.budget.release(offer)
    raised = future.exception()
    limiter, job.limiter = job.limiter, None
    if limiter is not None:
        resent, raised = _after_call(ctx, state, step, job, attempt, future, limiter, raised, jobs)
        if resent:
            return True
    if raised is None:
        try:
            # Checked before it is redacted or journaled (drive/outcomes.py): an output the
            # journal cannot hold unchanged fails the attempt here, for every runner kind.
            result = outcomes.checked_result(future.result())
            output = state.redactor.redact_value(result.output)
            output_json = outcomes.bounded_json(output)
        except RunnerError as problem:
            raised = problem
        else:
            attempts.finish_ok(ctx, state, attempt, result, output_json, defer=True, offer=offer)
            work.outputs[job.index] = output
            return True
    exc = outcomes.unit_failure(raised, redact=state.redactor.redact)
    failure = attempts.finish_error(ctx, state, attempt, exc, defer=True, offer=offer)
    retry = step.retry
    if exc.transient and job.tries < retry.max_attempts:
        # Jittered up to a quarter more, so units that failed together do not come back
        # together; never less than the documented wait.
        wait_s = retry.backoff_s * (2 ** (job.tries - 1)) * random.uniform(1.0, 1.25)  # noqa: S311
        # A provider's Retry-After is honoured (bounded: a bogus hour must not park the drive).
        wait_s = max(wait_s, min(exc.retry_after_s or 0.0, MAX_RETRY_AFTER_S))
        job.not_before = time.monotonic() + wait_s
        jobs.append(job)
        return True
    work.failures[job.unit.unit_id] = failure
    work.budget_error = work.budget_error or getattr(raised, "budget_stop", None)  # the bridge
    work.executed_failure = work.executed_failure or exc.executed
    work.outputs[job.index] = None
    return False


def _hold(ctx: DriveContext, state: RunState, job: _Job, jobs: deque[_Job]) -> bool:
    """Take a slot of the job's endpoint limiter; False (the job queued again) when refused."""
    limiter = limiter_for(ctx, state, job.unit)
    if limiter is None:
        return True
    wait_s = limiter.try_acquire()
    if wait_s > 0:
        job.not_before = time.monotonic() + wait_s
        jobs.appendleft(job)
        return False
    job.limiter = limiter
    return True


def _drop_hold(job: _Job) -> None:
    if job.limiter is not None:
        job.limiter.cancel()
        job.limiter = None


def _after_call(
    ctx: DriveContext,
    state: RunState,
    step: PlanStep,
    job: _Job,
    attempt: AttemptRow,
    future: Future[UnitResult],
    limiter: Limiter,
    raised: BaseException | None,
    jobs: deque[_Job],
) -> tuple[bool, BaseException | None]:
    """Give back the job's limiter slot; queue a refused call to be sent again (True).

    A call the provider refused was not served: the attempt stays ``running`` and goes out
    again once the endpoint's pause ends — no attempt row, no unit charge, no ``retry:``
    spent. Throttled past the step's ``timeout``, it fails as a timeout (transient).
    """
    if not isinstance(raised, RunnerError) or not raised.throttled:
        tokens = 0
        if raised is None:
            result = future.result()
            tokens = int(result.tokens_in or 0) + int(result.tokens_out or 0)
        limiter.release(ok=True, tokens=tokens)
        return False, raised
    limiter.release(ok=False)
    wait_s = throttle_wait(
        ctx,
        state,
        limiter,
        raised,
        step_id=step.id,
        unit_id=job.unit.unit_id,
        dispatch_id=attempt.dispatch_id,
    )
    if throttled_too_long(job.started, wait_s, step.timeout_s):
        return False, RunnerError(
            f"timed out: throttled by the provider for longer than the step's timeout "
            f"({step.timeout_s:g}s); last refusal: {raised}",
            transient=True,
        )
    job.tries -= 1
    job.reclaimed = attempt
    job.resend = True
    job.not_before = time.monotonic() + wait_s
    jobs.append(job)
    return True, None


def _load(output_json: str | None) -> Any:
    return None if output_json is None else json.loads(output_json)
