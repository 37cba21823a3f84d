"""QA review of the notebook surface (DESIGN.md §4 and §5: magics, widgets, DataFrames).

Plain tests pin behaviours verified here and not covered by test_magics/test_widgets/
test_notebooks; ``xfail(strict=True)`` tests assert DESIGN.md/README behaviour that the
code does not have yet (the reason says what is wrong).

Two harnesses: an in-process IPython shell (module fixture, like test_magics) and ONE real
kernel for the whole module, driven cell by cell through nbclient (like test_notebooks).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

from wf_magic import Engine, Run
from wf_magic.notebook.magics import WorkflowMagics

REPO = Path(__file__).resolve().parent.parent

DIGEST = """\
name: digest
params:
  topic: {type: string, default: owls}
  sections: {type: integer, default: 3, minimum: 1}
runner: scripted
steps:
  - id: outline
    prompt: "Outline {{ params.topic }} in {{ params.sections }} sections"
  - id: draft
    map: "{{ range(params.sections) | list }}"
    prompt: "Write section {{ item }} on {{ params.topic }}"
  - id: wrap
    prompt: "Wrap up {{ params.topic }}"
"""

SLOW = """\
name: slow
runner: scripted
execution: {max_concurrency: 1}
runners:
  scripted:
    rules:
      - {match: "unit", reply: "ok", sleep_s: 0.2}
steps:
  - id: fan
    map: "{{ range(10) | list }}"
    prompt: "unit {{ item }}"
"""

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

JUDGED = """\
name: judged
runner: scripted
runners:
  scripted:
    rules:
      - match: "Gate feedback"
        reply: "a long and detailed draft"
      - match: "(?s)^Judge.*long and detailed"
        reply: {complete: true, feedback: "", missing: []}
      - match: "(?s)^Judge"
        reply: {complete: false, feedback: "far too short", missing: [an example]}
steps:
  - id: draft
    prompt: "Write a draft"
    gate: {judge: llm, criteria: [detailed, has an example], max_loops: 3}
"""

HUMAN = """\
name: reviewed
runner: scripted
steps:
  - id: draft
    prompt: "Write a draft"
    gate: {judge: human}
