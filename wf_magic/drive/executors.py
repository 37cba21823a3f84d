"""Executors that run units: a thread pool on this machine, or a Dask cluster past it.

Any :class:`concurrent.futures.Executor` can be handed to ``Engine(executor=...)`` or
``Engine.drive(..., executor=...)``. The driver stays the only journal writer: it reserves
each attempt, submits ``runner.run(request)`` to the executor and journals the result when
the future completes, so an executor only ever runs units. How many units are in flight is
still bounded by the plan's ``execution.max_concurrency`` (and the caller's cap); the
executor decides where they run. The caller owns an executor it passes in: the engine never
shuts it down.

Dask is the optional extra ``wf_magic[dask]``; it is imported only when
:func:`dask_executor` is called.
"""

from __future__ import annotations

import importlib
import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import RunnerError, UsageError
from .interrupts import delivered, is_real_interrupt

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["InlineExecutor", "UnitExecutors", "dask_executor", "thread_executor"]

_DASK_MISSING = (
    "Dispatching units on Dask needs the `distributed` package, which is not installed; "
    "install the extra with `pip install 'wf_magic[dask]'`."
)


def thread_executor(max_workers: int) -> ThreadPoolExecutor:
    """A thread pool of ``max_workers`` threads named ``wf-unit_N``.

    Threads suit runners that wait on I/O (HTTP model calls, subprocesses). Shut the pool down
    (or use it as a context manager) when the drives that use it are over.

    Args:
        max_workers: threads in the pool, at least 1.

    Raises:
        UsageError: ``max_workers`` is below 1.
    """
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise UsageError(f"thread_executor expects max_workers >= 1 (got {max_workers!r})")
    return ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="wf-unit")


def dask_executor(client_or_address: Client | str) -> Executor:
    """An executor that runs units on a Dask distributed cluster.

    It submits through ``client.get_executor(pure=False)``. Given a ``distributed.Client``,
    the client stays yours to close; given a scheduler address (``"tcp://10.0.0.5:8786"``), a
    client is opened on it and closed when the executor is shut down (``with`` does that).

    Submissions are never *pure*: Dask would otherwise key a task by its arguments and could
    hand one result to two dispatches, while every dispatch must really run (sampling twice
    is a legitimate request). The runner and its request are pickled to the workers, so a
    runner that crosses machines must pickle and must find there what it needs (packages,
    credentials in the environment, files for ``exec`` units). A runner that does not pickle
    fails its attempt with a permanent ``RunnerError`` saying so, instead of crashing the drive.

    Args:
        client_or_address: a connected ``distributed.Client``, or a scheduler address.

    Raises:
        UsageError: ``distributed`` is not installed, or the argument is neither a client nor
            an address.
    """
    try:
        # Typed as Any: distributed ships no type hints, and may be absent when mypy runs.
        distributed: Any = importlib.import_module("distributed")
    except ImportError as exc:
        raise UsageError(_DASK_MISSING) from exc
    if isinstance(client_or_address, distributed.Client):
        return _DaskExecutor(client_or_address, owns_client=False)
    if isinstance(client_or_address, str) and client_or_address:
        return _DaskExecutor(distributed.Client(client_or_address), owns_client=True)
    raise UsageError(
        "dask_executor expects a distributed.Client or a scheduler address "
        f"(got {type(client_or_address).__name__})"
    )


