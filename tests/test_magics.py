"""Specification of ``%%workflow``/``%workflow`` (wf_magic.notebook.magics) in a real IPython.

Most tests drive an in-process shell (one per module); the "real kernel" tests feed ONE live
ipykernel cell by cell, for what only a kernel has: interrupts, restarts, widget front ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
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
from nbclient.exceptions import CellExecutionError

from tests.helpers_notebook import (
    CELL_DIGEST,
    HUMAN_DRAFT,
    JUDGED,
    REPO,
    SLOW,
    Kernel,
    cell,
    cell_text,
    execute_notebook,
    ipython_shell,
    magics_in,
    slow_digest,
)
from wf_magic import Engine, Run
from wf_magic.notebook.args import line_args
from wf_magic.notebook.magics import WorkflowMagics


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


@pytest.fixture
def magics(shell: InteractiveShell, tmp_path: Path) -> Iterator[WorkflowMagics]:
    with magics_in(shell, tmp_path / "state") as found:
        yield found


@pytest.fixture
def engine(magics: WorkflowMagics) -> Engine:
    return magics.engine


def attempts(engine: Engine) -> int:
    return sum(len(engine.attempts(r.run_id)) for r in engine.list_runs())


# -- %%workflow ---------------------------------------------------------------------------------
def test_a_cell_runs_its_workflow_and_evaluates_to_a_run_handle(
    shell: InteractiveShell, engine: Engine
) -> None:
    run = cell(shell, "--as digest_run")
    assert isinstance(run, Run)
    assert run.status == "completed"
    assert shell.user_ns["digest_run"] is run
    assert run.stats is not None and run.stats.dispatched == 5
    assert engine.state_dir == Path(shell.run_line_magic("config", "WorkflowMagics.state_dir"))


def test_an_unchanged_re_run_of_a_finished_run_dispatches_nothing(
    shell: InteractiveShell, engine: Engine
) -> None:
    first = cell(shell, "")
    before = attempts(engine)
    again = cell(shell, "")
    assert again.run_id == first.run_id
    assert again.stats is not None and again.stats.dispatched == 0
    assert attempts(engine) == before
    assert len(engine.list_runs()) == 1


def test_an_unchanged_re_run_resumes_the_unfinished_run(
    shell: InteractiveShell, engine: Engine
) -> None:
    first = cell(shell, "--max-steps 1")
    assert first.status == "active"
    again = cell(shell, "")
    assert again.run_id == first.run_id
    assert again.status == "completed"
    assert again.stats is not None and again.stats.dispatched == 4  # only what was owed


def test_a_changed_re_run_starts_a_new_run_and_supersedes_the_old(
    shell: InteractiveShell, engine: Engine
) -> None:
    old = cell(shell, "--max-steps 1")
    new = cell(shell, "", CELL_DIGEST.replace("Wrap up", "Sum up"))
    assert new.run_id != old.run_id
    assert new.status == "completed"
    assert old.status == "abandoned"
    assert old.reason == f"superseded by {new.run_id}"
    assert any("superseded" in w for w in new.warnings)
    assert new.stats is not None and new.stats.reused == 1  # the outline was not re-paid


def test_new_always_starts_a_fresh_run(shell: InteractiveShell, engine: Engine) -> None:
    first = cell(shell, "")
    second = cell(shell, "--new")
    assert second.run_id != first.run_id
    assert second.stats is not None and second.stats.reused == 5


def test_no_cache_re_pays_every_unit(shell: InteractiveShell, engine: Engine) -> None:
    cell(shell, "")
    fresh = cell(shell, "--new --no-cache")
    assert fresh.stats is not None and (fresh.stats.dispatched, fresh.stats.reused) == (5, 0)


def test_resume_drives_the_given_run(shell: InteractiveShell, engine: Engine) -> None:
    first = cell(shell, "--max-steps 1")
    edited = CELL_DIGEST.replace("Wrap up", "Sum up")
    resumed = cell(shell, f"--resume {first.run_id[:-2]}", edited)
    assert resumed.run_id == first.run_id and resumed.status == "completed"
    assert any("continuing with its frozen plan" in w for w in resumed.warnings)
    assert len(engine.list_runs()) == 1


def test_resume_refuses_params_and_no_cache_that_cannot_apply(
    shell: InteractiveShell, engine: Engine
) -> None:
    first = cell(shell, "--max-steps 1")
    for flags in ("--param topic=cats", "--no-cache"):
        with pytest.raises(UsageError, match=f"--resume drives run {first.run_id} as it was"):
            cell(shell, f"--resume {first.run_id} {flags}")
    assert first.status == "active" and len(engine.list_runs()) == 1


def test_a_dry_run_shows_the_plan_and_dispatches_nothing(
    shell: InteractiveShell, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cell(shell, "--dry-run --as planned") is None
    out = capsys.readouterr().out
    assert "Plan digest  hash" in out
    assert "flowchart TD" in out and "outline --> draft" in out
    assert engine.list_runs() == []
    assert shell.user_ns["planned"].name == "digest"


def test_params_come_from_flags_and_from_a_notebook_dict(
    shell: InteractiveShell, engine: Engine
) -> None:
    shell.user_ns["digest_params"] = {"topic": "bats", "sections": 1}
    run = cell(shell, "--params digest_params --param sections=2")
    assert run.params == {"topic": "bats", "sections": 2}
    assert run.stats is not None and run.stats.dispatched == 4


def test_an_undeclared_param_is_a_usage_error(shell: InteractiveShell, engine: Engine) -> None:
    with pytest.raises(UsageError, match="declares no param 'colour'"):
        cell(shell, "--param colour=red")


def test_a_definition_error_is_one_line_naming_the_cell_line_and_field(
    shell: InteractiveShell, engine: Engine
) -> None:
    body = CELL_DIGEST.replace(
        'prompt: "Wrap up {{ params.topic }}"', 'prompt: "Wrap up {{ steps.nowhere.output }}"'
    )
    with pytest.raises(UsageError) as info:
        cell(shell, "", body)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("workflow definition error — steps[2].prompt: ")
    assert "'nowhere'" in message
    assert message.endswith("(cell line 14)")  # the %%workflow line is cell line 1
    assert engine.list_runs() == []


def test_a_definition_error_shows_without_a_traceback(
    shell: InteractiveShell, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    result = shell.run_cell("%%workflow\nname: Bad Name\nsteps: []\n")
    assert result.error_in_exec is not None
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "UsageError: workflow definition error — name:" in text
    assert "Traceback" not in text


def test_name_fills_a_missing_name_and_must_match_a_present_one(
    shell: InteractiveShell, engine: Engine
) -> None:
    body = CELL_DIGEST.replace("name: digest\n", "")
    run = cell(shell, "digest", body)
    assert run.workflow == "digest"
    with pytest.raises(UsageError, match="names the workflow 'other'"):
        cell(shell, "other")
    with pytest.raises(
        UsageError, match=r"^workflow definition error — params: .*\(cell line 2\)$"
    ):
        cell(shell, "digest", "params: 3\nsteps: []\n")


def test_python_steps_call_notebook_functions(shell: InteractiveShell, engine: Engine) -> None:
    shell.run_cell("def shout(text):\n    return text.upper()\n")
    run = cell(
        shell,
        "",
        """\