"""


# -- in-process shell -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "wf_magic")
    yield ip
    ip.run_line_magic("unload_ext", "wf_magic")


@pytest.fixture
def magics(shell: InteractiveShell, tmp_path: Path) -> Iterator[WorkflowMagics]:
    found = shell.magics_manager.registry["WorkflowMagics"]
    assert isinstance(found, WorkflowMagics)
    shell.run_line_magic("config", f"WorkflowMagics.state_dir = {str(tmp_path / 'state')!r}")
    yield found
    shell.run_line_magic("config", "WorkflowMagics.widgets = 'auto'")
    found.close()


@pytest.fixture
def engine(magics: WorkflowMagics) -> Engine:
    return magics.engine


@pytest.fixture
def widgets_on(shell: InteractiveShell, magics: WorkflowMagics) -> WorkflowMagics:
    shell.run_line_magic("config", "WorkflowMagics.widgets = 'on'")
    return magics


def cell(shell: InteractiveShell, line: str, body: str = DIGEST) -> Any:
    return shell.run_cell_magic("workflow", line, body)


def line(shell: InteractiveShell, text: str) -> Any:
    return shell.run_line_magic("workflow", text)


# -- one real kernel for the module ---------------------------------------------------------------
class Kernel:
    """A live ipykernel (this venv's Python) fed one cell at a time through nbclient."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        kernels = workdir / "kernels"
        spec = kernels / "python3"
        spec.mkdir(parents=True, exist_ok=True)
        scratch = workdir / "tmp"
        scratch.mkdir(exist_ok=True)
        (spec / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": "wf_magic review",
                    "language": "python",
                    "env": {"PYTHONPATH": str(REPO), "TMPDIR": str(scratch)},
                }
            )
        )
        self.km = KernelManager(
            kernel_name="python3",
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]),
        )
        self.nb = nbformat.v4.new_notebook(
            metadata={
                "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}
            }
        )
        self.client = NotebookClient(
            self.nb,
            km=self.km,
            timeout=90,
            allow_errors=False,
            resources={"metadata": {"path": str(workdir)}},
        )

    def run(self, source: str) -> nbformat.NotebookNode:
        """Execute one cell; raises CellExecutionError when the kernel replies with an error."""
        node = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(node)
        self.client.execute_cell(node, len(self.nb.cells) - 1)
        return node

    def interrupt(self) -> None:
        """What ``KernelManager.interrupt_kernel`` does for a signal-mode kernel: SIGINT to the
        kernel's process group (its sync wrapper would leak an event loop in a timer thread)."""
        provisioner = self.km.provisioner
        assert provisioner is not None
        pgid = getattr(provisioner, "pgid", None)
        if pgid:
            os.killpg(pgid, signal.SIGINT)
        else:
            os.kill(provisioner.pid, signal.SIGINT)  # type: ignore[attr-defined]

    def value(self, expr: str) -> Any:
        """The JSON value of ``expr`` evaluated in the kernel."""
        node = self.run(f"import json as _j; print(_j.dumps({expr}))")
        text = "".join(o.get("text", "") for o in node.outputs if o.get("name") == "stdout")
        return json.loads(text.strip().splitlines()[-1])

    def home(self, name: str) -> None:
        """Point the kernel's wf_magic at a fresh state dir (per test)."""
        state = self.workdir / name
        self.run(f"%config WorkflowMagics.state_dir = {str(state)!r}")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    k = Kernel(tmp_path_factory.mktemp("kernel"))
    with k.client.setup_kernel(cleanup_kc=True):
        k.run(f"%env WF_MAGIC_HOME={k.workdir / 'home'}\n%load_ext wf_magic")
        # warm up (imports, first view) so timed interrupts land mid-drive
        k.run("%%workflow\nname: warm\nsteps:\n  - id: a\n    prompt: hi\n")
        yield k


def _texts(node: nbformat.NotebookNode) -> str:
    parts = []
    for out in node.outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        else:
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


# ================================================================================================
# Real kernel
# ================================================================================================
def test_kernel_interrupt_stops_gracefully_and_the_same_cell_resumes(kernel: Kernel) -> None:
    kernel.home("interrupt")
    timer = threading.Timer(1.0, kernel.interrupt)
    timer.start()
    started = time.monotonic()
    node = kernel.run(f"%%workflow --as s\n{SLOW}")
    timer.join()
    assert time.monotonic() - started < 10
    text = _texts(node)
    assert "Interrupted:" in text and "stays active" in text
    assert "KeyboardInterrupt" not in text and "Traceback" not in text
    status, done, stopped_by = kernel.value(
        "[s.status, int((s.journal()['status'] == 'succeeded').sum()), s.stopped_by]"
    )
    assert status == "active" and 0 < done < 10
    assert stopped_by == "signal"
    kernel.run(f"%%workflow --as s2\n{SLOW}")
    same, status, dispatched = kernel.value(
        "[s2.run_id == s.run_id, s2.status, s2.stats.dispatched]"
    )
    assert same and status == "completed" and dispatched == 10 - done


def test_kernel_definition_error_is_an_error_reply_with_one_short_line(kernel: Kernel) -> None:
    kernel.home("deferr")
    source = "%%workflow\nname: bad\nsteps:\n  - id: a\n    promt: x\n"
    with pytest.raises(CellExecutionError):  # so "Run All" stops at the bad cell
        kernel.run(source)
    node = kernel.nb.cells[-1]
    text = _texts(node)
    assert "Traceback" not in text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines == [
        "UsageError: workflow definition error — steps[0].promt: unknown key; check its "
        "spelling against the format reference (cell line 5)"
    ]
    assert (
        kernel.value(
            "len(get_ipython().magics_manager.registry['WorkflowMagics'].engine.list_runs())"
        )
        == 0
    )


