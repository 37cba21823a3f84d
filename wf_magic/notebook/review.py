"""The review panel of the run view: a waiting gate's question and a person's decision."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from ..display import STATUS_COLOURS, artifact_cards_html, criteria_html
from ..errors import RunNotOwned, WorkflowError
from .snapshot import Waiting

if TYPE_CHECKING:
    from ..engine import Engine

_JUDGE_TITLES = {
    "human": "Waiting for your decision",
    "exhausted": "Gate exhausted — approve the last artifact, or abandon or fork the run",
    "failed": "The judge could not answer — decide yourself",
}


STALE_AFTER_S = 5
"""A panel whose kernel stopped ticking hides its controls after this long (see ``tick``)."""
LIVE_STEP = 100
"""How far each tick moves the panel's ``--wf-live`` target (see :func:`live_controls_html`)."""


def say(message: w.HTML, text: str, *, error: bool = False) -> None:
    """Show ``text`` in a view's message line (an empty text clears it)."""
    if not text:
        message.value = ""
        return
    colour = STATUS_COLOURS["failed"] if error else "#57606a"
    message.value = f'<span style="color:{colour}">{html.escape(text)}</span>'


class ReviewPanel(w.VBox):  # type: ignore[misc]  # ipywidgets is untyped
    """What a waiting gate asks (criteria, the artifact) and the buttons that answer it.

    Approve/Reject record the decision through the engine and hand the run to
    ``continue_drive``; Abandon and Fork are the ways out of an exhausted gate. It never
    writes the journal itself, and it shows what it did in the view's ``message`` line.

    Args:
        engine: the engine holding the run.
        run_id: the run under review.
        waiting: returns what the run waits on as last read (None: nothing).
        message: the view's message line.
        poke: schedules a redraw of the whole view.
        continue_drive: called with the run id after Approve/Reject (and by nothing else).
    """

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        *,
        waiting: Callable[[], Waiting | None],
        message: w.HTML,
        poke: Callable[[], None],
        continue_drive: Callable[[str], object] | None = None,
        forked: Callable[[str], bool] | None = None,
        **kwargs: Any,
    ):
        self.engine = engine
        self.run_id = run_id
        self.waiting = waiting
        self.message = message
        self.poke = poke
        self.continue_drive = continue_drive
        self.forked = forked
        """Shows and drives a fork (the run view's); False when it cannot (then said how)."""
        self.acted: str | None = None
        """What this panel decided while the drive it started runs (said once it ended)."""
        self._decision_key: tuple[str, int, str] | None = None
        self.said = w.HTML()
        """The panel's own message line: what a button did, or why it did nothing."""
        self.kernel_line = w.HTML()
        """Its CSS shows the panel's controls only while the kernel ticks; without one, as in
        a reopened notebook from its first paint, it says a decision needs a kernel and the
        controls are not shown (see :meth:`tick`)."""
        self.summary = w.HTML()
        self.feedback = w.Textarea(
            placeholder="Feedback for the step (required to reject)",
            layout=w.Layout(width="100%", height="4em"),
        )
        self.approve_button = w.Button(description="Approve", button_style="success", icon="check")
        self.reject_button = w.Button(description="Reject", button_style="danger", icon="times")
        self.abandon_button = w.Button(
            description="Abandon", icon="ban", layout=w.Layout(display="none")
        )
        self.fork_button = w.Button(
            description="Fork from here", icon="code-branch", layout=w.Layout(display="none")
        )
        self.approve_button.on_click(lambda _b: self.decide(approve=True))
        self.reject_button.on_click(lambda _b: self.decide(approve=False))
        self.abandon_button.on_click(lambda _b: self.abandon())
        self.fork_button.on_click(lambda _b: self.fork())
        super().__init__(
            [
                self.summary,
                self.feedback,
                w.HBox(
                    [
                        self.approve_button,
                        self.reject_button,
                        self.abandon_button,
                        self.fork_button,
                    ]
                ),
                self.said,
                self.kernel_line,
            ],
            layout=w.Layout(display="none", border="1px solid #bf8700", padding="6px"),
            **kwargs,
        )
        self.add_class(f"wf-review-{_css_name(run_id)}")
        # Its own class for its kernel check: another panel of the run (a retired view's)
        # must not restyle this one's controls.
        self.css_class = f"wf-panel-{_css_name(self.model_id)}"
        self.add_class(self.css_class)

    def _say(self, text: str, *, error: bool = False) -> None:
        # Said in the panel too: the view's own message line is not shown while its output
        # is the static HTML and this panel is the live part below it.
        say(self.message, text, error=error)
        say(self.said, text, error=error)

    def kernel_note(self) -> str:
        """That a decision needs a running kernel, and the shell commands that take it."""
        waiting = self.waiting()
        step = waiting.step_id if waiting is not None else "STEP"
        return (
            "This decision needs a running kernel: run the notebook's cells again, or decide "
            f"from a shell with `wf approve {self.run_id} {step}` or "
            f"`wf reject {self.run_id} {step} --feedback TEXT` (then `wf resume {self.run_id}`)."
        )

    def tick(self, ticks: int) -> None:
        """Re-arm the panel's kernel check (the view's clock calls this about every second).

        The line's CSS shows the panel's buttons and feedback box only while a tick's change
        is still transitioning (:func:`live_controls_html`): a kernel that ticks keeps them
        shown; one that stopped hides them and shows the kernel note within
        :data:`STALE_AFTER_S` seconds; a reopened notebook's saved widget state, which nothing
        ticks, never shows them, from its first paint.
        """
        self.kernel_line.value = live_controls_html(
            self.kernel_note(), css_class=self.css_class, ticks=ticks
        )

    # -- acting -----------------------------------------------------------------------------
    def decide(self, *, approve: bool) -> None:
        """Record Approve/Reject for the waiting gate, then hand the run to a drive."""
        waiting = self.waiting()
        if waiting is None:
            self._say("nothing is waiting for a decision", error=True)
            return
        text = self.feedback.value.strip()
        if not approve and not text:
            self._say(
                "a rejection needs feedback: write what to change in the box above, then Reject",
                error=True,
            )
            return
        try:
            if approve:
                self.engine.approve(
                    self.run_id, waiting.step_id, feedback=text or None, loop=waiting.loop
                )
            else:
                self.engine.reject(self.run_id, waiting.step_id, feedback=text, loop=waiting.loop)
        except WorkflowError as exc:
            self._say(_said(exc), error=True)
            self.poke()  # the run moved on elsewhere: show where it is now
            return
        verb = "approved" if approve else "rejected"
        self.approve_button.disabled = self.reject_button.disabled = True
        self.feedback.value = ""
        self.acted = f"{verb} step {waiting.step_id} (loop {waiting.loop})"
        self._say(f"{self.acted}; continuing…")
        if self.continue_drive is not None:
            try:
                self.continue_drive(self.run_id)
            except WorkflowError as exc:
                self._say(f"{verb}, but the run could not continue here: {exc}", error=True)
        self.poke()

    def abandon(self) -> None:
        """Give up the run (an exhausted gate's way out): it becomes ``abandoned``."""
        try:
            self.engine.abandon(self.run_id, reason="abandoned from the run view")
        except WorkflowError as exc:
            self._say(_said(exc), error=True)
        else:
            self._disable_buttons()
            self._say("run abandoned")
        self.poke()

    def fork(self) -> None:
        """Start a new run of the same plan from the waiting step, reusing what came before
        (this run is superseded), and drive it with its view below this one; without a
        kernel-side view (a plain panel) the fork is created and the message says how."""
        waiting = self.waiting()
        if waiting is None:
            self._say("nothing is waiting for a decision", error=True)
            return
        try:
            forked = self.engine.fork(self.run_id, from_step=waiting.step_id)
        except WorkflowError as exc:
            self._say(_said(exc), error=True)
        else:
            self._disable_buttons()
            if self.forked is not None and self.forked(forked.run_id):
                self._say(
                    f"forked as run {forked.run_id} from step {waiting.step_id} (this run is "
                    "superseded); the fork is driven below"
                )
            else:
                self._say(
                    f"forked as run {forked.run_id} from step {waiting.step_id} (this run is "
                    f"superseded); `%workflow resume {forked.run_id}` drives it"
                )
        self.poke()

    def _disable_buttons(self) -> None:
        for button in (
            self.approve_button,
            self.reject_button,
            self.abandon_button,
            self.fork_button,
        ):
            button.disabled = True

    # -- drawing ----------------------------------------------------------------------------
    def draw(self, waiting: Waiting | None, *, is_retired: bool) -> None:
        """Show the question ``waiting`` asks, or hide the panel when nothing is left to
        decide here (no gate waits, it was decided elsewhere, or the view is retired)."""
        if waiting is None or is_retired:
            self.layout.display = "none"
            return
        if waiting.decided is not None and self.acted is None:
            # Decided from code, another cell or the CLI: no button left to press here.
            self.layout.display = "none"
            self._say(
                f"step {waiting.step_id} (loop {waiting.loop}) was {waiting.decided} "
                "elsewhere; re-run the cell or `%workflow resume` to continue"
            )
            return
        key = (waiting.step_id, waiting.loop, waiting.judge)
        # An exhausted gate has no loop left to re-execute: the engine refuses a rejection;
        # the ways out are approving the last artifact, abandoning, or forking from the step.
        can_reject = waiting.judge != "exhausted"
        if self._decision_key != key:
            self._decision_key = key  # a new question: re-arm the buttons
            self.approve_button.disabled = False
            self.reject_button.disabled = not can_reject
            self.abandon_button.disabled = self.fork_button.disabled = can_reject
        self.reject_button.layout.display = "" if can_reject else "none"
        for button in (self.abandon_button, self.fork_button):
            button.layout.display = "none" if can_reject else ""
        self.feedback.placeholder = (
            "Feedback for the step (required to reject)"
            if can_reject
            else "A note recorded with your approval (optional)"
        )
        self.summary.value = _question_html(waiting)
        if not self.kernel_line.value:  # controls hidden until the first tick shows them
            self.tick(0)
        self.layout.display = ""


