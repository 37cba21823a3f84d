"""One driver per run: a per-run lock file (``flock``) naming its holder, there while held.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a descriptor of the lock's own: the OS frees it
when the holder dies, and two descriptors conflict even within one process. The holder
(pid, host, since, thread) is written into the lock file itself once it is taken, and the
file is emptied and deleted before the lock is released, so the lock dir holds the locks of
live runs only (a driver killed with ``kill -9`` leaves its file behind, naming a dead pid:
the next driver takes it and deletes it in turn).

Deleting a lock file races with a process about to lock it: B opens ``RUN.lock`` (the inode
A holds), A deletes the file and releases, B's ``flock`` then succeeds on an inode no path
names any more, while C creates a new ``RUN.lock`` and locks that: two drivers. The standard
fix closes it: after ``flock`` succeeds the holder checks that the path still names the inode
it locked (``os.fstat`` of its descriptor against ``os.stat`` of the path, device and inode)
and, if not, closes its descriptor and starts over. Only a holder ever deletes the file, and
only the file it verified it holds, so a verified holder is the one holder.

Where ``fcntl`` is missing (Windows) filelock provides the lock and the holder goes to a file
beside it, ``RUN.holder.json`` (where earlier releases wrote it on every system; readers
still look there when the lock file names nobody). filelock is not used on POSIX because
every acquisition there took ~210 µs (its fork tracking, singleton registry and path
handling), against ~25 µs for the system calls on their own; a lock is taken per drive, so
a sweep of 10 000 one-unit cells paid it 10 000 times.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: filelock's msvcrt lock instead
    fcntl = None  # type: ignore[assignment]

from .errors import FileRefused, RunLockHeld, StateDirReadOnly, UsageError
from .reading import read_bounded_text

LOCK_RETRIES = 100
"""Attempts to lock the file the path names while holders keep deleting it under us."""
HOLDER_BYTES = 64 * 1024
"""A holder is a few dozen bytes of JSON; a file past this is not one of ours."""


class RunLock:
    """An exclusive, non-blocking lock on one run; the OS frees it when its holder dies.

    Each acquisition opens its own file descriptor, so a second thread of the same process is
    refused exactly like another process.
    """

    def __init__(self, lock_dir: Path, run_id: str):
        try:
            lock_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            read_only = StateDirReadOnly.from_os_error(str(lock_dir.parent), exc, run_id=run_id)
            if read_only is not None:
                raise read_only from None
            if not isinstance(exc, FileExistsError | NotADirectoryError):
                raise
            raise UsageError(
                f"Run {run_id}: the lock dir {lock_dir} is not a directory; move that file "
                "aside (wf_magic keeps its run locks there), then retry.",
                run_id=run_id,
            ) from None
        self.run_id = run_id
        self.path = lock_dir / f"{run_id}.lock"
        self.info_path = lock_dir / f"{run_id}.holder.json"
        self._lock: _FlockFile | _PortableLock = (
            _FlockFile(self.path) if fcntl is not None else _PortableLock(self.path, self.info_path)
        )

    def acquire(self) -> RunLock:
        """Take the lock or raise ``RunLockHeld`` naming the holder's pid and start time."""
        try:
            taken = self._lock.try_acquire()
        except OSError as exc:  # a read-only state dir, a permission problem
            read_only = StateDirReadOnly.from_os_error(
                str(self.path.parent.parent), exc, run_id=self.run_id
            )
            if read_only is not None:
                raise read_only from None
            raise UsageError(
                f"Run {self.run_id}: cannot take its lock {self.path} "
                f"({exc.strerror or exc}); driving a run needs a writable state dir. Fix its "
                "permissions, or point --db / WF_MAGIC_HOME at a writable directory.",
                run_id=self.run_id,
            ) from None
        if not taken:
            raise self._held()
        info = {
            "pid": os.getpid(),
            "since": time.time(),
            "host": socket.gethostname(),
            "thread": threading.current_thread().name,
        }
        try:
            self._lock.write_holder(json.dumps(info))
        except OSError:
            pass  # a full disk, say: the lock excludes all the same; it just names nobody
        return self

    def remove(self) -> None:
        """Delete the lock's files (a deleted run's); call while holding it, then release."""
        self.info_path.unlink(missing_ok=True)
        self._lock.delete_file()

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._lock.is_locked:
            try:
                self._lock.clear_holder()
            finally:
                self._lock.release()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _held(self) -> RunLockHeld:
        info = lock_holder_of(self.path.parent, self.run_id)
        since = info.get("since")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else None
        return RunLockHeld(self.run_id, pid=info.get("pid"), since=stamp, host=info.get("host"))


