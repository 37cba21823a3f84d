"""Notebook views that tell the truth (issue 13): live progress, honest headers and counts,
views that follow decisions taken elsewhere, and saved outputs that survive the kernel."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_notebook import (
    JUDGED,
    Kernel,
    drives_of,
    engine_at,
    execute_notebook,
    ipython_shell,
    magics_in,
    new_notebook,
    redraw_bound,
    tick_bound,
    view_of,
)
from wf_magic import Engine, ScriptedRunner, UnitRequest, register_runner
from wf_magic.display import STATUS_COLOURS
from wf_magic.errors import UsageError
from wf_magic.locking import RunLock
from wf_magic.notebook.drives import Drives, driver_text
from wf_magic.notebook.magics import WorkflowMagics
from wf_magic.notebook.widgets import RunView
from wf_magic.spec.params import resolve_params

SLOW_ONE = """\
name: slow-one
runner: scripted
runners:
  scripted:
    rules:
      - {match: "think", reply: "done", sleep_s: 2.5}
steps:
  - id: think
    prompt: "think hard"
"""

HELD_ONE = """\
name: held-one
runner: held
steps:
  - id: think
    prompt: "think hard"
"""
"""One unit that stays in flight until the test releases it (the ``held`` fixture)."""

DIGEST = """\
name: digest
runner: scripted
steps:
  - id: outline
    prompt: "Outline owls in 3 sections"
  - id: draft
    map: "{{ range(3) | list }}"
    prompt: "Write section {{ item }} on owls"
  - id: wrap
    prompt: "Wrap up owls"
"""

HUMAN = """\
name: release-notes
runner: scripted
steps:
  - id: draft
    prompt: "Draft the release notes of version 2.0."
  - id: signoff
    prompt: "Polish: {{ steps.draft.output }}"
    gate: {judge: human, criteria: [ready to publish]}
  - id: publish
    prompt: "Publish: {{ steps.signoff.output }}"
"""


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    yield from engine_at(tmp_path / "state")


@pytest.fixture
def drives(engine: Engine) -> Iterator[Drives]:
    yield from drives_of(engine)


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


@pytest.fixture
def magics(shell: InteractiveShell, tmp_path: Path) -> Iterator[WorkflowMagics]:
    with magics_in(shell, tmp_path / "magics-state", widgets="on") as found:
        yield found


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


# -- 1. the first cell: the validator is imported only for a real constraint -------------------
def test_params_of_a_plain_type_are_checked_without_importing_jsonschema(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = engine.load(
        "name: p\nparams:\n  topic: {type: string, default: owls}\n"
        "  n: {type: integer, default: 3}\n  bound: {type: integer, default: 2, minimum: 1}\n"
        "steps:\n  - id: a\n    prompt: '{{ params.topic }}'\n"
    ).plan
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # any `import jsonschema` now fails
    bare = plan.model_copy(update={"params": {k: plan.params[k] for k in ("topic", "n")}})
    assert resolve_params(bare, {"n": "4"}, from_strings=True) == {"topic": "owls", "n": 4}
    assert resolve_params(bare, {"n": 4.0}) == {"topic": "owls", "n": 4.0}  # JSON's integer
    with pytest.raises(UsageError, match=r"^param n: True is not of type 'integer'$"):
        resolve_params(bare, {"n": True})
    with pytest.raises(ImportError):  # a real constraint is what needs the validator
        resolve_params(plan, {})
    monkeypatch.delitem(sys.modules, "jsonschema")
    with pytest.raises(UsageError, match=r"^param bound: 0 is less than the minimum of 1$"):
        resolve_params(plan, {"bound": 0})


def test_a_run_without_params_or_schemas_does_not_import_jsonschema_when_it_starts(
    tmp_path: Path,
) -> None:
    # freeze.py's _check_params imports it for every workflow today (reported, not ours):
    # this pins the run-start half — resolve_params — in a fresh interpreter.
    code = (
        "import sys\nfrom wf_magic.spec.params import resolve_params\n"
        "from wf_magic.spec.plan import Plan\n"
        "plan = Plan.model_validate({'name': 'one', 'steps': []})\n"
        "assert resolve_params(plan, {}) == {}\n"
        "print('jsonschema' in sys.modules)\n"
    )
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    if out.returncode != 0 and "validation error" in out.stderr:
        pytest.skip("a Plan needs more fields than this minimal one")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# -- 2. running work looks like running work --------------------------------------------------
class HeldUnit:
    """The body of a runner whose unit stays in flight until :meth:`release` (60 s at most)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()

    def __call__(self, request: UnitRequest) -> str:
        self.entered.set()
        self._released.wait(60)
        return "done"

    def release(self) -> None:
        self._released.set()


