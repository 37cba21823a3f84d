"""The Store's named queries and writes over runs and steps (SQL in store/runs.py)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from . import listing, runs, sweeps
from .access import StoreAccess
from .cellstarts import Event
from .listing import RunListing
from .records import RunRow, RunStatus, ScopeChoice, StepRow, StepStatus
from .runs import LaunchKey


class RunQueries(StoreAccess):
    """Runs and their steps: find, list, create (once per scope or child), status writes, gc."""

    # -- reads -----------------------------------------------------------------------------
    def get_run(self, run_id: str) -> RunRow | None:
        """The run row of ``run_id`` (None when there is none)."""
        return self._read(lambda c: runs.get_run(c, run_id), run_id)

    def find_run_prefix(self, prefix: str, *, limit: int = 5) -> list[str]:
        """Run ids starting with ``prefix`` (close matches for a mistyped id)."""
        return self._read(lambda c: runs.find_run_prefix(c, prefix, limit=limit))

    def latest_of_workflow(self, workflow: str) -> str | None:
        """The id of the newest root run of ``workflow`` (a workflow name), if any."""
        return self._read(lambda c: runs.latest_of_workflow(c, workflow))

    def superseded_by(self, run_id: str) -> str | None:
        """The run that superseded the failed run ``run_id`` (it kept its failure), if any."""
        return self._read(lambda c: runs.superseded_by(c, run_id), run_id)

    def latest_in_scope(self, scope_key: str, *, owner: str | None = None) -> RunRow | None:
        """The newest root run of a scope (``owner``: that user's or nobody's)."""
        return self._read(lambda c: runs.latest_in_scope(c, scope_key, owner=owner))

    def list_runs(
        self, *, include_children: bool = False, limit: int | None = None, owner: str | None = None
    ) -> list[RunRow]:
        """Runs, newest first; ``owner``: only that user's runs and nobody's."""
        return self._read(
            lambda c: runs.list_runs(c, include_children=include_children, limit=limit, owner=owner)
        )

    def run_listing(
        self,
        *,
        limit: int | None,
        include_children: bool = False,
        group_sweeps: bool = True,
        owner: str | None = None,
    ) -> RunListing:
        """The newest ``limit`` runs (None: all), each sweep's cells as one entry with
        ``group_sweeps``, and how many there are in all (``wf list``, ``%workflow list``)."""
        return self._read(
            lambda c: listing.run_listing(
                c,
                limit=limit,
                include_children=include_children,
                group_sweeps=group_sweeps,
                owner=owner,
            )
        )

    def cell_listing(self, sweep_id: str, *, limit: int | None) -> RunListing:
        """The newest ``limit`` cells of a sweep (None: all), and how many it has."""
        return self._read(lambda c: listing.cell_listing(c, sweep_id, limit=limit))

    def sweep_cell_counts(self, sweep_id: str) -> tuple[tuple[str, int], ...]:
        """A sweep's cells counted by status (``pending``: no run yet; ``deleted``: its run
        was deleted by ``wf gc``), in ``listing.CELL_STATUSES`` order."""
        return self._read(lambda c: listing.sweep_cell_counts(c, [sweep_id])).get(sweep_id, ())

    def child_run(self, parent_run_id: str, invocation_key: str) -> RunRow | None:
        """The child run a parent published for one invocation."""
        return self._read(lambda c: runs.child_run(c, parent_run_id, invocation_key))

    def child_runs(self, parent_run_id: str) -> list[RunRow]:
        """The child runs a run published (its direct children), oldest first."""
        return self._read(lambda c: runs.child_runs(c, parent_run_id), parent_run_id)

    def steps_of(self, run_id: str) -> list[StepRow]:
        """A run's step rows in plan order."""
        return self._read(lambda c: runs.steps_of(c, run_id), run_id)

    def is_stop_requested(self, run_id: str) -> bool:
        """Whether someone asked the run's driver to stop."""
        if self._fresh_stop_answer(run_id):
            return False
        return self._read(lambda c: runs.is_stop_requested(c, run_id), run_id)

    def drive_view(self, run_id: str) -> tuple[RunRow | None, list[StepRow], bool]:
        """(the run, its step rows, whether it has any attempt) in one read."""
        return self._read(lambda c: runs.drive_view(c, run_id), run_id)

    def descendants(self, run_id: str) -> list[RunRow]:
        """Every run below ``run_id`` (children, their children, ...), oldest first."""
        return self._read(lambda c: runs.descendants(c, run_id), run_id)

    def finished_runs_before(self, cutoff: float) -> list[str]:
        """Finished root runs older than ``cutoff`` (gc candidates)."""
        return self._read(lambda c: runs.finished_runs_before(c, cutoff))

    # -- writes ----------------------------------------------------------------------------
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
        shared_plan: bool = False,
        cell: tuple[str, int] | None = None,
    ) -> RunRow:
        """Find the scope's run or insert ``row``, as one atomic step; returns the run kept.

        ``shared_plan``: a new row keeps its plan once per hash in ``plans`` (a sweep cell's).
        ``cell``: (sweep id, cell index) of the sweep cell whose run this is, recorded in the
        same transaction (a killed sweep never finds a run its cell does not name).

        ``decide(latest)`` sees the newest root run of ``row.scope_key`` that ``row.owner`` may
        change (theirs or nobody's; any owner's when ``row.owner`` is None) inside the write
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
            choice = decide(runs.latest_in_scope(conn, row.scope_key, owner=row.owner))
            kept = choice.keep
            if kept is None:
                runs.create_run_txn(
                    conn, row, steps, supersede=choice.supersede, shared_plan=shared_plan
                )
                kept = row
            if launch_key is not None:
                runs.insert_launch_key_txn(conn, launch_key, kept)
            if cell is not None:
                sweeps.set_cell_run_txn(conn, *cell, kept.run_id, None)
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
        """Write a run's status (with its ``run_status`` event), its texts redacted."""
        self._write_run_status(run_id, status, reason, result_json, time.time())

    def run_with_status(
        self,
        run: RunRow,
        status: RunStatus,
        *,
        reason: str | None = None,
        result_json: str | None = None,
        defer: bool = False,
    ) -> RunRow:
        """``set_run_status`` of ``run``'s row; returns the row as it now reads, unread.

        ``defer``: written with the next write transaction, after the finishes deferred
        before it (``Store.defer_write``): a sweep cell's last step, its run's status and
        its unit's finish commit together.
        """
        now = time.time()
        if defer:
            reason = self.scrubber.text(run.run_id, reason)
            result_json = self.scrubber.json_text(run.run_id, result_json)
            run_id, kept_reason, kept_result = run.run_id, reason, result_json
            self._defer_write(
                run_id,
                lambda c: runs.update_run_status_txn(
                    c, run_id, status, reason=kept_reason, result_json=kept_result, now=now
                ),
                [Event(run_id, "run_status", now, {"status": status, "reason": reason})],
            )
        else:
            reason, result_json = self._write_run_status(
                run.run_id, status, reason, result_json, now
            )
        return replace(
            run,
            status=status,
            status_reason=reason,
            result_json=run.result_json if result_json is None else result_json,
            updated_at=now,
            finished_at=now if status in runs.FINISHED_STATUSES else None,
        )

    def _write_run_status(
        self,
        run_id: str,
        status: RunStatus,
        reason: str | None,
        result_json: str | None,
        now: float,
    ) -> tuple[str | None, str | None]:
        """Write the status stamped ``now``; the reason and result as written (redacted)."""
        reason = self.scrubber.text(run_id, reason)
        result_json = self.scrubber.json_text(run_id, result_json)
        self._write(
            lambda c: runs.set_run_status_txn(
                c, run_id, status, reason=reason, result_json=result_json, now=now
            ),
            run_id,
        )
        return reason, result_json

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
        defer: bool = False,
    ) -> None:
        """Write a step's state (the spine is the only caller), its texts redacted.

        ``defer``: with the next write transaction (``Store.defer_write``).
        """
        note = self.scrubber.text(run_id, note)
        output_json = self.scrubber.json_text(run_id, output_json)
        if defer:
            now = time.time()
            self._defer_write(
                run_id,
                lambda c: runs.update_step_txn(
                    c,
                    run_id,
                    step_id,
                    status=status,
                    loop=loop,
                    note=note,
                    output_json=output_json,
                    stops_run=stops_run,
                    now=now,
                ),
                [
                    Event(
                        run_id,
                        "step_status",
                        now,
                        {"status": status, "loop": loop, "note": note},
                        step_id=step_id,
                    )
                ],
            )
            return
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

    def abandon_tree(self, run_id: str, *, reason: str) -> list[str]:
        """Abandon ``run_id`` and its unfinished descendants in one transaction (statuses
        re-read inside it); returns the run ids abandoned."""
        return self._write(lambda c: runs.abandon_tree_txn(c, run_id, reason=reason), run_id)

    def adopt_run(self, run_id: str, *, adopter: str, previous: str | None) -> list[str]:
        """Make ``adopter`` the owner of ``run_id`` (and of the runs below it ``previous`` or
        nobody owned), journaling ``run_adopted`` for each, in one transaction; returns the
        run ids adopted (empty: ``run_id``'s owner was no longer ``previous``)."""
        return self._write(
            lambda c: runs.adopt_tree_txn(c, run_id, adopter=adopter, previous=previous), run_id
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
