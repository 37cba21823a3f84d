"""Durable resume with real processes: kill -9 mid-unit, the run lock, reclaimed attempts."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from wf_magic import Engine, RunLockHeld

from .conftest import db_rows, run_wf, spawn_wf, wait_for

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


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    return path


def _attempts(state_dir: Path) -> list[tuple[str, int, str, str]]:
    return [
        (str(u), int(n), str(s), str(d))
        for u, n, s, d in db_rows(
            state_dir,
            "SELECT unit_id, attempt, status, dispatch_id FROM attempts ORDER BY attempt_pk",
        )
    ]


def test_kill_9_mid_exec_then_resume_reclaims_the_same_dispatch(
    tmp_path: Path, state_dir: Path
) -> None:
    path = _write(tmp_path, SLEEPY)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(
        lambda: any(u == "nap" and s == "running" for u, _, s, _ in _attempts(state_dir)),
        what="the exec unit to start",
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    before = _attempts(state_dir)
    nap = next(a for a in before if a[0] == "nap")
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])

    done = run_wf(state_dir, "resume", run_id)
    assert done.returncode == 0, done.stderr
    after = _attempts(state_dir)
    assert [(u, n, s) for u, n, s, _ in after] == [
        ("first", 1, "succeeded"),
        ("nap", 1, "succeeded"),
        ("last", 1, "succeeded"),
    ]
    assert after[1][3] == nap[3]  # same dispatch_id: an idempotency key for side effects
    output = db_rows(state_dir, "SELECT output_json FROM attempts WHERE unit_id = 'nap'")[0][0]
    assert nap[3] in str(output)


def test_two_concurrent_resumes_one_drives_other_exits_75(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NAP", "4")  # long enough for a second CLI to start meanwhile
    path = _write(tmp_path, SLEEPY)
    first = run_wf(state_dir, "run", str(path), "--max-steps", "1")
    assert first.returncode == 0, first.stderr
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    driver = spawn_wf(state_dir, "resume", run_id)
    wait_for(lambda: any(u == "nap" for u, *_ in _attempts(state_dir)), what="the drive")
    second = run_wf(state_dir, "resume", run_id)
    assert second.returncode == 75
    assert f"pid {driver.pid}" in second.stderr
    driver.communicate(timeout=60)
    assert driver.returncode == 0
    units = [u for u, *_ in _attempts(state_dir)]
    assert units == ["first", "nap", "last"]  # no duplicate attempts


def test_second_thread_is_refused_with_run_lock_held(engine: Engine) -> None:
    src = "name: t\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n"
    _started = engine.start(src)
    run_id = _started.run_id
    gate = threading.Event()
    release = threading.Event()
    from wf_magic import ScriptedRunner, register_runner

    class Blocking(ScriptedRunner):
        def run(self, request):  # type: ignore[no-untyped-def]
            gate.set()
            release.wait(10)
            return super().run(request)

    register_runner("blocking-test", lambda ctx: Blocking(), replace=True)
    src2 = "name: t2\nrunner: blocking-test\nsteps:\n  - id: a\n    prompt: x\n"
    _started = engine.start(src2)
    run2 = _started.run_id
    other = Engine(engine.state_dir)
    worker = threading.Thread(target=lambda: other.drive(run2))
    worker.start()
    assert gate.wait(10)
    with pytest.raises(RunLockHeld, match=f"pid {os.getpid()}"):
        engine.drive(run2)
    release.set()
    worker.join(10)
    other.close()
    assert engine.get_run(run2).status == "completed"
    assert engine.drive(run_id).status == "completed"


def test_dead_lock_holder_never_wedges_the_run(tmp_path: Path, state_dir: Path) -> None:
    path = _write(tmp_path, SLEEPY)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in _attempts(state_dir)), what="the exec unit")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    eng = Engine(state_dir)
    assert eng.drive(run_id).status == "completed"
    eng.close()


def test_sigterm_stops_gracefully_and_exit_130(tmp_path: Path, state_dir: Path) -> None:
    text = SLEEPY.replace(
        "  - id: last", "  - id: nap2\n    exec: [python3, -c, 'print(1)']\n  - id: last"
    )
    path = _write(tmp_path, text)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in _attempts(state_dir)), what="the exec unit")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert db_rows(state_dir, "SELECT status FROM runs")[0][0] == "active"
    units = [(u, s) for u, _, s, _ in _attempts(state_dir)]
    assert units == [("first", "succeeded"), ("nap", "succeeded")]


def test_stop_request_from_another_process(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NAP", "3")
    text = SLEEPY.replace(
        "  - id: last", "  - id: nap2\n    exec: [python3, -c, 'print(1)']\n  - id: last"
    )
    path = _write(tmp_path, text)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in _attempts(state_dir)), what="the exec unit")
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    assert run_wf(state_dir, "stop", run_id).returncode == 0
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert db_rows(state_dir, "SELECT status FROM runs")[0][0] == "active"
    assert run_wf(state_dir, "resume", run_id).returncode == 0
    assert [u for u, *_ in _attempts(state_dir)] == ["first", "nap", "nap2", "last"]


def test_sigint_stops_gracefully_and_exit_130(tmp_path: Path, state_dir: Path) -> None:
    text = SLEEPY.replace(
        "  - id: last", "  - id: nap2\n    exec: [python3, -c, 'print(1)']\n  - id: last"
    )
    path = _write(tmp_path, text)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in _attempts(state_dir)), what="the exec unit")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopping after the units in flight" in err
    assert [(u, s) for u, _, s, _ in _attempts(state_dir)] == [
        ("first", "succeeded"),
        ("nap", "succeeded"),
    ]


def test_superseding_a_run_being_driven_is_refused_and_writes_nothing(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NAP", "4")
    path = _write(tmp_path, SLEEPY)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in _attempts(state_dir)), what="the exec unit")
    eng = Engine(state_dir)
    with pytest.raises(RunLockHeld):
        eng.start(SLEEPY.replace("bye", "farewell"))
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs") == [(1,)]
    eng.close()
    proc.communicate(timeout=60)
    assert proc.returncode == 0
