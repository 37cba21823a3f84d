"""Specification of the live run view (wf_magic.notebook.widgets) and its throttle.

Most tests build a ``RunView`` over an Engine; the last ones show it through ``%%workflow``
with widgets on, in an in-process IPython shell.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_notebook import (
    CELL_DIGEST,
    HUMAN_DRAFT,
    JUDGED,
    SLOW,
    cell,
    drives_of,
    engine_at,
    ipython_shell,
    magics_in,
    redraw_bound,
    view_of,
)
from wf_magic import Engine
from wf_magic.notebook.drives import Drives
from wf_magic.notebook.magics import WorkflowMagics
from wf_magic.notebook.rows import elapsed_text
from wf_magic.notebook.throttle import Throttle
from wf_magic.notebook.widgets import RunView

DIGEST = """\
name: digest
runner: scripted
runners:
  scripted:
    rules:
      - match: "^Outline"
        reply: {sections: [intro, method, results]}
steps:
  - id: outline
    prompt: "Outline the digest"
    output:
      type: object
      properties: {sections: {type: array, items: {type: string}}}
      required: [sections]
  - id: draft
    map: "{{ steps.outline.output.sections }}"
    prompt: "Write the section {{ item }}"
  - id: wrap
    prompt: "Wrap up {{ steps.draft.output | length }} sections"
"""

HUMAN = """\
name: reviewed
runner: scripted
steps:
  - id: draft
    prompt: "Write a draft"
  - id: review
    prompt: "Polish {{ steps.draft.output }}"
    gate: {judge: human, criteria: [ready to publish]}
  - id: publish
    prompt: "Publish {{ steps.review.output }}"
