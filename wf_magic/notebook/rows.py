"""The widgets of one step row of the run view, and the small HTML pieces they show."""

from __future__ import annotations

import html
import json
import threading
import time
from collections.abc import Iterable

import ipywidgets as w

from ..display import (
    STATUS_COLOURS,
    UNKNOWN_STATUS_COLOUR,
    stacked_bar_html,
    step_badge,
    step_state,
)
from ..inspection import AttemptRecord, diff_html, input_text, record_of, unit_diff
from ..store import Store
from ..store.records import AttemptRow
from .snapshot import StepState

COLUMNS = ("step", "status", "progress", "units", "tokens", "elapsed", "loop", "note")
LIVE_TEXT_CHARS = 400
"""How much of an in-flight unit's streamed text its row shows (the end of it)."""
MAP_BUTTONS = 200
"""A map's units shown as buttons in its drill-down; past this, a box finds the others."""


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


def status_colour(status: str) -> str:
    return STATUS_COLOURS.get(status, UNKNOWN_STATUS_COLOUR)


def unit_statuses(attempts: Iterable[AttemptRow]) -> dict[str, str]:
    """Each work unit's latest attempt status, in unit order (a map's items by index)."""
    latest: dict[str, AttemptRow] = {}
    for a in attempts:
        if a.phase == "work":
            latest[a.unit_id] = a
    ordered = sorted(latest.values(), key=lambda a: (a.item_index is None, a.item_index or 0))
    return {a.unit_id: a.status for a in ordered}


def statuses_html(statuses: dict[str, str]) -> str:
    """``3 units: 2 succeeded · 1 failed`` with each count in its status colour."""
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    parts = " · ".join(
        f"<span style='color:{status_colour(k)}'>{n:,} {html.escape(k)}</span>"
        for k, n in sorted(counts.items())
    )
    count = f"{len(statuses):,} unit{'s' if len(statuses) != 1 else ''}"
    return f"<div class='wf-unit-counts'><b>{count}</b>{': ' if parts else ''}{parts}</div>"


def verdict_html(verdict: object) -> str:
    """A journaled gate verdict: passed or rejected, by which judge, its feedback and what
    it found missing."""
    if not isinstance(verdict, dict):
        return ""
    passed = bool(verdict.get("complete"))
    status = "completed" if passed else "failed"
    word = "passed" if passed else "rejected"
    judge = html.escape(str(verdict.get("judge") or "gate"))
    feedback = html.escape(str(verdict.get("feedback") or ""))
    missing = [html.escape(str(m)) for m in verdict.get("missing") or ()]
    gone = f"<div>missing: {', '.join(missing)}</div>" if missing else ""
    return (
        f"<div class='wf-verdict'><b style='color:{status_colour(status)}'>gate {word}</b> "
        f"({judge}){': ' + feedback if feedback else ''}{gone}</div>"
    )


def _value_html(record: AttemptRecord) -> str:
    if record.failure:
        colour = status_colour("failed")
        return (
            f"<pre style='color:{colour};white-space:pre-wrap'>{html.escape(record.failure)}</pre>"
        )
    if record.status == "running":
        return "<i>in flight</i>"
    value = record.output
    text = value if isinstance(value, str) else json.dumps(value, indent=2, default=str)
    return f"<pre style='white-space:pre-wrap'>{html.escape(text, quote=False)}</pre>"


def unit_loops_html(records: list[AttemptRecord], verdicts: dict[int, object]) -> str:
    """One unit loop by loop (its newest attempt of each): input, output, the gate's verdict
    on the loop and the diff to the previous loop."""
    sections = []
    previous: AttemptRecord | None = None
    for record in records:
        model = f"/{record.model}" if record.model else ""
        head = (
            f"<b>loop {record.loop}</b> · attempt {record.attempt} · "
            f"<span style='color:{status_colour(record.status)}'>{record.status}</span> · "
            f"{html.escape(record.runner + model)} · "
            f"{record.tokens_in + record.tokens_out:,} tokens"
        )
        diff = ""
        if previous is not None:
            text = unit_diff(previous, record)
            diff = (
                f"<details class='wf-loop-diff' open><summary>changes since loop "
                f"{previous.loop}</summary>{diff_html(text)}</details>"
                if text
                else f"<div><small>unchanged since loop {previous.loop}</small></div>"
            )
        sections.append(
            f"<div class='wf-loop' style='border-top:1px solid #d0d7de;padding:4px 0'>{head}"
            "<details class='wf-input'><summary>input</summary><pre style='white-space:pre-wrap'>"
            f"{html.escape(input_text(record.input), quote=False)}</pre></details>"
            f"<div><small>output</small>{_value_html(record)}</div>"
            f"{verdict_html(verdicts.get(record.loop))}{diff}</div>"
        )
        previous = record
    return "".join(sections) or "<i>no attempt journaled yet</i>"


