"""A sweep driven on a thread of its own: ``engine.sweep(..., background=True)`` returns at once.

The handle is a :class:`~wf_magic.sweeps.handle.Sweep` like any other — its status, frame and
views read the journal, so they follow the cells as they settle — plus what a caller needs
of a drive it does not wait for: ``running``, ``wait()`` (re-raising what ended the drive)
and ``stop()`` (the graceful stop: cells in flight finish and are journaled, the rest stay
owed for ``sweep_resume``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ..store import Store
from .handle import Sweep


class BackgroundSweep(Sweep):
    """A :class:`Sweep` whose drive runs on a daemon thread."""

    def __init__(
        self,
        store: Store,
        sweep_id: str,
        *,
        drive: Callable[[], Sequence[str]],
        signal: threading.Event,
    ) -> None:
        super().__init__(store, sweep_id)
        self._signal = signal
        self.error: BaseException | None = None
        """What ended the drive, when it raised (``wait()`` raises it)."""
        self._thread = threading.Thread(
            target=self._drive, args=(drive,), name=f"wf-sweep-{sweep_id}", daemon=True
        )
        self._thread.start()

    def _drive(self, drive: Callable[[], Sequence[str]]) -> None:
        try:
            self.skipped = list(drive())
        except BaseException as exc:  # kept for wait(); a daemon thread must not print it
            self.error = exc

    @property
    def running(self) -> bool:
        """Whether the drive is still going."""
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> BackgroundSweep:
        """Wait for the drive to end (at most ``timeout`` seconds); returns this handle.

        Raises:
            WorkflowError: what ended the drive, when it raised.
            TimeoutError: the drive is still going after ``timeout``.
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"sweep {self.sweep_id} is still being driven")
        if self.error is not None:
            raise self.error
        return self

    def stop(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Stop the drive gracefully: cells in flight finish, the others stay owed."""
        self._signal.set()
        if wait:
            self._thread.join(timeout)

    def __repr__(self) -> str:
        state = "driving" if self.running else "driven"
        return f"{super().__repr__()[:-1]} {state}>"
