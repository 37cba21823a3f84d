"""The ``python`` runner: calls a frozen callable, refusing one whose source changed.

A step's ``timeout:`` binds the call: with a timeout set, the callable runs in a daemon
worker thread and the runner stops waiting for it at the deadline, failing the attempt with
a transient ``RunnerError`` (like an exec timeout). Python cannot kill a thread, so the
abandoned call may keep running, and its side effects with it, until it returns on its own
or the process exits; the driver never waits for it. Without a timeout the callable runs in
the calling thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..errors import RunnerError
from . import functions
from .base import BaseRunner, RunnerContext, UnitRequest, UnitResult

T = TypeVar("T")


def call_with_timeout(call: Callable[[], T], timeout_s: float | None, *, what: str) -> T:
    """``call()``, giving up on it after ``timeout_s`` seconds (None: no limit).

    The call runs in a daemon thread (with a copy of the caller's context variables) and its
    result or exception is handed back to the caller. Waiting for it stays interruptible, so
    a Ctrl-C still stops the drive.

    Raises:
        RunnerError: transient, naming ``what`` and the timeout, when the call overran; the
            thread is abandoned, not stopped.
    """
    if timeout_s is None:
        return call()
    context = contextvars.copy_context()
    finished = threading.Event()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = context.run(call)
        except BaseException as exc:  # handed to the caller, who decides
            outcome["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=work, name=f"wf-call {what}", daemon=True).start()
    if not finished.wait(timeout_s):
        raise RunnerError(
            f"{what} timed out after {timeout_s:g}s; the call was abandoned and its thread may "
            "still be running",
            transient=True,
        )
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value


class FunctionRunner(BaseRunner):
    """Runs ``python:`` units: ``fn(**kwargs)``; the return value must be a JSON value.

    An ``async def`` target is awaited: its coroutine runs to its end on an event loop of its
    own, in the unit's worker thread (``timeout:`` binds it like any call).

    ``request.timeout_s`` is enforced by abandoning the call (see the module docstring).
    """

    ANSWER_OPTIONS: frozenset[str] = frozenset(())
    """The runner takes no options (the target's source hash is in the input already)."""

    def __init__(
        self, namespace: Mapping[str, Any] | None = None, *, source_dir: str | None = None
    ):
        self.namespace = namespace
        self.source_dir = source_dir

    @classmethod
    def from_context(cls, ctx: RunnerContext) -> FunctionRunner:
        """Factory: targets are looked up in ``ctx.namespace`` besides the registry."""
        return cls(ctx.namespace, source_dir=ctx.source_dir)

    def run(self, request: UnitRequest) -> UnitResult:
        target = request.target or ""
        try:
            fn = functions.resolve(target, self.namespace, search_dir=self.source_dir)
        except functions.TargetError as exc:
            raise RunnerError(str(exc), executed=False) from exc
        current = functions.source_hash(fn)
        if request.target_hash and current != request.target_hash:
            raise RunnerError(
                f"python target {target!r} changed since this run's plan was frozen "
                f"(source hash {request.target_hash[:12]} → {current[:12]}); the run will not "
                "silently run new code. Start a new run (--new) to use it, or restore the "
                "function.",
                executed=False,
            )
        kwargs = dict(request.kwargs or {})

        def call() -> Any:
            try:
                value = fn(**kwargs)
                return _awaited(value) if inspect.isawaitable(value) else value
            except Exception as exc:
                raise RunnerError(
                    f"{target} raised {type(exc).__name__}: {_described(exc)}",
                    detail=own_traceback(exc),
                ) from exc

        # What it returns is checked by the driver, like every runner's output, before it is
        # journaled (drive/outcomes.py): valid UTF-8 text, JSON, finite, bounded.
        return UnitResult(output=call_with_timeout(call, request.timeout_s, what=target))


def _awaited(value: Any) -> Any:
    """What an ``async def`` target's coroutine returns, run to its end on a loop of its own
    (on another thread when this one already runs a loop, as a notebook kernel's does)."""

    async def wait() -> Any:
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = asyncio.run(wait())
        except BaseException as exc:  # handed to the caller, who decides
            outcome["error"] = exc

    thread = threading.Thread(target=work, name="wf-call async target", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _described(exc: Exception) -> str:
    """The message of ``exc`` on one line (a stand-in when its ``__str__`` fails)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return f"<{type(exc).__name__} whose message cannot be shown>"
    return " ".join(text.split())


_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


def own_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` in the step's own frames (wf_magic's are left out).

    Whole: the drive redacts it, then clips it (``drive.attempts.TRACEBACK_CHARS``), so a
    cut never leaves part of a secret the redactor would have masked.
    """
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not str(Path(frame.filename).resolve()).startswith(_PACKAGE_DIR)
    ]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip("\n")