name: loud
steps:
  - id: yell
    python: shout
    with: {text: "hello"}
""",
    )
    assert run.result == "HELLO"


def test_child_workflows_resolve_from_earlier_cells(
    shell: InteractiveShell, engine: Engine
) -> None:
    cell(
        shell,
        "--dry-run",
        "name: child\nrunner: scripted\nsteps:\n  - id: c\n    prompt: child work\n",
    )
    run = cell(
        shell, "", "name: parent\nrunner: scripted\nsteps:\n  - id: p\n    workflow: child\n"
    )
    assert run.status == "completed"


def test_a_kernel_interrupt_stops_gracefully_and_the_cell_resumes(
    shell: InteractiveShell, engine: Engine
) -> None:
    body = slow_digest(0.15)
    main = threading.get_ident()
    timer = threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    stopped = cell(shell, "", body)
    timer.join()
    assert stopped.status == "active"
    owed = 14 - len([a for a in engine.attempts(stopped.run_id) if a.status == "succeeded"])
    assert owed > 0
    resumed = cell(shell, "", body)
    assert resumed.run_id == stopped.run_id and resumed.status == "completed"
    assert resumed.stats is not None and resumed.stats.dispatched == owed


def test_background_drives_in_a_thread(
    shell: InteractiveShell, magics: WorkflowMagics, engine: Engine
) -> None:
    run = cell(shell, "--background")
    assert magics.drives.wait(run.run_id, timeout=30)
    assert run.status == "completed"


def test_a_run_this_kernel_drives_in_the_background_names_the_stop_magic(
    shell: InteractiveShell, magics: WorkflowMagics, engine: Engine
) -> None:
    running = cell(shell, "--background", SLOW)
    try:
        time.sleep(0.2)
        with pytest.raises(UsageError) as info:
            cell(shell, "", SLOW.replace("unit {{ item }}", "piece {{ item }}"))
        assert "is being driven by pid" in str(info.value)
        assert str(info.value).endswith(
            f"This kernel drives it in the background: `%workflow stop {running.run_id}` "
            "stops it between units."
        )
    finally:
        magics.stop_drive(running.run_id)
        assert magics.drives.wait(running.run_id, timeout=30)


def test_a_cell_handle_says_whether_it_created_the_run(
    shell: InteractiveShell, engine: Engine
) -> None:
    first = cell(shell, "--max-steps 1")
    again = cell(shell, "")
    forked = line(shell, f"fork {first.run_id} --from draft")
    assert (first.created, again.created, forked.created) == (True, False, True)


# -- %workflow ----------------------------------------------------------------------------------
def line(shell: InteractiveShell, text: str) -> Any:
    return shell.run_line_magic("workflow", text)


HUMAN = """\
name: reviewed
runner: scripted
steps:
  - id: draft
    prompt: "Write a draft"
  - id: review
    prompt: "Polish {{ steps.draft.output }}"
    gate: {judge: human, max_loops: 2}
