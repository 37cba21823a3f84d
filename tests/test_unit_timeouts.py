"""Timeouts bind python and scripted units, and any judge exception blocks the gate.

Issue 12, items 5 and 11. Limits that could hang are checked through ``wf run`` in a real
process with a hard subprocess timeout; the time bounds are correctness bounds (a 2 s
timeout against a 30 s sleep), not speed benchmarks.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from tests.conftest import db_rows, run_wf, spawn_wf, wait_for, write_file
from tests.helpers_flow import only_run_id, use_runner
from wf_magic import Engine, UnitRequest

SLOW_MODULE = """
import time


def nap(seconds=30):
    time.sleep(seconds)
    return "late"
"""


def _attempts(state_dir: Path) -> list[tuple[str, int, str, str, int | None]]:
    return [
        (str(u), int(n), str(s), str(f or ""), None if t is None else int(str(t)))
        for u, n, s, f, t in db_rows(
            state_dir,
            "SELECT unit_id, attempt, status, failure, transient FROM attempts ORDER BY attempt_pk",
        )
    ]


# -- python units -----------------------------------------------------------------------------
def test_a_python_unit_past_its_timeout_fails_its_attempt(tmp_path: Path) -> None:
    write_file(tmp_path, "slow_steps.py", SLOW_MODULE)
    wf = write_file(
        tmp_path,
        "slow.yaml",
        """
name: slow-python
steps:
  - id: s
    python: slow_steps:nap
    timeout: 2
""",
    )
    started = time.monotonic()
    done = run_wf(tmp_path / "state", "run", str(wf), cwd=tmp_path, timeout=60)
    elapsed = time.monotonic() - started

    assert done.returncode == 1, done.stderr
    assert elapsed < 15  # 2 s timeout + interpreter start-up, never the 30 s sleep
    assert "Traceback" not in done.stderr
    assert _attempts(tmp_path / "state") == [
        (
            "s",
            1,
            "failed",
            "slow_steps:nap timed out after 2s; the call was abandoned and its thread may "
            "still be running",
            1,
        )
    ]


def test_a_python_timeout_is_retried_like_an_exec_timeout(tmp_path: Path) -> None:
    write_file(tmp_path, "slow_steps.py", SLOW_MODULE)
    wf = write_file(
        tmp_path,
        "retry.yaml",
        """
name: slow-python-retry
steps:
  - id: s
    python: slow_steps:nap
    timeout: 0.5
    retry: {max_attempts: 2, backoff_s: 0}
""",
    )
    done = run_wf(tmp_path / "state", "run", str(wf), cwd=tmp_path, timeout=60)

    assert done.returncode == 1, done.stderr
    assert [(u, n, s, t) for u, n, s, _, t in _attempts(tmp_path / "state")] == [
        ("s", 1, "failed", 1),
        ("s", 2, "failed", 1),
    ]


def test_a_python_unit_within_its_timeout_returns_its_output(tmp_path: Path) -> None:
    write_file(tmp_path, "slow_steps.py", SLOW_MODULE)
    wf = write_file(
        tmp_path,
        "quick.yaml",
        """
name: quick-python
steps:
  - id: s
    python: slow_steps:nap
    with: {seconds: 0.1}
    timeout: 20
""",
    )
    done = run_wf(tmp_path / "state", "run", str(wf), cwd=tmp_path, timeout=60)

    assert done.returncode == 0, done.stderr
    assert _attempts(tmp_path / "state") == [("s", 1, "succeeded", "", None)]


def test_a_second_interrupt_stops_a_python_unit_waiting_on_its_timeout(tmp_path: Path) -> None:
    write_file(tmp_path, "slow_steps.py", SLOW_MODULE)
    wf = write_file(
        tmp_path,
        "slow.yaml",
        """
name: interrupted-python
steps:
  - id: s
    python: slow_steps:nap
    with: {seconds: 60}
    timeout: 50
""",
    )
    state = tmp_path / "state"
    proc = spawn_wf(state, "run", str(wf), cwd=tmp_path)
    try:
        wait_for(
            lambda: [a[2] for a in _attempts(state)] == ["running"],
            timeout=30,
            what="the python unit to start",
        )
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert proc.returncode == 130, stderr
    assert time.monotonic() - started < 15  # not the 50 s timeout, not the 60 s sleep
    assert "Traceback" not in stderr
    assert [a[2] for a in _attempts(state)] == ["running"]  # owed to the next drive


# -- scripted units ---------------------------------------------------------------------------
def test_a_scripted_function_past_its_timeout_fails_its_attempt(tmp_path: Path) -> None:
    release = threading.Event()

    def stuck(request: UnitRequest) -> object:
        release.wait(30)  # released when the test ends, so the abandoned thread exits
        return "late"

    use_runner("stuck", stuck)
    engine = Engine(tmp_path / "state")
    try:
        started = time.monotonic()
        run = engine.run("""
name: stuck-scripted
runner: stuck
steps:
  - id: s
    prompt: Say something.
    timeout: 1
    retry: {max_attempts: 1}
