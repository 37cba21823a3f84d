"""``is_locked`` probes a run's lock without ever taking it (issue 12: races).

``%workflow watch`` polls ``is_driving`` four times a second; a probe that acquired the lock
for an instant would refuse a driver starting at that instant (exit 75).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from wf_magic import RunLockHeld
from wf_magic.locking import RunLock, is_locked


def test_probing_a_thousand_times_never_refuses_a_driver(tmp_path: Path) -> None:
    done = threading.Event()
    refused: list[RunLockHeld] = []
    acquired = 0

    def driver() -> None:
        nonlocal acquired
        while not done.is_set():
            try:
                RunLock(tmp_path, "r-1").acquire().release()
                acquired += 1
            except RunLockHeld as exc:
                refused.append(exc)

    thread = threading.Thread(target=driver)
    thread.start()
    try:
        for _ in range(1000):
            is_locked(tmp_path, "r-1")
    finally:
        done.set()
        thread.join(30)
    assert refused == []
    assert acquired > 0


def test_a_held_lock_probes_as_held_and_a_released_one_as_free(tmp_path: Path) -> None:
    with RunLock(tmp_path, "r-1"):
        assert is_locked(tmp_path, "r-1") is True
    assert is_locked(tmp_path, "r-1") is False


def test_a_holder_file_left_by_a_dead_process_probes_as_free(tmp_path: Path) -> None:
    (tmp_path / "r-1.holder.json").write_text(json.dumps({"pid": 2**22 + 7, "host": os.uname()[1]}))
    assert is_locked(tmp_path, "r-1") is False
    RunLock(tmp_path, "r-1").acquire().release()  # and the run can be driven


def test_a_holder_on_another_host_probes_as_held(tmp_path: Path) -> None:
    (tmp_path / "r-1.holder.json").write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    assert is_locked(tmp_path, "r-1") is True
