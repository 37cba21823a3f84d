"""``wf events`` as a stream: one line per event after a cursor, following a run until it settles.

Each line starts with (text) or carries (``"cursor"`` in JSON, ``event_id`` in CSV) its event's
id, the durable cursor; the last line, on stderr, is ``cursor: N``: ``--since N`` resumes after
everything printed. A line is flushed as soon as it is printed, so a follower killed at any
moment has printed exactly the cursors it passed; a Ctrl-C is held while a line prints, so the
final ``cursor:`` line names the last event printed, never one before or after it.
"""

from __future__ import annotations

import contextlib
import csv
import json
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .display.events import EVENT_COLUMNS, event_csv_row, event_json, event_text
from .exits import EXIT_INTERRUPTED, EXIT_OK

if TYPE_CHECKING:
    from .engine import Engine


def print_events(
    engine: Engine, run: str, *, since: int, follow: bool, idle_s: float, fmt: str
) -> int:
    """Print the run's events after ``since`` (following it when ``follow``) in ``fmt``
    (``table`` lines, ``json`` lines or ``csv`` rows), then ``cursor: N`` on stderr.

    Returns:
        0, or 130 after a Ctrl-C (the cursor line is printed either way).
    """
    cursor = since
    rows = (
        engine.follow_events(run, cursor, idle_s=idle_s)
        if follow
        else iter(engine.events_after(run, cursor))
    )
    writer = csv.writer(sys.stdout, lineterminator="\n") if fmt == "csv" else None
    if writer is not None:
        writer.writerow(EVENT_COLUMNS)
    interrupt = DeferredInterrupt()
    try:
        with interrupt:
            for row in rows:
                with interrupt.deferred():
                    if writer is not None:
                        writer.writerow(event_csv_row(row))
                    else:
                        print(json.dumps(event_json(row)) if fmt == "json" else event_text(row))
                    sys.stdout.flush()
                    cursor = row.event_id
    except KeyboardInterrupt:
        print(f"cursor: {cursor}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"cursor: {cursor}", file=sys.stderr)
    return EXIT_OK


class DeferredInterrupt:
    """While entered (on the main thread), SIGINT raises KeyboardInterrupt at once, except
    inside :meth:`deferred`, where it is held until the block ends."""

    def __init__(self) -> None:
        self._depth = 0
        self._pending = False
        self._installed = False
        self._previous: Any = None

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _on_sigint(self, signum: int, frame: object) -> None:
        if self._depth:
            self._pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A block a Ctrl-C does not cut in two: it is raised when the block ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._pending and not self._depth:
            self._pending = False
            raise KeyboardInterrupt
