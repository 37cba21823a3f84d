"""Dispatch one loop's units: resume/reuse lookups, budget, reserve → run → finish, retries.

The driver thread is the only journal writer; executors (threads, Dask) only run units.
"""

from __future__ import annotations

import json
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import BudgetExceeded, RunnerError
from .runners.base import UnitRequest, UnitResult
from .runners.process import minimal_env
from .spec.plan import PlanStep
from .store.records import AttemptRow
from .units import UnitPlan

if TYPE_CHECKING:
    from .drive import Driver

MAX_OUTPUT_BYTES = 10_000_000


class ChildBlocked(Exception):
    """A child workflow run is blocked; its parent unit stays in flight."""


class ChildBudgetStop(Exception):
    """A child workflow run was stopped by the (shared) budget: a hard stop for the parent."""


class InlineExecutor(Executor):
    """Runs each submitted call at once in the calling thread (concurrency 1, no threads)."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


@dataclass(slots=True)
class _Job:
    index: int
    unit: UnitPlan
    reclaimed: AttemptRow | None = None
    tries: int = 0
    not_before: float = 0.0
    offer: int | None = None
    """Tokens reserved for this dispatch (``UnitRequest.max_tokens``); released on finish."""


@dataclass(slots=True)
class LoopWork:
    """Mutable result of one loop's dispatch."""

    outputs: list[Any]
    failures: dict[str, str]
    budget_error: str | None = None
    blocked: str | None = None
    stopped: bool = False
    dispatched: int = 0
    executed_failure: bool = False
    """Some unit failed after really running (a run-level retry may help)."""


_MISSING = object()


def run_units(
    driver: Driver, step: PlanStep, units: list[UnitPlan], *, judged: bool = False
) -> LoopWork:
    """Produce every unit's output for one loop, dispatching only what the journal lacks.

    ``judged`` says the loop already has a journaled verdict: it is rebuilt from the journal
    exactly as it was judged, so its tolerated failures (``on_error: continue``) stay failures.
    """
    work = LoopWork(outputs=[_MISSING] * len(units), failures={})
    history = driver.attempts_by_unit(step.id)
    jobs: deque[_Job] = deque()
    for i, unit in enumerate(units):
        attempts = history.get(unit.unit_id, [])
        done = next(
            (
                a
                for a in reversed(attempts)
                if a.input_hash == unit.input_hash and a.status in ("succeeded", "reused")
            ),
            None,
        )
        if done is not None:
            work.outputs[i] = _load(done.output_json)
            continue
        latest = attempts[-1] if attempts else None
        same_input = [a for a in attempts if a.input_hash == unit.input_hash]
        if judged and same_input and same_input[-1].status == "failed":
            work.outputs[i] = None
            work.failures[unit.unit_id] = same_input[-1].failure or "failed"
            continue
        reclaim = None
        if latest is not None and latest.status == "running":
            if latest.input_hash == unit.input_hash:
                reclaim = latest  # the driver died mid-unit: same attempt, same dispatch_id
            else:
                driver.abandon_attempt(latest)
        if reclaim is None:
            reused = driver.try_reuse(step, unit)
            if reused is not None:
                work.outputs[i] = _load(reused.output_json)
                continue
        tries = 0 if driver.reopened else _retry_streak(attempts, unit.input_hash)
        jobs.append(_Job(index=i, unit=unit, reclaimed=reclaim, tries=tries))
    if jobs:
        _schedule(driver, step, jobs, work)
    return work


def _retry_streak(attempts: list[AttemptRow], input_hash: str) -> int:
    """Transient failures that ended this unit's latest tries (a crash does not reset them)."""
    streak = 0
    for attempt in reversed(attempts):
        if attempt.input_hash != input_hash or attempt.status == "running":
            continue
        if attempt.status != "failed" or not attempt.transient:
            break
        streak += 1
    return streak


