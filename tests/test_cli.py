"""The `wf` command: the README's first command, exit codes, one-line errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from tests.helpers_flow import journal_counts, run_cli
from wf_magic import Engine
from wf_magic.cli import main

from .conftest import ROOT, db_rows, run_wf, table_counts, wf_cmd, wf_inproc, write_file


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_readme_quickstart_runs_offline_and_prints_run_id_and_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WF_MAGIC_HOME")  # the default state dir: ./.wf_magic
    done = subprocess.run(
        [sys.executable, "-m", "wf_magic.cli", "run", str(ROOT / "examples" / "quickstart.yaml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    run_id = str(db_rows(tmp_path / ".wf_magic", "SELECT run_id FROM runs")[0][0])
    assert f"run {run_id} (new)" in done.stdout
    assert f"Run {run_id}  paper-digest  [completed]" in done.stdout
    assert (
        'result: {"characters": 110, "sections": 3, "title": "A digest of durable execution"}'
        in done.stdout
    )
    again = subprocess.run(
        [sys.executable, "-m", "wf_magic.cli", "run", str(ROOT / "examples" / "quickstart.yaml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 0 and "this drive: 0 dispatched" in again.stdout


def test_readme_first_lines_are_the_two_commands() -> None:
    blocks = (ROOT / "README.md").read_text().split("```sh\n")[1:3]
    commands = [b.split("\n```")[0].strip() for b in blocks]
    assert commands[0].endswith("wf run examples/quickstart.yaml")
    assert commands[1].endswith(".venv/bin/pytest")
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_definition_error_is_one_line_exit_2(tmp_path: Path, state_dir: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsteps:\n  - id: a\n    prompt: hi\n    gate: {max_loops: 0}\n")
    code, out, err = _cli("--db", str(state_dir), "run", str(bad))
    assert code == 2
    assert err == (f"error: steps[0].gate.max_loops: must be >= 1 (got 0) ({bad}, line 5)\n")
    assert "Traceback" not in err


def test_undeclared_param_is_a_usage_error(tmp_path: Path, state_dir: Path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text("name: x\nsteps:\n  - id: a\n    prompt: hi\n")
    code, _, err = _cli("--db", str(state_dir), "run", str(wf), "--param", "nope=1")
    assert code == 2 and "declares no param 'nope'" in err


def test_dry_run_dispatches_nothing(tmp_path: Path, state_dir: Path) -> None:
    code, out, _ = _cli(
        "--db", str(state_dir), "run", str(ROOT / "examples" / "quickstart.yaml"), "--dry-run"
    )
    assert code == 0
    assert out.startswith("Plan paper-digest  hash ")
    assert not (state_dir / "state.db").exists() or db_rows(
        state_dir, "SELECT COUNT(*) FROM runs"
    ) == [(0,)]


def test_human_gate_blocks_exit_3_then_approve_and_resume(tmp_path: Path, state_dir: Path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text(
        "name: h\nsteps:\n  - id: draft\n    prompt: hi\n    gate: {judge: human}\n"
        "  - id: after\n    prompt: bye\n"
    )
    blocked = run_wf(state_dir, "run", str(wf))
    assert blocked.returncode == 3, blocked.stderr
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    assert run_wf(state_dir, "status", run_id).returncode == 3
    approved = run_wf(state_dir, "approve", run_id, "draft", "--feedback", "lgtm")
    assert approved.returncode == 0 and "approved" in approved.stdout
    again = run_wf(state_dir, "approve", run_id, "draft")
    assert again.returncode == 2 and "already decided" in again.stderr
    done = run_wf(state_dir, "resume", run_id)
    assert done.returncode == 0 and "[completed]" in done.stdout


def test_journal_and_tokens_formats(tmp_path: Path, state_dir: Path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text(
        "name: j\nsteps:\n  - id: a\n    map: '{{ [1, 2] }}'\n    prompt: 'x {{ item }}'\n"
    )
    assert _cli("--db", str(state_dir), "run", str(wf))[0] == 0
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    code, out, _ = _cli("--db", str(state_dir), "journal", run_id, "--format", "json")
    rows = json.loads(out)
    assert code == 0 and [r["unit"] for r in rows] == ["a[0]", "a[1]"]
    code, out, _ = _cli("--db", str(state_dir), "journal", run_id, "--format", "csv")
    assert code == 0 and out.splitlines()[0].startswith("run,step,unit,attempt,dispatch_id")
    code, out, _ = _cli("--db", str(state_dir), "tokens", run_id, "--by", "step")
    assert code == 0 and "a" in out


def test_unknown_run_is_a_usage_error(state_dir: Path) -> None:
    code, _, err = _cli("--db", str(state_dir), "resume", "r-nope")
    assert code == 2 and "No run 'r-nope'" in err


def test_engine_imports_without_ipython_or_pandas() -> None:
    code = (
        "import sys, wf_magic, wf_magic.engine, wf_magic.cli; "
        "bad = [m for m in ('IPython', 'ipywidgets', 'pandas', 'matplotlib') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_module_level_frames_match_engine_methods(state_dir: Path) -> None:
    import wf_magic
    from wf_magic import Engine

    with Engine(state_dir) as engine:
        run = engine.run("name: f\nsteps:\n  - id: a\n    prompt: x\n")
        expected = engine.journal(run.run_id)
    frame = wf_magic.journal(run.run_id, state_dir=state_dir)
    assert frame.equals(expected)
    assert list(wf_magic.runs(state_dir=state_dir)["run"]) == [run.run_id]
    assert int(wf_magic.tokens(run.run_id, state_dir=state_dir)["tokens"].sum()) == int(
        expected["tokens_in"].sum() + expected["tokens_out"].sum()
    )
    assert len(wf_magic.events(run.run_id, state_dir=state_dir)) > 0
    assert set(wf_magic.budget(run.run_id, state_dir=state_dir)["ceiling"]) == {
        "units",
        "tokens",
        "cost",
    }


def test_run_plan_renders_the_frozen_plan(state_dir: Path) -> None:
    from wf_magic import Engine

    with Engine(state_dir) as engine:
        run = engine.run(ROOT / "examples" / "quickstart.yaml")
        plan = run.plan
        assert plan.name == "paper-digest" and [s.id for s in plan.steps][:2] == [
            "outline",
            "draft",
        ]
        assert repr(plan).startswith(f"Plan paper-digest  hash {run.row.plan_hash[:16]}")
        html = plan._repr_html_()
        assert "<pre class='mermaid'>flowchart TD" in html and "decide -- ok --&gt; publish" in html


def test_readme_python_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    text = (ROOT / "README.md").read_text()
    section = text.split("## Python API", 1)[1].split("## CLI", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - our own documentation
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("completed {")
    assert lines[1] == "completed"
    assert lines[2].startswith("blocked step draft: waiting for a human verdict on loop 1")
    assert lines[3] == "completed"


def test_gc_deletes_finished_runs_older_than_a_duration(tmp_path: Path, state_dir: Path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text("name: g\nsteps:\n  - id: a\n    prompt: hi\n")
    assert _cli("--db", str(state_dir), "run", str(wf))[0] == 0
    code, out, _ = _cli("--db", str(state_dir), "gc", "--older-than", "1d")
    assert code == 0 and out.startswith("deleted 0 finished run(s)")
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    code, out, _ = _cli("--db", str(state_dir), "gc", "--older-than", "0s")
    assert code == 0 and run_id in out
    assert db_rows(state_dir, "SELECT COUNT(*) FROM attempts") == [(0,)]


def test_list_all_shows_child_runs_with_their_parent(tmp_path: Path, state_dir: Path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text(
        "name: p\nsteps:\n  - id: c\n    workflow: kid\n---\nname: kid\nsteps:\n"
        "  - id: k\n    prompt: hi\n"
    )
    assert _cli("--db", str(state_dir), "run", str(wf))[0] == 0
    _, plain, _ = _cli("--db", str(state_dir), "list")
    _, everything, _ = _cli("list", "--all", "--db", str(state_dir))
    parent = str(db_rows(state_dir, "SELECT run_id FROM runs WHERE parent_run_id IS NULL")[0][0])
    assert len(plain.splitlines()) == 1
    assert len(everything.splitlines()) == 2 and f"(child of {parent})" in everything


def test_a_comment_only_edit_warns_once(tmp_path: Path, state_dir: Path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text("name: c\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n")
    assert _cli("--db", str(state_dir), "run", str(wf), "--max-steps", "1")[0] == 0
    wf.write_text("# a comment\n" + wf.read_text())
    code, _, err = _cli("--db", str(state_dir), "run", str(wf))
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert code == 0 and len(warnings) == 1
    assert "do not change the plan" in warnings[0]


def test_the_verb_table_offers_exactly_the_token_groupings_the_frames_accept() -> None:
    from wf_magic.store.frames import TOKENS_KEYS
    from wf_magic.verbs import TOKENS_BY

    assert tuple(TOKENS_BY) == tuple(TOKENS_KEYS)


# -- flags, state dirs and exit codes ---------------------------------------------------------
TWO_STEPS = "name: two\nsteps:\n  - id: a\n    prompt: hi\n  - id: b\n    prompt: there\n"
PARAMS = (
    "name: p\n"
    "params:\n"
    "  n: {type: integer, default: 2, minimum: 1}\n"
    "  f: {type: number, default: 1.5}\n"
    "steps:\n"
    "  - id: s\n"
    "    prompt: 'n={{ params.n }} f={{ params.f }}'\n"
)


def test_a_nan_param_is_a_usage_error(tmp_path: Path, state_dir: Path) -> None:
    wf = write_file(tmp_path, "p.yaml", PARAMS)
    res = run_wf(state_dir, "run", str(wf), "--param", "f=nan")
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "f" in res.stderr


def test_bad_param_values_are_usage_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = write_file(tmp_path, "p.yaml", PARAMS)
    for bad in ("n=abc", "n=0", "n", "=3"):
        res = wf_inproc(capsys, state_dir, "run", str(wf), "--param", bad)
        assert res.returncode == 2, (bad, res.stderr)
        assert "Traceback" not in res.stderr
    req = write_file(
        tmp_path,
        "r.yaml",
        "name: r\nparams:\n  t: {type: string}\nsteps:\n  - id: a\n    prompt: '{{ params.t }}'\n",
    )
    res = wf_inproc(capsys, state_dir, "run", str(req))
    assert res.returncode == 2 and "t" in res.stderr
    if (state_dir / "state.db").exists():
        assert table_counts(state_dir)["runs"] == 0


def test_scope_is_params_after_defaults(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = write_file(tmp_path, "p.yaml", PARAMS)
    first = wf_inproc(capsys, state_dir, "run", str(wf))
    again = wf_inproc(capsys, state_dir, "run", str(wf), "--param", "n=2", "--param", "f=1.5")
    assert first.returncode == again.returncode == 0
    assert "(existing)" in again.stdout
    other = wf_inproc(capsys, state_dir, "run", str(wf), "--param", "n=3")
    assert "(new)" in other.stdout
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs")[0][0] == 2


def test_spelled_out_default_params_resume_and_a_fork_of_a_blocked_run_blocks_again(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "p.yaml"
    wf.write_text("""