"""


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    yield from engine_at(tmp_path / "state")


@pytest.fixture
def drives(engine: Engine) -> Iterator[Drives]:
    yield from drives_of(engine)


def _cells(view: RunView, step_id: str) -> dict[str, object]:
    row = view.rows[step_id]
    return {
        "bar": row.bar.value,
        "bar_max": row.bar.max,
        "units": row.units.value,
        "tokens": row.tokens.value,
        "loop": row.loop.value,
        "status": row.status.value,
    }


def test_step_rows_match_the_journal_after_a_run(engine: Engine) -> None:
    _started = engine.start(DIGEST)
    run_id = _started.run_id
    view = view_of(engine, run_id)
    engine.drive(run_id)
    view.flush()
    journal = engine.journal(run_id)
    assert list(view.rows) == ["outline", "draft", "wrap"]
    for step_id in view.rows:
        work = journal[(journal["step"] == step_id) & (journal["phase"] == "work")]
        done = int((work["status"] == "succeeded").sum())
        tokens = int(
            (
                journal[journal["step"] == step_id]["tokens_in"]
                + journal[journal["step"] == step_id]["tokens_out"]
            ).sum()
        )
        cells = _cells(view, step_id)
        assert cells["units"] == f"{done}/{done}"
        assert (cells["bar"], cells["bar_max"]) == (done, done)
        assert cells["tokens"] == f"{tokens:,} paid"
        assert ">completed<" in str(cells["status"])
    assert _cells(view, "draft")["units"] == "3/3"
    assert ">completed<" in view.header.value and run_id in view.header.value
    assert "Run completed." in view.status_line.value
    use = engine.status(run_id).budget_use()
    assert view.units_label.value == f"{use.units:,} (no limit)"
    assert view.decision_box.layout.display == "none"
    assert view.gate_panel.layout.display == "none"
    assert view.events_seen > 0 and view.redraws >= 1


def test_budget_bars_show_use_against_the_ceilings(engine: Engine) -> None:
    _started = engine.start(
        DIGEST.replace(
            "runner: scripted\n", "runner: scripted\nbudget: {max_units: 40, max_tokens: 5000}\n", 1
        )
    )
    run_id = _started.run_id
    view = view_of(engine, run_id)
    engine.drive(run_id)
    view.flush()
    use = engine.status(run_id).budget_use()
    assert (view.units_bar.value, view.units_bar.max) == (use.units, 40)
    assert view.units_label.value == f"{use.units}/40"
    assert (view.tokens_bar.value, view.tokens_bar.max) == (use.tokens, 5000)


def test_a_rejected_gate_shows_in_the_gate_panel_with_its_feedback(engine: Engine) -> None:
    _started = engine.start(JUDGED)
    run_id = _started.run_id
    view = view_of(engine, run_id)
    engine.drive(run_id)
    view.flush()
    assert engine.status(run_id).status == "completed"
    assert view.gate_panel.layout.display == ""
    panel = view.gate_panel.value
    assert "Gate rejections</b> (1)" in panel
    assert (
        "<td><code>draft</code></td><td>1</td><td>llm</td><td>far too short</td>"
        "<td>an example</td>" in panel
    )
    assert _cells(view, "draft")["loop"] == "2/3"


def test_reused_results_and_tokens_saved_show_as_a_warning(engine: Engine) -> None:
    _started = engine.start(DIGEST)
    first = _started.run_id
    engine.drive(first)
    _started = engine.start(DIGEST.replace("Wrap up", "Sum up"))
    second = _started.run_id
    created = _started.created
    assert created
    view = view_of(engine, second)
    handle = engine.drive(second)
    view.flush()
    assert handle.stats is not None and handle.stats.reused == 4
    saved = handle.stats.saved_tokens
    assert f"reused 4 results from earlier runs ({saved:,} tokens saved)" in view.warning_box.value
    assert view.warning_box.layout.display == ""
    assert str(_cells(view, "draft")["tokens"]).endswith(" reused")
    assert _cells(view, "wrap")["tokens"] != "0"  # the edited step was re-paid


def test_clicking_approve_completes_a_blocked_human_gate_run(
    engine: Engine, drives: Drives
) -> None:
    _started = engine.start(HUMAN)
    run_id = _started.run_id
    view = view_of(engine, run_id, drives)
    engine.drive(run_id)
    view.flush()
    assert engine.status(run_id).status == "blocked"
    assert view.decision_box.layout.display == ""
    assert "Waiting for your decision" in view.summary.value
    assert "<code>review</code>, loop 1" in view.summary.value
    view.feedback.value = "ship it"
    view.approve_button.click()
    assert drives.wait(run_id, timeout=30)
    view.flush()
    assert engine.status(run_id).status == "completed"
    assert view.decision_box.layout.display == "none"
    assert "Run completed." in view.status_line.value
    assert "approved step review (loop 1)." in view.message.value
    verdicts = engine.journal(run_id)
    human = verdicts[verdicts["runner"] == "human"]
    assert list(human["unit"]) == ["review.gate:l1"]


def test_reject_needs_feedback_and_then_re_executes_the_step(
    engine: Engine, drives: Drives
) -> None:
    _started = engine.start(
        HUMAN.replace("criteria: [ready to publish]", "criteria: [ready to publish], max_loops: 2")
    )
    run_id = _started.run_id
    view = view_of(engine, run_id, drives)
    engine.drive(run_id)
    view.flush()
    view.reject_button.click()
    assert "a rejection needs feedback" in view.message.value
    assert not drives.is_driving(run_id)
    view.feedback.value = "mention the method"
    view.reject_button.click()
    assert drives.wait(run_id, timeout=30)
    view.flush()
    assert engine.status(run_id).status == "blocked"  # loop 2 waits for a person again
    assert "<code>review</code>, loop 2" in view.summary.value
    assert "mention the method" in view.gate_panel.value
    assert not view.approve_button.disabled  # a new question re-arms the buttons


def test_an_exhausted_gate_offers_approve_only(engine: Engine) -> None:
    exhausted = JUDGED.replace("a long and detailed draft", "still short").replace(
        "max_loops: 3", "max_loops: 2"
    )
    run_id = engine.start(exhausted).run_id
    view = view_of(engine, run_id)
    engine.drive(run_id)
    view.flush()
    assert engine.status(run_id).status == "blocked"
    assert view.decision_box.layout.display == ""
    assert "approve the last artifact, or abandon or fork the run" in view.summary.value
    assert view.reject_button.layout.display == "none" and view.reject_button.disabled
    assert not view.approve_button.disabled
    assert _cells(view, "draft")["loop"] == "2/2"


def test_a_human_gate_with_one_loop_shows_its_loop(engine: Engine) -> None:
    run_id = engine.start(HUMAN).run_id
    view = view_of(engine, run_id)
    engine.drive(run_id)
    view.flush()
    assert view.reject_button.layout.display == ""  # a human gate can be rejected
    assert (_cells(view, "draft")["loop"], _cells(view, "review")["loop"]) == ("", "1/1")


def test_a_completed_run_shows_its_result_in_the_header(engine: Engine) -> None:
    run = engine.run(DIGEST)
    view = view_of(engine, run.run_id)
    view.flush()
    assert (
        f"<pre style='max-height:12em;overflow:auto;white-space:pre-wrap'>{run.result}</pre>"
        in (view.header.value)
    )


def test_a_stale_decision_is_refused_and_shown(engine: Engine) -> None:
    _started = engine.start(HUMAN)
    run_id = _started.run_id
    view = view_of(engine, run_id)
    engine.drive(run_id)
    view.flush()
    engine.approve(run_id, "review")  # decided elsewhere (another view, the CLI)
    view.approve_button.click()
    assert "already decided" in view.message.value


def test_a_2000_unit_fan_out_redraws_a_bounded_number_of_times(engine: Engine) -> None:
    _started = engine.start("""\
