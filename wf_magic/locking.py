"""One driver per run: a per-run lock file (filelock) naming its holder."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

from filelock import FileLock, Timeout

from .errors import RunLockHeld


class RunLock:
    """An exclusive, non-blocking lock on one run; the OS frees it when its holder dies.

    Each acquisition opens its own file descriptor, so a second thread of the same process is
    refused exactly like another process.
    """

    def __init__(self, lock_dir: Path, run_id: str):
        lock_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.path = lock_dir / f"{run_id}.lock"
        self.info_path = lock_dir / f"{run_id}.holder.json"
        self._lock = FileLock(str(self.path), timeout=0, thread_local=False, is_singleton=False)

    def acquire(self) -> RunLock:
        """Take the lock or raise ``RunLockHeld`` naming the holder's pid and start time."""
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise self._held() from None
        info = {
            "pid": os.getpid(),
            "since": time.time(),
            "host": socket.gethostname(),
            "thread": threading.current_thread().name,
        }
        tmp = self.info_path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, self.info_path)
        return self

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._lock.is_locked:
            try:
                self.info_path.unlink(missing_ok=True)
            finally:
                self._lock.release(force=True)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _held(self) -> RunLockHeld:
        try:
            info = json.loads(self.info_path.read_text())
        except (OSError, ValueError):
            info = {}
        since = info.get("since")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else None
        return RunLockHeld(self.run_id, pid=info.get("pid"), since=stamp, host=info.get("host"))


def is_locked(lock_dir: Path, run_id: str) -> bool:
    """Whether some driver holds ``run_id`` right now (probe without waiting)."""
    probe = RunLock(lock_dir, run_id)
    try:
        probe._lock.acquire(timeout=0)
    except Timeout:
        return True
    probe._lock.release(force=True)
    return False
