"""A step's drill-down panel: its units coloured by status, and one unit loop by loop."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable

import ipywidgets as w

from ..display import STATUS_COLOURS, UNKNOWN_STATUS_COLOUR, agent_html
from ..inspection import AttemptRecord, diff_html, input_text, record_of, unit_diff
from ..store import Store
from ..store.records import AttemptRow

MAP_BUTTONS = 200
"""A map's units shown as buttons in its drill-down; past this, a box finds the others."""
STATUS_CSS = "".join(
    f".wf-sc-{status}{{background:{colour} !important}}"
    for status, colour in (*STATUS_COLOURS.items(), ("pending", "#ccc"))
)
"""A button's colour by its status class ``wf-sc-<status>``: a colour set per button would
cost a style model per button (the drill-down's units, the sweep grid's cells)."""


def status_classes(base: str, status: str) -> list[str]:
    """A status-coloured button's CSS classes (see :data:`STATUS_CSS`)."""
    return [base, f"wf-sc-{status}"]


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
        trace = (
            "<details class='wf-traceback' open><summary>traceback</summary>"
            f"<pre style='white-space:pre-wrap'>{html.escape(record.traceback)}</pre></details>"
            if record.traceback
            else ""
        )
        return (
            f"<pre style='color:{colour};white-space:pre-wrap'>{html.escape(record.failure)}</pre>"
            f"{trace}"
        )
    if record.status == "running":
        return "<i>in flight</i>"
    value = record.output
    text = value if isinstance(value, str) else json.dumps(value, indent=2, default=str)
    return f"<pre style='white-space:pre-wrap'>{html.escape(text, quote=False)}</pre>"


def _origin_html(record: AttemptRecord) -> str:
    """`` · reused from <run> · <unit> (first cost N tokens)`` for a reused attempt."""
    if record.status != "reused":
        return ""
    if record.reused_from_run is None:
        where = "a deleted run"
    else:
        where = (
            f"<code title='wf show {html.escape(record.reused_from_run)} "
            f"{html.escape(record.reused_from_unit or '')}'>"
            f"{html.escape(record.reused_from_run)} · {html.escape(record.reused_from_unit or '')}"
            "</code>"
        )
    return f" · reused from {where} (first cost {record.saved_tokens:,} tokens)"


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
            f"{_tokens_text(record)} tokens"
            f"{_origin_html(record)}"
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
            f"{agent_html(record.agent, record.cost) if record.agent else ''}"
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
        self.buttons: list[w.Button] = []
        """The unit buttons made so far (reused by every load; at most MAP_BUTTONS)."""
        self.shown_units: list[str] = []
        """The unit each button shows, by position."""
        self._button_look: tuple[w.Layout, w.ButtonStyle] | None = None
        """The layout and style every unit button shares (made with the first button)."""
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
        # The whole grid row, as grid-area (row-start / column-start / row-end / column-end):
        # the front end applies a Layout's traits in order and clears the unset grid_area
        # last, and that shorthand clears a grid-column set before it (the panel then fell
        # into the first column and pushed the next row's cells along).
        self.widget = w.VBox(
            [w.HBox([self.refresh_button, self.counts]), self.units, self.finder, self.unit_view],
            layout=w.Layout(
                display="none",
                grid_area="auto / 1 / auto / -1",
                border="1px solid #d0d7de",
                padding="4px",
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
        self.counts.value = f"<style>{STATUS_CSS}</style>{statuses_html(statuses)}"
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
        # The buttons are kept and relabelled on every load: a load never adds models, so a
        # panel opened over a 5 000-unit map holds at most MAP_BUTTONS of them.
        shown = list(statuses.items())[:MAP_BUTTONS]
        while len(self.buttons) < len(shown):
            self.buttons.append(self._button(len(self.buttons)))
        self.shown_units = [unit_id for unit_id, _ in shown]
        for button, (unit_id, status) in zip(self.buttons, shown, strict=False):
            button.description = unit_id
            button.tooltip = f"{unit_id}: {status}"
            classes = status_classes("wf-unit", status)
            if list(button._dom_classes) != classes:
                button._dom_classes = classes
        self.units.children = tuple(self.buttons[: len(shown)])
        self.units.layout.display = ""
        more = len(statuses) > MAP_BUTTONS
        self.finder.options = tuple(statuses) if more else ()
        self.finder.layout.display = "" if more else "none"

    def _button(self, index: int) -> w.Button:
        """The ``index``-th unit button (it opens whichever unit it shows now)."""
        if self._button_look is None:
            self._button_look = (
                w.Layout(width="auto", height="22px", margin="1px"),
                w.ButtonStyle(text_color="white"),
            )
        layout, style = self._button_look
        button = w.Button(layout=layout, style=style)
        button.on_click(lambda _b: self.open_unit(self.shown_units[index]))
        return button

    def _draw_unit(self, attempts: list[AttemptRow]) -> None:
        unit_id = self.unit_id
        if unit_id is None:
            self.unit_view.value = "<i>no unit has run yet</i>" if not self.is_map else ""
            return
        newest: dict[int, AttemptRow] = {}
        verdicts: dict[int, object] = {}
        item = next(
            (a.item_index for a in attempts if a.unit_id == unit_id and a.phase == "work"), None
        )
        for a in attempts:
            if a.unit_id == unit_id and a.phase == "work":
                newest[a.loop] = a
            elif (
                a.phase == "gate"
                and a.status in ("succeeded", "reused")
                and a.output_json
                and a.item_index in (None, item)  # a per-item gate's: this item's own verdict
            ):
                verdicts[a.loop] = json.loads(a.output_json)
        records = [record_of(self.store, newest[loop], with_agent=True) for loop in sorted(newest)]
        self.unit_view.value = (
            f"<div><code>{html.escape(unit_id)}</code></div>{unit_loops_html(records, verdicts)}"
        )


def _tokens_text(record: AttemptRecord) -> str:
    """The attempt's tokens as shown: ``?`` when the server reported no count."""
    if record.tokens_in is None or record.tokens_out is None:
        return "?"
    return f"{record.tokens_in + record.tokens_out:,}"