name: fan
runner: scripted
execution: {max_concurrency: 1}
steps:
  - id: fan
    map: "{{ range(2000) | list }}"
    prompt: "unit {{ item }}"
""")
    run_id = _started.run_id
    view = view_of(engine, run_id)
    started = time.monotonic()
    engine.drive(run_id)
    elapsed = time.monotonic() - started
    view.flush()
    assert view.events_seen >= 4000
    # ~10 a second at most (by the clock, however long a loaded machine takes), plus the flush
    assert view.redraws <= redraw_bound(view, elapsed)
    assert _cells(view, "fan")["units"] == "2000/2000"


def test_a_map_step_shows_its_total_before_its_units_run(engine: Engine) -> None:
    _started = engine.start(DIGEST)
    run_id = _started.run_id
    engine.drive(run_id, max_steps=1)
    view = view_of(engine, run_id)
    view.flush()
    assert _cells(view, "draft")["units"] == "0/3"
    assert _cells(view, "wrap")["units"] == "0/1"


def test_the_throttle_coalesces_bursts_and_always_draws_the_last_state() -> None:
    seen: list[int] = []
    state = {"n": 0}
    throttle = Throttle(lambda: seen.append(state["n"]), interval_s=0.1)
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        state["n"] += 1
        throttle.poke()
    time.sleep(0.3)
    assert 2 <= throttle.calls <= 8
    assert seen[-1] == state["n"]  # the trailing call saw the final state


def test_pokes_from_many_threads_never_overlap_calls() -> None:
    active = {"now": 0, "max": 0}
    lock = threading.Lock()

    def slow() -> None:
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
        time.sleep(0.01)
        with lock:
            active["now"] -= 1

    throttle = Throttle(slow, interval_s=0.0)
    threads = [
        threading.Thread(target=lambda: [throttle.poke() for _ in range(200)]) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    throttle.flush()
    assert active["max"] == 1


def test_a_detached_view_stops_observing(engine: Engine) -> None:
    _started = engine.start(DIGEST)
    run_id = _started.run_id
    view = view_of(engine, run_id)
    view.detach()
    engine.drive(run_id)
    assert view.events_seen == 0


def test_the_view_renders_as_text_outside_a_widget_front_end(engine: Engine) -> None:
    _started = engine.start(DIGEST)
    run_id = _started.run_id
    engine.drive(run_id)
    view = view_of(engine, run_id)
    text = repr(view)
    assert text.startswith(f"Run {run_id}  digest  [completed]")
    assert "draft            completed units 3/3" in text
    assert text.endswith(f"  result: {engine.status(run_id).result}")


def test_the_html_rendering_matches_the_view(engine: Engine) -> None:
    body = JUDGED.replace("runner: scripted\n", "runner: scripted\nbudget: {max_units: 10}\n", 1)
    run = engine.run(body)
    html = run._repr_html_()
    assert "<td><code>draft</code></td><td>1</td><td>llm</td><td>far too short</td>" in html
    assert "budget — units 2/10 · tokens " in html
    assert (
        f"<pre style='max-height:12em;overflow:auto;white-space:pre-wrap'>{run.result}</pre>"
        in (html)
    )
    text = repr(run)
    assert "  gate rejected draft loop 1 (llm): far too short; missing: an example" in text
    assert "  draft            completed units 1/1  tokens " in text and "loop 2/3" in text


def test_a_pending_map_step_shows_its_total_once_known(engine: Engine) -> None:
    run_id = engine.start(DIGEST).run_id
    assert "  draft            pending   units 0/?  tokens 0" in repr(engine.status(run_id))
    run = engine.drive(run_id, max_steps=1)
    assert "  draft            pending   units 0/3  tokens 0" in repr(run)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, ""), (0.42, "0.4 s"), (12.3, "12 s"), (184, "3 m 04 s"), (3720, "1 h 02 m")],
)
def test_elapsed_text(seconds: float | None, text: str) -> None:
    assert elapsed_text(seconds) == text


# -- the view a cell shows with widgets on ------------------------------------------------------
EXHAUSTED = """\
name: exhausted
runner: scripted
runners:
  scripted:
    rules:
      - match: "(?s)^Judge"
        reply: {complete: false, feedback: "too short", missing: [an example]}