"""


def test_approve_then_resume_completes_a_human_gate(
    shell: InteractiveShell, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    run = cell(shell, "", HUMAN)
    assert run.status == "blocked"
    line(shell, f"approve {run.run_id} review --feedback 'looks good'")
    assert "approved" in capsys.readouterr().out
    done = line(shell, f"resume {run.run_id}")
    assert done.status == "completed"


def test_reject_needs_feedback_and_re_executes_on_resume(
    shell: InteractiveShell, engine: Engine
) -> None:
    run = cell(shell, "", HUMAN)
    with pytest.raises(UsageError, match="required: --feedback"):
        line(shell, f"reject {run.run_id} review")
    line(shell, f"reject {run.run_id} review --feedback 'needs an example'")
    again = line(shell, f"resume {run.run_id}")
    assert again.status == "blocked"
    prompts = [
        a for a in engine.attempts(run.run_id) if a.step_id == "review" and a.phase == "work"
    ]
    assert [a.loop for a in prompts] == [1, 2]


def test_frames_and_listing(shell: InteractiveShell, engine: Engine) -> None:
    run = cell(shell, "")
    assert list(line(shell, "list")["run"]) == [run.run_id]
    journal = line(shell, f"journal {run.run_id}")
    assert len(journal) == 5
    assert list(line(shell, f"tokens {run.run_id}")["step"]) == ["outline", "draft", "wrap"]
    assert list(line(shell, f"tokens {run.run_id} --by runner")["runner"]) == ["scripted"]
    assert "run_created" in set(line(shell, f"events {run.run_id}")["kind"])
    assert line(shell, f"status {run.run_id}").status == "completed"
    # `%workflow status` alone lists the runs, as `wf status` alone does.
    assert list(line(shell, "status")["run"]) == [run.run_id]


def test_abandon_fork_stop_gc_and_config(
    shell: InteractiveShell, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    done = cell(shell, "")
    forked = line(shell, f"fork {done.run_id} --from wrap")
    assert forked.run_id != done.run_id and forked.status == "completed"
    assert forked.stats is not None and (forked.stats.reused, forked.stats.dispatched) == (4, 1)
    open_run = cell(shell, "--new --max-steps 1")
    line(shell, f"stop {open_run.run_id}")
    line(shell, f"abandon {open_run.run_id}")
    assert open_run.status == "abandoned"
    line(shell, "gc --older-than 1d")  # nothing that old yet
    line(shell, "gc --older-than-days 0")
    line(shell, "config")
    out = capsys.readouterr().out
    assert f"run {open_run.run_id} (active) is not being driven now: nothing stops" in out
    assert "deleted 0 finished run(s)\ndeleted 3 finished run(s)" in out
    assert f"state dir        {engine.state_dir}" in out
    assert engine.list_runs() == []


def test_unknown_commands_and_missing_runs_are_usage_errors(
    shell: InteractiveShell, engine: Engine
) -> None:
    with pytest.raises(UsageError, match="invalid choice: 'frobnicate'"):
        line(shell, "frobnicate")
    with pytest.raises(UsageError, match="No run 'r-nope'"):
        line(shell, "status r-nope")
    with pytest.raises(UsageError, match="the following arguments are required: --from"):
        line(shell, "fork r-x")
    with pytest.raises(UsageError, match="expected a duration like 30d, 12h, 45m or 90s"):
        line(shell, "gc --older-than soon")
    with pytest.raises(UsageError, match="not allowed with argument"):
        line(shell, "gc --older-than 1d --older-than-days 1")


def test_line_arguments_parse_into_a_dataclass() -> None:
    args = line_args("approve", "r-1 review --feedback 'ship it' --loop 2")
    assert (args.command, args.run, args.step, args.feedback, args.loop) == (
        "approve",
        "r-1",
        "review",
        "ship it",
        2,
    )
    assert line_args("tokens", "r-1 --by").by == "step"
    assert line_args("gc", "--older-than 2h").older_than_s == 7200
    assert line_args("budget", "r-1").run == "r-1"


def test_watch_follows_a_run_driven_by_another_process(
    shell: InteractiveShell, engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "slow.yaml"
    source.write_text("""\
