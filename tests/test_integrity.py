"""Plan integrity (wf_magic.drive.integrity): a run keeps to the plan and params it froze.

A stored plan or params edited outside wf_magic are refused before anything is dispatched; a
plan from a newer wf_magic is left untouched; an undecodable older plan abandons its run; an
edited source only warns, since the run continues with its frozen plan.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from wf_magic import Engine, PlanIntegrityError, PlanVersionError, PlanVersionTooNew, load_workflow
from wf_magic.drive.integrity import drift_warnings, verified_plan, verify
from wf_magic.hashing import sha256_text
from wf_magic.spec.plan import PLAN_VERSION
from wf_magic.store.records import RunRow

from .conftest import table_counts, tamper, wf_inproc, write_file

TWO_STEPS = "name: two\nsteps:\n  - id: a\n    prompt: hi\n  - id: b\n    prompt: there\n"
SOURCE = (
    "name: s\nparams: {n: {type: integer, default: 1}}\n"
    "steps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n"
)
DRIFT = (
    "the workflow source changed since run {run_id} started; continuing with its frozen plan "
    "(start a new run with --new to pick up the edit)"
)


def stored(engine: Engine, source: str | Path = SOURCE) -> RunRow:
    """The stored row of a freshly started (not driven) run of ``source``."""
    return engine.get_run(engine.start(source).run_id)


# -- verify: hashes and plan_version ----------------------------------------------------------
def test_verify_returns_the_frozen_plan_and_params_of_an_intact_run(engine: Engine) -> None:
    row = stored(engine)
    plan, params = verify(row)
    assert [s.id for s in plan.steps] == ["a", "b"]
    assert plan.to_json() == row.plan_json
    assert params == {"n": 1}


def test_verify_refuses_a_plan_that_does_not_match_its_hash(engine: Engine) -> None:
    row = stored(engine)
    edited = replace(row, plan_json=row.plan_json.replace('"y"', '"evil"'))
    with pytest.raises(PlanIntegrityError) as info:
        verify(edited)
    assert info.value.run_id == row.run_id
    assert str(info.value) == (
        f"Run {row.run_id}: the stored plan does not match its plan_hash {row.plan_hash[:12]}; "
        "it was edited outside wf_magic. Nothing was dispatched. Start a new run from the "
        "source (--new) or fork an intact run."
    )


def test_verify_refuses_params_that_do_not_match_their_hash(engine: Engine) -> None:
    row = stored(engine)
    with pytest.raises(PlanIntegrityError) as info:
        verify(replace(row, params_json='{"n":2}'))
    assert str(info.value) == (
        f"Run {row.run_id}: the stored params do not match their hash; they were edited "
        "outside wf_magic. Nothing was dispatched. Start a new run with the params you want."
    )


def test_verify_refuses_a_plan_frozen_by_a_newer_plan_version(engine: Engine) -> None:
    row = stored(engine)
    with pytest.raises(PlanVersionTooNew) as info:
        verify(replace(row, plan_version=PLAN_VERSION + 1))
    assert str(info.value) == (
        f"Run {row.run_id} was frozen by a newer wf_magic (plan version {PLAN_VERSION + 1} > "
        f"{PLAN_VERSION}); upgrade wf_magic to drive it. Nothing was changed."
    )


def test_an_undecodable_plan_of_a_finished_run_leaves_the_run_as_it_is(engine: Engine) -> None:
    done = engine.run(SOURCE)
    old = '{"name":"s","plan_version":0,"tasks":[]}'
    row = replace(
        engine.get_run(done.run_id), plan_json=old, plan_hash=sha256_text(old), plan_version=0
    )
    with pytest.raises(PlanVersionError, match="plan version 0 is no longer supported") as info:
        verified_plan(engine.store, engine.bus, row)
    assert str(info.value).endswith("Nothing was dispatched; it stays completed.")
    assert engine.get_run(done.run_id).status == "completed"


# -- drift_warnings: an edited source only warns ----------------------------------------------
def test_a_live_source_freezing_to_the_same_plan_does_not_warn(engine: Engine) -> None:
    row = stored(engine)
    assert drift_warnings(row, load_workflow("# a comment\n" + SOURCE)) == []


def test_a_live_source_with_another_plan_warns_that_the_frozen_plan_continues(
    engine: Engine,
) -> None:
    row = stored(engine)
    live = load_workflow(SOURCE.replace("prompt: y", "prompt: z"))
    assert drift_warnings(row, live) == [DRIFT.format(run_id=row.run_id)]


def test_without_a_live_source_the_runs_file_is_compared(engine: Engine, tmp_path: Path) -> None:
    path = write_file(tmp_path, "wf.yaml", SOURCE)
    row = stored(engine, path)
    assert drift_warnings(row, None) == []
    path.write_text(SOURCE.replace("prompt: y", "prompt: z"))
    assert drift_warnings(row, None) == [DRIFT.format(run_id=row.run_id)]
    path.unlink()
    assert drift_warnings(row, None) == []


# -- driving a run whose plan was tampered with -----------------------------------------------
def test_edited_plan_json_is_refused_and_nothing_dispatches(
    engine: Engine, state_dir: Path
) -> None:
    src = "name: s\nsteps:\n  - id: a\n    prompt: one\n  - id: b\n    prompt: two\n"
    run = engine.run(src, max_steps=1)
    tamper(
        engine,
        "UPDATE runs SET plan_json = replace(plan_json, 'two', 'evil') WHERE run_id = ?",
        (run.run_id,),
    )
    before = table_counts(state_dir)
    with pytest.raises(PlanIntegrityError, match=f"Run {run.run_id}: the stored plan"):
        engine.drive(run.run_id)
    assert table_counts(state_dir) == before


def test_edited_params_are_refused(engine: Engine) -> None:
    src = "name: s\nparams: {n: {type: integer, default: 1}}\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n"
    run = engine.run(src, max_steps=1)
    tamper(engine, "UPDATE runs SET params_json = '{\"n\":2}' WHERE run_id = ?", (run.run_id,))
    with pytest.raises(PlanIntegrityError, match="stored params"):
        engine.drive(run.run_id)


def test_newer_plan_version_is_left_untouched(engine: Engine, state_dir: Path) -> None:
    src = "name: s\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n"
    run = engine.run(src, max_steps=1)
    tamper(engine, "UPDATE runs SET plan_version = 99 WHERE run_id = ?", (run.run_id,))
    before = table_counts(state_dir)
    with pytest.raises(PlanIntegrityError, match="newer wf_magic"):
        engine.drive(run.run_id)
    assert table_counts(state_dir) == before
    assert engine.get_run(run.run_id).status == "active"


def test_changed_python_function_is_refused(engine: Engine) -> None:
    def step_fn() -> str:
        return "v1"

    namespace = {"step_fn": step_fn}
    eng = Engine(engine.state_dir, namespace=namespace)
    src = "name: f\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    python: step_fn\n"
    run = eng.run(src, max_steps=1)

    def step_fn_v2() -> str:  # different source
        return "v2 changed"

    namespace["step_fn"] = step_fn_v2
    done = eng.drive(run.run_id)
    assert done.status == "failed"
    assert "changed since this run's plan was frozen" in (done.reason or "")
    eng.close()


def test_undecodable_older_plan_abandons_the_run_with_guidance(engine: Engine) -> None:
    src = "name: s\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n"
    run = engine.run(src, max_steps=1)
    old = '{"name":"s","plan_version":0,"tasks":[]}'
    tamper(
        engine,
        "UPDATE runs SET plan_json = ?, plan_hash = ?, plan_version = 0 WHERE run_id = ?",
        (old, sha256_text(old), run.run_id),
    )
    with pytest.raises(PlanVersionError, match="wf run FILE --new"):
        engine.drive(run.run_id)
    row = engine.get_run(run.run_id)
    assert row.status == "abandoned"
    assert row.status_reason == (
        "plan version 0 is no longer supported; start afresh with `wf run FILE --new`"
    )


def test_resume_warns_once_when_the_source_file_changed(tmp_path: Path, engine: Engine) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text("name: d\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n")
    run = engine.run(path, max_steps=1)
    path.write_text(path.read_text().replace("prompt: y", "prompt: z"))
    resumed = engine.drive(run.run_id)
    assert resumed.warnings == [
        f"the workflow source changed since run {run.run_id} started; continuing with its "
        "frozen plan (start a new run with --new to pick up the edit)"
    ]
    assert resumed.output("b") == json.loads(engine.attempts(run.run_id)[-1].output_json or "")
    assert [a.unit_id for a in engine.attempts(run.run_id)] == ["a", "b"]
    assert "y" in str(resumed.output("b"))


def test_plan_integrity_failure_exits_1_and_names_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = write_file(tmp_path, "two.yaml", TWO_STEPS)
    wf_inproc(capsys, state_dir, "run", str(wf), "--max-steps", "1")
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
