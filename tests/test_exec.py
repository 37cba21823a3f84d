"""Exec steps (DESIGN.md §2): a minimal environment, bounded output, failures never crash a run."""

from __future__ import annotations

import gc

import pytest

from wf_magic import Engine


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


def test_exec_output_over_the_cap_names_cap_and_byte_count(engine: Engine) -> None:
    src = (
        "name: bigout\nsteps:\n  - id: e\n"
        "    exec: [python3, -c, 'import sys; sys.stdout.write(\"x\" * 2000000)']\n"
    )
    run = engine.run(src)
    assert run.status == "failed"
    failure = engine.attempts(run.run_id)[0].failure or ""
    assert "2000000" in failure and "1048576" in failure


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_exec_output_nan_fails_the_step_instead_of_wedging_the_run(engine: Engine) -> None:
    src = "name: nanx\nsteps:\n  - id: a\n    exec: [echo, 'NaN']\n    output: {type: number}\n"
    try:
        run = engine.run(src)
    except ValueError as exc:  # a raw ValueError would leave the exec pipes unclosed too
        gc.collect()
        pytest.fail(f"raw ValueError escaped the engine: {exc}")
    assert run.status in ("failed", "completed")
    # a re-drive must not crash either
    assert engine.drive(run.run_id).status == run.status
