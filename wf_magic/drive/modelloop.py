"""The drive's model loop: one event loop, on its own daemon thread, for every model call.

A prompt or judge unit whose runner has ``async def arun(request) -> UnitResult`` runs as a
coroutine here instead of holding a worker thread for the length of its call: at 128 calls
in flight that is one thread waiting on 128 sockets, not 128 threads. Every run, sweep cell
and map of the process shares it, as they share the endpoints' limiters
(``drive/limiter.py``); the Engine drives through it, so a notebook cell, ``--background``,
the CLI and a sweep's cell threads all behave as before: each waits on its units' futures.

A runner with only ``run()`` (a third party's) keeps its worker threads; a unit sent to a Dask
cluster keeps ``run()`` too (the cluster's workers have their own processes). The loop is
started on first use and again in a forked child process; a drive never blocks it (a
runner's ``arun`` awaits its I/O and runs no long computation there).
"""

from __future__ import annotations

from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar, runtime_checkable

from ..runners.base import UnitRequest, UnitResult
from ..runners.bounded_http import AttemptLoop

T = TypeVar("T")


@runtime_checkable
class AsyncRunner(Protocol):
    """A runner that can be awaited: the optional half of the runner protocol."""

    def arun(self, request: UnitRequest) -> Coroutine[Any, Any, UnitResult]:
        """Run one attempt as a coroutine; raise ``RunnerError`` like ``run`` does."""
        ...


MODEL_LOOP = AttemptLoop("wf-model")
"""The process's model loop (a daemon thread named ``wf-model-runner-loop``)."""


def has_arun(runner: object) -> bool:
    """Whether ``runner`` offers an ``arun`` coroutine function that is its ``run``'s twin.

    A subclass that overrides ``run`` and not ``arun`` (a test double, a wrapper adding
    behaviour) is driven through its ``run``: the inherited ``arun`` would skip what it added.
    An instance whose ``arun`` attribute is None (set on it) opts out the same way.
    """
    import inspect

    if not inspect.iscoroutinefunction(getattr(runner, "arun", None)):
        return False
    own = vars(runner) if hasattr(runner, "__dict__") else {}
    if "run" in own:  # a run set on the instance
        return "arun" in own
    if "arun" in own:
        return True
    mro = type(runner).__mro__
    run_at = next((i for i, cls in enumerate(mro) if "run" in vars(cls)), len(mro))
    arun_at = next((i for i, cls in enumerate(mro) if "arun" in vars(cls)), len(mro))
    return arun_at <= run_at


def submit_arun(runner: object, request: UnitRequest) -> Future[UnitResult]:
    """``runner.arun(request)`` started on the model loop; cancelling its future cancels it.

    ``runner`` is one :func:`has_arun` said yes to.
    """
    assert isinstance(runner, AsyncRunner)  # noqa: S101 - has_arun checked it
    return MODEL_LOOP.submit(runner.arun(request))
