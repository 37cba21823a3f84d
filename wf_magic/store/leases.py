"""One driver per run across hosts: a lease on the run row, fenced by its epoch.

On PostgreSQL a lock file excludes nobody on another host, so the run row carries the lease:
``lease_holder`` (host, pid, user), ``lease_epoch`` (incremented at each acquisition) and
``lease_expires`` — judged by the database's clock only (``clock_timestamp()``), never a
driver's. A daemon thread renews it every third of its TTL (``WF_MAGIC_LEASE_TTL`` seconds,
default 30) on a connection of its own, so a busy drive or a notebook's event loop never
delays a renewal. Every write the Store makes for a leased run checks, in its own
transaction, that the epoch is still this driver's and unexpired (``Store._write``): a driver
that was paused, partitioned or simply outlived its lease gets ``LeaseLost`` on its next
write, which rolls back whole — it writes nothing more and stops (exit 75). A dead holder's
lease expires and the next ``resume`` takes the run over, reclaiming in-flight attempts with
their dispatch ids exactly as after a crash on SQLite.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..errors import LeaseLost, RunLockHeld
from ..locking import process_alive
from ..users import current_user
from .location import PgLocation
from .pgopen import lease_ttl_s, open_pg

T = TypeVar("T")


class LeaseStore(Protocol):
    """What a lease needs of the Store (store/store.py), named here so this module does not
    import the Store that imports it."""

    pg: PgLocation | None
    _fences: dict[str, int]

    def _write(self, fn: Callable[[Any], T], run_id: str | None = None) -> T: ...

    def _read(self, fn: Callable[[Any], T], run_id: str | None = None) -> T: ...


def _holder() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "user": current_user()}


_ACQUIRE = (
    "UPDATE runs SET lease_epoch = lease_epoch + 1, lease_holder = ?,"
    " lease_expires = clock_timestamp() + make_interval(secs => ?)"
    " WHERE run_id = ? AND (lease_expires IS NULL OR lease_expires <= clock_timestamp())"
    " RETURNING lease_epoch"
)
_TAKE_OVER = (
    "UPDATE runs SET lease_epoch = lease_epoch + 1, lease_holder = ?,"
    " lease_expires = clock_timestamp() + make_interval(secs => ?)"
    " WHERE run_id = ? AND lease_epoch = ?"
    " RETURNING lease_epoch"
)
"""Take over the lease of a holder seen dead, if nobody took it since (compare-and-set)."""
_RENEW = (
    "UPDATE runs SET lease_expires = clock_timestamp() + make_interval(secs => ?)"
    " WHERE run_id = ? AND lease_epoch = ? AND lease_expires > clock_timestamp()"
)
_RELEASE = (
    "UPDATE runs SET lease_expires = NULL, lease_holder = NULL WHERE run_id = ? AND lease_epoch = ?"
)
FENCE = (
    "SELECT 1 FROM runs WHERE run_id = ? AND lease_epoch = ? AND lease_expires > clock_timestamp()"
)
"""The check every write of a leased run makes first, in its own transaction."""
_HELD = (
    "SELECT lease_holder, extract(epoch FROM lease_expires - clock_timestamp()) FROM runs"
    " WHERE run_id = ? AND lease_expires > clock_timestamp()"
)


class RunLease:
    """The lease of one run, held while a drive runs (a context manager like ``RunLock``)."""

    def __init__(self, store: LeaseStore, run_id: str):
        self.store = store
        self.run_id = run_id
        self.ttl_s = lease_ttl_s()
        self.epoch: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    def acquire(self) -> RunLease:
        """Take the lease, or raise ``RunLockHeld`` naming its live holder.

        A lease whose holder is a dead process on this host is taken at once (its process
        cannot write again, as the OS frees a dead holder's lock file on SQLite); a holder on
        another host, or a live one here (paused, say), keeps it until it expires.
        """
        holder = json.dumps(_holder())
        row = self.store._write(
            lambda c: c.execute(_ACQUIRE, (holder, self.ttl_s, self.run_id)).fetchone()
        )
        if row is None:
            seen = self.store._read(
                lambda c: c.execute(
                    "SELECT lease_holder, lease_epoch FROM runs WHERE run_id = ?", (self.run_id,)
                ).fetchone()
            )
            if seen is not None and _dead_here(seen[0]):
                row = self.store._write(
                    lambda c: c.execute(
                        _TAKE_OVER, (holder, self.ttl_s, self.run_id, seen[1])
                    ).fetchone()
                )
        if row is None:
            raise self._held()
        self.epoch = int(row[0])
        self.store._fences[self.run_id] = self.epoch
        self._thread = threading.Thread(
            target=self._renew, name=f"wf_magic lease {self.run_id}", daemon=True
        )
        self._thread.start()
        return self

    def _renew(self) -> None:
        assert self.store.pg is not None
        conn = None
        try:
            while not self._stop.wait(self.ttl_s / 3):
                try:
                    if conn is None:
                        conn = open_pg(self.store.pg, migrate=False)
                    done = conn.execute(_RENEW, (self.ttl_s, self.run_id, self.epoch)).rowcount
                except Exception:  # the server is away: the next round tries again; the
                    if conn is not None:  # fence stops this driver if the lease runs out
                        conn.close()
                    conn = None
                    continue
                if not done:
                    self.lost = True
                    return
        finally:
            if conn is not None:
                conn.close()

    def release(self) -> None:
        """Stop renewing and give the lease back (only if it is still ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.epoch is None:
            return
        epoch, self.epoch = self.epoch, None
        self.store._fences.pop(self.run_id, None)
        try:
            self.store._write(lambda c: c.execute(_RELEASE, (self.run_id, epoch)))
        except Exception:  # a lost server: the lease simply expires
            pass

    def remove(self) -> None:
        """Nothing to delete: the lease lives on the run row (gone with it)."""

    def __enter__(self) -> RunLease:
        return self if self.epoch is not None else self.acquire()  # taken already: kept

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _held(self) -> RunLockHeld:
        info = holder_of(self.store, self.run_id) or {}
        return RunLockHeld(
            self.run_id,
            pid=info.get("pid"),
            since=None,
            host=info.get("host"),
            user=info.get("user"),
        )


def _dead_here(holder_json: str | None) -> bool:
    """Whether a lease's holder is a process of this host that no longer runs."""
    try:
        info = json.loads(holder_json or "{}")
        pid, host = int(info["pid"]), info.get("host")
    except (TypeError, ValueError, KeyError):
        return False
    return host == socket.gethostname() and not process_alive(pid)


def holder_of(store: LeaseStore, run_id: str) -> dict[str, Any] | None:
    """The live holder of ``run_id``'s lease (host, pid, user, expires_in_s), or None."""
    row = store._read(lambda c: c.execute(_HELD, (run_id,)).fetchone())
    if row is None:
        return None
    try:
        info = dict(json.loads(row[0] or "{}"))
    except (TypeError, ValueError):
        info = {}
    info["expires_in_s"] = float(row[1] or 0.0)
    return info


def fence(conn: Any, run_id: str, epoch: int) -> None:
    """Raise ``LeaseLost`` unless ``epoch`` still holds ``run_id``'s unexpired lease."""
    if conn.execute(FENCE, (run_id, epoch)).fetchone() is None:
        raise LeaseLost(run_id)


QUEUED_FENCE = "SELECT wf_fence(?, ?)"
"""The fence as the server checks it (``wf_fence``, migration m018): it raises
``LEASE_LOST_STATE`` instead of returning nothing, so no reply needs reading and the check
goes out with the transaction's next statement (pgconn batches it like a write)."""
LEASE_LOST_STATE = "WF075"
"""The SQLSTATE ``wf_fence`` raises; its message is ``lease lost: <run id>``."""


def queue_fence(conn: Any, run_id: str, epoch: int) -> None:
    """Fence a write transaction of ``run_id`` without waiting for a reply: the transaction
    fails with ``LEASE_LOST_STATE`` (see :func:`lease_lost_of`) where :func:`fence` would raise."""
    conn.execute(QUEUED_FENCE, (run_id, epoch))


def lease_lost_of(exc: BaseException) -> LeaseLost | None:
    """The ``LeaseLost`` a failed write means when the server's fence refused it, else None."""
    if getattr(exc, "sqlstate", None) != LEASE_LOST_STATE:
        return None
    text = str(exc)
    run_id = text.split("lease lost: ", 1)[1].split()[0] if "lease lost: " in text else "?"
    return LeaseLost(run_id)
