"""The widgets of one step row of the run view, and the small HTML pieces they show."""

from __future__ import annotations

import html
import time

import ipywidgets as w

from ..display import stacked_bar_html, step_badge, step_state
from .snapshot import StepState

COLUMNS = ("step", "status", "progress", "units", "tokens", "elapsed", "loop", "note")


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

    def __init__(self, step_id: str):
        self.name = w.HTML(f"<code>{html.escape(step_id)}</code>")
        self.status = w.HTML()
        self.bar = StackedBar()
        self.units = w.Label()
        self.tokens = w.Label()
        self.elapsed = w.Label()
        self.loop = w.Label()
        self.note = w.HTML(layout=w.Layout(overflow="hidden"))
        self.state: StepState | None = None
        self.is_running = False

    def cells(self) -> list[w.Widget]:
        return [
            self.name,
            self.status,
            self.bar.widget,
            self.units,
            self.tokens,
            self.elapsed,
            self.loop,
            self.note,
        ]

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
        self.tokens.value = (
            f"{s.tokens:,}"
            + (f" (+{s.saved_tokens:,} reused)" if s.saved_tokens else "")
            + (f" + {s.judge_tokens:,} judge (not charged)" if s.judge_tokens else "")
        )
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
