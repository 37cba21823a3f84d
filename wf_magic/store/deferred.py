"""The Store's deferred writes (group commit): how a queue of finishes and event-bearing
writes runs in the next write transaction, in the order it was deferred in, its events
appended together (``Store._defer_write``, ``Store.defer_finish``, ``Store._write``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial

from . import journal
from .cellstarts import Event, append_events_txn


class EventWrite:
    """A deferred write and the events it appends (``Store._defer_write``)."""

    __slots__ = ("events", "fn")

    def __init__(self, fn: Callable[[sqlite3.Connection], object], events: tuple[Event, ...]):
        self.fn, self.events = fn, events

    def __call__(self, conn: sqlite3.Connection) -> object:
        return self.fn(conn)

    def with_events(self, conn: sqlite3.Connection) -> None:
        """The write and its events, in the caller's transaction (not deferred)."""
        self.fn(conn)
        append_events_txn(conn, self.events)


def run_deferred(
    conn: sqlite3.Connection, deferred: list[tuple[str, Callable[[sqlite3.Connection], object]]]
) -> None:
    """Run the deferred writes in order; the events of consecutive event-bearing writes are
    appended together, before the next write that takes an event id of its own (a finish),
    so ids keep the order the writes were deferred in. A finish followed by such writes (a
    sweep cell's unit, then its step and run status) leaves its bump of the event counter to
    their events' one bump."""
    events: list[Event] = []
    after: str | None = None
    for i, (_, write) in enumerate(deferred):
        if isinstance(write, EventWrite):
            write(conn)
            events.extend(write.events)
            continue
        if events:
            append_events_txn(conn, events, after_finish=after)
            events, after = [], None
        following = deferred[i + 1][1] if i + 1 < len(deferred) else None
        if isinstance(following, EventWrite) and following.events and is_finish(write):
            write(conn, bump=False)  # type: ignore[call-arg]
            after = write.keywords["attempt"].dispatch_id  # type: ignore[attr-defined]
        else:
            write(conn)
    if events:
        append_events_txn(conn, events, after_finish=after)


def is_finish(write: Callable[[sqlite3.Connection], object]) -> bool:
    """Whether ``write`` is a deferred finish (``Store.defer_finish``)."""
    return isinstance(write, partial) and write.func is journal.queue_finish_txn
