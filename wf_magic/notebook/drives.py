"""Drive runs from a kernel: in the foreground (interrupt = graceful stop) or in a thread."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine import Engine
from ..errors import UsageError, WorkflowError
from ..run import Run
from ..spec.workflow import Workflow

log = logging.getLogger("wf_magic")


@dataclass(slots=True)
class _Drive:
    """One drive running in a thread of this kernel."""

    run_id: str
    signal: threading.Event
    thread: threading.Thread
    handle: Run | None = None
    error: BaseException | None = None
    is_over: bool = False
    """The engine call returned (set before the after-drive callback runs)."""
    done: threading.Event = field(default_factory=threading.Event)
    """Set once the callback ran too: waiting on it sees the view's final state."""
    is_followable: bool = False
    """Started by a view's decision button: a cell driving the run follows it to its end
    instead of being refused (the notebook did not ask for a background drive)."""
    late: list[Callable[[], None]] = field(default_factory=list)
    """Called once the drive is over, for a foreground that stopped waiting for it."""
    late_lock: threading.Lock = field(default_factory=threading.Lock)

    def when_over(self, call: Callable[[], None]) -> None:
        """Call ``call`` once the drive is over (now, when it is already)."""
        with self.late_lock:
            if not self.is_over:
                self.late.append(call)
                return
        call()

    def call_late(self) -> None:
        """Run what :meth:`when_over` left for the drive's end (from its thread)."""
        with self.late_lock:
            late, self.late = self.late, []
        for call in late:
            try:
                call()
            except Exception:
                log.exception("after-drive call of %s failed", self.run_id)


