"""A run's lock file is there while a driver holds it, and gone once it is released (issue 33).

Deleting a lock file races with a process about to lock it (it locks an inode no path names
any more); ``wf_magic.locking`` re-checks the inode after ``flock`` and retries. The race is
shown here deterministically (one interleaving forced) and under load (real processes taking
and releasing one lock thousands of times, a marker file proving no two ever held it at once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from wf_magic import Engine, RunLockHeld
from wf_magic import locking as locking_module
from wf_magic.locking import RunLock, is_locked

from .conftest import ROOT, run_wf, spawn_wf, wait_for, write_file

NAP = """\
name: nap
steps:
  - id: nap
    exec: [python3, -c, "import time; time.sleep(1.5)"]
"""

SWEEPABLE = """\
name: cells
params:
  k: {type: integer, default: 0}
steps:
  - id: say
    prompt: "cell {{ params.k }}"
"""


def _lock_files(state_dir: Path) -> list[str]:
    locks = state_dir / "locks"
    return sorted(p.name for p in locks.iterdir()) if locks.is_dir() else []


def test_a_released_lock_leaves_no_file_and_can_be_taken_again(tmp_path: Path) -> None:
    lock = RunLock(tmp_path, "r-1").acquire()
    assert _names(tmp_path) == ["r-1.lock"]
    lock.release()
    assert _names(tmp_path) == []
    with RunLock(tmp_path, "r-1"):
        assert _names(tmp_path) == ["r-1.lock"]
    assert _names(tmp_path) == []
    assert not is_locked(tmp_path, "r-1")


def test_a_released_lock_never_deletes_a_newer_holders_file(tmp_path: Path) -> None:
    """gc deletes a run's lock file while holding it; the file another driver made
    afterwards at the same path is that driver's, and the first release leaves it alone."""
    first = RunLock(tmp_path, "r-1").acquire()
    first.remove()  # gc: the deleted run's files go while the lock is held
    second = RunLock(tmp_path, "r-1").acquire()  # a new file, a new inode
    first.release()
    assert _names(tmp_path) == ["r-1.lock"]
    with pytest.raises(RunLockHeld):
        RunLock(tmp_path, "r-1").acquire()
    second.release()
    assert _names(tmp_path) == []


def test_a_lock_taken_on_a_deleted_file_is_dropped_and_taken_on_the_path_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The classic interleaving, forced: B opens the file A holds; A deletes it and releases;
    C creates a new file and locks it; B's flock then succeeds on the orphan inode. B must
    notice (the path names another inode), retry, and be refused: C holds the run."""
    a = RunLock(tmp_path, "r-1").acquire()
    real_flock = locking_module.fcntl.flock
    calls: list[int] = []
    holders: list[RunLock] = []

    def flock_after_a_hands_over(fd: int, how: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # B's first flock: the file it opened is A's, about to go
            a.release()
            holders.append(RunLock(tmp_path, "r-1").acquire())  # C, on a new file
        real_flock(fd, how)

    monkeypatch.setattr(locking_module.fcntl, "flock", flock_after_a_hands_over)
    with pytest.raises(RunLockHeld):
        RunLock(tmp_path, "r-1").acquire()  # B
    monkeypatch.undo()
    assert len(calls) == 3  # B's flock on the orphan, C's, and B's retry on C's file
    [c] = holders
    assert json.loads((tmp_path / "r-1.lock").read_text())["pid"] == os.getpid()
    c.release()
    assert _names(tmp_path) == []


# The worker: takes the lock, proves it is alone by creating a marker with O_EXCL (a second
# holder finds it there), and releases; prints how often it held the lock and any overlap.
WORKER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from wf_magic.errors import RunLockHeld
    from wf_magic.locking import RunLock

    lock_dir, marker, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    held = overlaps = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            lock = RunLock(lock_dir, "r-1").acquire()
        except RunLockHeld:
            continue
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            overlaps += 1
        else:
            os.close(fd)
            held += 1
            os.unlink(marker)
        finally:
            lock.release()
    print(held, overlaps)
    """
)


def test_processes_racing_for_one_lock_never_hold_it_together(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    marker = tmp_path / "inside"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path / "locks"), str(marker), "2.0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    results = []
    for proc in workers:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        held, overlaps = map(int, out.split())
        results.append((held, overlaps))
    assert [overlaps for _, overlaps in results] == [0, 0, 0, 0]
    assert all(held > 0 for held, _ in results)  # every process got the lock, repeatedly
    assert _names(tmp_path / "locks") == []  # and the last release left no file


def test_a_driven_run_holds_its_lock_file_only_while_driven(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = write_file(tmp_path, "nap.yaml", NAP)
    driver = spawn_wf(state, "run", str(path))
    wait_for(lambda: len(_lock_files(state)) == 1, what="the driver's lock file")
    [name] = _lock_files(state)
    holder = json.loads((state / "locks" / name).read_text())
    assert holder["pid"] == driver.pid
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 0, err
    assert _lock_files(state) == []
    assert run_wf(state, "resume", name.removesuffix(".lock")).returncode == 0
    assert _lock_files(state) == []


def test_a_sweep_of_many_cells_leaves_no_lock_files(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = write_file(tmp_path, "cells.yaml", SWEEPABLE)
    res = run_wf(state, "sweep", str(path), "--grid", "k=" + ",".join(map(str, range(30))))
    assert res.returncode == 0, res.stderr
    with Engine(state) as engine:
        assert len(engine.store.list_runs()) == 30
    assert _lock_files(state) == []


def test_a_killed_drivers_lock_file_is_taken_over_and_then_deleted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = write_file(tmp_path, "nap.yaml", NAP)
    driver = spawn_wf(state, "run", str(path))
    wait_for(lambda: len(_lock_files(state)) == 1, what="the driver's lock file")
    [name] = _lock_files(state)
    driver.kill()
    driver.communicate(timeout=30)
    assert _lock_files(state) == [name]  # kill -9 runs no release: the file names a dead pid
    assert not is_locked(state / "locks", name.removesuffix(".lock"))
    assert run_wf(state, "resume", name.removesuffix(".lock")).returncode == 0
    assert _lock_files(state) == []


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