def _schedule(driver: Driver, step: PlanStep, jobs: deque[_Job], work: LoopWork) -> None:
    executor, limit = driver.executor_for(step)
    in_flight: dict[Future[UnitResult], tuple[_Job, AttemptRow]] = {}
    halt = False
    try:
        while jobs or in_flight:
            while jobs and len(in_flight) < limit and not halt:
                if driver.should_stop():
                    work.stopped = halt = True
                    break
                job = _next_ready(jobs)
                if job is None:
                    break
                job.offer = driver.budget.offer(slots=limit - len(in_flight))
                if job.offer == 0 and in_flight:
                    # Every unspent token is promised to units in flight: wait for one.
                    driver.budget.release(job.offer)
                    jobs.appendleft(job)
                    break
                started = _start(driver, step, job, work, executor)
                if started is None:
                    driver.budget.release(job.offer)
                    halt = work.budget_error is not None or bool(work.blocked)
                    continue
                in_flight[started[0]] = (started[1], started[2])
            if in_flight:
                done, _ = wait(list(in_flight), timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    job, attempt = in_flight.pop(future)
                    if not _finish(driver, step, job, attempt, future, work, jobs):
                        halt = halt or step.on_error == "fail"
            elif jobs and not halt:
                time.sleep(min(0.05, max(0.0, jobs[0].not_before - time.monotonic())))
            elif halt:
                break
    except BaseException:
        # An interrupt: let in-flight units finish and journal them, then stop.
        for future, (job, attempt) in list(in_flight.items()):
            try:
                future.result()
            except BaseException:  # noqa: S110 - journaled below or owed to the next drive
                pass
            if future.done() and not future.cancelled():
                _finish(driver, step, job, attempt, future, work, deque())
        raise


def _next_ready(jobs: deque[_Job]) -> _Job | None:
    now = time.monotonic()
    for _ in range(len(jobs)):
        job = jobs.popleft()
        if job.not_before <= now:
            return job
        jobs.append(job)
    return None


def _start(
    driver: Driver, step: PlanStep, job: _Job, work: LoopWork, executor: Executor
) -> tuple[Future[UnitResult], _Job, AttemptRow] | None:
    unit = job.unit
    attempt = job.reclaimed
    job.reclaimed = None
    if attempt is None:
        if unit.charged:
            try:
                driver.budget.check(run_id=driver.run.run_id, step_id=step.id, unit_id=unit.unit_id)
            except BudgetExceeded as exc:
                work.budget_error = str(exc)
                driver.emit("warning", step_id=step.id, message=str(exc))
                return None
        driver.before_dispatch(step, unit.loop)
        attempt = driver.reserve(unit)
    else:  # a reclaim writes nothing until its outcome: a re-stop stays a no-op
        driver.emit(
            "unit_reclaimed", step_id=step.id, unit_id=unit.unit_id, dispatch_id=attempt.dispatch_id
        )
    job.tries += 1
    work.dispatched += 1
    if unit.kind in ("workflow", "route"):
        future: Future[UnitResult] = Future()
        try:
            future.set_result(driver.run_inline(step, unit, attempt))
        except ChildBudgetStop as exc:
            # The child stays as it is (failed on the shared budget) and so does this unit's
            # attempt: a re-drive re-stops exactly the same way and writes nothing.
            work.budget_error = str(exc)
            return None
        except ChildBlocked as exc:
            if driver.should_stop():
                work.stopped = True  # the child stopped for the same stop request
            else:
                work.blocked = str(exc)
            return None
        except Exception as exc:
            future.set_exception(exc)
        return future, job, attempt
    request = _request(driver, step, unit, attempt, job.offer)
    try:
        runner = driver.runner(unit.runner)
    except (
        Exception
    ) as exc:  # a runner that cannot be built fails the attempt, never leaves it running
        failed: Future[UnitResult] = Future()
        failed.set_exception(
            exc
            if isinstance(exc, RunnerError)
            else RunnerError(f"runner {unit.runner!r} could not be created: {exc}", executed=False)
        )
        return failed, job, attempt
    return executor.submit(runner.run, request), job, attempt


def _request(
    driver: Driver, step: PlanStep, unit: UnitPlan, attempt: AttemptRow, job_offer: int | None
) -> UnitRequest:
    env: dict[str, str] = {}
    if unit.kind == "exec":
        item = (
            unit.item
            if isinstance(unit.item, str)
            else ("" if unit.item is None else json.dumps(unit.item))
        )
        env = minimal_env(
            step.pass_env,
            {
                "WF_RUN_ID": driver.run.run_id,
                "WF_STEP_ID": step.id,
                "WF_UNIT_ID": unit.unit_id,
                "WF_DISPATCH_ID": attempt.dispatch_id,
                "WF_ITEM": item,
            },
        )
    return UnitRequest(
        run_id=driver.run.run_id,
        step_id=step.id,
        unit_id=unit.unit_id,
        dispatch_id=attempt.dispatch_id,
        input_hash=unit.input_hash,
        attempt=attempt.attempt,
        kind=unit.kind if unit.kind in ("prompt", "exec", "python") else "prompt",  # type: ignore[arg-type]
        prompt=unit.prompt,
        argv=unit.argv,
        target=unit.target,
        kwargs=unit.kwargs,
        target_hash=step.target_hash,
        model=unit.model,
        output_schema=step.output,
        timeout_s=step.timeout_s,
        item=unit.item,
        index=unit.item_index,
        max_tokens=job_offer,
        env=env,
    )


def _finish(
    driver: Driver,
    step: PlanStep,
    job: _Job,
    attempt: AttemptRow,
    future: Future[UnitResult],
    work: LoopWork,
    jobs: deque[_Job],
) -> bool:
    """Journal a finished unit; returns False when it failed for good."""
    driver.budget.release(job.offer)
    job.offer = None
    exc = future.exception()
    if exc is None:
        result = future.result()
        problem = _oversize(result.output)
        if problem is None:
            work.outputs[job.index] = driver.finish_ok(attempt, result)
            return True
        exc = RunnerError(problem)
    if not isinstance(exc, RunnerError):
        if not isinstance(exc, Exception):
            raise exc
        exc = RunnerError(f"runner raised {type(exc).__name__}: {exc}")
    failure = driver.finish_error(attempt, exc)
    retry = step.retry
    if exc.transient and job.tries < retry.max_attempts:
        job.not_before = time.monotonic() + retry.backoff_s * (2 ** (job.tries - 1))
        jobs.append(job)
        return True
    work.failures[job.unit.unit_id] = failure
    work.executed_failure = work.executed_failure or exc.executed
    work.outputs[job.index] = None
    return False


def _oversize(output: Any) -> str | None:
    try:
        size = len(json.dumps(output, allow_nan=False))
    except ValueError:
        return "output contains NaN or Infinity, which JSON cannot hold; return finite numbers"
    except TypeError:
        return f"output of type {type(output).__name__} is not JSON-serialisable"
    if size > MAX_OUTPUT_BYTES:
        return f"output is {size} bytes, over the bound of {MAX_OUTPUT_BYTES} bytes"
    return None


def _load(output_json: str | None) -> Any:
    return None if output_json is None else json.loads(output_json)


def is_complete(work: LoopWork) -> bool:
    """Whether every unit has an output or a recorded failure."""
    return all(o is not _MISSING for o in work.outputs)