""")
        elapsed = time.monotonic() - started
        attempts = engine.attempts(run.run_id)
    finally:
        release.set()
        engine.close()

    assert run.status == "failed"
    assert elapsed < 8
    assert [(a.unit_id, a.status, a.failure, a.transient) for a in attempts] == [
        (
            "s",
            "failed",
            "scripted reply timed out after 1s; the call was abandoned and its thread may "
            "still be running",
            True,
        )
    ]


def test_a_scripted_rule_sleeping_past_the_timeout_fails_its_attempt(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    started = time.monotonic()
    run = engine.run("""
name: sleepy-rule
runners:
  scripted:
    rules:
      - {match: "Say", reply: "late", sleep_s: 20}
steps:
  - id: s
    prompt: Say something.
    timeout: 0.5
    retry: {max_attempts: 1}
""")
    elapsed = time.monotonic() - started
    attempts = engine.attempts(run.run_id)
    engine.close()

    assert run.status == "failed"
    assert elapsed < 10
    assert [(a.status, a.transient) for a in attempts] == [("failed", True)]
    assert (attempts[0].failure or "").startswith("scripted reply timed out after 0.5s")


def test_a_scripted_unit_without_a_timeout_is_not_limited(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: no-timeout
runners:
  scripted:
    rules:
      - {match: "Say", reply: "on time", sleep_s: 0.2}
steps:
  - id: s
    prompt: Say something.
""")
    engine.close()
    assert (run.status, run.result) == ("completed", "on time")


# -- judges -----------------------------------------------------------------------------------
def _raising_judge(request: UnitRequest) -> object:
    if request.kind == "judge":
        raise ValueError("the judge's parser broke")
    return "the work"


def test_a_judge_raising_any_exception_blocks_the_step_and_fails_the_gate_attempt(
    tmp_path: Path,
) -> None:
    use_runner("raising_judge", _raising_judge)
    engine = Engine(tmp_path / "state")
    source = """
name: raising-judge
runner: raising_judge
steps:
  - id: work
    prompt: Do the work.
    gate: {criteria: [done], max_loops: 3}
"""
    run = engine.run(source)

    assert run.status == "blocked"
    assert run.reason == (
        "step work: judge failed on loop 1: runner raised ValueError: the judge's parser "
        "broke; no loop was consumed. Fix the judge and resume to re-judge this work."
    )
    assert [(a.unit_id, a.attempt, a.status) for a in engine.attempts(run.run_id)] == [
        ("work", 1, "succeeded"),
        ("work.gate:l1", 1, "failed"),
    ]
    [gate] = [a for a in engine.attempts(run.run_id) if a.phase == "gate"]
    assert gate.failure == "runner raised ValueError: the judge's parser broke"

    again = engine.drive(run.run_id)

    assert again.status == "blocked"
    assert again.reason == run.reason
    assert [(a.unit_id, a.attempt, a.status) for a in engine.attempts(run.run_id)] == [
        ("work", 1, "succeeded"),
        ("work.gate:l1", 1, "failed"),
        ("work.gate:l1", 2, "failed"),
    ]
    engine.close()


def test_a_judge_reply_template_error_exits_3_and_resume_reblocks_without_a_traceback(
    tmp_path: Path,
) -> None:
    wf = write_file(
        tmp_path,
        "judge.yaml",
        """
name: template-judge
runners:
  scripted:
    rules:
      - {match: "Judge", kind: judge, reply: "{{ nope.missing }}"}
steps:
  - id: s
    prompt: hello
    gate: {max_loops: 2}
""",
    )
    state = tmp_path / "state"
    first = run_wf(state, "run", str(wf), timeout=60)

    assert first.returncode == 3, first.stderr
    assert "Traceback" not in first.stderr
    run_id = only_run_id(state)
    [(status, reason)] = db_rows(
        state, "SELECT status, status_reason FROM runs WHERE run_id = ?", (run_id,)
    )
    assert status == "blocked"
    assert str(reason).startswith("step s: judge failed on loop 1: runner raised TemplateError: ")
    assert [(u, n, s) for u, n, s, _, _ in _attempts(state)] == [
        ("s", 1, "succeeded"),
        ("s.gate:l1", 1, "failed"),
    ]

    again = run_wf(state, "resume", run_id, timeout=60)

    assert again.returncode == 3, again.stderr
    assert "Traceback" not in again.stderr
    assert [(u, n, s) for u, n, s, _, _ in _attempts(state)] == [
        ("s", 1, "succeeded"),
        ("s.gate:l1", 1, "failed"),
        ("s.gate:l1", 2, "failed"),
    ]
    assert db_rows(state, "SELECT status FROM runs WHERE run_id = ?", (run_id,)) == [("blocked",)]


def test_the_judge_timeout_binds_a_slow_scripted_judge(tmp_path: Path) -> None:
    wf = write_file(
        tmp_path,
        "slow_judge.yaml",
        """
name: slow-judge
runners:
  scripted:
    rules:
      - {match: "Judge", kind: judge, reply: {complete: true}, sleep_s: 30}
steps:
  - id: s
    prompt: hello
    timeout: 1
    gate: {max_loops: 2}
""",
    )
    started = time.monotonic()
    done = run_wf(tmp_path / "state", "run", str(wf), timeout=60)

    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 15
    assert [(u, s) for u, _, s, _, _ in _attempts(tmp_path / "state")] == [
        ("s", "succeeded"),
        ("s.gate:l1", "failed"),
    ]
