"""Gate panels are complete: an exhausted human gate offers Approve / Abandon / Fork from here
like an exhausted LLM gate, and a button that does nothing says why in the panel itself; a
panel without a live kernel says the decision needs one and names ``wf approve`` /
``wf reject``, and its CSS shows no control unless a tick of a live kernel re-arms it: a
reopened notebook's panel shows none from its first paint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers_notebook import drives_of, engine_at, view_of
from wf_magic import Engine
from wf_magic.notebook.drives import Drives
from wf_magic.notebook.review import LIVE_STEP, STALE_AFTER_S, live_controls_html

HUMAN_TWO_LOOPS = """\
name: reviewed
runner: scripted
steps:
  - id: review
    prompt: "Polish the draft"
    gate: {judge: human, max_loops: 2}
"""


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    yield from engine_at(tmp_path / "state")


@pytest.fixture
def drives(engine: Engine) -> Iterator[Drives]:
    yield from drives_of(engine)


def _exhausted_by_a_person(engine: Engine) -> str:
    """A human gate rejected on every loop (its last rejection exhausts it)."""
    run_id = engine.run(HUMAN_TWO_LOOPS).run_id
    for loop in (1, 2):
        engine.reject(run_id, "review", feedback=f"no, loop {loop}")
        engine.resume(run_id)
    return run_id


def _shown(button: object) -> bool:
    return bool(button.layout.display != "none" and not button.disabled)  # type: ignore[attr-defined]


def test_an_exhausted_human_gate_offers_approve_abandon_and_fork(
    engine: Engine, drives: Drives
) -> None:
    run_id = _exhausted_by_a_person(engine)
    view = view_of(engine, run_id, drives)
    view.flush()
    assert view.snapshot is not None and view.snapshot.waiting is not None
    assert view.snapshot.waiting.judge == "exhausted"
    assert view.snapshot.waiting.decided is None  # the rejection exhausted it, decided nothing
    assert view.decision_box.layout.display == ""
    assert "approve the last artifact, or abandon or fork the run" in view.summary.value
    assert [_shown(b) for b in (view.approve_button, view.abandon_button, view.fork_button)] == [
        True,
        True,
        True,
    ]
    assert not _shown(view.reject_button)
    view.approve_button.click()
    assert drives.wait(run_id, 10)
    assert engine.get_run(run_id).status == "completed"
    view.close()


@pytest.mark.parametrize("action", ["abandon", "fork"])
def test_an_exhausted_human_gate_can_be_abandoned_or_forked_from_the_view(
    engine: Engine, action: str
) -> None:
    run_id = _exhausted_by_a_person(engine)
    view = view_of(engine, run_id)
    view.flush()
    getattr(view, f"{action}_button").click()
    assert engine.get_run(run_id).status == "abandoned"  # a fork supersedes the run
    said = view.review.said.value
    assert ("run abandoned" in said) if action == "abandon" else ("forked as run" in said)
    view.close()


@pytest.mark.parametrize("box", ["", "   ", "\n\t"])
def test_reject_with_an_empty_box_says_why_nothing_happened_in_the_panel(
    engine: Engine, box: str
) -> None:
    run_id = engine.run(HUMAN_TWO_LOOPS).run_id
    view = view_of(engine, run_id)
    view.flush()
    view.review.feedback.value = box
    view.reject_button.click()
    for line in (view.review.said.value, view.message.value):
        assert "a rejection needs feedback: write what to change in the box above" in line
    assert engine.get_run(run_id).status == "blocked"
    assert engine.status(run_id).attempts()[-1].runner != "human"  # nothing was recorded
    view.close()


def test_a_panel_without_a_ticking_kernel_names_the_cli_and_shows_no_control(
    engine: Engine,
) -> None:
    run_id = engine.run(HUMAN_TWO_LOOPS).run_id
    view = view_of(engine, run_id)
    view.flush()
    note = view.review.kernel_note()
    assert "needs a running kernel" in note
    assert f"wf approve {run_id} review" in note
    assert f"wf reject {run_id} review --feedback TEXT" in note
    # Drawn, before any tick: the line's CSS already hides the controls (what a panel saved
    # at once and reopened shows).
    first = view.review.kernel_line.value
    assert first == live_controls_html(note, css_class=view.review.css_class, ticks=0)
    view.review.tick(1)
    second = view.review.kernel_line.value
    view.review.tick(2)
    third = view.review.kernel_line.value
    panel = f".{view.review.css_class}"
    for ticks, line in enumerate((first, second, third)):
        target = ticks * LIVE_STEP
        # Controls show only while --wf-live still transitions to this tick's target: at
        # rest (a first paint, or STALE_AFTER_S after the last tick) they are not there.
        assert f"{panel}{{--wf-live:{target};transition:--wf-live {STALE_AFTER_S}s linear;" in line
        assert f"--wf-on:clamp(0,calc({target} - var(--wf-live) + 1 - var(--wf-reg,0)),1)" in line
        assert f"{panel} .widget-button,{panel} .widget-textarea" in line
        assert "{opacity:var(--wf-on);transform:scale(var(--wf-on))}" in line
        assert "@property --wf-live{syntax:'<number>';inherits:true;initial-value:0}" in line
        assert "animation" not in line  # an animation would start on a first paint too
        assert "needs a running kernel" in line and f"wf approve {run_id} review" in line
    assert f"wf-review-{run_id}" in view.review._dom_classes
    assert view.review.css_class in view.review._dom_classes
    view.close()


def test_two_panels_of_one_run_never_restyle_each_other(engine: Engine) -> None:
    run_id = engine.run(HUMAN_TWO_LOOPS).run_id
    first, second = view_of(engine, run_id), view_of(engine, run_id)
    for view in (first, second):
        view.flush()
    assert first.review.css_class != second.review.css_class
    assert f".{first.review.css_class}" not in second.review.kernel_line.value
    first.close()
    second.close()


def test_the_saved_decision_output_reads_without_a_widget_manager(
    engine: Engine, drives: Drives
) -> None:
    run_id = engine.run(HUMAN_TWO_LOOPS).run_id
    view = view_of(engine, run_id, drives)
    published: list[object] = []
    view.display_handle = _Handle([])
    view.decision_handle = _Handle(published)
    view.flush()
    view.refresh()
    bundle = published[-1]
    assert isinstance(bundle, dict)
    assert "application/vnd.jupyter.widget-view+json" in bundle  # live while the kernel lives
    for kind in ("text/plain", "text/html"):
        assert "needs a running kernel" in bundle[kind]
        assert f"wf approve {run_id} review" in bundle[kind]
        assert "ReviewPanel(" not in bundle[kind]  # never the widget's repr
    assert "<button" not in bundle["text/html"]
    view.close()


class _Handle:
    """A display handle that records what was published (no front end here)."""

    def __init__(self, published: list[object]) -> None:
        self.published = published

    def update(self, obj: object, **_kw: object) -> None:
        self.published.append(obj)
