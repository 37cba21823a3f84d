"""Contract review against DESIGN.md: deviations are strict xfails, verified gaps are plain tests.

Each xfail's reason says what is wrong; the assertion states the DESIGN.md behaviour.
"""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wf_magic import (
    BudgetExceeded,
    DefinitionError,
    Engine,
    MigrationError,
    PlanIntegrityError,
    RunLockHeld,
    RunnerError,
    UsageError,
    WorkflowError,
    load_workflow,
)

from .conftest import ROOT, db_rows, run_wf, table_counts, wf_cmd

SLOW_IF_NEEDED = 60


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


class _Result:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def wf_inproc(capsys: pytest.CaptureFixture[str], state_dir: Path, *args: str) -> _Result:
    """The real ``wf`` entry point, in-process (fast); ``run_wf`` is used where a process matters."""
    from wf_magic.cli import main

    capsys.readouterr()
    try:
        code = main(["--db", str(state_dir), *args])
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return _Result(code, out.out, out.err)


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


# --------------------------------------------------------------------------------------------
# §10 errors: every class importable from wf_magic, one base
# --------------------------------------------------------------------------------------------


def test_every_documented_error_class_is_a_workflow_error() -> None:
    for cls in (
        DefinitionError,
        UsageError,
        PlanIntegrityError,
        RunLockHeld,
        BudgetExceeded,
        RunnerError,
        MigrationError,
    ):
        assert issubclass(cls, WorkflowError)
    err = DefinitionError("bad", field="steps[0].id", line=3)
    assert (err.field, err.line) == ("steps[0].id", 3)


# --------------------------------------------------------------------------------------------
# Non-finite floats (NaN / Infinity): raw ValueError crashes instead of WorkflowErrors
# --------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_exec_output_nan_fails_the_step_instead_of_wedging_the_run(engine: Engine) -> None:
    src = "name: nanx\nsteps:\n  - id: a\n    exec: [echo, 'NaN']\n    output: {type: number}\n"
    try:
        run = engine.run(src)
    except ValueError as exc:  # what happens today (the exec pipes are left unclosed too)
        gc.collect()
        pytest.fail(f"raw ValueError escaped the engine: {exc}")
    assert run.status in ("failed", "completed")
    # a re-drive must not crash either
    assert engine.drive(run.run_id).status == run.status


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_python_step_returning_nan_is_a_unit_failure(engine: Engine) -> None:
    from wf_magic import register_function

    register_function("contract_review_nan", lambda **kw: math.nan)
    src = "name: pynan\nsteps:\n  - id: a\n    python: contract_review_nan\n"
    try:
        run = engine.run(src)
    except ValueError as exc:
        pytest.fail(f"raw ValueError escaped the engine: {exc}")
    assert run.status == "failed"
    assert "a" in (run.reason or "")


def test_cli_param_nan_is_a_usage_error(tmp_path: Path, state_dir: Path) -> None:
    wf = _write(tmp_path, "p.yaml", PARAMS)
    res = run_wf(state_dir, "run", str(wf), "--param", "f=nan")
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "f" in res.stderr


def test_infinite_budget_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError) as info:
        load_workflow("name: x\nbudget: {max_cost: .inf}\nsteps:\n  - id: a\n    prompt: hi\n")
    assert info.value.field is not None and "budget" in info.value.field


def test_nan_param_default_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        load_workflow(
            "name: x\nparams:\n  f: {type: number, default: .nan}\n"
            "steps:\n  - id: a\n    prompt: hi\n"
        )


# --------------------------------------------------------------------------------------------
# §5 CLI flags: --max-steps bounds, --db placement, state dir errors
# --------------------------------------------------------------------------------------------


def test_max_steps_zero_dispatches_nothing_or_is_refused(tmp_path: Path, state_dir: Path) -> None:
    wf = _write(tmp_path, "two.yaml", TWO_STEPS)
    res = run_wf(state_dir, "run", str(wf), "--max-steps", "0")
    if res.returncode != 2:
        assert db_rows(state_dir, "SELECT COUNT(*) FROM attempts")[0][0] == 0


def test_negative_max_steps_is_a_usage_error(tmp_path: Path, state_dir: Path) -> None:
    wf = _write(tmp_path, "two.yaml", TWO_STEPS)
    res = run_wf(state_dir, "run", str(wf), "--max-steps", "-1")
    assert res.returncode == 2


