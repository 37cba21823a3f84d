"""Durable resume: kill -9 mid-unit, signals and stop requests, and what a re-run resumes."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from wf_magic import Engine

from .conftest import attempts_in, db_rows, run_wf, spawn_wf, tamper, wait_for, write_file

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

SLEEPY = """\
name: sleepy
steps:
  - id: first
    prompt: "hello"
  - id: nap
    exec: [python3, -c, "import time, os; time.sleep(float(os.environ.get('NAP', '0.8'))); print(os.environ['WF_DISPATCH_ID'])"]
    pass_env: [NAP]
  - id: last
    prompt: "bye"
"""

TWO_STEPS = "name: two\nsteps:\n  - id: a\n    prompt: hi\n  - id: b\n    prompt: there\n"


def test_kill_9_mid_exec_then_resume_reclaims_the_same_dispatch(
    tmp_path: Path, state_dir: Path
) -> None:
    path = write_file(tmp_path, "wf.yaml", SLEEPY)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(
        lambda: any(u == "nap" and s == "running" for u, _, s, _ in attempts_in(state_dir)),
        what="the exec unit to start",
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    before = attempts_in(state_dir)
    nap = next(a for a in before if a[0] == "nap")
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])

    done = run_wf(state_dir, "resume", run_id)
    assert done.returncode == 0, done.stderr
    after = attempts_in(state_dir)
    assert [(u, n, s) for u, n, s, _ in after] == [
        ("first", 1, "succeeded"),
        ("nap", 1, "succeeded"),
        ("last", 1, "succeeded"),
    ]
    assert after[1][3] == nap[3]  # same dispatch_id: an idempotency key for side effects
    output = db_rows(state_dir, "SELECT output_json FROM attempts WHERE unit_id = 'nap'")[0][0]
    assert nap[3] in str(output)


def test_sigterm_stops_gracefully_and_exit_130(tmp_path: Path, state_dir: Path) -> None:
    text = SLEEPY.replace(
        "  - id: last", "  - id: nap2\n    exec: [python3, -c, 'print(1)']\n  - id: last"
    )
    path = write_file(tmp_path, "wf.yaml", text)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in attempts_in(state_dir)), what="the exec unit")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert db_rows(state_dir, "SELECT status FROM runs")[0][0] == "active"
    units = [(u, s) for u, _, s, _ in attempts_in(state_dir)]
    assert units == [("first", "succeeded"), ("nap", "succeeded")]


def test_stop_request_from_another_process(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NAP", "3")
    text = SLEEPY.replace(
        "  - id: last", "  - id: nap2\n    exec: [python3, -c, 'print(1)']\n  - id: last"
    )
    path = write_file(tmp_path, "wf.yaml", text)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in attempts_in(state_dir)), what="the exec unit")
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    stopped = run_wf(state_dir, "stop", run_id)
    assert stopped.returncode == 0
    assert stopped.stdout == (
        f"stop requested for {run_id}; its driver stops after the units in flight\n"
    )
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert db_rows(state_dir, "SELECT status FROM runs")[0][0] == "active"
    assert run_wf(state_dir, "resume", run_id).returncode == 0
    assert [u for u, *_ in attempts_in(state_dir)] == ["first", "nap", "nap2", "last"]


def test_wf_stop_of_a_run_nobody_drives_says_nothing_stops(tmp_path: Path, state_dir: Path) -> None:
    path = tmp_path / "gated.yaml"
    path.write_text("name: gated\nsteps:\n  - id: a\n    prompt: A\n    gate: {judge: human}\n")
    assert run_wf(state_dir, "run", str(path)).returncode == 3  # blocked on the human gate
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    stopped = run_wf(state_dir, "stop", run_id)
    assert (stopped.returncode, stopped.stdout) == (
        0,
        f"run {run_id} (blocked) is not being driven now: nothing stops; a drive started later "
        "runs as usual\n",
    )


def test_sigint_stops_gracefully_and_exit_130(tmp_path: Path, state_dir: Path) -> None:
    text = SLEEPY.replace(
        "  - id: last", "  - id: nap2\n    exec: [python3, -c, 'print(1)']\n  - id: last"
    )
    path = write_file(tmp_path, "wf.yaml", text)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in attempts_in(state_dir)), what="the exec unit")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopping after the units in flight" in err
    assert [(u, s) for u, _, s, _ in attempts_in(state_dir)] == [
        ("first", "succeeded"),
        ("nap", "succeeded"),
    ]


def test_stop_request_is_cleared_so_the_next_drive_runs(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    started = engine.start("""
name: stop-clear
runners:
  scripted:
    rules:
      - {match: "slow", sleep_s: 0.3}
steps:
  - id: a
    prompt: "slow"
  - id: b
    prompt: "fast"
""")
    timer = threading.Timer(0.1, engine.stop, args=(started.run_id,))
    timer.start()
    try:
        t0 = time.monotonic()
        assert engine.drive(started).status == "active"
    finally:
        timer.join()
    assert time.monotonic() - t0 < 5
    assert engine.drive(started.run_id).status == "completed"


# -- what an unchanged re-run resumes ---------------------------------------------------------
def test_abandoned_run_is_not_resumed_by_an_unchanged_rerun(engine: Engine) -> None:
    first = engine.run(TWO_STEPS, max_steps=1)
    engine.abandon(first.run_id)
    again = engine.run(TWO_STEPS)
    assert again.run_id != first.run_id and again.status == "completed"


def test_abandoned_blocked_run_rerun_reuses_work_and_blocks_again(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    src = """
name: abandon-rerun
steps:
  - id: a
    prompt: Write A.
  - id: h
    prompt: Write H.
    gate: {judge: human}
"""
    run = engine.run(src)
    engine.abandon(run)

    again = engine.run(src)

    assert again.run_id != run.run_id and again.created
    assert again.status == "blocked"  # human approvals are never cached
    assert [(a.unit_id, a.status, a.charged) for a in engine.attempts(again.run_id)] == [
        ("a", "reused", 0),
        ("h", "reused", 0),
    ]


def test_a_run_left_active_with_every_step_settled_completes_on_resume(
    engine: Engine, state_dir: Path
) -> None:
    """A driver killed between the last step's status write and the run's status write
    leaves the run active with nothing owed: the next drive completes it, dispatching nothing."""

    run = engine.run("name: x\nsteps:\n  - id: a\n    prompt: hi\n  - id: b\n    prompt: yo\n")
    assert run.status == "completed"
    before = len(engine.attempts(run.run_id))
    tamper(engine, "UPDATE runs SET status = 'active', finished_at = NULL, result_json = NULL")
    engine.close()
    with Engine(state_dir) as again:
        resumed = again.resume(run.run_id)
        assert resumed.status == "completed"
        assert resumed.result == run.result
        assert len(again.attempts(run.run_id)) == before