def test_kernel_python_step_calls_a_notebook_function(kernel: Kernel) -> None:
    kernel.home("python")
    kernel.run("def shout(text):\n    return text.upper() + '!'\n")
    kernel.run(
        "%%workflow --as loud\nname: loud\nsteps:\n  - id: yell\n    python: shout\n"
        "    with: {text: hello}\n"
    )
    assert kernel.value("[loud.status, loud.result]") == ["completed", "HELLO!"]


def test_kernel_restart_mid_drive_then_the_cell_resumes_reclaiming_in_place(
    kernel: Kernel,
) -> None:
    kernel.home("restart")
    kernel.run(f"%%workflow --background --as s\n{SLOW}")
    time.sleep(1.0)
    kernel.km.restart_kernel(now=True)  # a crash: the driver dies mid-unit
    kernel.client.kc.wait_for_ready(timeout=60)
    kernel.run(f"%env WF_MAGIC_HOME={kernel.workdir / 'home'}\n%load_ext wf_magic")
    kernel.home("restart")
    kernel.run(f"%%workflow --as again\n{SLOW}")
    status, runs, attempts = kernel.value(
        "[again.status, len(again.store.list_runs()), "
        "again.journal()[['unit', 'attempt', 'status']].astype(str).values.tolist()]"
    )
    assert status == "completed" and runs == 1
    assert all(a == "1" and s == "succeeded" for _, a, s in attempts)  # reclaimed in place
    assert len(attempts) == 10


def test_kernel_approve_button_click_completes_a_human_gate(kernel: Kernel) -> None:
    kernel.home("approve")
    kernel.run(f"%%workflow --as h\n{HUMAN}")
    assert kernel.value("[h.status, h.view.decision_box.layout.display]") == ["blocked", ""]
    kernel.run(
        "h.view.feedback.value = 'ship it'\nh.view.approve_button.click()\n"
        "get_ipython().magics_manager.registry['WorkflowMagics'].drives.wait(h.run_id, 30)\n"
        "h.view.flush()"
    )
    status, display, line_ = kernel.value(
        "[h.status, h.view.decision_box.layout.display, h.view.status_line.value]"
    )
    assert status == "completed" and display == "none" and "Run completed." in line_


def test_kernel_background_cell_fallback_ends_in_the_final_state(kernel: Kernel) -> None:
    kernel.home("bgfallback")
    node = kernel.run(
        "%%workflow --background --as bg\nname: quick\nsteps:\n  - id: a\n    prompt: hi\n"
    )
    kernel.run(
        "get_ipython().magics_manager.registry['WorkflowMagics'].drives.wait(bg.run_id, 30)\n"
        "import time; time.sleep(0.5)"
    )
    shown = [o for o in node.outputs if o.get("output_type") == "display_data"]
    assert shown and "[completed]" in shown[0]["data"]["text/plain"]


# ================================================================================================
# In-process shell: %%workflow semantics (DESIGN §4)
# ================================================================================================
def test_help_lists_every_verb_and_every_cell_option(
    shell: InteractiveShell, magics: WorkflowMagics
) -> None:
    line_doc = shell.find_line_magic("workflow").__doc__ or ""
    cell_doc = shell.find_cell_magic("workflow").__doc__ or ""
    for verb in (
        "list", "status RUN", "resume RUN", "abandon RUN", "fork RUN --from STEP",
        "approve RUN STEP [--feedback TEXT]", "reject RUN STEP --feedback TEXT",
        "journal RUN", "tokens RUN", "events RUN", "watch RUN", "stop RUN", "gc", "config",
    ):  # fmt: skip
        assert f"%workflow {verb}" in line_doc, verb
    for option in (
        "--param", "--params VAR", "--new", "--resume RUN", "--max-steps N", "--dry-run",
        "--no-cache", "--background", "--as VAR", "name",
    ):  # fmt: skip
        assert option in cell_doc, option


