"""Coalesce bursts of pokes into at most a few calls a second, always with a trailing call."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 2.0
COST_FACTOR = 4.0
"""The interval grows to this many times the last call's duration, so a slow redraw (a huge
run) never takes more than about a fifth of the time it is throttling."""


class Throttle:
    """Call ``fn`` on a timer thread after pokes, no more often than every ``interval_s``.

    Every poke is eventually followed by a call that starts after it (the trailing call), so
    the last state is always shown. Calls never overlap.
    """

    def __init__(self, fn: Callable[[], None], *, interval_s: float = MIN_INTERVAL_S):
        self.fn = fn
        self.min_interval_s = interval_s
        self.interval_s = interval_s
        self.calls = 0
        self._lock = threading.Lock()
        self._call_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._last_start = float("-inf")
        self._closed = False

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def poke(self) -> None:
        """Ask for a call; returns at once (safe from any thread)."""
        with self._lock:
            if self._timer is not None or self._closed:
                return  # a pending call will start after this poke and see its state
            delay = max(0.0, self._last_start + self.interval_s - time.monotonic())
            timer = threading.Timer(delay, self._fire)
            timer.daemon = True
            timer.name = "wf-view-throttle"
            self._timer = timer
        timer.start()

    def _fire(self) -> None:
        with self._lock:
            self._timer = None
            if self._closed:
                return
            # Marked started under the same lock that clears the timer: a poke landing before
            # ``_call`` records its own start waits a full interval, not none.
            self._last_start = time.monotonic()
        self._call()

    def _call(self) -> None:
        with self._call_lock:
            started = time.monotonic()
            with self._lock:
                self._last_start = started
            try:
                self.fn()
            finally:
                self.calls += 1
                cost = time.monotonic() - started
                self.interval_s = min(MAX_INTERVAL_S, max(self.min_interval_s, COST_FACTOR * cost))

    def flush(self) -> None:
        """Call ``fn`` now in this thread, dropping a pending timer (its call would be stale)."""
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self._call()

    def close(self) -> None:
        """Cancel a pending call; later pokes do nothing."""
        with self._lock:
            self._closed = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()


class Ticker:
    """Call ``fn`` about every ``interval_s`` on a daemon thread between :meth:`start` and
    :meth:`stop` (the live clock of a run view: a tick assigns a few labels, no journal read).
    """

    def __init__(self, fn: Callable[[], None], *, interval_s: float = 1.0):
        self.fn = fn
        self.interval_s = interval_s
        self.ticks = 0
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None

    @property
    def is_running(self) -> bool:
        with self._lock:
            return self._stop is not None

    def start(self) -> None:
        """Start ticking (no-op while ticking)."""
        with self._lock:
            if self._stop is not None:
                return
            stop = self._stop = threading.Event()
        thread = threading.Thread(target=self._loop, args=(stop,), daemon=True, name="wf-clock")
        thread.start()

    def stop(self) -> None:
        """Stop ticking (idempotent); a tick in progress finishes."""
        with self._lock:
            stop, self._stop = self._stop, None
        if stop is not None:
            stop.set()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            self.fn()
            self.ticks += 1
