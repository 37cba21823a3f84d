"""The widgets of one step row of the run view, and the small HTML pieces they show."""

from __future__ import annotations

import html
import threading
import time

import ipywidgets as w

from ..display import stacked_bar_html, step_badge, step_state, token_text
from .detail import StepDetail
from .snapshot import StepState

COLUMNS = ("step", "status", "progress", "units", "tokens", "elapsed", "loop", "note")
LIVE_TEXT_CHARS = 400
"""How much of an in-flight unit's streamed text its row shows (the end of it)."""


def elapsed_text(seconds: float | None) -> str:
    """``0.4 s``, ``12 s``, ``3 m 04 s``, ``1 h 02 m``."""
    if seconds is None:
        return ""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} m"


class StackedBar:
    """A step's progress: done, in flight and failed units side by side, out of ``max``.

    ``value``/``max`` read like an ``IntProgress``; the widget is an HTML bar, because a
    progress widget cannot stack the three counts.
    """

    def __init__(self) -> None:
        self.widget = w.HTML(stacked_bar_html(0, 0, 0, 1))
        self.value = self.running = self.failed = 0
        self.max = 1

    def show(self, *, done: int, running: int, failed: int, total: int) -> None:
        counts = (done, running, failed, total)
        if counts != (self.value, self.running, self.failed, self.max):
            self.value, self.running, self.failed, self.max = counts
            self.widget.value = stacked_bar_html(done, running, failed, total)


class StepRowWidgets:
    """The widgets of one step row (created once, then only their values change)."""

    def __init__(self, step_id: str, *, detail: StepDetail | None = None):
        self.name = w.HTML(f"<code>{html.escape(step_id)}</code>")
        self.detail = detail
        self.toggle = w.ToggleButton(
            icon="chevron-right",
            tooltip="show the step's units: input, output and verdict, loop by loop",
            layout=w.Layout(width="26px", height="22px", padding="0"),
        )
        self.toggle.observe(self._toggled, "value")
        self.name_cell = w.HBox([self.toggle, self.name], layout=w.Layout(align_items="center"))
        self.live = w.HTML()
        """The in-flight unit's streamed text (empty when nothing streams)."""
        self._live_text: str | None = None
        self.status = w.HTML()
        self.bar = StackedBar()
        self.units = w.Label()
        self.tokens = w.Label()
        self.elapsed = w.Label()
        self.loop = w.Label()
        self.note = w.HTML(layout=w.Layout(overflow="hidden"))
        self.note_cell = w.VBox([self.note, self.live], layout=w.Layout(overflow="hidden"))
        self.state: StepState | None = None
        self.is_running = False

    def cells(self) -> list[w.Widget]:
        """The row's grid cells, then its drill-down panel (spanning the whole grid row)."""
        cells = [
            self.name_cell,
            self.status,
            self.bar.widget,
            self.units,
            self.tokens,
            self.elapsed,
            self.loop,
            self.note_cell,
        ]
        return cells + ([self.detail.widget] if self.detail is not None else [])

    def _toggled(self, change: dict[str, object]) -> None:
        is_open = bool(change["new"])
        self.toggle.icon = "chevron-down" if is_open else "chevron-right"
        if self.detail is None:
            return
        if is_open:
            self.detail.open()
        else:
            self.detail.close()

    def show_text(self, text: str | None) -> None:
        """Show the in-flight unit's text so far (None: nothing streams now)."""
        if text == self._live_text:
            return
        self._live_text = text
        self.live.value = live_text_html(text) if text else ""

    def show(self, s: StepState, *, is_live: bool = True, note: str | None = None) -> None:
        """Draw the step; ``is_live`` says a drive is running, so attempts in flight are real
        (a dead driver's orphans are not "running"); ``note`` replaces the step's note (the
        view drops what its gate panel already says)."""
        self.state = s
        self.is_running = step_state(s.status, running=s.running, is_live=is_live) == "running"
        total = s.total if s.total is not None else max(s.done, 1)
        done = s.done
        self.status.value = step_badge(
            s.status, running=s.running, failed=s.failed, is_live=is_live
        )
        self.bar.show(
            done=min(done, max(total, 1)),
            running=s.running if self.is_running else 0,
            failed=s.failed,
            total=max(total, 1),
        )
        running = f" · {s.running} in flight" if self.is_running else ""
        failed = f" · {s.failed} failed" if s.failed else ""
        self.units.value = f"{done}/{s.total if s.total is not None else '?'}{running}{failed}"
        self.tokens.value = token_text(s.token_split)
        self.elapsed.value = elapsed_with_wait(s, time.time())
        self.loop.value = f"{s.loop}/{s.max_loops}" if s.has_gate or s.max_loops > 1 else ""
        shown = s.note if note is None else note
        self.note.value = f"<small>{html.escape(shown or '')}</small>"

    def tick(self, now: float) -> None:
        """Advance the elapsed clock of a running step, or the waiting clock of a step a
        person decides, without reading the journal."""
        state = self.state
        if state is None:
            return
        if self.is_running and state.started_at is not None:
            text = elapsed_text(max(0.0, now - state.started_at - state.waited_s))
        elif state.waiting_since is not None:
            text = elapsed_with_wait(state, now)
        else:
            return
        if self.elapsed.value != text:
            self.elapsed.value = text


def elapsed_with_wait(s: StepState, now: float) -> str:
    """``1.2 s``, or ``1.2 s · waiting 3 m 04 s`` / ``· waited 40 s``: time spent waiting for
    a person is shown apart, never in the step's elapsed time."""
    text = elapsed_text(s.elapsed_s)
    if s.waiting_since is not None:
        waiting = s.waited_s + max(0.0, now - s.waiting_since)
        return f"{text} · waiting {elapsed_text(waiting)}"
    if s.waited_s >= 0.05:
        return f"{text} · waited {elapsed_text(s.waited_s)}"
    return text


class LiveTexts:
    """The streamed text of the units in flight, by step then unit (safe from any thread)."""

    def __init__(self) -> None:
        self._texts: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def note(self, step_id: str, unit_id: str, text: str) -> None:
        """Keep ``unit_id``'s text so far (a ``unit_text`` event)."""
        with self._lock:
            self._texts.setdefault(step_id, {})[unit_id] = text

    def drop(self, step_id: str, unit_id: str) -> bool:
        """Forget a finished unit's text; returns whether it had any."""
        with self._lock:
            return self._texts.get(step_id, {}).pop(unit_id, None) is not None

    def latest(self, step_id: str) -> str | None:
        """The text of the step's most recently started unit that streams."""
        with self._lock:
            texts = list(self._texts.get(step_id, {}).values())
        return texts[-1] if texts else None


def live_text_html(text: str) -> str:
    """The end of a streamed answer, small and grey, under the step's note."""
    tail = text if len(text) <= LIVE_TEXT_CHARS else "…" + text[-LIVE_TEXT_CHARS:]
    return (
        "<pre class='wf-live' style='margin:0;max-height:6em;overflow:auto;white-space:pre-wrap;"
        f"font-size:11px;color:#57606a'>{html.escape(tail, quote=False)}</pre>"
    )
