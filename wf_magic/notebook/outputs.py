"""Where a run view is shown: its live widget or its static HTML, and a gate's decision output.

A view's output is the live widget only while a drive of this kernel runs; otherwise it is the
static HTML run view, which a saved notebook keeps and every front end shows, and the models
behind the widget are closed. A static output still follows its run while the kernel lives:
it repaints when the run changes elsewhere (another cell, kernel or the CLI) until it settles.

Several threads move the outputs: the kernel's main thread (a cell, a button's click), a
drive's thread (its end), the view's redraw and clock threads. Each move between live and
static (which output shows what, which models are open) happens whole under the view's
display lock, which also reads whether this kernel drives the run. A drive is marked over
before its end repaints the static view, so no live widget is published after that repaint,
naming models it closed (the front end's "model not found").
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..display import good_news_html, run_html, run_text
from ..run import Run
from .rows import elapsed_text
from .snapshot import RunSnapshot, SnapshotReader
from .teardown import close_tree, is_open, reopen_tree
from .throttle import Throttle, Ticker

if TYPE_CHECKING:
    import ipywidgets as w

    from ..engine import Engine
    from .review import ReviewPanel

FINAL = ("completed", "failed", "abandoned")
"""Run statuses no drive or decision can change any more."""


class RunOutputs:
    """The outputs of a run view (mixed into ``RunView``, which sets these attributes)."""

    engine: Engine
    run_id: str
    reader: SnapshotReader
    snapshot: RunSnapshot | None
    warnings: list[str]
    _warn_lock: threading.Lock
    _display_lock: threading.RLock
    display_handle: Any
    shown_again: list[Any]
    decision_handle: Any
    is_static: bool
    is_closed: bool
    retired: str | None
    origin: str | None
    review: ReviewPanel
    decision_box: w.Widget
    throttle: Throttle
    clock: Ticker
    continue_drive: Callable[[str], object] | None
    is_driving: Callable[[str], bool] | None
    open_fork: Callable[[str, Any], object] | None
    _shown_key: tuple[object, ...] | None

    def detach(self) -> None:
        raise NotImplementedError  # RunView's

    def live_bundle(self) -> dict[str, Any]:
        raise NotImplementedError  # RunView's

    def _handle(self) -> Run:
        handle = self.engine.status(self.run_id)
        with self._warn_lock:
            handle.warnings.extend(self.warnings)
        return handle

    def _is_driving_here(self) -> bool:
        return bool(self.is_driving and self.is_driving(self.run_id))

    def show(self) -> None:
        """Display the view (from the main thread) and remember where, for :meth:`refresh`."""
        from IPython.display import display

        with self._display_lock:
            self.display_handle = display(  # type: ignore[no-untyped-call]
                self.live_bundle(), raw=True, display_id=True
            )
            if any(s.gate is not None for s in self.reader.plan.steps):
                # Only a gated run can wait for a person. Created now, inside the cell, so
                # that an update from a drive thread lands in this cell.
                self.decision_handle = display(  # type: ignore[no-untyped-call]
                    {"text/plain": ""}, raw=True, display_id=True
                )

    def _forked(self, run_id: str) -> bool:
        """Fork from here: hand the decision output to the fork's view, which drives.

        Returns whether the fork is shown and driven (else the panel says how to drive it)."""
        if self.open_fork is None or self.decision_handle is None:
            return False
        handle, self.decision_handle = self.decision_handle, None  # the fork's output now
        self.open_fork(run_id, handle)
        return True

    def go_live(self) -> None:
        """Show the live widget again while a drive of this kernel runs (e.g. after Approve).

        Called after the drive started. A drive already over leaves the output static: its
        end repaints it (see :meth:`refresh`) after marking the drive over, so whichever of
        the two takes the display lock first, the static view is published last.
        """
        with self._display_lock:
            if self.display_handle is None or not self._is_driving_here():
                return
            self.is_static = False
            self._publish(self.live_bundle())
            self._show_decision(False)

    def refresh(self) -> None:
        """Re-publish the display so what a saved notebook keeps is readable without a kernel.

        While this kernel drives the run, the output is the live widget. Once the drive ended,
        for any reason (completed, failed, blocked, stopped by ``--max-steps`` or Stop,
        interrupted, superseded), it becomes the static HTML run view: a notebook reopened
        without a kernel shows it, where a widget would say "model not found". A blocked
        gate's Approve/Reject panel stays usable below it while the kernel lives (the
        ``decision_handle`` output); once the run moves on it becomes static too. A static
        output of a run that can still change keeps following it (see :meth:`follow`).
        """
        with self._display_lock:
            if self.display_handle is None and not self.shown_again:
                return
            snap = self.snapshot or self.reader.take()
            if self._is_driving_here() and not self.retired:
                self._publish(self.live_bundle())
                self.is_static = False
                self._show_decision(False)
                return
            self._publish(self.static_bundle())
            self.is_static = True
            self._shown_key = static_key(snap)
            waiting = snap.waiting
            live = (
                snap.status == "blocked"
                and waiting is not None
                and not waiting.decided
                and self.continue_drive is not None
                and not self.retired
                and self.decision_handle is not None
            )
            self._show_decision(live)
            # The output reads the static HTML from now on: the models behind the widget it
            # showed go, so neither the kernel nor a saved notebook's widget state keeps them.
            self._release(keep_review=live)
            if snap.status not in FINAL and not self.throttle.is_closed:
                self.clock.start()  # its ticks poll the run's events: see follow()

    def _publish(self, bundle: dict[str, Any]) -> None:
        """Show ``bundle`` in every output of the view: the first and those shown again."""
        for handle in (self.display_handle, *self.shown_again):
            if handle is not None:
                handle.update(bundle, raw=True)

    def follow(self, snap: RunSnapshot) -> None:
        """Repaint a static output whose run changed (decided, driven or finished elsewhere);
        once the run is final, stop observing it."""
        with self._display_lock:
            if not self.is_static or self._is_driving_here():
                return
            if static_key(snap) != self._shown_key:
                self.refresh()
        if snap.status in FINAL:
            self.detach()

    def _show_decision(self, live: bool) -> None:
        """The decision output: the review panel's widgets, or nothing once no one can act."""
        with self._display_lock:
            if self.decision_handle is None:
                return
            if live:
                if not is_open(self.review):
                    reopen_tree(self.review)
                self.decision_handle.update(self._decision_bundle(), raw=True)
            else:
                self.decision_handle.update({"text/plain": ""}, raw=True)
                if self.is_closed and is_open(self.review):
                    close_tree(self.review)

    def _decision_bundle(self) -> dict[str, Any]:
        """The review panel as a widget, with text and HTML for a front end without its model
        (an untrusted copy, nbconvert): that a decision needs a running kernel, and the
        commands that take it from a shell."""
        bundle: dict[str, Any] = dict(self.review._repr_mimebundle_() or {})
        note = self.review.kernel_note()
        bundle["text/plain"] = note
        bundle["text/html"] = f"<div class='wf-decision-static'>{html.escape(note)}</div>"
        return bundle

    def _release(self, *, keep_review: bool) -> None:
        """Close the models of a view gone static; a live decision panel's stay open."""
        with self._display_lock:
            if not self.is_closed:
                close_tree(self, keep=[self.review] if keep_review else ())
                self.is_closed = True
            if not keep_review and is_open(self.review):
                close_tree(self.review)

    def _revive(self) -> None:
        """Open the models again (a drive of this kernel shows the view live once more)."""
        with self._display_lock:
            if self.is_closed:
                reopen_tree(self)
                self.is_closed = False

    def static_bundle(self) -> dict[str, str]:
        """The run view as text and HTML, with the header's origin and the status line."""
        handle = self._handle()
        snap = self.snapshot or self.reader.take()
        origin = good_news_html(self.origin) if self.origin else ""
        body = run_html(handle)
        return {
            "text/plain": run_text(handle),
            "text/html": f"<div class='wf-run-view-static'>{origin}{body}"
            f"<div>{static_status_line(snap)}</div></div>",
        }


def static_key(snap: RunSnapshot) -> tuple[object, ...]:
    """What a static output shows of a run, as a value (a change repaints it)."""
    waiting = snap.waiting
    return (
        snap.status,
        snap.reason,
        snap.units,
        snap.result,
        len(snap.rejections),
        (waiting.step_id, waiting.loop, waiting.decided) if waiting is not None else None,
        tuple((s.step_id, s.status, s.done, s.failed, s.loop) for s in snap.steps),
    )


def static_status_line(snap: RunSnapshot) -> str:
    """The static view's last line: how the run stands and what to do next."""
    if snap.status == "completed":
        return "<b>Run completed.</b>"
    if snap.status == "active":
        return (
            "<i>not being driven: re-run the cell or <code>%workflow resume</code> to continue</i>"
        )
    if snap.status == "blocked" and snap.waiting is not None:
        since = snap.waiting.since
        waited = (
            f" for {elapsed_text(max(0.0, time.time() - since))}"
            if since is not None and not snap.waiting.decided
            else ""
        )
        return f"Blocked: waiting on step <code>{html.escape(snap.waiting.step_id)}</code>{waited}."
    return f"Run {html.escape(snap.status)}."
