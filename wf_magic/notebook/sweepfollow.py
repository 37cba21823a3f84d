"""The static grid of a ``%%sweep`` cell that follows its sweep while the kernel lives.

Shown with a display id, it polls the sweep's cells counted by status (one aggregate query;
the sweep's row too while it reads ``running`` or once the counts moved) on a clock thread and
repaints when they changed — a ``wf sweep-resume`` in a terminal, another kernel, a later cell
— until the sweep settled with nothing owed. It is plain text and HTML: no widget model, so
nothing of it is left in the kernel or in a saved notebook's widget state.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..errors import UsageError
from ..sweeps.handle import Sweep
from .throttle import COST_FACTOR, Ticker

OWED = ("pending", "active", "blocked")
"""Cell statuses a later drive or decision can still change."""
MOVABLE = ("running", "stopped")
"""Sweep statuses a later drive (``wf sweep-resume``, a re-run cell) can still change."""
POLL_S = 1.0
"""How often the clock polls the sweep's cell counts."""
MAX_FAILURES = 5
"""Polls that may fail in a row (a read racing a writer) before the output stops following."""

log = logging.getLogger("wf_magic")


class SweepOutput:
    """A sweep's static grid in one output (display id), repainted as the sweep changes.

    Args:
        sweep: the sweep shown.
        below: HTML shown under the grid (a background sweep's opened cell's run view).
        poll_s: the clock's interval (each tick is at most two cheap reads).
    """

    def __init__(self, sweep: Sweep, *, below: str = "", poll_s: float = POLL_S):
        self.sweep = sweep
        self.below = below
        self.handle: Any = None
        """The output this grid is shown in (``display(..., display_id=True)``'s handle)."""
        self.repaints = 0
        self.clock = Ticker(self._tick_safely, interval_s=poll_s)
        self._counts: tuple[tuple[str, int], ...] | None = None
        self._shown: tuple[object, ...] | None = None
        self._status: str | None = None
        self._next_poll = 0.0
        self._failures = 0
        self._lock = threading.Lock()  # a repaint from the main thread and the clock's

    @property
    def is_following(self) -> bool:
        """Whether the clock still polls the sweep."""
        return self.clock.is_running

    def bundle(self) -> dict[str, str]:
        """The grid as text and HTML (what every front end, and a saved notebook, shows)."""
        return {
            "text/plain": repr(self.sweep),
            "text/html": self.sweep._repr_html_() + self.below,
        }

    def show(self) -> None:
        """Display the grid in a new output (from the main thread) and follow the sweep."""
        from IPython.display import display

        with self._lock:
            key, settled = self._read()
            shown = self.bundle()
            self.handle = display(shown, raw=True, display_id=True)  # type: ignore[no-untyped-call]
            self._shown = key
            self._observe(settled)

    def attach(self, handle: Any) -> None:
        """Show the grid in the existing output ``handle`` and follow the sweep."""
        self.handle = handle
        self.poll(force=True)

    def poll(self, *, force: bool = False) -> bool:
        """Read the sweep's cell counts; repaint when what the grid shows changed, and stop
        following once the sweep settled with nothing owed. Returns whether it repainted."""
        with self._lock:
            counts = self.sweep._store.sweep_cell_counts(self.sweep.sweep_id)
            if not force and counts == self._counts and self._status not in ("running", None):
                return False  # nothing moved: the row is read only while a drive may change it
            key, settled = self._read(counts)
            repainted = force or key != self._shown
            if repainted:
                started = time.monotonic()
                self.handle.update(self.bundle(), raw=True)
                self._shown = key
                self.repaints += 1
                # A big grid costs more to draw: poll less often (at most a fifth of the time).
                self._next_poll = started + COST_FACTOR * (time.monotonic() - started)
            self._observe(settled)
            return repainted

    def _read(
        self, counts: tuple[tuple[str, int], ...] | None = None
    ) -> tuple[tuple[object, ...], bool]:
        """(what the grid shows of the sweep, as a value; whether it settled with nothing
        owed), from its cell counts and its row."""
        store, sweep_id = self.sweep._store, self.sweep.sweep_id
        if counts is None:
            counts = store.sweep_cell_counts(sweep_id)
        row = self.sweep.row  # UsageError when the sweep is gone: the clock stops
        self._counts, self._status = counts, row.status
        owed = sum(n for status, n in counts if status in OWED)
        return (row.status, row.status_reason, counts), row.status not in MOVABLE and not owed

    def _observe(self, settled: bool) -> None:
        if settled:
            self.clock.stop()  # no drive or decision can change it any more
        else:
            self.clock.start()

    def stop(self) -> None:
        """Stop following (the output keeps its last grid)."""
        self.clock.stop()

    def _tick_safely(self) -> None:
        if time.monotonic() < self._next_poll:
            return
        try:
            self.poll()
            self._failures = 0
        except UsageError:  # the sweep is gone (its state dir replaced, say): nothing to follow
            self.clock.stop()
        except Exception:  # a clock must never print into a cell; a broken read stops it
            self._failures += 1
            log.exception("following sweep %s failed", self.sweep.sweep_id)
            if self._failures >= MAX_FAILURES:
                self.clock.stop()


class FollowedSweep(Sweep):
    """The ``Sweep`` a ``%%sweep`` cell evaluates to when its grid above follows the sweep.

    Its first display (the cell's own value) shows nothing: the output above is its display,
    and a grid printed once would go stale. Shown again later (``s`` in another cell), it is
    the static grid of that moment.
    """

    def __init__(self, sweep: Sweep, output: SweepOutput):
        super().__init__(sweep._store, sweep.sweep_id, skipped=sweep.skipped)
        self.output = output
        self._is_shown = False

    def _ipython_display_(self) -> None:
        if not self._is_shown:
            self._is_shown = True
            return
        from IPython.display import display

        display(self.output.bundle(), raw=True)  # type: ignore[no-untyped-call]