class StepDetail:
    """A step's drill-down: its units (a map's as a list coloured by status), and one unit
    loop by loop. It reads the journal only when opened, refreshed or a unit is picked."""

    def __init__(self, store: Store, run_id: str, step_id: str, *, is_map: bool):
        self.store = store
        self.run_id = run_id
        self.step_id = step_id
        self.is_map = is_map
        self.unit_id: str | None = None
        """The unit shown loop by loop (a map's pick; the step's only unit otherwise)."""
        self.loads = 0
        self.counts = w.HTML()
        self.units = w.HBox(layout=w.Layout(flex_flow="row wrap", display="none"))
        self.finder = w.Combobox(
            placeholder="unit id", ensure_option=True, layout=w.Layout(display="none")
        )
        self.finder.observe(self._found, "value")
        self.unit_view = w.HTML()
        self.refresh_button = w.Button(
            icon="refresh", tooltip="read the journal again", layout=w.Layout(width="32px")
        )
        self.refresh_button.on_click(lambda _b: self.load())
        self.widget = w.VBox(
            [w.HBox([self.refresh_button, self.counts]), self.units, self.finder, self.unit_view],
            layout=w.Layout(
                display="none", grid_column="1 / -1", border="1px solid #d0d7de", padding="4px"
            ),
        )
        self.widget.add_class("wf-step-detail")

    @property
    def is_open(self) -> bool:
        return bool(self.widget.layout.display != "none")

    def open(self) -> None:
        """Show the panel, read fresh from the journal."""
        self.widget.layout.display = ""
        self.load()

    def close(self) -> None:
        self.widget.layout.display = "none"

    def load(self) -> None:
        """Read the step's attempts and draw its units (and the open unit)."""
        self.loads += 1
        attempts = self.store.attempts_of(self.run_id, self.step_id)
        statuses = unit_statuses(attempts)
        self.counts.value = statuses_html(statuses)
        if self.is_map:
            self._draw_units(statuses)
        elif self.unit_id is None and statuses:
            self.unit_id = next(iter(statuses))
        self._draw_unit(attempts)

    def open_unit(self, unit_id: str) -> None:
        """Show ``unit_id`` loop by loop (a click on a map's unit)."""
        self.unit_id = unit_id
        self._draw_unit(self.store.attempts_of(self.run_id, self.step_id))

    def _found(self, change: dict[str, object]) -> None:
        if change["new"]:
            self.open_unit(str(change["new"]))

    def _draw_units(self, statuses: dict[str, str]) -> None:
        buttons = []
        for unit_id, status in list(statuses.items())[:MAP_BUTTONS]:
            button = w.Button(
                description=unit_id,
                tooltip=f"{unit_id}: {status}",
                layout=w.Layout(width="auto", height="22px", margin="1px"),
            )
            button.style.button_color = status_colour(status)
            button.style.text_color = "white"
            button.on_click(lambda _b, u=unit_id: self.open_unit(u))
            buttons.append(button)
        self.units.children = buttons
        self.units.layout.display = ""
        more = len(statuses) > MAP_BUTTONS
        self.finder.options = tuple(statuses) if more else ()
        self.finder.layout.display = "" if more else "none"

    def _draw_unit(self, attempts: list[AttemptRow]) -> None:
        unit_id = self.unit_id
        if unit_id is None:
            self.unit_view.value = "<i>no unit has run yet</i>" if not self.is_map else ""
            return
        newest: dict[int, AttemptRow] = {}
        verdicts: dict[int, object] = {}
        for a in attempts:
            if a.unit_id == unit_id and a.phase == "work":
                newest[a.loop] = a
            elif a.phase == "gate" and a.status in ("succeeded", "reused") and a.output_json:
                verdicts[a.loop] = json.loads(a.output_json)
        records = [record_of(self.store, newest[loop]) for loop in sorted(newest)]
        self.unit_view.value = (
            f"<div><code>{html.escape(unit_id)}</code></div>{unit_loops_html(records, verdicts)}"
        )