def test_after_a_user_abandon_the_unchanged_cell_starts_a_new_run_reusing_results(
    shell: InteractiveShell, engine: Engine
) -> None:
    first = cell(shell, "--max-steps 1")
    line(shell, f"abandon {first.run_id}")
    again = cell(shell, "")
    assert again.run_id != first.run_id and again.status == "completed"
    assert again.stats is not None and (again.stats.reused, again.stats.dispatched) == (1, 4)
    assert first.reason == "abandoned by user"


def test_params_after_defaults_define_the_scope(shell: InteractiveShell, engine: Engine) -> None:
    first = cell(shell, "--max-steps 1")
    same = cell(shell, "--param sections=3 --param topic=owls")  # the defaults, spelled out
    assert same.run_id == first.run_id and same.status == "completed"
    other = cell(shell, "--param topic=cats --max-steps 1")
    assert other.run_id != first.run_id and other.status == "active"
    assert first.status == "completed"  # another scope never supersedes this one
    assert cell(shell, "--param topic=123 --new").params["topic"] == "123"  # stays a string


def test_a_changed_cell_is_refused_while_the_old_run_is_driven_and_nothing_is_written(
    shell: InteractiveShell, magics: WorkflowMagics, engine: Engine
) -> None:
    running = cell(shell, "--background", SLOW)
    try:
        time.sleep(0.2)
        with pytest.raises(UsageError, match="is being driven by pid"):
            cell(shell, "", SLOW.replace("unit {{ item }}", "piece {{ item }}"))
        assert [r.run_id for r in engine.list_runs()] == [running.run_id]
        with pytest.raises(UsageError, match="already being driven in this kernel"):
            cell(shell, "", SLOW)
    finally:
        line(shell, f"stop {running.run_id}")
        assert magics.drives.wait(running.run_id, timeout=30)
    assert running.status == "active"  # a stop request leaves the run owed, not failed
    resumed = cell(shell, "", SLOW)
    assert resumed.run_id == running.run_id and resumed.status == "completed"


