"""Live progress of a drive in a terminal: a line per step transition, one updating unit line.

An observer of engine events (it never drives). On a TTY the units of the running step are
one line rewritten in place at most ``MAX_REDRAWS_PER_S`` times a second; elsewhere (a pipe,
a CI log) only step transitions are printed, one plain line each. What a unit or a model
wrote (a streamed line, a note, a warning) has its control characters made visible.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TextIO

from .bus import Event
from .visible import visible_line

MAX_REDRAWS_PER_S = 10
_MARKS = {"completed": "✓", "failed": "✗", "skipped": "–", "blocked": "‖"}


@dataclass(slots=True)
class _StepUnits:
    done: int = 0
    running: int = 0
    failed: int = 0
    reused: int = 0
    text: str = ""
    """The last streamed line of a running unit (an agent's turns and tool uses)."""


class ProgressPrinter:
    """Prints step transitions and unit counts of the runs it observes.

    Args:
        stream: where to write (the CLI's stdout).
        tty: rewrite one unit line in place (True on a terminal).
    """

    def __init__(self, stream: TextIO, *, tty: bool):
        self.stream = stream
        self.tty = tty
        self._units: dict[tuple[str, str], _StepUnits] = {}
        self._live: tuple[str, str] | None = None
        self._drawn_at = 0.0
        self._line_open = False

    def __call__(self, event: Event) -> None:
        """Take one engine event (the bus calls this from the driving thread)."""
        if event.step_id is None:
            return
        key = (event.run_id, event.step_id)
        if event.kind == "step_started":
            self._units[key] = _StepUnits()
            self._live = key
        elif event.kind in ("unit_started", "unit_finished", "unit_reused"):
            self._count(key, event)
        elif event.kind == "unit_text" and event.data.get("text"):
            lines = str(event.data["text"]).strip().splitlines()
            self._units.setdefault(key, _StepUnits()).text = lines[-1][:60] if lines else ""
            self._draw_units(key, force=False)
        elif event.kind == "step_status" and event.data.get("status") in _MARKS:
            self._step_line(event)
        elif event.kind == "gate_rejected":
            self._line(f"  ↺ {event.step_id} loop {event.data.get('loop')} rejected")
        elif event.kind == "warning" and event.data.get("message"):
            self._line(f"  ! {event.step_id}: {event.data['message']}")

    def _count(self, key: tuple[str, str], event: Event) -> None:
        units = self._units.setdefault(key, _StepUnits())
        if event.data.get("phase") == "gate":
            return
        if event.kind == "unit_started":
            units.running += 1
        elif event.kind == "unit_reused":
            units.done += 1
            units.reused += 1
        else:
            units.running = max(0, units.running - 1)
            if event.data.get("status") == "failed":
                units.failed += 1
            else:
                units.done += 1
        self._draw_units(key, force=False)

    def _draw_units(self, key: tuple[str, str], *, force: bool) -> None:
        if not self.tty or key != self._live:
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < 1 / MAX_REDRAWS_PER_S:
            return
        self._drawn_at = now
        u = self._units[key]
        text = f"  … {key[1]}: {u.done} done, {u.running} running, {u.failed} failed"
        if u.reused:
            text += f" ({u.reused} reused)"
        if u.text and u.running:
            text += f" · {u.text}"
        self.stream.write("\r\x1b[2K" + visible_line(text))
        self.stream.flush()
        self._line_open = True

    def _step_line(self, event: Event) -> None:
        status = str(event.data.get("status"))
        units = self._units.get((event.run_id, event.step_id or ""))
        counts = ""
        if units is not None and (units.done + units.failed) > 1:
            counts = f" [{units.done} done" + (f", {units.failed} failed" if units.failed else "")
            counts += "]"
        note = event.data.get("note")
        tail = f" — {note}" if note else ""
        self._line(f"  {_MARKS[status]} {event.step_id} {status}{counts}{tail}")

    def _line(self, text: str) -> None:
        if self._line_open:
            self.stream.write("\r\x1b[2K")
            self._line_open = False
        self.stream.write(visible_line(text) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End an open unit line (a drive that stopped mid-step)."""
        if self._line_open:
            self.stream.write("\n")
            self.stream.flush()
            self._line_open = False