def test_db_flag_is_accepted_after_the_verb(tmp_path: Path, state_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "wf_magic.cli", "list", "--db", str(state_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=SLOW_IF_NEEDED,
        check=False,
    )
    assert res.returncode == 0, res.stderr


def test_a_corrupt_state_db_is_a_clear_error(tmp_path: Path) -> None:
    state = tmp_path / "bad"
    state.mkdir()
    (state / "state.db").write_text("this is not a database")
    res = run_wf(state, "list")
    assert res.returncode in (1, 2)
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("error:")


def test_db_pointing_at_a_file_is_a_usage_error(tmp_path: Path) -> None:
    target = _write(tmp_path, "afile", "x")
    res = run_wf(target, "list")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr


def test_closed_stdout_does_not_print_a_traceback(tmp_path: Path, state_dir: Path) -> None:
    wf = _write(tmp_path, "two.yaml", TWO_STEPS)
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
    proc.wait(timeout=SLOW_IF_NEEDED)
    assert "Traceback" not in err
    assert proc.returncode == 141  # as a SIGPIPE'd tool would


# --------------------------------------------------------------------------------------------
# §2 definition errors: file line of a child document, freeze-time template checks
# --------------------------------------------------------------------------------------------


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
    wf = _write(tmp_path, "ch.yaml", CHILD_DOC_ERROR)
    res = run_wf(state_dir, "run", str(wf))
    assert res.returncode == 2
    assert "max_loops" in res.stderr
    assert "ch.yaml" in res.stderr and "line 10" in res.stderr
    assert not (state_dir / "state.db").exists() or table_counts(state_dir)["runs"] == 0


def test_unknown_attribute_of_a_step_is_a_freeze_time_error() -> None:
    with pytest.raises(DefinitionError) as info:
        load_workflow(
            "name: x\nsteps:\n  - id: a\n    prompt: hi\n"
            "  - id: b\n    prompt: '{{ steps.a.outputs }}'\n"
        )
    assert info.value.field == "steps[1].prompt"


def test_recursive_child_workflow_is_named_as_recursion(tmp_path: Path, state_dir: Path) -> None:
    wf = _write(tmp_path, "self_call.yaml", "name: loopy\nsteps:\n  - id: a\n    workflow: loopy\n")
    res = run_wf(state_dir, "run", str(wf))  # named loopy.yaml it does say "cycle"
    assert res.returncode == 2
    text = res.stderr.replace(str(tmp_path), "").lower()  # the tmp path names the test
    assert "unknown child workflow" not in text
    assert "recurs" in text or "cycle" in text or "itself" in text


def test_pass_env_on_a_non_exec_step_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        load_workflow("name: x\nsteps:\n  - id: a\n    prompt: hi\n    pass_env: [HOME]\n")


def test_reduce_without_map_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        load_workflow("name: x\nsteps:\n  - id: a\n    prompt: hi\n    reduce: vote\n")


# --------------------------------------------------------------------------------------------
# Verified behaviours not covered elsewhere (plain tests)
# --------------------------------------------------------------------------------------------


def test_missing_file_and_directory_are_usage_errors_writing_nothing(
    tmp_path: Path, state_dir: Path
) -> None:
    for target in (tmp_path / "nope.yaml", tmp_path):
        res = run_wf(state_dir, "run", str(target))
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
    if (state_dir / "state.db").exists():
        assert table_counts(state_dir)["runs"] == 0


def test_bad_param_values_are_usage_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = _write(tmp_path, "p.yaml", PARAMS)
    for bad in ("n=abc", "n=0", "n", "=3"):
        res = wf_inproc(capsys, state_dir, "run", str(wf), "--param", bad)
        assert res.returncode == 2, (bad, res.stderr)
        assert "Traceback" not in res.stderr
    req = _write(
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
    wf = _write(tmp_path, "p.yaml", PARAMS)
    first = wf_inproc(capsys, state_dir, "run", str(wf))
    again = wf_inproc(capsys, state_dir, "run", str(wf), "--param", "n=2", "--param", "f=1.5")
    assert first.returncode == again.returncode == 0
    assert "(existing)" in again.stdout
    other = wf_inproc(capsys, state_dir, "run", str(wf), "--param", "n=3")
    assert "(new)" in other.stdout
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs")[0][0] == 2


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


def test_exec_env_is_minimal_plus_pass_env_and_wf_ids(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTRACT_PASSED", "yes-passed")
    monkeypatch.setenv("CONTRACT_NOT_PASSED", "no")
    src = (
        "name: envt\nsteps:\n  - id: m\n    map: \"{{ ['x', 'y'] }}\"\n"
        "    exec: [/usr/bin/env]\n    pass_env: [CONTRACT_PASSED, CONTRACT_UNSET]\n"
    )
    run = engine.run(src)
    assert run.status == "completed"
    for index, text in enumerate(run.result):
        env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        assert env["CONTRACT_PASSED"] == "yes-passed"
        assert "CONTRACT_NOT_PASSED" not in env and "CONTRACT_UNSET" not in env
        assert env["WF_RUN_ID"] == run.run_id
        assert env["WF_STEP_ID"] == "m" and env["WF_UNIT_ID"] == f"m[{index}]"
        assert env["WF_ITEM"] == ["x", "y"][index]
        assert len(env["WF_DISPATCH_ID"]) >= 16
        allowed = {"PATH", "HOME", "TMPDIR", "TMP", "TEMP", "LANG", "LANGUAGE", "TZ"}
        extra = {
            k
            for k in env
            if k not in allowed and not k.startswith(("LC_", "WF_")) and k != "CONTRACT_PASSED"
        }
        assert extra == set()


@pytest.mark.parametrize("name", ["WF_TOKEN", "1ABC", "A-B", "A B"])
def test_pass_env_names_are_validated(name: str) -> None:
    with pytest.raises(DefinitionError) as info:
        load_workflow(
            f"name: x\nsteps:\n  - id: a\n    exec: [env]\n    pass_env: [{json.dumps(name)}]\n"
        )
    assert info.value.field == "steps[0].pass_env" and info.value.line == 5


def test_exec_output_over_the_cap_names_cap_and_byte_count(engine: Engine) -> None:
    src = (
        "name: bigout\nsteps:\n  - id: e\n"
        "    exec: [python3, -c, 'import sys; sys.stdout.write(\"x\" * 2000000)']\n"
    )
    run = engine.run(src)
    assert run.status == "failed"
    failure = engine.attempts(run.run_id)[0].failure or ""
    assert "2000000" in failure and "1048576" in failure


def test_ten_thousand_and_one_items_is_a_clear_bound_error(engine: Engine) -> None:
    src = "name: big\nsteps:\n  - id: m\n    map: '{{ range(10001) | list }}'\n    prompt: x\n"
    run = engine.run(src)
    assert run.status == "failed"
    assert "10000" in (run.reason or "") and "10001" in (run.reason or "")
    assert engine.attempts(run.run_id) == []


def test_reuse_needs_the_same_model_and_workflow(engine: Engine) -> None:
    base = "name: {n}\nsteps:\n  - id: a\n    prompt: hello world\n{extra}"
    engine.run(base.format(n="rx", extra=""))
    other_model = engine.run(base.format(n="rx", extra="    model: m2\n"))
    assert [a.status for a in engine.attempts(other_model.run_id)] == ["succeeded"]
    other_wf = engine.run(base.format(n="ry", extra=""))
    assert [a.status for a in engine.attempts(other_wf.run_id)] == ["succeeded"]
    same = engine.run(base.format(n="rx", extra="    timeout: 5\n"))
    assert [a.status for a in engine.attempts(same.run_id)] == ["reused"]


def test_cli_no_cache_re_pays_every_unit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = _write(tmp_path, "two.yaml", TWO_STEPS)
    assert wf_inproc(capsys, state_dir, "run", str(wf)).returncode == 0
    res = wf_inproc(capsys, state_dir, "run", str(wf), "--new", "--no-cache")
    assert res.returncode == 0
    statuses = db_rows(
        state_dir,
        "SELECT status FROM attempts WHERE run_id = (SELECT run_id FROM runs "
        "ORDER BY created_at DESC LIMIT 1)",
    )
    assert [s for (s,) in statuses] == ["succeeded", "succeeded"]


def test_abandoned_run_is_not_resumed_by_an_unchanged_rerun(engine: Engine) -> None:
    first = engine.run(TWO_STEPS, max_steps=1)
    engine.abandon(first.run_id)
    again = engine.run(TWO_STEPS)
    assert again.run_id != first.run_id and again.status == "completed"


def test_cli_abandoned_and_failed_runs_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = _write(tmp_path, "two.yaml", TWO_STEPS)
    wf_inproc(capsys, state_dir, "run", str(wf), "--max-steps", "1")
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    assert wf_inproc(capsys, state_dir, "abandon", run_id).returncode == 0
    assert wf_inproc(capsys, state_dir, "status", run_id).returncode == 1
    fail = _write(tmp_path, "f.yaml", "name: f\nsteps:\n  - id: e\n    exec: [sh, -c, 'exit 3']\n")
    res = wf_inproc(capsys, state_dir, "run", str(fail))
    assert res.returncode == 1 and "status 3" in res.stdout + res.stderr


def test_wf_magic_home_is_the_cli_default_state_dir(tmp_path: Path) -> None:
    home = tmp_path / "myhome"
    wf = _write(tmp_path, "two.yaml", TWO_STEPS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WF_MAGIC_HOME": str(home)}
    res = subprocess.run(
        [sys.executable, "-m", "wf_magic.cli", "run", str(wf)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=SLOW_IF_NEEDED,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert (home / "state.db").exists()
    assert not (tmp_path / ".wf_magic").exists()


def test_migration_ledger_prefix_plus_newer_opens_divergent_is_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = _write(tmp_path, "two.yaml", TWO_STEPS)
    wf_inproc(capsys, state_dir, "run", str(wf))
    import sqlite3

    conn = sqlite3.connect(state_dir / "state.db")
    conn.execute("INSERT INTO schema_migrations VALUES ('m999_future', 999, 0)")
    conn.commit()
    assert wf_inproc(capsys, state_dir, "list").returncode == 0
    first = conn.execute("SELECT id FROM schema_migrations ORDER BY position LIMIT 1").fetchone()[0]
    conn.execute("UPDATE schema_migrations SET id = 'x_other' WHERE id = ?", (first,))
    conn.commit()
    conn.close()
    res = wf_inproc(capsys, state_dir, "list")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "WF_MAGIC_HOME" in res.stderr or "--db" in res.stderr


def test_plan_integrity_failure_exits_1_and_names_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = _write(tmp_path, "two.yaml", TWO_STEPS)
    wf_inproc(capsys, state_dir, "run", str(wf), "--max-steps", "1")
    import sqlite3

    conn = sqlite3.connect(state_dir / "state.db")
    run_id = conn.execute("SELECT run_id FROM runs").fetchone()[0]
    conn.execute("UPDATE runs SET params_json = '{\"x\": 1}'")
    conn.commit()
    conn.close()
    before = table_counts(state_dir)
    res = wf_inproc(capsys, state_dir, "resume", run_id)
    assert res.returncode == 1
    assert run_id in res.stderr
    assert table_counts(state_dir)["attempts"] == before["attempts"]


def test_gate_exhausted_rerun_of_the_file_writes_nothing_and_exits_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = _write(
        tmp_path,
        "g.yaml",
        "name: g\nsteps:\n  - id: a\n    prompt: 'Write {{ gate.feedback }}'\n"
        "    gate: {judge: expr, check: 'false', criteria: [be perfect], max_loops: 2}\n",
    )
    assert wf_inproc(capsys, state_dir, "run", str(wf)).returncode == 3
    before = table_counts(state_dir)
    res = wf_inproc(capsys, state_dir, "run", str(wf))
    assert res.returncode == 3 and "gate exhausted" in res.stdout
    assert table_counts(state_dir) == before


def test_yaml_12_numbers_and_dates_stay_as_written() -> None:
    wf = load_workflow(
        "name: x\ndescription: 1_000\nparams:\n  d: {type: string, default: 2020-01-01}\n"
        "  o: {type: integer, default: 017}\n"
        "steps:\n  - id: a\n    prompt: hi\n"
    )
    assert wf.plan.description == "1_000"
    plan = json.loads(wf.plan_json)
    assert plan["params"]["d"]["default"] == "2020-01-01"
    assert plan["params"]["o"]["default"] == 17


def test_storage_status_vocabularies_are_enforced(engine: Engine) -> None:
    engine.run(TWO_STEPS)
    schema = " ".join(
        str(r[0])
        for r in db_rows(engine.state_dir, "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")
    )
    for vocab in (
        "'active','blocked','completed','failed','abandoned'",
        "'pending','completed','failed','skipped','blocked'",
        "'running','succeeded','failed','reused'",
    ):
        assert vocab in schema
    for column in (
        "plan_json",
        "plan_hash",
        "plan_version",
        "source_hash",
        "params_json",
        "scope_key",
        "parent_run_id",
        "invocation_key",
    ):
        assert column in schema