@pytest.fixture
def held() -> Iterator[HeldUnit]:
    """Runner ``held``: its units wait for the test (released at teardown, before the drives
    fixture stops its drives)."""
    body = HeldUnit()
    register_runner("held", lambda ctx: ScriptedRunner(fn=body), replace=True)
    yield body
    body.release()


def _no_redraw_pending() -> bool:
    """No run view's throttle timer is pending or firing (so no redraw is on its way)."""
    return not any(t.name == "wf-view-throttle" for t in threading.enumerate())


def test_a_step_with_a_unit_in_flight_shows_running_and_its_clock_ticks(
    engine: Engine, drives: Drives, held: HeldUnit
) -> None:
    run_id = engine.start(HELD_ONE).run_id
    view = view_of(engine, run_id, drives)
    drives.background(run_id)
    row = view.rows["think"]
    # The runner is entered after the dispatch's events are out; none comes until the release.
    _until(held.entered.is_set, 30)
    _until(_no_redraw_pending, 30)

    def running() -> bool:
        view.flush()
        return ">running<" in row.status.value

    _until(running, 30)
    assert row.units.value == "0/1 · 1 in flight"
    assert (row.bar.value, row.bar.running, row.bar.failed, row.bar.max) == (0, 1, 0, 1)
    assert STATUS_COLOURS["running"] in row.bar.widget.value
    assert "driving…" in view.status_line.value and "1 in flight" in view.status_line.value
    redraws, shown = view.redraws, row.elapsed.value
    # No event arrives while the unit is held; the clock still moves (~1 tick a second).
    _until(lambda: view.clock.ticks >= 1 and row.elapsed.value != shown, 30)
    assert view.clock.ticks >= 1 and row.elapsed.value != shown
    assert view.redraws == redraws  # ticks assign labels; they do not re-read the journal
    held.release()
    drives.wait(run_id, 30)
    view.flush()
    assert ">completed<" in row.status.value and row.units.value == "1/1"
    assert not view.clock.is_running
    view.close()