def _css_name(run_id: str) -> str:
    return "".join(c if c.isalnum() or c == "-" else "-" for c in run_id)


def live_controls_html(note: str, *, css_class: str, ticks: int) -> str:
    """CSS that shows ``css_class``'s buttons and text box only while a change of its
    ``--wf-live`` is transitioning, else ``note`` in their place.

    Each tick sets ``--wf-live`` to a higher target (``ticks`` × :data:`LIVE_STEP`), which a
    registered property transitions to over :data:`STALE_AFTER_S` seconds; a control is shown
    while the value still lags its target. A CSS transition never runs on a first paint, so
    a panel drawn from a saved notebook's widget state (nothing ticks it) shows the note and
    no control from the start, and a live one loses its controls that long after its
    kernel's last tick. A browser without ``@property`` falls back to showing the controls
    (``--wf-reg`` is then unset).
    """
    target = max(ticks, 0) * LIVE_STEP
    root = f".{css_class}"
    return (
        "<style>"
        "@property --wf-live{syntax:'<number>';inherits:true;initial-value:0}"
        "@property --wf-reg{syntax:'<number>';inherits:true;initial-value:1}"
        f"{root}{{--wf-live:{target};transition:--wf-live {STALE_AFTER_S}s linear;"
        f"--wf-on:clamp(0,calc({target} - var(--wf-live) + 1 - var(--wf-reg,0)),1)}}"
        f"{root} .widget-button,{root} .widget-textarea"
        "{opacity:var(--wf-on);transform:scale(var(--wf-on))}"
        f"{root} .wf-kernel-note{{display:block;overflow:hidden;"
        "opacity:calc(1 - var(--wf-on));max-height:calc((1 - var(--wf-on)) * 12em)}"
        "</style>"
        f"<span class='wf-kernel-note' style='color:{STATUS_COLOURS['failed']}'>"
        f"{html.escape(note)}</span>"
    )


def _question_html(waiting: Waiting) -> str:
    title = _JUDGE_TITLES.get(waiting.judge, "Waiting for a decision")
    if waiting.units:
        artifact = artifact_cards_html(waiting.units, loop=waiting.loop)
    else:  # nothing journaled to show unit by unit: the judge's summary
        artifact = (
            "<pre style='max-height:12em;overflow:auto;white-space:pre-wrap'>"
            f"{html.escape(waiting.summary)}</pre>"
        )
    return (
        f"<b>{html.escape(title)}</b>: step <code>"
        f"{html.escape(waiting.step_id)}</code>, loop {waiting.loop}"
        f"{criteria_html(waiting.criteria)}{artifact}"
    )


def _said(exc: WorkflowError) -> str:
    """An error as the panel says it: another user's run names the notebook's adopt command."""
    if isinstance(exc, RunNotOwned):
        return exc.text(adopt=f"%workflow adopt {exc.run_id}")
    return str(exc)