class _FlockFile:
    """An exclusive ``flock`` on ``path`` through a descriptor of its own."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    @property
    def is_locked(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock now (True when this object holds it already), or False when another
        descriptor holds it. One ``release`` frees it however often it was taken.

        A lock taken on a file deleted meanwhile (its holder released it between our open and
        our ``flock``) is dropped and taken again on the file the path names now.

        Raises:
            OSError: the lock file cannot be opened (permissions, a read-only dir).
        """
        if self._fd is not None:
            return True
        for _ in range(LOCK_RETRIES):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            if self._names(fd):
                self._fd = fd
                return True
            os.close(fd)  # an unlinked inode: whoever locks the path's file now wins
        return False  # the file churned under us every time: as good as held

    def _names(self, fd: int) -> bool:
        """Whether ``self.path`` still names the file open on ``fd``."""
        try:
            on_path = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (mine.st_dev, mine.st_ino) == (on_path.st_dev, on_path.st_ino)

    def write_holder(self, text: str) -> None:
        """Write the holder into the lock file."""
        if self._fd is not None:
            data = text.encode()
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)

    def clear_holder(self) -> None:
        """Empty the lock file before release, so a released lock names nobody."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)

    def delete_file(self) -> None:
        """Delete the lock file: only while it is the file this object holds (another
        driver's newer file stays); a lock nobody holds here deletes whatever is there."""
        if self._fd is None:
            self.path.unlink(missing_ok=True)
        elif self._names(self._fd):
            # Nobody else deletes the file we hold, so it is still ours at the unlink.
            self.path.unlink()

    def release(self) -> None:
        """Delete the lock file, then free the lock (in that order: see the module)."""
        fd = self._fd
        if fd is None:
            return
        try:
            self.delete_file()
        except OSError:
            pass  # a dir made read-only meanwhile: the empty file stays, as it once did
        finally:
            self._fd = None
            os.close(fd)  # closing the only descriptor of this open file frees the lock

    def __del__(self) -> None:  # a lock dropped while held is freed, as filelock's was
        try:
            self.release()
        except Exception:  # noqa: S110 - interpreter shutdown: the OS frees it anyway
            pass


class _PortableLock:
    """filelock's lock behind ``_FlockFile``'s members (where fcntl is missing); the holder
    goes to ``info_path``, a file beside the lock."""

    def __init__(self, path: Path, info_path: Path):
        from filelock import FileLock

        self.info_path = info_path
        self._lock = FileLock(str(path), timeout=0, thread_local=False, is_singleton=False)

    @property
    def is_locked(self) -> bool:
        return self._lock.is_locked

    def try_acquire(self) -> bool:
        from filelock import Timeout

        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        return True

    def write_holder(self, text: str) -> None:
        """Write the holder file beside the lock (replaced atomically: never half-read)."""
        tmp = self.info_path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.info_path)

    def clear_holder(self) -> None:
        self.info_path.unlink(missing_ok=True)

    def delete_file(self) -> None:
        Path(self._lock.lock_file).unlink(missing_ok=True)

    def release(self) -> None:
        self._lock.release(force=True)


def lock_holder_of(lock_dir: Path, run_id: str) -> dict[str, Any]:
    """Who holds (or last held, if it died) ``run_id``'s lock; {} when nobody is named.

    The lock file names its holder; a lock file naming nobody falls back to the holder file
    beside it (the portable core's, or one an older wf_magic wrote).
    """
    info = read_holder(lock_dir / f"{run_id}.lock")
    return info if info else read_holder(lock_dir / f"{run_id}.holder.json")


def read_holder(path: Path) -> dict[str, Any]:
    """A lock's holder file (pid, since, host, thread); {} when missing or not one of ours."""
    try:
        info = json.loads(read_bounded_text(path, limit=HOLDER_BYTES))
    except (FileRefused, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def is_locked(lock_dir: Path, run_id: str) -> bool:
    """Whether some driver holds ``run_id`` right now, without ever taking the lock.

    Probing by acquiring would, for an instant, refuse a driver starting at that moment
    (`%workflow watch` polls four times a second). The holder file is read instead: a holder
    is alive when its process runs on this host. A stale file (its holder died) or a driver
    that took the lock but has not written the file yet reads as not held; a holder on
    another host (a shared state dir) cannot be checked and reads as held.
    """
    try:
        info = lock_holder_of(lock_dir, run_id)
        pid, host = int(info["pid"]), info.get("host")
    except (ValueError, TypeError, KeyError):
        return False  # holder files are replaced atomically: an unreadable one is no driver's
    if host and host != socket.gethostname():
        return True
    return process_alive(pid)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another account's live process
    except OSError:
        return False
    try:  # a killed, not yet reaped child still answers signal 0
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]