name: slow
runner: scripted
execution: {max_concurrency: 1}
runners:
  scripted:
    rules:
      - {match: "unit", reply: "ok", sleep_s: 0.1}
steps:
  - id: fan
    map: "{{ range(15) | list }}"
    prompt: "unit {{ item }}"
""")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "wf_magic.cli", "--db", str(engine.state_dir), "run", str(source)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not engine.list_runs() and time.monotonic() < deadline:
            time.sleep(0.05)
        run_id = engine.list_runs()[0].run_id
        handle = line(shell, f"watch {run_id}")
    finally:
        proc.wait(timeout=60)
    assert handle.status == "completed"
    out = capsys.readouterr().out
    assert f"watching {run_id}" in out
    assert "unit_finished  fan fan[14]" in out


def test_magic_semantics_hold_in_a_real_kernel(tmp_path: Path) -> None:
    edited = CELL_DIGEST.replace("Wrap up", "Sum up")
    cells = [
        f"%env WF_MAGIC_HOME={tmp_path / 'state'}\n%load_ext wf_magic",
        f"%%workflow --as a\n{CELL_DIGEST}",
        f"%%workflow --as b\n{CELL_DIGEST}",
        "assert b.run_id == a.run_id and b.stats.dispatched == 0\n"
        "assert len(b.journal()) == len(a.journal()) == 5",
        f"%%workflow --new --max-steps 1 --as c\n{CELL_DIGEST}",
        f"%%workflow --as d\n{edited}",
        "assert d.run_id != c.run_id and d.status == 'completed'\n"
        "assert c.status == 'abandoned' and c.reason == f'superseded by {d.run_id}'",
        f"%%workflow --dry-run\n{edited.replace('Sum up', 'Close')}",
        "assert len(a.store.list_runs()) == 3",
    ]
    nb = nbformat.v4.new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}
        }
    )
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    execute_notebook(nb, tmp_path)
    dry_run = {key for out in nb.cells[7].outputs for key in out.get("data", {})}
    assert {"text/html", "text/markdown"} <= dry_run


def test_with_widgets_on_runs_show_a_live_view(
    shell: InteractiveShell,
    magics: WorkflowMagics,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shell.run_line_magic("config", "WorkflowMagics.widgets = 'on'")
    try:
        run = cell(shell, "", HUMAN)
        view = run.view  # type: ignore[attr-defined]
        assert view.snapshot.status == "blocked" and view.decision_box.layout.display == ""
        assert run._repr_mimebundle_() == {"text/plain": f"<Run {run.run_id} (reviewed)>"}
        assert f"Run {run.run_id}  reviewed  [" in capsys.readouterr().out  # the text fallback
        view.approve_button.click()
        assert magics.drives.wait(run.run_id, timeout=30)
        assert run.status == "completed"
        assert "Run completed." in view.status_line.value
        assert view._unsubscribe is None  # a finished run's view stops observing
        status = line(shell, f"status {run.run_id}")
        assert status.view is not view and status.view.snapshot.status == "completed"
        watched = line(shell, f"watch {run.run_id}")
        assert watched.view.redraws >= 1
    finally:
        shell.run_line_magic("config", "WorkflowMagics.widgets = 'auto'")


def test_unload_and_reload_the_extension(shell: InteractiveShell) -> None:
    shell.run_line_magic("reload_ext", "wf_magic")
    assert shell.find_cell_magic("workflow") is not None
    assert shell.find_line_magic("workflow") is not None
    assert sum(isinstance(c, WorkflowMagics) for c in shell.configurables) == 1


def test_a_cell_may_name_a_workflow_file(
    shell: InteractiveShell, engine: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "digest.yaml"
    path.write_text(CELL_DIGEST)
    run = cell(shell, "", f"{path}\n")
    assert run.status == "completed" and run.row.source_path == str(path.resolve())
    path.write_text(CELL_DIGEST.replace("steps:", "steps: 3\nx:"))
    with pytest.raises(UsageError, match=r"^workflow definition error — .*digest\.yaml, line"):
        cell(shell, "--new", str(path))


# -- more %%workflow and %workflow semantics (DESIGN.md §4) -----------------------------------------
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
    edited = cell(shell, "", CELL_DIGEST.replace("Wrap up", "Sum up"))
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
        (
            "gc --older-than-days -1",
            r"argument --older-than-days: expected a finite number in \[0, 36525\]",
        ),
        (f"tokens {done.run_id} --by colour", "invalid choice"),
    ):
        with pytest.raises(UsageError, match=message) as info:
            line(shell, text)
        assert "\n" not in str(info.value)


def test_gc_never_deletes_a_live_run(shell: InteractiveShell, engine: Engine) -> None:
    done = cell(shell, "")
    live = cell(shell, "--param topic=bats --max-steps 1")
    blocked = cell(shell, "", HUMAN_DRAFT)
    line(shell, "gc --older-than-days 0")
    left = {r.run_id for r in engine.list_runs()}
    assert left == {live.run_id, blocked.run_id} and done.run_id not in left


def test_gc_accepts_the_cli_duration_spelling(shell: InteractiveShell, engine: Engine) -> None:
    cell(shell, "")
    line(shell, "gc --older-than 0d")
    assert engine.list_runs() == []


def test_the_magic_frames_have_the_documented_columns_and_types(
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


def test_the_budget_verb_returns_the_budget_frame(shell: InteractiveShell, engine: Engine) -> None:
    run = cell(shell, "")
    frame = line(shell, f"budget {run.run_id}")
    assert list(frame["ceiling"]) == ["units", "tokens", "cost"]


# -- the Run handle a cell evaluates to -------------------------------------------------------------
def test_rerunning_a_completed_cell_returns_a_handle_that_did_not_create_the_run(
    shell: InteractiveShell, engine: Engine
) -> None:
    first = cell(shell, "")
    again = cell(shell, "")
    assert (first.created, again.created) == (True, False)


def test_the_plain_handle_renders_as_text_and_html(shell: InteractiveShell, engine: Engine) -> None:
    run = cell(shell, "--as r")
    assert type(run) is Run and shell.user_ns["r"] is run
    text = repr(run)
    assert text.startswith(f"Run {run.run_id}  digest  [completed]")
    html = run._repr_html_()
    assert run.run_id in html and "<table>" in html and ">completed<" in html


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
    body = CELL_DIGEST.replace("runner: scripted\n", "runner: scripted\nbudget: {max_units: 10}\n")
    run = cell(shell, "", body)
    assert "5/10" in run._repr_html_()


def test_the_html_rendering_shows_gate_rejections(shell: InteractiveShell, engine: Engine) -> None:
    run = cell(shell, "", JUDGED)
    assert run.status == "completed"
    html = run._repr_html_()
    assert "far too short" in html and "an example" in html


def test_the_html_rendering_reports_reuse(shell: InteractiveShell, engine: Engine) -> None:
    cell(shell, "")
    edited = cell(shell, "", CELL_DIGEST.replace("Wrap up", "Sum up"))
    assert edited.stats is not None and edited.stats.reused == 4
    assert f"{edited.stats.saved_tokens}" in edited._repr_html_()
    assert "reused" in edited._repr_html_()


# -- in a real kernel (one for the module, fed cell by cell) ----------------------------------------
@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    k = Kernel(tmp_path_factory.mktemp("kernel"))
    with k.client.setup_kernel(cleanup_kc=True):
        k.run(f"%env WF_MAGIC_HOME={k.workdir / 'home'}\n%load_ext wf_magic")
        # warm up (imports, first view) so timed interrupts land mid-drive
        k.run("%%workflow\nname: warm\nsteps:\n  - id: a\n    prompt: hi\n")
        yield k


def test_kernel_interrupt_stops_gracefully_and_the_same_cell_resumes(kernel: Kernel) -> None:
    kernel.home("interrupt")
    timer = threading.Timer(1.0, kernel.interrupt)
    timer.start()
    started = time.monotonic()
    node = kernel.run(f"%%workflow --as s\n{SLOW}")
    timer.join()
    assert time.monotonic() - started < 10
    text = cell_text(node)
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
    text = cell_text(node)
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
    kernel.run(f"%%workflow --as h\n{HUMAN_DRAFT}")
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
