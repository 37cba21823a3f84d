"""The Store: owns the state database's connections and is the only way to its rows.

One writer connection (``BEGIN IMMEDIATE`` per named write, serialised by a lock) serves the
driver and the decision verbs; each reading thread gets its own WAL reader connection, so a
widget redraw, a frame or ``status`` never queues behind a journal write. Every method is a
named query or a named write; rows cross the boundary as frozen dataclasses, never cursors.
This module holds the connections, the write lock and group commit; the named queries and
writes come from mixins by concern (``queries_runs``, ``queries_journal``, ``queries_views``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ..errors import LeaseLost, StateDBError, StateDirReplaced, WorkflowError
from ..locking import RunLock, is_locked, lock_holder_of
from ..redact import Redactor
from . import journal
from .cellstarts import Event
from .checkpoint import BACKSTOP_PAGES, Checkpointer
from .db import connect_reader, immediate
from .deferred import EventWrite, run_deferred
from .faults import integrity_summary, pg_fault, state_db_fault, unreadable_row
from .journal import Finish
from .leases import RunLease, fence, holder_of, lease_lost_of, queue_fence
from .location import DB_FILENAME, PgLocation
from .opening import open_state_db, schema_is_current
from .pgopen import open_pg
from .queries_calls import CallQueries
from .queries_journal import JournalQueries
from .queries_otel import OtelQueries
from .queries_runs import RunQueries
from .queries_sweeps import SweepQueries
from .queries_views import ViewQueries
from .records import AttemptRow
from .scrub import Scrubber

T = TypeVar("T")


class Store(RunQueries, JournalQueries, ViewQueries, SweepQueries, OtelQueries, CallQueries):
    """Named queries and writes over ``state.db`` (opened and migrated on first use).

    The queries and writes themselves are inherited, grouped by concern: runs and steps
    (``RunQueries``), the journal and loop resume (``JournalQueries``), frames, tallies,
    recordings and the library cache (``ViewQueries``). This class owns what they share:
    the connections, the write lock and the deferred finishes (group commit). Every read
    flushes those finishes first, whichever thread reads (see ``_read``).

    Args:
        db_path: the SQLite file, or a :class:`PgLocation` (a schema on a PostgreSQL server:
            store/pgopen.py opens it, store/pgconn.py speaks the same SQL to it).
        durability: ``normal`` (WAL, synchronous=NORMAL) or ``full`` (synchronous=FULL).
        redactor: what every write outside a drive is redacted with (default: the
            environment's secrets and credential shapes); see store/scrub.py.
    """

    def __init__(
        self,
        db_path: Path | PgLocation,
        *,
        durability: str = "normal",
        redactor: Redactor | None = None,
    ):
        self.pg: PgLocation | None = None
        self.db_path: Path
        if isinstance(db_path, PgLocation):
            self.pg, self.db_path = db_path, db_path.local_dir / DB_FILENAME
        else:
            self.db_path = Path(db_path)
        """The SQLite file (on PostgreSQL: where it would be in ``state_dir``, never opened)."""
        self.where = self.pg.where if self.pg is not None else str(self.db_path)
        """The state as messages name it (a folder's ``state.db``, or the URL, no password)."""
        self.scrubber = Scrubber(redactor if redactor is not None else Redactor.from_environ())
        self.durability = durability
        self._writer: sqlite3.Connection | None = None
        self._migrated = False
        """Set once the schema is known current: checked read-only, or migrated by the writer."""
        self._write_lock = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._deferred: list[tuple[str, Callable[[sqlite3.Connection], object]]] = []
        """(run id, finish write) waiting for the next write transaction, in the order they
        were deferred (group commit; see defer_finish)."""
        self._sync_full = durability == "full"
        self._checkpointer: Checkpointer | None = None
        self._identity: tuple[int, int] | None = None
        """(device, inode) of the file the connections opened: a state dir deleted or
        replaced under this Store is noticed before the next read or write (see
        ``_check_identity``) instead of journaling into an unlinked file."""
        self._written: set[str] = set()
        """Run ids written through these connections (their rows live in that file)."""
        self._bounded_payers: set[str] = set()
        self._after_flush: list[Callable[[], None]] = []
        """Run locks to release once the deferred writes commit (``release_after_flush``)."""
        self._fresh_runs: set[str] = set()
        """Runs driven under their lock here that have no attempt yet (``fresh_drive``)."""
        self._fresh_polls: set[str] = set()
        """Fresh runs whose first stop poll is still to come (answered by their drive view)."""
        self._fences: dict[str, int] = {}
        """Run id → the epoch of this process's lease on it (PostgreSQL): every write of that
        run checks it first, in its own transaction (store/leases.py)."""

    @property
    def journal_url(self) -> str | None:
        """The ``postgresql://…?schema=`` URL another Store opens this journal with (None on
        SQLite: the file in ``state_dir`` is the journal)."""
        if self.pg is None:
            return None
        sep = "&" if "?" in self.pg.url else "?"
        return f"{self.pg.url}{sep}schema={self.pg.schema}"

    @property
    def state_dir(self) -> Path:
        """This machine's folder of the state: the SQLite file's folder, or on PostgreSQL the
        local folder of what is not journal (process sidecars, agent homes, the seal key)."""
        return self.pg.local_dir if self.pg is not None else self.db_path.parent

    @property
    def lock_dir(self) -> Path:
        """Where the run locks of this state dir live."""
        return self.state_dir / "locks"

    # -- connections -----------------------------------------------------------------------
    def open(self) -> None:
        """Open (creating and migrating) the database now rather than on first use.

        Raises:
            UsageError: the state dir or file is unusable.
            MigrationError: the migration ledger diverges.
        """
        self._write_conn()

    def _write_conn(self) -> sqlite3.Connection:
        with self._write_lock:
            if self._writer is None and self.pg is not None:
                self._writer = open_pg(self.pg, migrate=True)  # type: ignore[assignment]
                self._migrated = True
            if self._writer is None:
                writer = open_state_db(self.db_path, durability=self.durability)
                if str(writer.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
                    # Checkpoints move to a thread of their own (store/checkpoint.py); the
                    # writer's automatic one stays as a backstop.
                    writer.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
                    self._checkpointer = Checkpointer(self.db_path)
                    # A Store dropped without close() still stops its thread.
                    weakref.finalize(self, self._checkpointer.close)
                self._writer = writer
                self._migrated = True
                if self._identity is None:
                    self._identity = _file_identity(self.db_path)
            return self._writer

    def _read_conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None and self.pg is not None:
            if not self._migrated:
                self._write_conn()
            conn = open_pg(self.pg, migrate=False)  # type: ignore[assignment]
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)  # type: ignore[arg-type]
        if conn is None:
            # The schema exists before any reader looks at it. A current ledger is checked
            # read-only, so `status` or `list` work on a read-only file and never queue
            # behind a writer; only a missing or older schema opens the writer to migrate.
            if not self._migrated and not schema_is_current(self.db_path):
                self._write_conn()
            self._migrated = True
            conn = connect_reader(self.db_path)
            if self._identity is None:
                self._identity = _file_identity(self.db_path)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _read(
        self,
        fn: Callable[[sqlite3.Connection], T],
        run_id: str | None = None,
        *,
        flush: bool = True,
    ) -> T:
        """Run ``fn`` on this thread's reader connection, after flushing deferred finishes.

        The flush happens on whatever thread reads, and takes the write lock to do it: so a
        read always sees the driver's finishes (correct: the Store reads its own writes), but
        a widget thread's read may be the one that commits the driver's pending finishes, and
        it waits for the write lock while the driver holds it.
        """
        self._check_identity(run_id)
        if flush and self._deferred:  # read your own writes
            self.flush(run_id)
        try:
            return fn(self._read_conn())
        except sqlite3.Error as exc:
            raise self._fault(exc, run_id) from exc
        except StateDBError as exc:  # opening failed: say which run was being read
            raise (exc.for_run(run_id) if run_id else exc) from exc.__cause__

    def _owes(self, run_id: str | None) -> bool:
        """Whether a read of ``run_id`` (of anything: None) must flush the deferred finishes
        first: those of its own run are its own writes; another run's wait for that run's commit
        (a sweep drives many runs at once, and every flush takes the write lock)."""
        deferred = self._deferred
        return run_id is None or any(rid == run_id for rid, _ in deferred)

    def _write(self, fn: Callable[[sqlite3.Connection], T], run_id: str | None = None) -> T:
        self._check_identity(run_id)
        if run_id is not None:
            self._written.add(run_id)
            if self._fresh_runs:  # a run written to is fresh no more: its reads read
                self._fresh_runs.discard(run_id)
                self._fresh_polls.discard(run_id)
        try:
            with self._write_lock:
                with immediate(self._write_conn()) as conn:
                    if self._fences:
                        self._fence(conn, run_id)
                    deferred = self._deferred
                    if deferred:  # they commit first, in the same transaction
                        run_deferred(conn, deferred)
                    result = fn(conn)
                # Committed: only now are the deferred writes off the queue (a rolled-back
                # transaction keeps them for the next write or flush).
                if deferred:
                    self._deferred = []
                    released, self._after_flush = self._after_flush, []
                    for release in released:  # their runs' writes are durable now
                        release()
                if self._checkpointer is not None:
                    self._checkpointer.poke()
                return result
        except sqlite3.Error as exc:
            lost = lease_lost_of(exc)
            if lost is not None:  # the server's fence refused it: nothing was written
                self._drop_deferred(lost.run_id)
                raise lost from None
            fault = self._fault(exc, run_id)
            if isinstance(fault, StateDBError) and run_id in self._fences:
                # A leased run's connection died under the write (the server ended a session
                # left idle in a transaction by a paused driver, say): if the lease is gone
                # meanwhile, that is what to say.
                try:
                    self._lost_lease(run_id)
                except LeaseLost:
                    self._drop_deferred(run_id)
                    raise
            raise fault from exc
        except StateDBError as exc:
            raise (exc.for_run(run_id) if run_id else exc) from exc.__cause__

    def _drop_deferred(self, run_id: str | None) -> None:
        """Forget the deferred finishes of a run whose lease is lost: whoever holds it now
        reclaims those attempts (same dispatch ids), and no later write of this process may
        carry them, fenced or not (a lease's release stops fencing its run)."""
        with self._write_lock:
            self._deferred = [d for d in self._deferred if d[0] != run_id]

    def _fence(self, conn: sqlite3.Connection, run_id: str | None) -> None:
        """Fence this write by every lease it depends on (the write's own run's, and every run
        whose finishes it carries): the server fails the transaction when one is no longer
        this driver's, and :meth:`_write` turns that into ``LeaseLost``."""
        runs = {rid for rid, _ in self._deferred}
        if run_id is not None:
            runs.add(run_id)
        for rid in runs:
            epoch = self._fences.get(rid)
            if epoch is not None:
                queue_fence(conn, rid, epoch)

    def _lost_lease(self, run_id: str) -> None:
        """Raise ``LeaseLost`` when ``run_id``'s lease is no longer this driver's (checked on
        a connection of its own); return when it still is, or when nothing can be checked."""
        epoch = self._fences.get(run_id)
        if self.pg is None or epoch is None:
            return
        try:
            conn = open_pg(self.pg, migrate=False)
        except StateDBError:
            return
        try:
            fence(conn, run_id, epoch)
        except sqlite3.Error:
            return
        finally:
            conn.close()

    # -- one driver per run ------------------------------------------------------------------
    def run_lock(self, run_id: str) -> RunLock | RunLease:
        """The lock a driver holds on ``run_id``: a lock file on SQLite (one host), a lease on
        the run row on PostgreSQL (every host; store/leases.py)."""
        if self.pg is not None:
            return RunLease(self, run_id)
        return RunLock(self.lock_dir, run_id)

    def is_driven_now(self, run_id: str) -> bool:
        """Whether some driver holds ``run_id`` right now (never takes the lock to find out)."""
        if self.pg is not None:
            return holder_of(self, run_id) is not None
        return is_locked(self.lock_dir, run_id)

    def lock_holder(self, run_id: str) -> dict[str, Any]:
        """Who holds ``run_id`` (pid, host, and user or since where known); {} when nobody."""
        if self.pg is not None:
            return holder_of(self, run_id) or {}
        return lock_holder_of(self.lock_dir, run_id)

    def _check_identity(self, run_id: str | None) -> None:
        """Reopen when ``state.db`` at our path is no longer the file we opened.

        A notebook that deletes its state folder (a tour's first cell, run twice) must not
        journal into the unlinked file, where every write would be silently lost. The
        connections are closed and the next one opens what is at the path now (a new, empty
        state dir when it is gone). A run this Store was writing lived in the old file: its
        next read or write says so in one line instead of failing obscurely in the new one.

        Raises:
            StateDirReplaced: ``run_id`` was written through the replaced file.
        """
        if (
            self.pg is not None
            or self._identity is None
            or _file_identity(self.db_path) == self._identity
        ):
            return
        lost = run_id is not None and run_id in self._written
        self._reset_connections()
        if lost:
            raise StateDirReplaced(
                f"Run {run_id}: the state dir {self.db_path.parent} was deleted or replaced "
                "while the run was open, and its journal went with it; start the run again "
                "(re-run the cell, or `wf run FILE`).",
                run_id=run_id,
            )

    def _reset_connections(self) -> None:
        """Drop every connection and deferred write of the replaced file (nothing flushed)."""
        with self._write_lock:
            self._deferred = []
            self._identity = None
            self._migrated = False
            self._written = set()
        self.close()

    def _fault(self, exc: sqlite3.Error, run_id: str | None) -> BaseException:
        """A fault of the database itself as ``StateDBError``; anything else unchanged."""
        if self.pg is not None:
            fault = pg_fault(exc, self.where, run_id)
            if fault is not None:
                self._reset_connections()  # a lost server: the next use connects afresh
            return fault or exc
        return state_db_fault(exc, self.db_path, run_id) or exc

    @contextmanager
    def synchronous_full(self, enabled: bool = True) -> Iterator[None]:
        """``synchronous=FULL`` on the writer while the block runs (a plan's ``durability``)."""
        if not enabled or self.durability == "full" or self.pg is not None:
            yield  # PostgreSQL commits are durable already (synchronous_commit=on)
            return
        conn = self._write_conn()
        with self._write_lock:
            self.flush()
            conn.execute("PRAGMA synchronous = FULL")
            self._sync_full = True
        try:
            yield
        finally:
            with self._write_lock:
                self.flush()
                conn.execute("PRAGMA synchronous = NORMAL")
                self._sync_full = False

    def close(self) -> None:
        """Close every connection (readers of other threads too), after a last flush."""
        if self._deferred and self._writer is not None:
            try:
                self.flush()
            except StateDBError:
                pass  # already reported by the write that failed; the attempts stay running
            finally:  # and the next drive reclaims them, as after a crash
                self._deferred = []
        self._release_all()
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        self._local = threading.local()
        with self._write_lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check`` in one line (``ok``, or the first problem and a count);
        on PostgreSQL, the server keeps its own pages: ``ok`` once the schema answers."""
        if self.pg is not None:
            self._read(lambda c: c.execute("SELECT 1 FROM runs LIMIT 1").fetchall())
            return "ok"
        return integrity_summary(self.db_path)

    def unreadable(self, run_id: str, what: str) -> WorkflowError:
        """The error for a row of ``run_id`` edited by hand into something unreadable."""
        if self.pg is not None:
            return StateDBError(
                "unreadable", detail=what, db_path=self.where, run_id=run_id, integrity=None
            )
        return unreadable_row(self.db_path, run_id, what)

    def vacuum(self) -> None:
        """Rebuild the database file to return the pages gc freed (``VACUUM``; no transaction)."""
        try:
            with self._write_lock:
                self._write_conn().execute("VACUUM")
        except sqlite3.Error as exc:
            raise self._fault(exc, None) from exc

    def _defer_write(
        self,
        run_id: str,
        fn: Callable[[sqlite3.Connection], object],
        events: Sequence[Event] = (),
    ) -> None:
        """Queue a write of ``run_id`` (``fn``, then ``events``) behind the deferred finishes:
        it commits with the next write transaction, or now under ``durability: full``.

        Every read of the run flushes it first, as for a deferred finish; the events of
        writes deferred one after another go in as one multi-row insert.
        """
        with self._write_lock:
            if self._sync_full:
                self._write(EventWrite(fn, tuple(events)).with_events, run_id)
                return
            self._written.add(run_id)
            self._fresh_runs.discard(run_id)
            self._fresh_polls.discard(run_id)
            self._deferred.append((run_id, EventWrite(fn, tuple(events))))

    def _defers_inputs(self, input_hashes: Sequence[str]) -> bool:
        """Whether a deferred finish is of an attempt of one of ``input_hashes`` (a read of
        those inputs' attempts must flush first; other deferred writes change nothing it
        reads)."""
        wanted = set(input_hashes)
        with self._write_lock:
            for _, write in self._deferred:
                attempt = getattr(write, "keywords", {}).get("attempt")
                if not isinstance(attempt, AttemptRow) or attempt.input_hash in wanted:
                    if not isinstance(write, EventWrite):
                        return True
        return False

    def release_after_flush(self, run_id: str, release: Callable[[], None]) -> None:
        """Call ``release`` (a run lock's) once the writes deferred for ``run_id`` commit:
        now when there are none, or on PostgreSQL (whose lease's release is a write of its
        own, fenced apart: the writes commit first, here)."""
        with self._write_lock:
            if self.pg is None and any(rid == run_id for rid, _ in self._deferred):
                self._after_flush.append(release)
                return
        try:
            self.flush(run_id)
        finally:
            release()

    def _release_all(self) -> None:
        """Release every lock waiting for deferred writes that will not commit here."""
        released, self._after_flush = self._after_flush, []
        for release in released:
            release()

    # -- fresh runs ------------------------------------------------------------------------
    @contextmanager
    def fresh_drive(self, run_id: str, fresh: bool = True) -> Iterator[None]:
        """While a drive of ``run_id`` holds its lock: when ``fresh`` (its drive view, read
        under the lock, found no attempt), its journal reads answer empty without a read
        until something is written for it, and its first stop poll is answered by that view
        (the drive clears a stop requested before it). Nobody else writes a run's attempts
        while its lock is held, so there is nothing to read."""
        if not fresh:
            yield
            return
        self._fresh_runs.add(run_id)
        self._fresh_polls.add(run_id)
        try:
            yield
        finally:
            self._fresh_runs.discard(run_id)
            self._fresh_polls.discard(run_id)

    def _fresh(self, run_id: str) -> bool:
        return run_id in self._fresh_runs

    def _fresh_stop_answer(self, run_id: str) -> bool:
        if run_id in self._fresh_polls:
            self._fresh_polls.discard(run_id)
            return True
        return False

    # -- group commit ----------------------------------------------------------------------
    def defer_finish(self, attempt: AttemptRow, finish: Finish) -> None:
        """Finish ``attempt`` in the next write transaction (group commit), or now under ``full``.

        The driver defers a unit's finish and commits it together with the next reservation,
        so a dispatch costs one transaction instead of two; it calls ``flush`` before it
        waits for work in flight and before anything depends on the finish, and every read
        through this Store flushes first (it reads its own writes). A crash
        in between leaves the attempt ``running``: the next drive reclaims it in place (same
        dispatch_id), exactly as for a crash while the unit ran. ``durability: full`` keeps
        one commit per finish.
        """
        with self._write_lock:
            if self._sync_full:
                self.finish_attempt(attempt, finish)
            else:
                scrubbed = self.scrubber.finish(attempt.run_id, finish)
                self._deferred.append(
                    (
                        attempt.run_id,
                        partial(journal.queue_finish_txn, attempt=attempt, finish=scrubbed),
                    )
                )

    def flush(self, run_id: str | None = None) -> None:
        """Commit the deferred finishes now (a no-op when there are none).

        ``run_id``: only when some of them are that run's (then all of them commit): a drive
        waits for its own finishes, not for the other runs' a sweep drives beside it, and
        the write lock is not taken for nothing.
        """
        if not self._deferred or (run_id is not None and not self._owes(run_id)):
            return
        with self._write_lock:
            if self._deferred:
                run_id = self._deferred[0][0]
                self._write(lambda c: None, run_id)

    @property
    def has_deferred(self) -> bool:
        """Writes are waiting for the next write transaction."""
        return bool(self._deferred)


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``, or None when there is no file there."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)