class Drives:
    """The drives this kernel runs; every drive happens in a worker thread.

    The foreground waits for its thread: a kernel interrupt (KeyboardInterrupt in the main
    thread) sets the drive's stop signal, so the driver stops between units and never in the
    middle of a journal write; a second interrupt stops waiting (the thread still winds down).
    """

    def __init__(self, engine: Callable[[], Engine]):
        self._engine = engine
        self._drives: dict[str, _Drive] = {}
        self._lock = threading.Lock()

    def is_driving(self, run_id: str) -> bool:
        """Whether a thread of this kernel drives ``run_id`` now."""
        with self._lock:
            drive = self._drives.get(run_id)
        return drive is not None and not drive.is_over

    def is_followable(self, run_id: str) -> bool:
        """Whether this kernel drives ``run_id`` after a view's decision (see ``_Drive``)."""
        with self._lock:
            drive = self._drives.get(run_id)
        return drive is not None and not drive.is_over and drive.is_followable

    def _begin(
        self,
        run_id: str,
        *,
        max_steps: int | None,
        live_source: Workflow | None,
        on_done: Callable[[_Drive], None] | None,
        is_followable: bool = False,
    ) -> _Drive:
        engine = self._engine()

        def target() -> None:
            try:
                drive.handle = engine.drive(
                    run_id, max_steps=max_steps, signal=drive.signal, live_source=live_source
                )
            except BaseException as exc:  # handed to the waiter or logged below
                drive.error = exc
            finally:
                with drive.late_lock:
                    drive.is_over = True
                if on_done is not None:
                    try:
                        on_done(drive)
                    except Exception:
                        log.exception("after-drive callback failed")
                drive.call_late()
                drive.done.set()

        drive = _Drive(
            run_id=run_id,
            signal=threading.Event(),
            thread=threading.Thread(target=target, name=f"wf-drive-{run_id}", daemon=True),
            is_followable=is_followable,
        )
        with self._lock:
            current = self._drives.get(run_id)
            if current is not None and not current.is_over:
                raise UsageError(
                    f"Run {run_id} is already being driven in this kernel; "
                    f"wait for it or `%workflow stop {run_id}`.",
                    run_id=run_id,
                )
            self._drives[run_id] = drive
        drive.thread.start()
        return drive

    def foreground(
        self,
        run_id: str,
        *,
        max_steps: int | None = None,
        live_source: Workflow | None = None,
        when_over: Callable[[], None] | None = None,
    ) -> Run:
        """Drive ``run_id`` and wait; an interrupt stops it gracefully (the run stays active).

        ``when_over``: called from the drive's thread when it ends after a second interrupt
        stopped this wait (the cell's view then goes static without another cell).

        Raises:
            WorkflowError: whatever the drive raised (lock held, plan integrity, ...).
        """
        with self._lock:
            before = self._drives.get(run_id)
        try:
            drive = self._begin(run_id, max_steps=max_steps, live_source=live_source, on_done=None)
            interrupted = False
        except KeyboardInterrupt:
            # The interrupt landed while the thread was starting (Thread.start waits for it):
            # the drive it started, if any, must still stop gracefully.
            with self._lock:
                started = self._drives.get(run_id)
            if started is None or started is before:
                raise  # nothing was started
            drive, interrupted = started, True
            drive.signal.set()
            _say_interrupted(run_id)
        while not drive.done.is_set():
            try:
                drive.done.wait(0.1)
            except KeyboardInterrupt:
                if interrupted:
                    print(
                        f"Stopped waiting; run {run_id} stops after its units in flight.",
                        file=sys.stderr,
                    )
                    if when_over is not None:
                        drive.when_over(when_over)
                    return self._engine().status(run_id)
                interrupted = True
                drive.signal.set()
                _say_interrupted(run_id)
        if drive.error is not None:
            raise drive.error
        return drive.handle if drive.handle is not None else self._engine().status(run_id)

    def background(
        self,
        run_id: str,
        *,
        max_steps: int | None = None,
        live_source: Workflow | None = None,
        on_done: Callable[[Run | None, BaseException | None], None] | None = None,
        is_followable: bool = False,
    ) -> threading.Thread:
        """Drive ``run_id`` in a daemon thread; ``on_done(handle, error)`` runs in that thread.

        ``is_followable``: a cell that drives the run meanwhile waits for this drive.
        """

        def finished(drive: _Drive) -> None:
            if drive.error is not None and not isinstance(drive.error, WorkflowError):
                log.error("background drive of %s failed", run_id, exc_info=drive.error)
            if on_done is not None:
                on_done(drive.handle, drive.error)

        return self._begin(
            run_id,
            max_steps=max_steps,
            live_source=live_source,
            on_done=finished,
            is_followable=is_followable,
        ).thread

    def stop(self, run_id: str) -> bool:
        """Ask a drive of this kernel to stop between units; False when none runs."""
        with self._lock:
            drive = self._drives.get(run_id)
        if drive is None or drive.is_over:
            return False
        drive.signal.set()
        return True

    def wait(self, run_id: str, timeout: float | None = None) -> bool:
        """Wait for this kernel's drive of ``run_id`` to end; False on timeout."""
        with self._lock:
            drive = self._drives.get(run_id)
        return drive is None or drive.done.wait(timeout)

    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every drive of this kernel (unloading the extension)."""
        with self._lock:
            drives = list(self._drives.values())
        for drive in drives:
            drive.signal.set()
        for drive in drives:
            drive.done.wait(timeout)


def _say_interrupted(run_id: str) -> None:
    print(
        f"Interrupted: run {run_id} stops after the units in flight and stays active; "
        "re-run the cell (or `%workflow resume`) to continue.",
        file=sys.stderr,
    )


def driver_text(engine: Engine, run_id: str) -> str | None:
    """Who drives ``run_id`` from elsewhere (``driven by pid 4242 on host since 10:31:02``),
    or None when no driver holds its lock."""
    if not engine.is_driving(run_id):
        return None
    info = engine.store.lock_holder(run_id)
    if not info:
        return "driven by another process"
    since = info.get("since")
    stamp = f" since {time.strftime('%H:%M:%S', time.localtime(since))}" if since else ""
    host = f" on {info['host']}" if info.get("host") else ""
    return f"driven by pid {info.get('pid', '?')}{host}{stamp}"
