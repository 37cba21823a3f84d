"""The widgets of one step row of the run view, and the small HTML pieces they show."""

from __future__ import annotations

import html

import ipywidgets as w

from ..display import badge
from .snapshot import StepState

BAR_STYLES = {
    "completed": "success",
    "failed": "danger",
    "blocked": "warning",
    "skipped": "",
    "pending": "info",
}
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


class StepRowWidgets:
    """The widgets of one step row (created once, then only their values change)."""

    def __init__(self, step_id: str):
        self.name = w.HTML(f"<code>{html.escape(step_id)}</code>")
        self.status = w.HTML()
        self.bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="120px"))
        self.units = w.Label()
        self.tokens = w.Label()
        self.elapsed = w.Label()
        self.loop = w.Label()
        self.note = w.HTML(layout=w.Layout(overflow="hidden"))

    def cells(self) -> list[w.Widget]:
        return [
            self.name,
            self.status,
            self.bar,
            self.units,
            self.tokens,
            self.elapsed,
            self.loop,
            self.note,
        ]

    def show(self, s: StepState) -> None:
        total = s.total if s.total is not None else max(s.done, 1)
        done = s.done
        self.status.value = badge(s.status)
        self.bar.max = max(total, 1)
        self.bar.value = min(done, self.bar.max)
        self.bar.bar_style = BAR_STYLES.get(s.status, "")
        self.units.value = f"{done}/{s.total if s.total is not None else '?'}"
        self.tokens.value = f"{s.tokens:,}" + (
            f" (+{s.saved_tokens:,} reused)" if s.saved_tokens else ""
        )
        self.elapsed.value = elapsed_text(s.elapsed_s)
        self.loop.value = f"{s.loop}/{s.max_loops}" if s.has_gate or s.max_loops > 1 else ""
        self.note.value = f"<small>{html.escape(s.note or '')}</small>"