steps:
  - id: draft
    prompt: "Write a draft"
    gate: {judge: llm, criteria: [detailed], max_loops: 2}
"""


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


@pytest.fixture
def widgets_on(shell: InteractiveShell, tmp_path: Path) -> Iterator[WorkflowMagics]:
    with magics_in(shell, tmp_path / "state", widgets="on") as magics:
        yield magics


def test_the_view_shows_superseded_drift_and_reuse_warnings(
    shell: InteractiveShell, widgets_on: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    old = cell(shell, "--max-steps 1")
    new = cell(shell, "", CELL_DIGEST.replace("Wrap up", "Sum up"))
    box = new.view.warning_box
    assert box.layout.display == ""
    assert f"superseded by {new.run_id}" in box.value
    assert "reused 1 result from earlier runs (14 tokens saved)" in box.value
    assert old.status == "abandoned"
    owed = cell(shell, "--new --max-steps 1")
    drifted = cell(shell, f"--resume {owed.run_id}", CELL_DIGEST.replace("Wrap up", "Close"))
    assert drifted.run_id == owed.run_id
    assert "continuing with its frozen plan" in drifted.view.warning_box.value
    capsys.readouterr()


def test_the_view_rows_header_and_budget_after_a_run(
    shell: InteractiveShell, widgets_on: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    body = CELL_DIGEST.replace("runner: scripted\n", "runner: scripted\nbudget: {max_units: 10}\n")
    run = cell(shell, "", body)
    view = run.view
    assert "<b>digest</b>" in view.header.value and run.run_id in view.header.value
    assert ">completed<" in view.header.value
    draft = view.rows["draft"]
    assert draft.units.value == "3/3" and draft.bar.value == draft.bar.max == 3
    assert draft.elapsed.value.endswith(" s")
    assert (view.units_bar.value, view.units_bar.max) == (5, 10)
    assert view.units_label.value == "5/10"
    assert view.tokens_bar.layout.display == "none"  # no token ceiling: no misleading bar
    capsys.readouterr()


def test_stop_button_stops_a_background_drive_and_the_run_stays_active(
    shell: InteractiveShell, widgets_on: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    run = cell(shell, "--background", SLOW)
    view = run.view
    time.sleep(0.3)
    view.flush()
    assert view.stop_button.layout.display == ""
    view.stop_button.click()
    assert widgets_on.drives.wait(run.run_id, timeout=30)
    view.flush()
    assert run.status == "active"
    assert "not being driven" in view.status_line.value
    assert view.stop_button.layout.display == "none"
    capsys.readouterr()


def test_an_exhausted_gate_can_be_approved_from_the_view(
    shell: InteractiveShell, widgets_on: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    run = cell(shell, "", EXHAUSTED)
    assert run.status == "blocked" and "gate exhausted" in (run.reason or "")
    view = run.view
    assert "Gate rejections</b> (2)" in view.gate_panel.value
    assert view.rows["draft"].loop.value == "2/2"
    assert view.decision_box.layout.display == ""
    view.approve_button.click()
    assert widgets_on.drives.wait(run.run_id, timeout=30)
    view.flush()
    assert run.status == "completed"
    capsys.readouterr()


def test_an_exhausted_gate_view_offers_no_reject_that_is_always_refused(
    shell: InteractiveShell, widgets_on: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    run = cell(shell, "", EXHAUSTED)
    view = run.view
    capsys.readouterr()
    offered = not view.reject_button.disabled and view.reject_button.layout.display != "none"
    if offered:
        view.feedback.value = "try again"
        view.reject_button.click()
        assert "Nothing was recorded" not in view.message.value
    assert "reject it" not in view.summary.value


def test_a_gated_step_row_shows_its_loop(
    shell: InteractiveShell, widgets_on: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    run = cell(shell, "", HUMAN_DRAFT)
    capsys.readouterr()
    assert run.status == "blocked"
    assert run.view.rows["draft"].loop.value == "1/1"
