"""Specification of ``%%workflow``/``%workflow`` (wf_magic.notebook.magics) in a real IPython."""

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

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from wf_magic import Engine, Run
from wf_magic.notebook.args import line_args
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
    found.close()


@pytest.fixture
def engine(magics: WorkflowMagics) -> Engine:
    return magics.engine


def cell(shell: InteractiveShell, line: str, body: str = DIGEST) -> Any:
    return shell.run_cell_magic("workflow", line, body)


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
    new = cell(shell, "", DIGEST.replace("Wrap up", "Sum up"))
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
    edited = DIGEST.replace("Wrap up", "Sum up")
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
    body = DIGEST.replace(
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
    body = DIGEST.replace("name: digest\n", "")
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
    body = DIGEST.replace(
        "runner: scripted\n",
        """\
runner: scripted
execution: {max_concurrency: 1}
runners:
  scripted:
    rules:
      - {match: "Write section", reply: "text", sleep_s: 0.15}
""",
    ).replace("default: 3", "default: 12")
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
    assert f"stop requested for {open_run.run_id}" in out
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
    import nbformat

    from .test_notebooks import execute_notebook

    edited = DIGEST.replace("Wrap up", "Sum up")
    cells = [
        f"%env WF_MAGIC_HOME={tmp_path / 'state'}\n%load_ext wf_magic",
        f"%%workflow --as a\n{DIGEST}",
        f"%%workflow --as b\n{DIGEST}",
        "assert b.run_id == a.run_id and b.stats.dispatched == 0\n"
        "assert len(b.journal()) == len(a.journal()) == 5",
        f"%%workflow --new --max-steps 1 --as c\n{DIGEST}",
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
    path.write_text(DIGEST)
    run = cell(shell, "", f"{path}\n")
    assert run.status == "completed" and run.row.source_path == str(path.resolve())
    path.write_text(DIGEST.replace("steps:", "steps: 3\nx:"))
    with pytest.raises(UsageError, match=r"^workflow definition error — .*digest\.yaml, line"):
        cell(shell, "--new", str(path))
