"""One driver per run (wf_magic.locking): a per-run lock file that names its holder.

A second driver — another thread or another process — is refused with ``RunLockHeld``
(CLI exit 75); the OS frees the lock when its holder dies, so a crash never wedges a run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from wf_magic import Engine, RunLockHeld
from wf_magic.locking import RunLock, is_locked

from .conftest import ROOT, attempts_in, db_rows, run_wf, spawn_wf, wait_for, write_file

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


# -- RunLock and is_locked --------------------------------------------------------------------
def test_a_held_lock_refuses_a_second_holder_naming_its_pid_and_host(tmp_path: Path) -> None:
    with RunLock(tmp_path, "r-1"):
        with pytest.raises(RunLockHeld) as info:
            RunLock(tmp_path, "r-1").acquire()
    err = info.value
    assert (err.run_id, err.pid, err.host) == ("r-1", os.getpid(), socket.gethostname())
    assert str(err) == (
        f"Run r-1 is being driven by pid {os.getpid()} on {socket.gethostname()} since "
        f"{err.since}; wait for it or stop that process (`wf stop r-1`)."
    )


@pytest.mark.parametrize("flock", [True, False], ids=["flock", "filelock-fallback"])
def test_both_lock_cores_refuse_a_second_descriptor_and_free_on_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flock: bool
) -> None:
    """The flock core on POSIX and filelock where fcntl is missing (Windows) behave alike."""
    from wf_magic import locking

    if not flock:
        monkeypatch.setattr(locking, "fcntl", None)
    first = RunLock(tmp_path, "r-1").acquire()
    assert type(first._lock).__name__ == ("_FlockFile" if flock else "_PortableLock")
    with pytest.raises(RunLockHeld):
        RunLock(tmp_path, "r-1").acquire()
    assert first.acquire() is first  # the holder taking it again (`with` on a held lock)
    first.release()
    first.release()  # idempotent
    with RunLock(tmp_path, "r-1") as again:
        assert again._lock.is_locked
    assert not again._lock.is_locked


def test_the_lock_file_names_the_holder_and_is_deleted_on_release(tmp_path: Path) -> None:
    lock = RunLock(tmp_path, "r-1").acquire()
    assert lock.path == tmp_path / "r-1.lock"
    info = json.loads((tmp_path / "r-1.lock").read_text())
    assert (info["pid"], info["host"], info["thread"]) == (
        os.getpid(),
        socket.gethostname(),
        threading.current_thread().name,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-1.lock"]  # no holder file
    lock.release()
    assert not (tmp_path / "r-1.lock").exists()  # a released lock leaves no file
    assert not is_locked(tmp_path, "r-1")
    RunLock(tmp_path, "r-1").acquire().release()  # free again


def test_the_portable_core_names_the_holder_in_a_file_beside_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wf_magic import locking

    monkeypatch.setattr(locking, "fcntl", None)  # as on Windows: filelock's lock
    with RunLock(tmp_path, "r-1"):
        info = json.loads((tmp_path / "r-1.holder.json").read_text())
        assert info["pid"] == os.getpid()
        assert is_locked(tmp_path, "r-1")
        with pytest.raises(RunLockHeld) as held:
            RunLock(tmp_path, "r-1").acquire()
    assert held.value.pid == os.getpid()
    assert not (tmp_path / "r-1.holder.json").exists()


def test_release_is_idempotent(tmp_path: Path) -> None:
    lock = RunLock(tmp_path, "r-1")
    lock.release()  # never acquired
    lock.acquire()
    lock.release()
    lock.release()
    assert not is_locked(tmp_path, "r-1")


def test_is_locked_probes_without_taking_the_lock(tmp_path: Path) -> None:
    assert is_locked(tmp_path, "r-1") is False
    assert is_locked(tmp_path, "r-1") is False  # the probe did not keep it
    with RunLock(tmp_path, "r-1"):
        assert is_locked(tmp_path, "r-1") is True
        assert is_locked(tmp_path, "r-2") is False  # one lock per run
    assert is_locked(tmp_path, "r-1") is False


def test_a_holder_without_a_readable_holder_file_is_another_driver(tmp_path: Path) -> None:
    with RunLock(tmp_path, "r-1"):
        (tmp_path / "r-1.lock").write_text("{not json")
        with pytest.raises(RunLockHeld) as info:
            RunLock(tmp_path, "r-1").acquire()
    assert (info.value.pid, info.value.since, info.value.host) == (None, None, None)
    assert str(info.value) == (
        "Run r-1 is being driven by another driver; wait for it or stop that process "
        "(`wf stop r-1`)."
    )


def test_a_lock_held_by_another_process_is_freed_when_that_process_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from wf_magic.locking import RunLock; "
            "lock = RunLock(Path(sys.argv[1]), 'r-1').acquire(); print('held', flush=True); "
            "time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert is_locked(tmp_path, "r-1")
        with pytest.raises(RunLockHeld) as info:
            RunLock(tmp_path, "r-1").acquire()
        assert info.value.pid == holder.pid
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.communicate(timeout=10)
    assert not is_locked(tmp_path, "r-1")  # no cleanup ran: the OS released it
    RunLock(tmp_path, "r-1").acquire().release()


# -- one driver per run -----------------------------------------------------------------------
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


def test_two_concurrent_resumes_one_drives_other_exits_75(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NAP", "4")  # long enough for a second CLI to start meanwhile
    path = write_file(tmp_path, "wf.yaml", SLEEPY)
    first = run_wf(state_dir, "run", str(path), "--max-steps", "1")
    assert first.returncode == 0, first.stderr
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    driver = spawn_wf(state_dir, "resume", run_id)
    wait_for(lambda: any(u == "nap" for u, *_ in attempts_in(state_dir)), what="the drive")
    second = run_wf(state_dir, "resume", run_id)
    assert second.returncode == 75
    assert f"pid {driver.pid}" in second.stderr
    driver.communicate(timeout=60)
    assert driver.returncode == 0
    units = [u for u, *_ in attempts_in(state_dir)]
    assert units == ["first", "nap", "last"]  # no duplicate attempts


def test_dead_lock_holder_never_wedges_the_run(tmp_path: Path, state_dir: Path) -> None:
    path = write_file(tmp_path, "wf.yaml", SLEEPY)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in attempts_in(state_dir)), what="the exec unit")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    run_id = str(db_rows(state_dir, "SELECT run_id FROM runs")[0][0])
    eng = Engine(state_dir)
    assert eng.drive(run_id).status == "completed"
    eng.close()


def test_superseding_a_run_being_driven_is_refused_and_writes_nothing(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NAP", "4")
    path = write_file(tmp_path, "wf.yaml", SLEEPY)
    proc = spawn_wf(state_dir, "run", str(path))
    wait_for(lambda: any(u == "nap" for u, *_ in attempts_in(state_dir)), what="the exec unit")
    eng = Engine(state_dir)
    with pytest.raises(RunLockHeld):
        eng.start(SLEEPY.replace("bye", "farewell"))
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs") == [(1,)]
    eng.close()
    proc.communicate(timeout=60)
    assert proc.returncode == 0