def test_fork_from_a_middle_step_re_executes_that_step_and_everything_after(
    shell: InteractiveShell, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    done = cell(shell, "")
    forked = line(shell, f"fork {done.run_id[:-3]} --from draft")
    assert f"fork of {done.run_id[:-3]} from step draft" in capsys.readouterr().out
    assert forked.row.plan_hash == done.row.plan_hash
    assert forked.stats is not None and (forked.stats.reused, forked.stats.dispatched) == (1, 4)
    journal = forked.journal()
    assert list(journal.loc[journal["status"] == "reused", "step"]) == ["outline"]
    assert journal.loc[journal["status"] == "reused", "tokens_in"].sum() == 0
    with pytest.raises(UsageError, match="has no step 'nowhere'"):
        line(shell, f"fork {done.run_id} --from nowhere")


def test_reuse_is_reported_as_saved_tokens_and_charged_zero(
    shell: InteractiveShell, engine: Engine
) -> None:
    first = cell(shell, "")
    edited = cell(shell, "", DIGEST.replace("Wrap up", "Sum up"))
    by_step = line(shell, f"tokens {edited.run_id}").set_index("step")
    first_tokens = line(shell, f"tokens {first.run_id}").set_index("step")
    assert by_step.loc["outline", "tokens"] == 0 and by_step.loc["draft", "tokens"] == 0
    assert by_step.loc["draft", "saved_tokens"] == first_tokens.loc["draft", "tokens"]
    assert edited.stats is not None
    assert edited.stats.saved_tokens == int(by_step["saved_tokens"].sum())
    assert "4 reused" in repr(edited)
    assert edited.budget_use().units == 1  # reused results are not charged


def test_line_verbs_refuse_what_cannot_be_done_with_one_line_messages(
    shell: InteractiveShell, engine: Engine
) -> None:
    done = cell(shell, "")
    for text, message in (
        (f"reject {done.run_id} draft --feedback no", "is not waiting for a decision"),
        (f"approve {done.run_id} draft", "is not waiting for a decision"),
        (f"abandon {done.run_id}", "completed; there is nothing to abandon"),
        ("resume", "required: run"),
        ("gc --older-than-days -1", "retention must be >= 0"),
        (f"tokens {done.run_id} --by colour", "invalid choice"),
    ):
        with pytest.raises(UsageError, match=message) as info:
            line(shell, text)
        assert "\n" not in str(info.value)


def test_gc_never_deletes_a_live_run(shell: InteractiveShell, engine: Engine) -> None:
    done = cell(shell, "")
    live = cell(shell, "--param topic=bats --max-steps 1")
    blocked = cell(shell, "", HUMAN)
    line(shell, "gc --older-than-days 0")
    left = {r.run_id for r in engine.list_runs()}
    assert left == {live.run_id, blocked.run_id} and done.run_id not in left


def test_the_magic_frames_have_design_columns_and_types(
    shell: InteractiveShell, engine: Engine
) -> None:
    run = cell(shell, "")
    journal = line(shell, f"journal {run.run_id}")
    assert list(journal.columns[:18]) == [
        "run", "step", "unit", "attempt", "dispatch_id", "phase", "runner", "model", "status",
        "input_hash", "tokens_in", "tokens_out", "cost", "reused_from", "started_at",
        "finished_at", "duration_s", "failure",
    ]  # fmt: skip
    for column in ("started_at", "finished_at"):
        assert pd.api.types.is_datetime64_any_dtype(journal[column])
    assert pd.api.types.is_integer_dtype(journal["tokens_in"])
    events = line(shell, f"events {run.run_id}")
    assert pd.api.types.is_datetime64_any_dtype(events["at"])
    for by in ("step", "model", "runner"):
        assert by in line(shell, f"tokens {run.run_id} --by {by}").columns
    budget = run.budget()
    assert list(budget["ceiling"]) == ["units", "tokens", "cost"]
    assert budget.set_index("ceiling").loc["units", "used"] == 5


def test_the_plain_handle_renders_as_text_and_html(shell: InteractiveShell, engine: Engine) -> None:
    run = cell(shell, "--as r")
    assert type(run) is Run and shell.user_ns["r"] is run
    text = repr(run)
    assert text.startswith(f"Run {run.run_id}  digest  [completed]")
    html = run._repr_html_()
    assert run.run_id in html and "<table>" in html and ">completed<" in html


# ================================================================================================
# In-process shell: the live view (DESIGN §5 Widgets)
# ================================================================================================
def test_the_view_shows_superseded_drift_and_reuse_warnings(
    shell: InteractiveShell, widgets_on: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    old = cell(shell, "--max-steps 1")
    new = cell(shell, "", DIGEST.replace("Wrap up", "Sum up"))
    box = new.view.warning_box
    assert box.layout.display == ""
    assert f"superseded by {new.run_id}" in box.value
    assert "reused 1 result from earlier runs (14 tokens saved)" in box.value
    assert old.status == "abandoned"
    owed = cell(shell, "--new --max-steps 1")
    drifted = cell(shell, f"--resume {owed.run_id}", DIGEST.replace("Wrap up", "Close"))
    assert drifted.run_id == owed.run_id
    assert "continuing with its frozen plan" in drifted.view.warning_box.value
    capsys.readouterr()


def test_the_view_rows_header_and_budget_after_a_run(
    shell: InteractiveShell, widgets_on: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    body = DIGEST.replace("runner: scripted\n", "runner: scripted\nbudget: {max_units: 10}\n")
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


# ================================================================================================
# Deviations (xfail strict): each asserts what DESIGN.md / README promise
# ================================================================================================
def test_a_child_document_error_names_the_cell_line(
    shell: InteractiveShell, engine: Engine
) -> None:
    body = (
        "name: parent\nsteps:\n  - id: p\n    workflow: kid\n---\nname: kid\nsteps:\n"
        "  - id: k\n    prompt: hi\n    gate: {judge: expr, max_loops: 0}\n"
    )
    with pytest.raises(UsageError) as info:
        cell(shell, "", body)
    assert str(info.value).endswith("(cell line 11)")


def test_an_unchanged_completed_cell_shows_the_result(
    shell: InteractiveShell, engine: Engine
) -> None:
    cell(shell, "")
    again = cell(shell, "")
    assert again.stats is not None and again.stats.dispatched == 0
    result = str(again.result)
    assert result in repr(again)
    assert result in again._repr_html_()


def test_the_text_rendering_shows_units_done_over_total(
    shell: InteractiveShell, engine: Engine
) -> None:
    run = cell(shell, "--max-steps 1")
    assert "draft            pending   units 0/3" in repr(run)


def test_the_html_rendering_shows_the_budget(shell: InteractiveShell, engine: Engine) -> None:
    body = DIGEST.replace("runner: scripted\n", "runner: scripted\nbudget: {max_units: 10}\n")
    run = cell(shell, "", body)
    assert "5/10" in run._repr_html_()


def test_the_html_rendering_shows_gate_rejections(shell: InteractiveShell, engine: Engine) -> None:
    run = cell(shell, "", JUDGED)
    assert run.status == "completed"
    html = run._repr_html_()
    assert "far too short" in html and "an example" in html


def test_the_html_rendering_reports_reuse(shell: InteractiveShell, engine: Engine) -> None:
    cell(shell, "")
    edited = cell(shell, "", DIGEST.replace("Wrap up", "Sum up"))
    assert edited.stats is not None and edited.stats.reused == 4
    assert f"{edited.stats.saved_tokens}" in edited._repr_html_()
    assert "reused" in edited._repr_html_()


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
    run = cell(shell, "", HUMAN)
    capsys.readouterr()
    assert run.status == "blocked"
    assert run.view.rows["draft"].loop.value == "1/1"


def test_gc_accepts_the_cli_duration_spelling(shell: InteractiveShell, engine: Engine) -> None:
    cell(shell, "")
    line(shell, "gc --older-than 0d")
    assert engine.list_runs() == []


def test_the_cell_handle_says_whether_it_created_the_run(
    shell: InteractiveShell, engine: Engine
) -> None:
    first = cell(shell, "")
    again = cell(shell, "")
    assert (first.created, again.created) == (True, False)


def test_the_budget_frame_from_the_magic(shell: InteractiveShell, engine: Engine) -> None:
    run = cell(shell, "")
    frame = line(shell, f"budget {run.run_id}")
    assert list(frame["ceiling"]) == ["units", "tokens", "cost"]


def test_an_interrupt_while_the_drive_starts_still_stops_it_gracefully(
    shell: InteractiveShell, magics: WorkflowMagics, monkeypatch: pytest.MonkeyPatch
) -> None:
    begin = magics.drives._begin

    def begin_then_interrupted(*args: Any, **kwargs: Any) -> Any:
        begin(*args, **kwargs)  # the thread is running now ...
        raise KeyboardInterrupt  # ... and the kernel interrupt arrives (as in Thread.start)

    monkeypatch.setattr(magics.drives, "_begin", begin_then_interrupted)
    try:
        cell(shell, "--as s", SLOW)
    except KeyboardInterrupt:
        pass
    run = shell.user_ns.get("s") or magics.engine.status(magics.engine.list_runs()[0].run_id)
    assert magics.drives.wait(run.run_id, timeout=30)
    assert run.status == "active"  # stopped between units, work still owed
