"""Event cursors for followers: a run's events after a durable cursor, followed until it settles.

The cursor is an event id. Event ids grow in commit order (every write is one ``BEGIN
IMMEDIATE`` transaction, so no event commits under a smaller id after a larger one is visible):
"every event with ``event_id > cursor``" misses nothing and repeats nothing, across processes and
restarts of the follower.

A run **settles** when no driver holds it (its own lock, or its root's: a child is driven by its
root's driver) and it is not ``active``, or has been ``active`` with no driver for ``idle_s``
seconds (a drive stopped by ``--max-steps``, a driver that died). The settle state is read
*before* each read of the events, so the last read after settling drains everything the
driver wrote.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from .run import RunRef
from .store import Store
from .store.records import EventRow, RunRow

PAGE = 1_000
"""Events read per query while following."""
POLL_S = 0.2
"""How often a follower looks for new events and the run's state."""
IDLE_S = 10.0
"""How long an ``active`` run may go without a driver before a follower stops."""


def events_after(
    store: Store, run_id: str, cursor: int = 0, *, limit: int | None = None
) -> list[EventRow]:
    """The events of ``run_id`` with ``event_id > cursor``, oldest first (at most ``limit``)."""
    out: list[EventRow] = []
    while limit is None or len(out) < limit:
        page = PAGE if limit is None else min(PAGE, limit - len(out))
        rows = store.events_after(run_id, cursor, page)
        out.extend(rows)
        if len(rows) < page:
            break
        cursor = rows[-1].event_id
    return out


def is_driven(store: Store, row: RunRow) -> bool:
    """Whether a driver holds ``row``'s run now: its own lock (or lease) or its root's."""
    if store.is_driven_now(row.run_id):
        return True
    return row.root_run_id != row.run_id and store.is_driven_now(row.root_run_id)


def follow_events(
    store: Store,
    run_id: str,
    *,
    cursor: int = 0,
    idle_s: float = IDLE_S,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[EventRow]:
    """Yield the events of ``run_id`` after ``cursor`` as they are committed, until the run
    settles (module docstring) or is deleted; each event's ``event_id`` is the next cursor."""
    idle_since: float | None = None
    while True:
        row = store.get_run(run_id)
        driven = row is not None and is_driven(store, row)
        for event in events_after(store, run_id, cursor):
            cursor = event.event_id
            yield event
        if row is None:
            return  # deleted (gc) while followed
        if driven:
            idle_since = None
        elif row.status != "active":
            return
        elif idle_since is None:
            idle_since = clock()
        elif clock() - idle_since >= idle_s:
            return
        sleep(poll_s)


class FollowVerbs:
    """The Engine's event cursors (``events_after``, ``follow_events``), as a mixin."""

    store: Store

    def resolve_run_id(self, run_id: RunRef) -> str:
        raise NotImplementedError

    def events_after(
        self, run_id: RunRef, cursor: int = 0, *, limit: int | None = None
    ) -> list[EventRow]:
        """The run's events with ``event_id > cursor``, oldest first, as ``EventRow`` records.

        The cursor is durable: pass the last record's ``event_id`` to get exactly the events
        committed since, in this process or another.
        """
        return events_after(self.store, self.resolve_run_id(run_id), cursor, limit=limit)

    def follow_events(
        self, run_id: RunRef, cursor: int = 0, *, idle_s: float = 10.0, poll_s: float = 0.2
    ) -> Iterator[EventRow]:
        """Yield the run's events after ``cursor`` as they are committed, until the run settles:
        no driver holds it and it is not active (or has been active with no driver for
        ``idle_s`` seconds). Each record's ``event_id`` is the cursor to resume from."""
        rid = self.resolve_run_id(run_id)
        return follow_events(self.store, rid, cursor=cursor, idle_s=idle_s, poll_s=poll_s)
