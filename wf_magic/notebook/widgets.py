"""The live run view: an ipywidgets box that observes a run and redraws it, throttled."""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from ..bus import Event
from ..display import (
    STATUS_COLOURS,
    badge,
    gates_html,
    good_news_html,
    result_html,
    run_html,
    run_text,
    shown_note,
    shown_reason,
    token_text,
)
from ..errors import StateDirReplaced
from .detail import StepDetail
from .drives import driver_text
from .outputs import FINAL, RunOutputs, static_status_line
from .review import ReviewPanel, say
from .rows import COLUMNS, LiveTexts, StepRowWidgets, elapsed_text
from .snapshot import RunSnapshot, SnapshotReader
from .teardown import close_tree
from .throttle import Throttle, Ticker

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger("wf_magic")

STALE_AFTER_S = 5
"""A live status line not refreshed for this long says its kernel stopped updating it (the
kernel restarted or died): shown by the browser alone, since no kernel is left to say it."""
POLL_EVERY_TICKS = 2
"""While a gate waits, the clock polls the run's events every this many ticks (~2 s), so a
decision taken elsewhere (another process, the CLI) reaches the view."""


class RunView(RunOutputs, w.VBox):  # type: ignore[misc]  # ipywidgets is untyped
    """A live view of one run: header, step rows, gate panel, budget, warnings, decisions.

    It observes: engine events (or :meth:`poke`) schedule a throttled redraw that reads the
    journal and assigns widget traits — safe from any thread, at most ~10 redraws a second,
    always with a trailing redraw. While a drive is live, a clock ticks about once a second
    (elapsed times, no journal read); while a gate waits, it polls the run's events so a
    decision taken elsewhere reaches the view. Its review panel (``review.py``) records a
    person's decision and hands the run to ``continue_drive`` (a background drive); it never
    writes the journal itself.

    Args:
        engine: the engine holding the run.
        run_id: the run to show.
        subscribe: follow ``engine.subscribe`` events (False when another process drives).
        continue_drive: called with the run id after Approve/Reject (and by nothing else).
        stop_drive: called with the run id by the Stop button.
        is_driving: whether this kernel drives the run now (shows the Stop button).
    """

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        *,
        subscribe: bool = True,
        continue_drive: Callable[[str], object] | None = None,
        stop_drive: Callable[[str], object] | None = None,
        is_driving: Callable[[str], bool] | None = None,
        warnings: list[str] | None = None,
        open_fork: Callable[[str, Any], object] | None = None,
        interval_s: float = 0.1,
        **kwargs: Any,
    ):
        self.engine = engine
        self.run_id = run_id
        self._display_lock = threading.RLock()
        """Held while the outputs move between live and static (see ``outputs.py``)."""
        self.reader = SnapshotReader(engine, run_id)
        self.continue_drive = continue_drive
        self.stop_drive = stop_drive
        self.is_driving = is_driving
        self.open_fork = open_fork
        """Called with a fork's run id and an output to show it in (Fork from here)."""
        self.redraws = 0
        self.events_seen = 0
        self.snapshot: RunSnapshot | None = None
        self.warnings: list[str] = list(warnings or [])
        self._warn_lock = threading.Lock()
        self._unsubscribe: Callable[[], None] | None = None
        self.display_handle: Any = None
        self.shown_again: list[Any] = []
        """Further outputs of the view (``run.view`` as a later cell's value): each is
        repainted with the first, so none keeps naming models the view closed."""
        self.decision_handle: Any = None
        """A second output below the view: a blocked gate's Approve/Reject panel, live while
        its kernel lives, while the view itself is already static HTML (see :meth:`refresh`)."""
        self._shown_key: tuple[object, ...] | None = None
        """What the static output last showed (a change repaints it: see ``follow``)."""
        self.origin: str | None = None
        """How the last drive began (``resumed: 6/8 already done, 2 dispatched``)."""
        self.retired: str | None = None
        self.is_static = False
        """The output shows the static HTML now (see :meth:`refresh`)."""
        self.is_closed = False
        """The view's widget models are closed (it is static): see :meth:`_release`."""
        self._is_live = False
        self._is_stopping = False
        """Stop was clicked during the last drive (see :meth:`_status_line`); a new drive
        clears it."""
        self._stop_said = False
        self._live_since: float | None = None
        self._last_event_id: int | None = None
        self.throttle = Throttle(self._redraw_safely, interval_s=interval_s)
        self.texts = LiveTexts()
        # Streamed text only assigns a row's text widget: it never costs a journal read.
        self.text_throttle = Throttle(self._draw_texts_safely, interval_s=interval_s)
        self.clock = Ticker(self._tick_safely, interval_s=1.0)
        self._build()
        super().__init__(
            children=[
                self.header,
                self.grid,
                self.gate_panel,
                self.budget_box,
                self.warning_box,
                self.decision_box,
                self.footer,
            ],
            **kwargs,
        )
        self.add_class("wf-run-view")
        if subscribe:
            self._unsubscribe = engine.subscribe(self._on_event)

    # -- construction -----------------------------------------------------------------------
    def _build(self) -> None:
        self.header = w.HTML()
        self.rows = {
            s.id: StepRowWidgets(
                s.id,
                detail=StepDetail(self.engine.store, self.run_id, s.id, is_map=s.map is not None),
            )
            for s in self.reader.plan.steps
        }
        heads = [w.HTML(f"<b>{c}</b>") for c in COLUMNS]
        cells: list[w.Widget] = [*heads]
        for row in self.rows.values():
            cells.extend(row.cells())
        self.grid = w.GridBox(
            cells,
            layout=w.Layout(
                grid_template_columns="max-content max-content 130px max-content max-content "
                "max-content max-content minmax(0, 1fr)",
                grid_gap="2px 12px",
                align_items="center",
            ),
        )
        self.gate_panel = w.HTML(layout=w.Layout(display="none"))
        self.units_bar = w.IntProgress(min=0, max=1, layout=w.Layout(width="160px"))
        self.tokens_bar = w.IntProgress(min=0, max=1, layout=w.Layout(width="160px"))
        self.units_label, self.tokens_label = w.Label(), w.Label()
        self.run_tokens_label = w.Label()
        self.budget_box = w.HBox(
            [
                w.Label("budget — units"),
                self.units_bar,
                self.units_label,
                w.Label("tokens"),
                self.tokens_bar,
                self.tokens_label,
                self.run_tokens_label,
            ],
            layout=w.Layout(align_items="center", grid_gap="8px"),
        )
        self.warning_box = w.HTML(layout=w.Layout(display="none"))
        self.message = w.HTML()
        self.review = ReviewPanel(
            self.engine,
            self.run_id,
            waiting=lambda: self.snapshot.waiting if self.snapshot else None,
            message=self.message,
            poke=self.poke,
            continue_drive=self.continue_drive,
            forked=self._forked,
        )
        # The panel's widgets under the names the view has always had.
        self.decision_box = self.review
        self.summary, self.feedback = self.review.summary, self.review.feedback
        self.approve_button, self.reject_button = (
            self.review.approve_button,
            self.review.reject_button,
        )
        self.abandon_button, self.fork_button = (
            self.review.abandon_button,
            self.review.fork_button,
        )
        self.stop_button = w.Button(
            description="Stop", icon="stop", layout=w.Layout(display="none")
        )
        self.stop_button.on_click(lambda _b: self.stop())
        self.status_line = w.HTML()
        self.footer = w.HBox(
            [self.stop_button, self.status_line, self.message],
            layout=w.Layout(align_items="center", grid_gap="12px"),
        )

    # -- observing --------------------------------------------------------------------------
    def _on_event(self, event: Event) -> None:
        if event.run_id != self.run_id:
            return
        if event.kind == "unit_text" and event.step_id and event.unit_id:
            self.texts.note(event.step_id, event.unit_id, str(event.data.get("text", "")))
            self.text_throttle.poke()
            return
        self.events_seen += 1
        if event.kind in ("unit_finished", "unit_reused") and event.step_id and event.unit_id:
            if self.texts.drop(event.step_id, event.unit_id):
                self.text_throttle.poke()
        if event.kind == "warning" and event.data.get("message"):
            self.add_warning(str(event.data["message"]))
        self.throttle.poke()

    def _draw_texts_safely(self) -> None:
        try:
            self.draw_texts()
        except Exception:  # a view must never break the drive it observes
            log.exception("run view text update failed")

    def draw_texts(self) -> None:
        """Show each row's in-flight streamed text (the newest unit that streams)."""
        for step_id, row in self.rows.items():
            row.show_text(self.texts.latest(step_id))

    def add_warning(self, message: str) -> None:
        """Show a warning (drift, a retried unit, ...) once."""
        with self._warn_lock:
            if message not in self.warnings:
                self.warnings.append(message)

    def poke(self) -> None:
        """Schedule a throttled redraw (from any thread)."""
        self.throttle.poke()

    def flush(self) -> None:
        """Redraw now in this thread (the final state after a drive)."""
        self.throttle.flush()
        self.text_throttle.flush()

    def close(self) -> None:
        """Stop observing and close every widget model of the view (the panel's too)."""
        self.detach()
        with self._display_lock:
            close_tree(self)
            self.is_closed = True

    def release(self) -> None:
        """Let go for good (the extension unloads, the state dir changes): the output keeps
        its static HTML, the decision output empties, and every model is closed."""
        with self._display_lock:
            self.retired = self.retired or "released"
            try:
                self.refresh()  # retired: static, whoever drives
            except Exception:  # the engine may be gone already: the output keeps what it showed
                log.exception("the last repaint of the view of %s failed", self.run_id)
            self._show_decision(False)
            self.close()

    def detach(self) -> None:
        """Stop observing; the view keeps showing its last state."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.throttle.close()
        self.text_throttle.close()
        self.clock.stop()
        # No tick comes any more, on purpose: the browser must not call the view stale.
        self.status_line.value = self.status_line.value.replace(STALE_MARKER, "")

    def retire(self, reason: str) -> None:
        """Take the buttons away (a newer view shows the run): the output becomes static and
        still follows the run, by polling, until it settles."""
        self.retired = reason
        if self._unsubscribe is not None:  # the newer view takes the engine's events
            self._unsubscribe()
            self._unsubscribe = None
        self.decision_box.layout.display = "none"
        self.stop_button.layout.display = "none"
        self._say(reason)
        self.refresh()

    # -- acting -----------------------------------------------------------------------------
    def decide(self, *, approve: bool) -> None:
        """Record Approve/Reject for the waiting gate, then hand the run to a drive."""
        self.review.decide(approve=approve)

    def abandon(self) -> None:
        """Give up the run (an exhausted gate's way out): it becomes ``abandoned``."""
        self.review.abandon()

    def fork(self) -> None:
        """Fork a new run from the waiting step (see :meth:`ReviewPanel.fork`)."""
        self.review.fork()

    def stop(self) -> None:
        """Ask this run's driver to stop between units (the run stays active)."""
        if self.stop_drive is not None:
            self.stop_drive(self.run_id)
        else:
            self.engine.stop(self.run_id)
        self._is_stopping = self._stop_said = True
        self._say("stop requested; the driver stops after the units in flight")
        self.poke()

    def _say(self, text: str, *, error: bool = False) -> None:
        say(self.message, text, error=error)

    # -- drawing ----------------------------------------------------------------------------
    def _redraw_safely(self) -> None:
        try:
            self.redraw()
        except StateDirReplaced:
            self.detach()
        except Exception:  # a view must never break the drive it observes
            log.exception("run view redraw failed")

    def redraw(self) -> None:
        """Read the run and assign every widget's value (counted in :attr:`redraws`)."""
        snap = self.reader.take()
        self.snapshot = snap
        self.redraws += 1
        driving = bool(self.is_driving and self.is_driving(self.run_id))
        elsewhere = (
            driver_text(self.engine, self.run_id)
            if snap.status == "active" and not driving
            else None
        )
        self._set_live(driving or elsewhere is not None, snap)
        self.header.value = self._header_html(snap)
        for state in snap.steps:
            if state.step_id in self.rows:
                note = shown_note(state.note, snap.rejections, state.step_id)
                self.rows[state.step_id].show(state, is_live=self._is_live, note=note)
        self._draw_gates(snap)
        self._draw_budget(snap)
        self._draw_warnings(snap)
        self.review.draw(snap.waiting, is_retired=bool(self.retired))
        self.stop_button.layout.display = (
            "" if self._is_live and snap.status == "active" and not self.retired else "none"
        )
        self.status_line.value = self._status_line(snap, elsewhere=elsewhere)
        if self.review.acted is not None and not driving:
            self._say(f"{self.review.acted}.")
            self.review.acted = None
        if self.is_static and not driving:
            self.follow(snap)  # moved elsewhere (the CLI, another kernel): repaint the saved view
        if self._is_stopping and not self._is_live and self._stop_said:
            self._stop_said = False  # the status line now says how the drive ended
            self._say("")

    def _header_html(self, snap: RunSnapshot) -> str:
        said = shown_reason(snap.reason, (s.note for s in snap.steps))
        reason = f" <i>{html.escape(said)}</i>" if said else ""
        result = result_html(snap.result) if snap.result is not None else ""
        origin = good_news_html(self.origin) if self.origin else ""
        return (
            f"<b>{html.escape(snap.workflow)}</b> &nbsp;<code>"
            f"{html.escape(snap.run_id)}</code> &nbsp;{badge(snap.status)}"
            f"{reason}{origin}{result}"
        )

    def _set_live(self, is_live: bool, snap: RunSnapshot) -> None:
        """Note whether a drive is live; run the clock while one is or while a gate waits."""
        if is_live and not self._is_live:
            self._live_since = time.monotonic()
            self._is_stopping = False
        self._is_live = is_live
        open_gate = snap.waiting is not None and snap.waiting.decided is None
        following = self.is_static and snap.status not in FINAL  # see RunOutputs.follow
        if (is_live or open_gate or following) and not self.throttle.is_closed:
            self.clock.start()
        else:
            self.clock.stop()

    def _status_line(self, snap: RunSnapshot, *, elsewhere: str | None) -> str:
        if snap.status == "active" and self._is_live:
            done, running, failed, _total = snap.units
            since = self._live_since
            clock = elapsed_text(time.monotonic() - since) if since is not None else ""
            counts = f"{done:,} done, {running:,} in flight" + (
                f", {failed:,} failed" if failed else ""
            )
            who = f" — {html.escape(elsewhere)}" if elsewhere else ""
            verb = "stopping after the units in flight…" if self._is_stopping else "driving…"
            return f"{verb} <b>{clock}</b> · {counts}{who}{STALE_MARKER}"
        if self._is_stopping and snap.status == "active":
            return (
                "<b>Stopped</b> between units; the run stays active, not being driven: "
                "re-run the cell or <code>%workflow resume</code> to continue."
            )
        line = static_status_line(snap)
        if self.clock.is_running and not self.retired:  # a gate waits: the clock ticks
            line += STALE_MARKER
        return line

    def _tick_safely(self) -> None:
        try:
            self.tick()
        except StateDirReplaced:  # the run went with its state dir: nothing left to observe
            self.detach()
        except Exception:  # a clock must never break the drive it observes
            log.exception("run view clock failed")

    def tick(self) -> None:
        """Advance the clocks of running steps; while a gate waits, poll the run's events."""
        snap = self.snapshot
        if snap is None:
            return
        if self._is_live:
            now = time.time()
            for row in self.rows.values():
                row.tick(now)
            self.status_line.value = self._status_line(snap, elsewhere=None)
            if self._unsubscribe is None or not self._is_driving_here():
                self._poll_events()  # driven elsewhere: no engine event of it reaches us
            return
        now = time.time()
        for row in self.rows.values():
            row.tick(now)  # the waiting clock of a gate
        self.status_line.value = self._status_line(snap, elsewhere=None)
        self.review.tick(self.clock.ticks)
        if self.clock.ticks % POLL_EVERY_TICKS == 0:
            self._poll_events()

    def _poll_events(self) -> None:
        """Poke a redraw when the run has events this view has not seen (the first poll
        always pokes: it cannot tell what happened before it)."""
        newest = self._last_event_id or 0
        while rows := self.engine.store.events_after(self.run_id, newest):
            newest = rows[-1].event_id
        if self._last_event_id is None or newest != self._last_event_id:
            self._last_event_id = newest
            self.poke()

    def _draw_gates(self, snap: RunSnapshot) -> None:
        if not snap.rejections:
            self.gate_panel.layout.display = "none"
            return
        self.gate_panel.value = gates_html(snap.rejections)
        self.gate_panel.layout.display = ""

    def _draw_budget(self, snap: RunSnapshot) -> None:
        use = snap.budget
        self.run_tokens_label.value = f"· run tokens: {token_text(snap.tokens)}"
        for bar, label, used, limit in (
            (self.units_bar, self.units_label, use.units, use.max_units),
            (self.tokens_bar, self.tokens_label, use.tokens, use.max_tokens),
        ):
            bar.layout.display = "" if limit else "none"  # a full bar would mean "at the limit"
            bar.max = max(int(limit or used or 1), 1)
            bar.value = min(int(used), bar.max)
            share = used / limit if limit else 0.0
            bar.bar_style = "danger" if share >= 0.9 else "warning" if share >= 0.7 else ""
            label.value = f"{used:,}/{limit:,}" if limit else f"{used:,} (no limit)"

    def _draw_warnings(self, snap: RunSnapshot) -> None:
        with self._warn_lock:
            items = [f"<div>⚠ {html.escape(m)}</div>" for m in self.warnings]
        if snap.reused:  # good news, not a warning
            items.append(
                good_news_html(
                    f"reused {snap.reused} result{'s' if snap.reused != 1 else ''} from "
                    f"earlier runs ({snap.saved_tokens:,} tokens saved)"
                )
            )
        self.warning_box.value = "".join(items)
        self.warning_box.layout.display = "" if items else "none"

    def __repr__(self) -> str:
        return run_text(self._handle())

    def _ipython_display_(self) -> None:
        """Shown again (``run.view`` as a cell's value): a view gone static opens its models
        again, so it is live and clickable in that output (its drill-downs too)."""
        from IPython.display import display

        shown = display(self.live_bundle(), raw=True, display_id=True)  # type: ignore[no-untyped-call]
        if shown is not None:
            with self._display_lock:
                self.shown_again.append(shown)

    def live_bundle(self) -> dict[str, Any]:
        """The live widget's display bundle (its models opened again if they were closed)."""
        with self._display_lock:  # no drive's end closes them between these two lines
            self._revive()
            return RunView._repr_mimebundle_(self) or {}

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        # Front ends without the widget manager (nbconvert, GitHub, a closed kernel) fall
        # back to these: the full text summary (ipywidgets clips it) and the HTML table.
        bundle: dict[str, Any] | None = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            handle = self._handle()
            bundle["text/plain"] = run_text(handle)
            bundle["text/html"] = run_html(handle)
        return bundle


STALE_MARKER = (
    "<style>@keyframes wf-stale{to{visibility:visible}}</style>"
    "<span class='wf-stale' style='visibility:hidden;"
    f"animation:wf-stale 0s linear {STALE_AFTER_S}s forwards;color:{STATUS_COLOURS['failed']}'>"
    " — this view stopped updating: its kernel stopped or restarted, so the drive it showed "
    "ended; re-run the cell to see the run</span>"
)
"""A note the browser reveals when the kernel stops refreshing a live status line.

Every tick replaces the line, which restarts the CSS animation; once the ticks stop (the
kernel restarted or died), the note appears after :data:`STALE_AFTER_S` seconds. A view that
stops ticking on purpose (detached, retired, final) removes it.
"""
