"""The Store: owns the state database's connections and is the only way to its rows.

One writer connection (``BEGIN IMMEDIATE`` per named write, serialised by a lock) serves the
driver and the decision verbs; each reading thread gets its own WAL reader connection, so a
widget redraw, a frame or ``status`` never queues behind a journal write. Every method is a
named query or a named write; rows cross the boundary as frozen dataclasses, never cursors.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import StateDBError, WorkflowError
from . import journal, recordings, resume, runs, summary
from .checkpoint import BACKSTOP_PAGES, Checkpointer
from .db import connect_reader, immediate
from .faults import integrity_summary, state_db_fault, unreadable_row
from .journal import Finish, UnitKey
from .opening import open_state_db, schema_is_current
from .recordings import RecordingRow
from .records import (
    AttemptRow,
    BudgetUse,
    EventRow,
    RunRow,
    RunStatus,
    ScopeChoice,
    StepRow,
    StepStatus,
)
from .runs import LaunchKey

if TYPE_CHECKING:
    import pandas as pd

    from .library_cache import LibraryCopy

T = TypeVar("T")


class Store:
    """Named queries and writes over ``state.db`` (opened and migrated on first use).

    Args:
        db_path: the SQLite file.
        durability: ``normal`` (WAL, synchronous=NORMAL) or ``full`` (synchronous=FULL).
    """

    def __init__(self, db_path: Path, *, durability: str = "normal"):
        self.db_path = db_path
        self.durability = durability
        self._writer: sqlite3.Connection | None = None
        self._migrated = False
        """Set once the schema is known current: checked read-only, or migrated by the writer."""
        self._write_lock = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._deferred: list[tuple[AttemptRow, Finish]] = []
        """Finishes waiting for the next write transaction (group commit; see defer_finish)."""
        self._sync_full = durability == "full"
        self._checkpointer: Checkpointer | None = None

    @property
    def lock_dir(self) -> Path:
        """Where the run locks of this state dir live."""
        return self.db_path.parent / "locks"

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
            return self._writer

    def _read_conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # The schema exists before any reader looks at it. A current ledger is checked
            # read-only, so `status` or `list` work on a read-only file and never queue
            # behind a writer; only a missing or older schema opens the writer to migrate.
            if not self._migrated and not schema_is_current(self.db_path):
                self._write_conn()
            self._migrated = True
            conn = connect_reader(self.db_path)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _read(self, fn: Callable[[sqlite3.Connection], T], run_id: str | None = None) -> T:
        if self._deferred:  # read your own writes: a deferred finish is visible to every read
            self.flush()
        try:
            return fn(self._read_conn())
        except sqlite3.Error as exc:
            raise self._fault(exc, run_id) from exc
        except StateDBError as exc:  # opening failed: say which run was being read
            raise (exc.for_run(run_id) if run_id else exc) from exc.__cause__

    def _write(self, fn: Callable[[sqlite3.Connection], T], run_id: str | None = None) -> T:
        try:
            with self._write_lock:
                with immediate(self._write_conn()) as conn:
                    deferred = self._deferred
                    if deferred:  # they commit first, in the same transaction
                        for attempt, finish in deferred:
                            journal.finish_attempt_txn(conn, attempt, finish)
                    result = fn(conn)
                # Committed: only now are the deferred finishes off the queue (a rolled-back
                # transaction keeps them for the next write or flush).
                if deferred:
                    self._deferred = []
                if self._checkpointer is not None:
                    self._checkpointer.poke()
                return result
        except sqlite3.Error as exc:
            raise self._fault(exc, run_id) from exc
        except StateDBError as exc:
            raise (exc.for_run(run_id) if run_id else exc) from exc.__cause__

    def _fault(self, exc: sqlite3.Error, run_id: str | None) -> BaseException:
        """A fault of the database itself as ``StateDBError``; anything else unchanged."""
        return state_db_fault(exc, self.db_path, run_id) or exc

    @contextmanager
    def synchronous_full(self, enabled: bool = True) -> Iterator[None]:
        """``synchronous=FULL`` on the writer while the block runs (a plan's ``durability``)."""
        if not enabled or self.durability == "full":
            yield
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
        """``PRAGMA integrity_check`` in one line (``ok``, or the first problem and a count)."""
        return integrity_summary(self.db_path)

    def unreadable(self, run_id: str, what: str) -> WorkflowError:
        """The error for a row of ``run_id`` edited by hand into something unreadable."""
        return unreadable_row(self.db_path, run_id, what)

    # -- runs ------------------------------------------------------------------------------
    def get_run(self, run_id: str) -> RunRow | None:
        """The run row of ``run_id`` (None when there is none)."""
        return self._read(lambda c: runs.get_run(c, run_id), run_id)

    def find_run_prefix(self, prefix: str) -> list[str]:
        """Run ids starting with ``prefix`` (close matches for a mistyped id)."""
        return self._read(lambda c: runs.find_run_prefix(c, prefix))

    def latest_in_scope(self, scope_key: str) -> RunRow | None:
        """The newest root run of a scope."""
        return self._read(lambda c: runs.latest_in_scope(c, scope_key))

    def list_runs(
        self, *, include_children: bool = False, limit: int | None = None
    ) -> list[RunRow]:
        """Runs, newest first."""
        return self._read(
            lambda c: runs.list_runs(c, include_children=include_children, limit=limit)
        )

    def child_run(self, parent_run_id: str, invocation_key: str) -> RunRow | None:
        """The child run a parent published for one invocation."""
        return self._read(lambda c: runs.child_run(c, parent_run_id, invocation_key))

    def steps_of(self, run_id: str) -> list[StepRow]:
        """A run's step rows in plan order."""
        return self._read(lambda c: runs.steps_of(c, run_id), run_id)

    def is_stop_requested(self, run_id: str) -> bool:
        """Whether someone asked the run's driver to stop."""
        return self._read(lambda c: runs.is_stop_requested(c, run_id), run_id)

    def finished_runs_before(self, cutoff: float) -> list[str]:
        """Finished root runs older than ``cutoff`` (gc candidates)."""
        return self._read(lambda c: runs.finished_runs_before(c, cutoff))

    def create_run(
        self,
        row: RunRow,
        steps: Sequence[tuple[str, int, str, int]],
        *,
        supersede: str | None = None,
    ) -> None:
        """Insert a run and its steps; with ``supersede`` abandon that run in the same write.

        Raises:
            sqlite3.IntegrityError: a child with the same (parent, invocation key) exists.
        """

        self._write(lambda c: runs.create_run_txn(c, row, steps, supersede=supersede), row.run_id)

    def start_in_scope(
        self,
        row: RunRow,
        steps: Sequence[tuple[str, int, str, int]],
        *,
        decide: Callable[[RunRow | None], ScopeChoice],
        launch_key: str | None = None,
        check_key: Callable[[LaunchKey], None] | None = None,
    ) -> RunRow:
        """Find the scope's run or insert ``row``, as one atomic step; returns the run kept.

        ``decide(latest)`` sees the newest root run of ``row.scope_key`` inside the write
        transaction, so two starts at the same instant (threads or processes) cannot both
        insert: the second sees the first's run. It returns what to do (``ScopeChoice``), or
        raises to refuse (nothing is written).

        With ``launch_key``, a key already recorded is checked by ``check_key`` (which raises
        to refuse) and its run is returned; otherwise the key is recorded for the run kept,
        in the same transaction.
        """

        def txn(conn: sqlite3.Connection) -> RunRow:
            if launch_key is not None:
                prior = runs.launch_key(conn, launch_key)
                keyed = runs.get_run(conn, prior.run_id) if prior is not None else None
                if prior is not None and keyed is not None:
                    if check_key is not None:
                        check_key(prior)
                    return keyed
            choice = decide(runs.latest_in_scope(conn, row.scope_key))
            kept = choice.keep
            if kept is None:
                runs.create_run_txn(conn, row, steps, supersede=choice.supersede)
                kept = row
            if launch_key is not None:
                runs.insert_launch_key_txn(conn, launch_key, kept)
            return kept

        return self._write(txn, row.run_id)

    def publish_child(self, row: RunRow, steps: Sequence[tuple[str, int, str, int]]) -> RunRow:
        """Insert a child run once per ``(parent_run_id, invocation_key)``; returns the row kept.

        A child published meanwhile (the pair is unique) is returned instead of ``row``.
        """
        try:
            self.create_run(row, steps)
        except sqlite3.IntegrityError:
            existing = self.child_run(row.parent_run_id or "", row.invocation_key or "")
            if existing is None:
                raise
            return existing
        return row

    def set_run_status(
        self,
        run_id: str,
        status: RunStatus,
        *,
        reason: str | None = None,
        result_json: str | None = None,
    ) -> None:
        """Write a run's status (with its ``run_status`` event)."""
        self._write(
            lambda c: runs.set_run_status_txn(
                c, run_id, status, reason=reason, result_json=result_json
            ),
            run_id,
        )

    def write_step(
        self,
        run_id: str,
        step_id: str,
        *,
        status: StepStatus,
        loop: int,
        note: str | None,
        output_json: str | None,
        stops_run: bool = False,
    ) -> None:
        """Write a step's state (the spine is the only caller)."""
        self._write(
            lambda c: runs.write_step_txn(
                c,
                run_id,
                step_id,
                status=status,
                loop=loop,
                note=note,
                output_json=output_json,
                stops_run=stops_run,
            ),
            run_id,
        )

    def set_stop_requested(self, run_id: str, value: bool) -> None:
        """Ask a run's driver to stop between units (or clear the request)."""
        self._write(lambda c: runs.set_stop_requested(c, run_id, value), run_id)

    def delete_run_tree(self, run_id: str) -> None:
        """Delete a finished root run and its descendants."""
        self._write(lambda c: runs.delete_run_tree_txn(c, run_id), run_id)

    def delete_finished_tree(
        self, run_id: str, *, cutoff: float, statuses: Sequence[str] = runs.FINISHED
    ) -> list[str]:
        """Delete a root run and its descendants only if it is still finished before ``cutoff``.

        The status is checked inside the delete's transaction (a failed run resumed since it
        was listed is kept), and each deleted run leaves a receipt (``run_receipts``) written
        in that same transaction. Returns the deleted run ids, root first (empty: nothing
        deleted).
        """
        return self._write(
            lambda c: runs.delete_finished_tree_txn(c, run_id, cutoff, statuses), run_id
        )

    def vacuum(self) -> None:
        """Rebuild the database file to return the pages gc freed (``VACUUM``; no transaction)."""
        try:
            with self._write_lock:
                self._write_conn().execute("VACUUM")
        except sqlite3.Error as exc:
            raise self._fault(exc, None) from exc

    # -- journal ---------------------------------------------------------------------------
    def attempts_of(self, run_id: str, step_id: str | None = None) -> list[AttemptRow]:
        """A run's attempts (optionally of one step), in journal order."""
        return self._read(lambda c: journal.attempts_of(c, run_id, step_id), run_id)

    def done_outputs(self, run_id: str, step_id: str) -> dict[str, dict[str, Any]]:
        """unit_id → input_hash → output JSON of a step's newest succeeded/reused attempts."""
        return self._read(lambda c: journal.done_outputs(c, run_id, step_id), run_id)

    def attempts_of_units(self, run_id: str, unit_ids: Sequence[str]) -> list[AttemptRow]:
        """The attempts of the given units of a run, in journal order."""
        ids = list(unit_ids)
        if not ids:
            return []
        return self._read(lambda c: journal.attempts_of_units(c, run_id, ids), run_id)

    def find_reusable(
        self,
        *,
        workflow: str,
        input_hash: str,
        runner: str,
        exclude_run_id: str,
        phase: str = "work",
        unit_id: str | None = None,
    ) -> AttemptRow | None:
        """The newest succeeded attempt of another run of ``workflow`` with the same input."""
        return self._read(
            lambda c: journal.find_reusable(
                c,
                workflow=workflow,
                input_hash=input_hash,
                runner=runner,
                exclude_run_id=exclude_run_id,
                phase=phase,
                unit_id=unit_id,
            )
        )

    def input_of(self, input_hash: str) -> dict[str, Any] | None:
        """The journaled (redacted) input of ``input_hash``; None when it was never recorded."""
        text = self._read(lambda c: journal.input_of(c, input_hash))
        return None if text is None else dict(json.loads(text))

    def inputs_of(self, input_hashes: set[str]) -> dict[str, str]:
        """The journaled inputs (JSON text) of the given hashes that have one."""
        return self._read(lambda c: journal.inputs_of(c, input_hashes))

    def find_in_run(self, *, run_id: str, input_hash: str, unit_id: str) -> AttemptRow | None:
        """The newest succeeded/reused attempt of ``unit_id`` in ``run_id`` with that input."""
        return self._read(
            lambda c: journal.find_in_run(c, run_id=run_id, input_hash=input_hash, unit_id=unit_id),
            run_id,
        )

    def budget_usage(self, root_run_id: str) -> tuple[int, int, float]:
        """(charged attempts, their tokens, their cost) over a root run and its descendants."""
        return self._read(lambda c: journal.budget_usage(c, root_run_id), root_run_id)

    def budget_use(self, run_id: str) -> BudgetUse:
        """Charged use of ``run_id``'s root (and its descendants) against the root's ceilings.

        Raises:
            UsageError: no such run.
        """
        return self._read(lambda c: journal.budget_use(c, run_id), run_id)

    def events_after(self, run_id: str, after_id: int = 0, limit: int = 10_000) -> list[EventRow]:
        """Events of ``run_id`` newer than ``after_id`` (watch/tail)."""
        return self._read(lambda c: journal.events_after(c, run_id, after_id, limit), run_id)

    def reserve_attempt(self, key: UnitKey, *, charged: bool) -> AttemptRow:
        """Insert a ``running`` attempt with a fresh dispatch_id."""
        return self._write(
            lambda c: journal.reserve_attempt_txn(c, key, charged=charged), key.run_id
        )

    def reserve_attempts(self, keys: Sequence[tuple[UnitKey, bool]]) -> list[AttemptRow]:
        """Reserve several ``(key, charged)`` attempts in one transaction (a dispatch batch).

        Each unit is still reserved before it is dispatched: the batch is the units about to
        be handed to the executor together, and the transaction commits before any of them.
        """
        if not keys:
            return []
        return self._write(lambda c: journal.reserve_attempts_txn(c, keys), keys[0][0].run_id)

    def finish_attempt(self, attempt: AttemptRow, finish: Finish) -> bool:
        """Finish a running attempt; False (nothing written) when it was already finished."""
        return self._write(lambda c: journal.finish_attempt_txn(c, attempt, finish), attempt.run_id)

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
                self._deferred.append((attempt, finish))

    def flush(self) -> None:
        """Commit the deferred finishes now (a no-op when there are none)."""
        with self._write_lock:
            if self._deferred:
                run_id = self._deferred[0][0].run_id
                self._write(lambda c: None, run_id)

    @property
    def has_deferred(self) -> bool:
        """Finishes are waiting for the next write transaction."""
        return bool(self._deferred)

    def record_terminal_attempt(
        self,
        key: UnitKey,
        finish: Finish,
        *,
        reused_from: str | None = None,
        saved_tokens: int = 0,
        event: str = "unit_finished",
    ) -> AttemptRow:
        """Insert an attempt that is terminal at once (a reused result or a verdict)."""
        return self._write(
            lambda c: journal.record_terminal_attempt_txn(
                c, key, finish, reused_from=reused_from, saved_tokens=saved_tokens, event=event
            ),
            key.run_id,
        )

    def record_decision(
        self,
        run_id: str,
        step_id: str,
        decide: Callable[[StepRow | None, Callable[[str, str], AttemptRow | None]], UnitKey],
        finish: Finish,
    ) -> UnitKey:
        """Compare-and-set a person's verdict in one transaction.

        ``decide(step_row, latest_verdict)`` sees the step row and a lookup of the newest
        verdict of ``(unit_id, input_hash)``; it returns the key to journal, or raises to
        refuse (nothing is written).
        """

        def txn(conn: sqlite3.Connection) -> UnitKey:
            row = next((s for s in runs.steps_of(conn, run_id) if s.step_id == step_id), None)

            def latest(unit_id: str, input_hash: str) -> AttemptRow | None:
                return journal.latest_verdict(
                    conn, run_id=run_id, unit_id=unit_id, input_hash=input_hash
                )

            key = decide(row, latest)
            journal.record_terminal_attempt_txn(conn, key, finish, event="human_verdict")
            return key

        return self._write(txn, run_id)

    # -- frames ----------------------------------------------------------------------------
    def runs_frame(self, *, include_deleted: bool = False) -> pd.DataFrame:
        """All runs, with gc receipts too (see :func:`wf_magic.store.frames.runs_frame`)."""
        from . import frames  # pandas is imported only when a frame is asked for

        return self._read(lambda c: frames.runs_frame(c, include_deleted=include_deleted))

    def journal_frame(self, run_id: str | None = None) -> pd.DataFrame:
        """One row per attempt (see :func:`wf_magic.store.frames.journal_frame`)."""
        from . import frames

        return self._read(lambda c: frames.journal_frame(c, run_id), run_id)

    def tokens_frame(self, run_id: str | None = None, *, by: str = "step") -> pd.DataFrame:
        """Token accounting grouped ``by`` (see :func:`wf_magic.store.frames.tokens_frame`)."""
        from . import frames

        return self._read(lambda c: frames.tokens_frame(c, run_id, by=by), run_id)

    def events_frame(self, run_id: str | None = None) -> pd.DataFrame:
        """Events (see :func:`wf_magic.store.frames.events_frame`)."""
        from . import frames

        return self._read(lambda c: frames.events_frame(c, run_id), run_id)

    def budget_frame(self, run_id: str) -> pd.DataFrame:
        """Used vs limit per ceiling (see :func:`wf_magic.store.frames.budget_frame`)."""
        from . import frames

        return self._read(lambda c: frames.budget_frame(c, run_id), run_id)

    # -- recordings (replay runner, cassette export) ---------------------------------------
    def latest_recording(
        self, *, phase: str, input_hash: str, workflow: str
    ) -> RecordingRow | None:
        """The newest succeeded attempt of ``phase`` with ``input_hash``, ``workflow``'s first."""
        return self._read(
            lambda c: recordings.latest_recording(
                c, phase=phase, input_hash=input_hash, workflow=workflow
            )
        )

    def run_recordings(self, run_id: str) -> list[RecordingRow]:
        """The succeeded and reused attempts of a run and its children, in journal order."""
        return self._read(lambda c: recordings.run_recordings(c, run_id), run_id)

    # -- workflow library cache ------------------------------------------------------------
    def library_copy(self, url: str) -> LibraryCopy | None:
        """The library cache's copy of ``url`` (an index or a workflow source), if any."""
        from . import library_cache

        return self._read(lambda c: library_cache.library_copy(c, url))

    def keep_library_copy(self, copy: LibraryCopy) -> None:
        """Write a fetched, verified copy into the library cache (over an older one)."""
        from . import library_cache

        self._write(lambda c: library_cache.keep_library_copy_txn(c, copy))

    # -- resume of one loop (drive/resume.py) ----------------------------------------------
    def loop_context(self, run_id: str, step_id: str, loop: int) -> resume.LoopContext:
        """The context hash recorded for a loop of a map step, and whether it is mixed."""
        return self._read(lambda c: resume.loop_context(c, run_id, step_id, loop), run_id)

    def record_loop_context(
        self, run_id: str, step_id: str, *, loop: int, context_hash: str | None
    ) -> str:
        """Record the context a loop of a map step dispatches under (see store/resume.py)."""
        return self._write(
            lambda c: resume.record_loop_context_txn(
                c, run_id, step_id, loop=loop, context_hash=context_hash
            ),
            run_id,
        )

    def loop_outputs(
        self, run_id: str, step_id: str, loop: int, *, grouped: bool = False
    ) -> resume.LoopOutputs:
        """The succeeded outputs of a loop's units as two JSON arrays (``grouped``: newest)."""
        return self._read(
            lambda c: resume.loop_outputs(c, run_id, step_id, loop, grouped=grouped), run_id
        )

    def done_outputs_of_units(
        self, run_id: str, unit_ids: list[str]
    ) -> dict[str, dict[str, str | None]]:
        """unit_id → input_hash → output JSON of its succeeded attempts, for a few units."""
        return self._read(lambda c: resume.done_outputs_of_units(c, run_id, unit_ids), run_id)

    # -- run views (display.py) ------------------------------------------------------------
    def run_tally(self, run_id: str) -> summary.RunTally:
        """Per-step unit and token counts, gate verdicts and reuse of a run, counted in SQL."""
        return self._read(lambda c: summary.run_tally(c, run_id), run_id)