name: cli-params
params:
  n: {type: integer, default: 2}
steps:
  - id: a
    prompt: "N {{ params.n }}"
  - id: h
    prompt: "H"
    gate: {judge: human}
""")
    assert run_cli(state, "run", str(wf)) == 3
    engine = Engine(state)
    [first] = [r.run_id for r in engine.list_runs()]
    # The explicit default is the same scope: it resumes, writing nothing.
    before = journal_counts(engine, first)
    assert run_cli(state, "run", str(wf), "--param", "n=2") == 3
    assert [r.run_id for r in engine.list_runs()] == [first]
    assert journal_counts(engine, first) == before
    assert run_cli(state, "run", str(wf), "--param", "m=2") == 2
    # A fork of the blocked run re-blocks on its own human gate (exit 3), prefix reused.
    assert run_cli(state, "fork", first, "--from", "h") == 3
    fork = next(r.run_id for r in engine.list_runs() if r.run_id != first)
    assert [(a.unit_id, a.status) for a in engine.attempts(fork)] == [
        ("a", "reused"),
        ("h", "succeeded"),
    ]
    # Overriding the default is a different scope: a new run.
    assert run_cli(state, "run", str(wf), "--param", "n=3") == 3
    assert len(engine.list_runs()) == 3
    assert json.loads(engine.get_run(engine.list_runs()[0].run_id).params_json) == {"n": 3}


def test_max_steps_zero_dispatches_nothing_or_is_refused(tmp_path: Path, state_dir: Path) -> None:
    wf = write_file(tmp_path, "two.yaml", TWO_STEPS)
    res = run_wf(state_dir, "run", str(wf), "--max-steps", "0")
    if res.returncode != 2:
        assert db_rows(state_dir, "SELECT COUNT(*) FROM attempts")[0][0] == 0


def test_negative_max_steps_is_a_usage_error(tmp_path: Path, state_dir: Path) -> None:
    wf = write_file(tmp_path, "two.yaml", TWO_STEPS)
    res = run_wf(state_dir, "run", str(wf), "--max-steps", "-1")
    assert res.returncode == 2


def test_no_cache_re_pays_every_unit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = write_file(tmp_path, "two.yaml", TWO_STEPS)
    assert wf_inproc(capsys, state_dir, "run", str(wf)).returncode == 0
    res = wf_inproc(capsys, state_dir, "run", str(wf), "--new", "--no-cache")
    assert res.returncode == 0
    statuses = db_rows(
        state_dir,
        "SELECT status FROM attempts WHERE run_id = (SELECT run_id FROM runs "
        "ORDER BY created_at DESC LIMIT 1)",
    )
    assert [s for (s,) in statuses] == ["succeeded", "succeeded"]


def test_abandoned_and_failed_runs_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = write_file(tmp_path, "two.yaml", TWO_STEPS)
    wf_inproc(capsys, state_dir, "run", str(wf), "--max-steps", "1")
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    assert wf_inproc(capsys, state_dir, "abandon", run_id).returncode == 0
    assert wf_inproc(capsys, state_dir, "status", run_id).returncode == 1
    fail = write_file(
        tmp_path, "f.yaml", "name: f\nsteps:\n  - id: e\n    exec: [sh, -c, 'exit 3']\n"
    )
    res = wf_inproc(capsys, state_dir, "run", str(fail))
    assert res.returncode == 1 and "status 3" in res.stdout + res.stderr


def test_unknown_run_is_exit_2_for_every_verb(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    for args in (
        ("status", "nope"),
        ("resume", "nope"),
        ("journal", "nope"),
        ("tokens", "nope"),
        ("abandon", "nope"),
        ("fork", "nope", "--from", "a"),
        ("stop", "nope"),
        ("approve", "nope", "a"),
        ("reject", "nope", "a", "--feedback", "x"),
    ):
        res = wf_inproc(capsys, state_dir, *args)
        assert res.returncode == 2, (args, res.stderr)
        assert "nope" in res.stderr


def test_missing_file_and_directory_are_usage_errors_writing_nothing(
    tmp_path: Path, state_dir: Path
) -> None:
    for target in (tmp_path / "nope.yaml", tmp_path):
        res = run_wf(state_dir, "run", str(target))
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
    if (state_dir / "state.db").exists():
        assert table_counts(state_dir)["runs"] == 0


CHILD_DOC_ERROR = (
    "name: parent\n"  # 1
    "steps:\n"  # 2
    "  - id: a\n"  # 3
    "    workflow: kid\n"  # 4
    "---\n"  # 5
    "name: kid\n"  # 6
    "steps:\n"  # 7
    "  - id: k\n"  # 8
    "    prompt: hi\n"  # 9
    "    gate: {judge: llm, max_loops: 0}\n"  # 10
)


def test_definition_error_in_a_child_document_names_the_file_line(
    tmp_path: Path, state_dir: Path
) -> None:
    wf = write_file(tmp_path, "ch.yaml", CHILD_DOC_ERROR)
    res = run_wf(state_dir, "run", str(wf))
    assert res.returncode == 2
    assert "max_loops" in res.stderr
    assert "ch.yaml" in res.stderr and "line 10" in res.stderr
    assert not (state_dir / "state.db").exists() or table_counts(state_dir)["runs"] == 0


def test_db_flag_is_accepted_after_the_verb(tmp_path: Path, state_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "wf_magic.cli", "list", "--db", str(state_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr


def test_wf_magic_home_is_the_cli_default_state_dir(tmp_path: Path) -> None:
    home = tmp_path / "myhome"
    wf = write_file(tmp_path, "two.yaml", TWO_STEPS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WF_MAGIC_HOME": str(home)}
    res = subprocess.run(
        [sys.executable, "-m", "wf_magic.cli", "run", str(wf)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert (home / "state.db").exists()
    assert not (tmp_path / ".wf_magic").exists()


def test_a_corrupt_state_db_is_a_clear_error(tmp_path: Path) -> None:
    state = tmp_path / "bad"
    state.mkdir()
    (state / "state.db").write_text("this is not a database")
    res = run_wf(state, "list")
    assert res.returncode in (1, 2)
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("error:")


def test_db_pointing_at_a_file_is_a_usage_error(tmp_path: Path) -> None:
    target = write_file(tmp_path, "afile", "x")
    res = run_wf(target, "list")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr


def test_closed_stdout_does_not_print_a_traceback(tmp_path: Path, state_dir: Path) -> None:
    wf = write_file(tmp_path, "two.yaml", TWO_STEPS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        wf_cmd(state_dir, "run", str(wf)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head -0`
    err = proc.stderr.read().decode()
    proc.stderr.close()
    proc.wait(timeout=60)
    assert "Traceback" not in err
    assert proc.returncode == 141  # as a SIGPIPE'd tool would