def test_a_2000_unit_fan_out_stays_within_the_redraw_bound_with_the_clock(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = engine.start(
        "name: fan\nrunner: scripted\nexecution: {max_concurrency: 1}\nsteps:\n"
        "  - id: fan\n    map: '{{ range(2000) | list }}'\n    prompt: 'unit {{ item }}'\n"
    ).run_id
    view = view_of(engine, run_id)
    started = time.monotonic()
    engine.drive(run_id)
    elapsed = time.monotonic() - started
    view.flush()
    updates = view.redraws + view.clock.ticks
    with capsys.disabled():
        print(
            f"\n2000-unit fan-out: {elapsed:.1f} s, {view.redraws} redraws + "
            f"{view.clock.ticks} clock ticks = {updates / elapsed:.1f} updates/s"
        )
    assert updates <= redraw_bound(view, elapsed) + tick_bound(view, elapsed)
    assert view.rows["fan"].units.value == "2000/2000"
    view.close()


# -- 3. a re-run says so, and reuse reads as good news ----------------------------------------
def test_re_runs_say_what_they_did_in_the_header(
    shell: InteractiveShell, magics: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    first = shell.run_cell_magic("workflow", "--max-steps 1", DIGEST)
    assert first.view.origin is None  # a fresh run needs no explanation
    resumed = shell.run_cell_magic("workflow", "", DIGEST)
    assert resumed.run_id == first.run_id
    assert resumed.view.origin == "resumed: 1/5 already done, 4 dispatched"
    again = shell.run_cell_magic("workflow", "", DIGEST)
    assert again.view.origin == "existing run, nothing dispatched"
    assert "✓ existing run, nothing dispatched" in again.view.header.value
    changed = shell.run_cell_magic("workflow", "", DIGEST.replace("Wrap up", "Sum up"))
    box = changed.view.warning_box.value
    assert f'<div style="color:{STATUS_COLOURS["completed"]}">✓ reused 4 results' in box
    assert "⚠ reused" not in box
    capsys.readouterr()


# -- 4. views follow decisions taken elsewhere -------------------------------------------------
def test_a_decision_from_code_takes_the_buttons_away_from_a_waiting_view(engine: Engine) -> None:
    run_id = engine.start(HUMAN).run_id
    engine.drive(run_id)
    view = view_of(engine, run_id)
    view.flush()
    assert view.decision_box.layout.display == ""
    engine.approve(run_id, "signoff", feedback="from code")  # the bus tells the view
    _until(lambda: view.decision_box.layout.display == "none", 5)
    assert "was approved elsewhere" in view.message.value
    view.close()


def test_a_decision_from_another_process_reaches_a_waiting_view_by_polling(
    engine: Engine, tmp_path: Path
) -> None:
    run_id = engine.start(HUMAN).run_id
    engine.drive(run_id)
    view = view_of(engine, run_id, subscribe=False)
    view.flush()
    assert view.decision_box.layout.display == "" and view.clock.is_running
    with Engine(tmp_path / "state") as other:  # its own bus: only the journal is shared
        other.approve(run_id, "signoff")
    _until(lambda: view.decision_box.layout.display == "none", 6)
    assert "was approved elsewhere" in view.message.value
    assert not view.clock.is_running  # nothing left to wait for
    view.close()


def test_an_older_view_of_a_run_loses_its_buttons_when_a_newer_one_opens(
    shell: InteractiveShell, magics: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    old = shell.run_cell_magic("workflow", "", HUMAN)
    assert old.view.decision_box.layout.display == ""
    new = shell.run_line_magic("workflow", f"status {old.run_id}")
    assert new.view.decision_box.layout.display == ""
    assert old.view.decision_box.layout.display == "none"
    assert "a newer view of this run is below" in old.view.message.value
    capsys.readouterr()


def test_the_gates_tutorial_works_after_clicking_approve_and_in_the_other_order(
    tmp_path: Path,
) -> None:
    kernel = Kernel(tmp_path)
    with kernel.client.setup_kernel(cleanup_kc=True):
        kernel.run(f"%env WF_MAGIC_HOME={tmp_path / 'home'}\n%load_ext wf_magic")
        # click first, then the tutorial's code cells as written
        kernel.run(f"%%workflow --as review\n{HUMAN}")
        kernel.run("review.view.approve_button.click()")
        out = kernel.run('loop = review.approve("signoff", feedback="Ship it.")\nprint(loop)')
        assert "was already approved" in "".join(o.get("text", "") for o in out.outputs)
        kernel.run("done = %workflow resume {review.run_id}\nassert done.status == 'completed'")
        # code first, then a click on the (now refreshed) view
        kernel.run(f"%%workflow --new --as second\n{HUMAN}")
        kernel.run('second.approve("signoff", feedback="Ship it.")\nimport time; time.sleep(0.5)')
        assert kernel.value("second.view.decision_box.layout.display") == "none"
        kernel.run("second.view.approve_button.click()")  # hidden, and harmless if clicked
        kernel.run("done = %workflow resume {second.run_id}\nassert done.status == 'completed'")


def test_an_empty_rejection_speaks_notebook(engine: Engine) -> None:
    run_id = engine.start(HUMAN).run_id
    engine.drive(run_id)
    view = view_of(engine, run_id)
    view.flush()
    view.reject_button.click()
    assert "write what to change in the box above, then Reject" in view.message.value
    assert "--feedback" not in view.message.value
    view.close()


# -- 5. a saved notebook keeps the run view ---------------------------------------------------
def test_a_saved_notebook_holds_the_static_html_run_view(tmp_path: Path) -> None:
    nb = new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(src)
        for src in (
            f"%env WF_MAGIC_HOME={tmp_path / 'home'}\n%load_ext wf_magic",
            "%%workflow\nname: tiny\nsteps:\n  - id: a\n    prompt: hi\n",
            "%%workflow --background --as bg\nname: quick\nsteps:\n  - id: b\n    prompt: yo\n",
            "get_ipython().magics_manager.registry['WorkflowMagics'].drives.wait(bg.run_id, 30)",
        )
    ]
    execute_notebook(nb, tmp_path)
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    saved = nbformat.read(path, as_version=4)
    for index, name in ((1, "tiny"), (2, "quick")):
        (shown,) = [o for o in saved.cells[index].outputs if o["output_type"] == "display_data"]
        assert set(shown["data"]) == {"text/plain", "text/html"}, index
        assert f"<b>{name}</b>" in shown["data"]["text/html"]
        assert "Run completed." in shown["data"]["text/html"]


# -- 6. watch says who drives ------------------------------------------------------------------
def test_a_view_of_a_run_driven_elsewhere_names_its_driver(engine: Engine) -> None:
    run_id = engine.start(DIGEST).run_id
    assert driver_text(engine, run_id) is None
    lock = RunLock(engine.lock_dir, run_id)
    holder = threading.Thread(target=lock.acquire)  # another driver, as far as the view knows
    holder.start()
    holder.join()
    try:
        said = driver_text(engine, run_id)
        assert said is not None
        assert said.startswith(f"driven by pid {os.getpid()} on {socket.gethostname()} since ")
        view = view_of(engine, run_id, subscribe=False)
        view.flush()
        assert "driving…" in view.status_line.value and said in view.status_line.value
        assert "not being driven" not in view.status_line.value
        view.close()
    finally:
        lock.release()


# -- 7. honest counts --------------------------------------------------------------------------
def test_judge_tokens_show_apart_from_the_charged_work_tokens(engine: Engine) -> None:
    run_id = engine.start(JUDGED).run_id
    view = view_of(engine, run_id)
    engine.drive(run_id)
    view.flush()
    state = next(s for s in view.snapshot.steps if s.step_id == "draft")  # type: ignore[union-attr]
    assert state.judge_tokens > 0
    assert state.tokens == engine.status(run_id).budget_use().tokens
    assert (
        view.rows["draft"].tokens.value == f"{state.tokens:,} paid · {state.judge_tokens:,} judge"
    )
    view.close()


def test_a_map_that_finished_with_failed_units_is_amber_with_its_failed_count(
    engine: Engine,
) -> None:
    run_id = engine.start(
        "name: partial\nrunner: scripted\nrunners:\n  scripted:\n    rules:\n"
        "      - {match: 'unit 1', error: permanent}\n"
        "steps:\n  - id: fan\n    map: '{{ range(3) | list }}'\n    prompt: 'unit {{ item }}'\n"
        "    on_error: continue\n"
    ).run_id
    view = view_of(engine, run_id)
    engine.drive(run_id)
    view.flush()
    row = view.rows["fan"]
    assert f"background:{STATUS_COLOURS['partial']}" in row.status.value
    assert ">completed · 1 failed<" in row.status.value
    assert row.units.value == "2/3 · 1 failed"
    assert (row.bar.value, row.bar.failed) == (2, 1)
    view.close()


# -- 8. no Out[n] under a view -----------------------------------------------------------------
def test_a_cell_with_a_view_adds_no_out_line(
    shell: InteractiveShell, magics: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    run = shell.run_cell_magic("workflow", "", DIGEST)
    assert shell.display_formatter.format(run) == ({}, {})
    assert repr(run).startswith(f"Run {run.run_id}  digest  [completed]")
    capsys.readouterr()


# -- 9. the review panel of a blocked gate (issue 13 item 7) -----------------------------------
EXHAUSTED = """\
name: judged-map
runner: scripted
params:
  topic: {type: string, default: animals}
runners:
  scripted:
    rules:
      - match: "(?s)^Judge"
        reply: {complete: false, feedback: "far too short", missing: [an example]}
      - match: "Gate feedback"
        reply: "A **longer** draft of {{ item }}"
steps:
  - id: draft
    map: "{{ ['owls', 'bats'] }}"
    prompt: "Write a draft on {{ item }}"
    gate: {judge: llm, criteria: [detailed, "about {{ params.topic }}"], max_loops: 2}
"""


def _all_html(view: RunView) -> str:
    rows = "".join(r.note.value for r in view.rows.values())
    return view.header.value + rows + view.gate_panel.value + view.summary.value


def test_an_exhausted_gate_shows_criteria_one_card_per_unit_and_the_diff(engine: Engine) -> None:
    run_id = engine.start(EXHAUSTED).run_id
    engine.drive(run_id)
    view = view_of(engine, run_id)
    view.flush()
    summary = view.summary.value
    assert "<li>detailed</li><li>about animals</li>" in summary  # rendered, not the template
    assert summary.count("class='wf-card'") == 2
    assert "<code>draft[0]</code>" in summary and "<code>draft[1]</code>" in summary
    assert "<strong>longer</strong>" in summary  # a string artifact reads as Markdown
    assert summary.count("changes since loop 1") == 2
    assert f"color:{STATUS_COLOURS['completed']}" in summary  # the added line, green
    assert f"color:{STATUS_COLOURS['failed']}" in summary  # the removed line, red
    assert "+A **longer** draft of owls" in summary
    shown = [
        b.description
        for b in (view.approve_button, view.reject_button, view.abandon_button, view.fork_button)
        if b.layout.display != "none" and not b.disabled
    ]
    assert shown == ["Approve", "Abandon", "Fork from here"]
    view.close()


def test_each_message_of_a_blocked_gate_is_shown_once(engine: Engine) -> None:
    run_id = engine.start(EXHAUSTED).run_id
    engine.drive(run_id)
    view = view_of(engine, run_id)
    view.flush()
    assert _all_html(view).count("far too short") == 1  # two loops, one merged row
    assert "<td>1–2</td>" in view.gate_panel.value
    assert view.rows["draft"].note.value == "<small>gate exhausted after 2 loop(s)</small>"
    static = view.static_bundle()["text/html"]
    assert static.count("far too short") == 1
    view.close()


def test_the_rejections_table_is_styled_with_separate_feedback_and_missing_cells(
    engine: Engine,
) -> None:
    run_id = engine.start(EXHAUSTED).run_id
    engine.drive(run_id)
    view = view_of(engine, run_id)
    view.flush()
    panel = view.gate_panel.value
    assert ".wf-gates th,.wf-gates td{padding:3px 10px;text-align:left" in panel
    assert "<td>far too short</td><td>an example</td>" in panel
    view.close()


def test_abandon_and_fork_from_here_act_on_an_exhausted_gate(engine: Engine) -> None:
    first = engine.start(EXHAUSTED).run_id
    engine.drive(first)
    view = view_of(engine, first)
    view.flush()
    view.fork_button.click()
    (forked,) = [r.run_id for r in engine.list_runs() if r.run_id != first]
    assert f"forked as run {forked} from step draft" in view.message.value
    assert engine.get_run(first).status == "abandoned"  # superseded by the fork
    view.flush()
    assert view.decision_box.layout.display == "none"
    view.close()
    engine.drive(forked)
    other = view_of(engine, forked)
    other.flush()
    other.abandon_button.click()
    assert engine.get_run(forked).status == "abandoned"
    assert "run abandoned" in other.message.value
    other.close()


def test_rejections_reused_from_an_earlier_run_are_listed(engine: Engine) -> None:
    source = engine.start(JUDGED + "  - id: wrap\n    prompt: 'Wrap {{ steps.draft.output }}'\n")
    engine.drive(source.run_id)
    forked = engine.fork(source.run_id, from_step="wrap").run_id
    engine.drive(forked)
    view = view_of(engine, forked)
    view.flush()
    assert "far too short" in view.gate_panel.value
    assert "(reused from an earlier run)" in view.gate_panel.value
    view.close()


# -- 10. frames readable by default (issue 13 item 10) -----------------------------------------
def test_the_journal_verb_shows_a_compact_frame_and_all_shows_every_column(
    shell: InteractiveShell, magics: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    run = shell.run_cell_magic("workflow", "", DIGEST)
    frame = shell.run_line_magic("workflow", f"journal {run.run_id}")
    assert len(frame.columns) == 25  # the data stays whole for Python
    shown = frame.readable()
    assert "run" not in shown.columns and "dispatch_id" not in shown.columns
    assert "input_hash" not in shown.columns
    page = frame._repr_html_()
    assert run.run_id not in page and "<NA>" not in page and "NaN" not in page
    assert '<td style="white-space:nowrap">outline</td>' in page
    every = shell.run_line_magic("workflow", f"journal {run.run_id} --all")
    assert type(every) is pd.DataFrame and len(every.columns) == 25
    capsys.readouterr()


def test_list_shows_no_na_and_budget_says_no_limit_with_whole_units(
    shell: InteractiveShell, magics: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    run = shell.run_cell_magic(
        "workflow",
        "",
        DIGEST.replace("runner: scripted\n", "runner: scripted\nbudget: {max_units: 10}\n"),
    )
    listing = shell.run_line_magic("workflow", "list")
    assert "<NA>" not in listing._repr_html_() and "<NA>" not in repr(listing)
    assert list(listing["run"]) == [run.run_id]
    budget = shell.run_line_magic("workflow", f"budget {run.run_id}")
    assert budget["limit"].isna().sum() == 2  # the frame keeps its float NaN for Python
    shown = budget.readable().set_index("ceiling")
    assert shown.loc["units", "used"] == "5" and shown.loc["units", "limit"] == "10"
    assert shown.loc["tokens", "limit"] == "no limit"
    assert "NaN" not in budget._repr_html_() and "5.0" not in repr(budget)
    capsys.readouterr()


# -- 11. status line, kernel restarts, waiting time (issue 13 item 12) ------------------------
def test_after_stop_the_status_line_says_the_drive_stopped(engine: Engine, drives: Drives) -> None:
    run_id = engine.start(
        SLOW_ONE.replace("steps:", "steps:\n  - id: first\n    prompt: 'think a'")
    ).run_id
    view = view_of(engine, run_id, drives, stop_drive=drives.stop)
    drives.background(run_id)
    _until(lambda: (view.flush(), "driving…" in view.status_line.value)[1])
    view.stop()
    drives.wait(run_id, 10)
    view.flush()
    assert view.status_line.value.startswith("<b>Stopped</b> between units")
    assert view.message.value == ""  # "stop requested" is not left behind
    assert engine.get_run(run_id).status == "active"
    view.close()


def test_a_live_status_line_turns_stale_in_the_browser_once_the_kernel_stops_ticking(
    engine: Engine, drives: Drives
) -> None:
    from wf_magic.notebook.widgets import STALE_AFTER_S, STALE_MARKER

    run_id = engine.start(SLOW_ONE).run_id
    view = view_of(engine, run_id, drives)
    drives.background(run_id)
    _until(lambda: (view.flush(), "driving…" in view.status_line.value)[1])
    assert STALE_MARKER in view.status_line.value  # revealed by CSS unless a tick replaces it
    assert f"{STALE_AFTER_S}s forwards" in STALE_MARKER and "kernel" in STALE_MARKER
    drives.wait(run_id, 10)
    view.flush()
    assert STALE_MARKER not in view.status_line.value  # a drive that ended says so itself
    view.close()


def test_elapsed_excludes_time_waiting_for_a_person(engine: Engine) -> None:
    run_id = engine.start(HUMAN).run_id
    engine.drive(run_id)
    view = view_of(engine, run_id)
    time.sleep(1.2)
    view.flush()
    row = view.rows["signoff"]
    state = row.state
    assert state is not None and state.waiting_since is not None
    assert state.elapsed_s is not None and state.elapsed_s < 0.5
    assert " · waiting 1." in row.elapsed.value
    assert "for 1." in view.status_line.value  # "waiting on step signoff for 1.2 s"
    engine.approve(run_id, "signoff")
    engine.drive(run_id)
    view.flush()
    state = view.rows["signoff"].state
    assert state is not None and state.waited_s >= 1.2 and state.elapsed_s < 0.5  # type: ignore[operator]
    assert " · waited 1." in view.rows["signoff"].elapsed.value
    view.close()


# -- 12. help and notebook state (issue 13 item 13) --------------------------------------------
def test_workflow_help_lists_every_verb_and_option_the_readme_documents(
    shell: InteractiveShell, magics: WorkflowMagics
) -> None:
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Notebook", 1)[1].split("\n## ", 1)[0]
    doc = shell.find_line_magic("workflow").__doc__ or ""
    verbs = re.search(r"`%workflow ([a-z|\n ]+)`", section)
    assert verbs is not None
    for verb in re.split(r"[|\s]+", verbs.group(1).strip()):
        assert f"%workflow {verb}" in doc, verb
    for option in set(re.findall(r"--[a-z-]+", section)):
        assert option in doc, option


def test_the_demo_notebooks_keep_state_beside_them_and_plot_without_matplotlib_inline(
    tmp_path: Path,
) -> None:
    path = Path(__file__).resolve().parent.parent / "notebooks" / "04_budget_analysis.ipynb"
    source = nbformat.read(path, as_version=4)
    assert "%matplotlib" not in "".join(c.source for c in source.cells if c.cell_type == "code")
    first = execute_notebook(nbformat.read(path, as_version=4), tmp_path)
    assert (tmp_path / ".wf_magic_budget" / "state.db").exists()  # a fixed folder beside it
    images = [
        o for c in first.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})
    ]
    assert len(images) == 2  # run.timeline() and run.token_chart()
    # a restarted kernel (a new one) finds the runs and re-runs every cell without error
    again = execute_notebook(nbformat.read(path, as_version=4), tmp_path)
    texts = "".join(
        o.get("data", {}).get("text/html", "") for c in again.cells for o in c.get("outputs", [])
    )
    assert "existing run, nothing dispatched" in texts or "Run completed." in texts


# -- 13. a blocked run's view is static HTML; its decision panel is an output of its own -----
def test_a_blocked_runs_saved_view_is_static_html_with_the_decision_panel_beside_it(
    tmp_path: Path,
) -> None:
    nb = new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"%env WF_MAGIC_HOME={tmp_path / 'home'}\n%load_ext wf_magic"),
        nbformat.v4.new_code_cell(f"%%workflow\n{HUMAN}"),
    ]
    execute_notebook(nb, tmp_path)
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    view, decision = [o for o in nbformat.read(path, as_version=4).cells[1].outputs if "data" in o]
    assert set(view["data"]) == {"text/plain", "text/html"}  # readable without a kernel
    page = view["data"]["text/html"]
    assert "<b>release-notes</b>" in page and "blocked" in page
    # The Approve/Reject panel: a live widget while the kernel lives.
    assert "application/vnd.jupyter.widget-view+json" in decision["data"]
