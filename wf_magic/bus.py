"""Engine events for in-process observers (widgets, progress printers).

Observers are plain callables taking one :class:`Event`. Most events are delivered from the
driving thread after the matching journal write committed; ``unit_text`` is the exception: it
comes from the worker thread running the unit, while the unit is still in flight, and nothing is
journaled for it. Observers must therefore be quick, thread-safe (poke a throttle, assign a
trait) and must not drive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EventKind = str
"""``step_started``, ``unit_started``, ``unit_reclaimed``, ``unit_finished``, ``unit_reused``,
``gate_verdict``, ``gate_rejected``, ``step_status``, ``run_status``, ``warning``, and
``unit_text`` (a watched prompt unit's streamed text so far, in ``data["text"]``, redacted;
emitted from the worker thread, never journaled)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Something that happened to a run."""

    kind: EventKind
    run_id: str
    step_id: str | None = None
    unit_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)


Observer = Callable[[Event], None]
_log = logging.getLogger("wf_magic")


class EventBus:
    """Fan events out to observers; a failing observer is dropped, never breaks a drive."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []
        self._lock = threading.Lock()

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Add ``observer``; returns a function that removes it."""
        with self._lock:
            self._observers.append(observer)

        def unsubscribe() -> None:
            with self._lock:
                if observer in self._observers:
                    self._observers.remove(observer)

        return unsubscribe

    def notify(
        self,
        kind: EventKind,
        *,
        run_id: str,
        step_id: str | None = None,
        unit_id: str | None = None,
        **data: Any,
    ) -> None:
        """Build and deliver an event, only when somebody listens."""
        if self._observers:
            self.emit(Event(kind=kind, run_id=run_id, step_id=step_id, unit_id=unit_id, data=data))

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to every observer."""
        with self._lock:
            observers = list(self._observers)
        for observer in observers:
            try:
                observer(event)
            except Exception:  # an observer bug must not lose journaled work
                _log.exception("event observer failed; removed")
                with self._lock:
                    if observer in self._observers:
                        self._observers.remove(observer)

    @property
    def has_observers(self) -> bool:
        """Whether anyone listens (lets the driver skip building events)."""
        return bool(self._observers)
