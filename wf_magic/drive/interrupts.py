"""Tells an interrupt delivered to this process from a ``KeyboardInterrupt`` a unit raised.

A signal reaches Python only in the main thread, through its handler. While a drive runs
in the main thread, :func:`watching` wraps the SIGINT and SIGTERM handlers (those that are
Python callables) so each delivery is counted before the original handler runs. A unit run
in the main thread that ends in ``KeyboardInterrupt`` with no delivery counted meanwhile
raised it itself: its attempt fails and the drive goes on. With a delivery counted, it is
the user's interrupt and the drive stops (DESIGN.md §3.9). A ``KeyboardInterrupt`` from a
worker thread is always the unit's own: signals are never delivered there.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

WATCHED = (signal.SIGINT, signal.SIGTERM)


class _Deliveries:
    """The process's count of watched signals delivered (signals are per process)."""

    count = 0


def delivered() -> int:
    """How many watched signals were delivered so far (compare two readings)."""
    return _Deliveries.count


def note_delivery() -> None:
    """Count a delivery (a handler that raises ``KeyboardInterrupt`` itself may call it)."""
    _Deliveries.count += 1


def is_real_interrupt(exc: BaseException, seen: int) -> bool:
    """Whether ``exc`` is an interrupt delivered since ``delivered()`` read ``seen``."""
    return isinstance(exc, KeyboardInterrupt) and delivered() != seen


@contextmanager
def watching() -> Iterator[None]:
    """Count the deliveries of SIGINT/SIGTERM while the block runs (main thread only).

    Elsewhere, or for a signal whose handler is not a Python callable (``SIG_DFL``,
    ``SIG_IGN``), nothing is installed. The original handlers are put back after.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    installed: dict[int, tuple[Callable[[int, FrameType | None], Any], Any]] = {}
    for signum in map(int, WATCHED):
        previous = signal.getsignal(signum)
        if not callable(previous) or getattr(previous, "counts_deliveries", False):
            continue
        installed[signum] = (_counting(previous), previous)
        signal.signal(signum, installed[signum][0])
    try:
        yield
    finally:
        for signum, (handler, previous) in installed.items():
            if signal.getsignal(signum) is handler:
                signal.signal(signum, previous)


def _counting(
    previous: Callable[[int, FrameType | None], Any],
) -> Callable[[int, FrameType | None], Any]:
    def handler(signum: int, frame: FrameType | None) -> Any:
        note_delivery()
        return previous(signum, frame)

    handler.counts_deliveries = True  # type: ignore[attr-defined]
    return handler