class _DaskExecutor(Executor):
    """A Dask ``ClientExecutor`` that fails unpicklable units cleanly and may own its client."""

    def __init__(self, client: Any, *, owns_client: bool):  # a distributed.Client (untyped)
        self._client = client
        self._owns_client = owns_client
        self._inner: Executor = self._client.get_executor(pure=False)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        try:
            return self._inner.submit(fn, *args, **kwargs)
        except TypeError as exc:
            if "serializ" not in str(exc) and "pickle" not in str(exc):
                raise
            # Dask pickles the call in the driver thread; nothing ran anywhere.
            owner = type(getattr(fn, "__self__", fn)).__name__
            root: BaseException = exc
            while root.__cause__ is not None:
                root = root.__cause__
            future: Future[Any] = Future()
            future.set_exception(
                RunnerError(
                    f"{owner} cannot be sent to the Dask workers: it does not pickle ({root}). Run "
                    "this step without the Dask executor, or make the runner picklable (create "
                    "clients and locks on first use and leave them out of its pickled state).",
                    executed=False,
                )
            )
            return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        try:
            # ClientExecutor cancels what is pending when told not to wait.
            self._inner.shutdown(wait=wait and not cancel_futures)
        finally:
            if self._owns_client:
                self._client.close()


class InlineExecutor(Executor):
    """Runs each submitted call at once in the calling thread (concurrency 1, no threads).

    Whatever the call raises lands on its future, ``SystemExit`` and a ``KeyboardInterrupt``
    of the call's own included; only an interrupt delivered meanwhile propagates
    (:mod:`wf_magic.drive.interrupts`).
    """

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        seen = delivered()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            if is_real_interrupt(exc, seen):
                raise
            future.set_exception(exc)
        return future


class UnitSlots:
    """Units in flight counted across several drives (a sweep's cells): at most ``limit``.

    A drive takes slots before it reserves units and gives each back when its unit's outcome
    is in, so the cells of a sweep together never have more than ``limit`` units reserved
    and running, whatever executor runs them (a Dask cluster runs as many as it is given).
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._used = 0
        self._lock = threading.Lock()

    def take(self, wanted: int) -> int:
        """Take up to ``wanted`` free slots at once; how many were taken (maybe 0)."""
        with self._lock:
            got = max(0, min(wanted, self.limit - self._used))
            self._used += got
            return got

    def give(self, count: int = 1) -> None:
        """Give back ``count`` slots."""
        if count:
            with self._lock:
                self._used -= count


class UnitExecutors:
    """Where one run's units execute and how many at once: the one place that decides.

    A step that is not a map runs one unit at a time; a map runs up to the plan's
    ``max_concurrency`` (and the caller's cap) on the caller's executor, else on a thread
    pool this object owns (built on first use, shut down by :meth:`shutdown`), else inline.
    """

    def __init__(
        self,
        *,
        plan_limit: int,
        cap: int | None,
        external: Executor | None,
        lone_inline: bool = False,
    ):
        self.plan_limit = plan_limit
        self.cap = cap
        self.external = external
        self.lone_inline = lone_inline
        """A lone unit runs inline even with ``external`` set (see DriveOptions)."""
        self._pool: ThreadPoolExecutor | None = None
        self._solo: ThreadPoolExecutor | None = None

    def for_step(self, *, is_map: bool, threaded: bool = False) -> tuple[Executor, int]:
        """The executor for a step's units and the most units it may have in flight.

        ``threaded``: a lone unit runs on a worker thread too, so the driver keeps polling
        for a Stop while it runs (agent units, which may run for long).
        """
        limit = self.plan_limit if self.cap is None else min(self.plan_limit, self.cap)
        if not is_map:
            limit = 1
        if not is_map and not threaded and self.lone_inline:
            return InlineExecutor(), 1
        if self.external is not None:
            return self.external, max(1, limit)
        if limit <= 1 and threaded:
            if self._solo is None:
                self._solo = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wf-unit")
            return self._solo, 1
        if limit <= 1:
            return InlineExecutor(), 1
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="wf-unit")
        return self._pool, limit

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop the owned thread pools (a caller's executor is never shut down).

        ``wait=False`` (an interrupt) does not wait for units still running: a unit that never
        returns must not hold the driver, and its attempt stays owed to the next drive.
        """
        for pool in (self._pool, self._solo):
            if pool is not None:
                pool.shutdown(wait=wait, cancel_futures=True)
        self._pool = self._solo = None
