"""The Store's named queries and writes over the journal: attempts, inputs, events, loops.

SQL in store/journal.py (writes) and store/journal_reads.py (reads) of attempts, inputs,
events and budget, and store/resume.py (a loop's recorded context and done outputs).
Deferred finishes (group commit) live with the connections in store/store.py.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from . import journal, journal_reads, resume, runs, sweeps
from .access import StoreAccess
from .journal import Finish, UnitKey
from .records import AttemptRow, BudgetUse, EventRow, RunRow, StepRow


class _SweepBounded(Exception):
    """A reservation found its sweep's ceilings set (its transaction rolls back)."""


class JournalQueries(StoreAccess):
    """Attempts and their inputs, events and budget use; reservations, finishes, verdicts."""

    _bounded_payers: set[str]
    """Sweeps seen with ceilings: their reservations count what fits first."""

    # -- reads -----------------------------------------------------------------------------
    def attempts_of(self, run_id: str, step_id: str | None = None) -> list[AttemptRow]:
        """A run's attempts (optionally of one step), in journal order."""
        if self._fresh(run_id):
            return []
        return self._read(lambda c: journal_reads.attempts_of(c, run_id, step_id), run_id)

    def done_outputs(self, run_id: str, step_id: str) -> dict[str, dict[str, Any]]:
        """unit_id → input_hash → output JSON of a step's newest succeeded/reused attempts."""
        if self._fresh(run_id):
            return {}
        return self._read(lambda c: journal_reads.done_outputs(c, run_id, step_id), run_id)

    def agent_facts(self, dispatch_id: str) -> dict[str, Any] | None:
        """The journaled facts of one agent attempt (None when it has none)."""
        text = self._read(lambda c: journal_reads.agent_facts(c, dispatch_id))
        return None if text is None else dict(json.loads(text))

    def agent_facts_of_run(self, run_id: str) -> dict[str, dict[str, Any]]:
        """dispatch id → facts of a run's agent attempts, in journal order."""
        rows = self._read(lambda c: journal_reads.agent_facts_of_run(c, run_id), run_id)
        return {dispatch_id: dict(json.loads(text)) for dispatch_id, text in rows}

    def attempts_of_units(self, run_id: str, unit_ids: Sequence[str]) -> list[AttemptRow]:
        """The attempts of the given units of a run, in journal order."""
        ids = list(unit_ids)
        if not ids or self._fresh(run_id):
            return []
        return self._read(lambda c: journal_reads.attempts_of_units(c, run_id, ids), run_id)

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
            lambda c: journal_reads.find_reusable(
                c,
                workflow=workflow,
                input_hash=input_hash,
                runner=runner,
                exclude_run_id=exclude_run_id,
                phase=phase,
                unit_id=unit_id,
            )
        )

    def find_reusable_many(
        self, *, workflow: str, input_hashes: Sequence[str], exclude_run_id: str
    ) -> dict[tuple[str, str], AttemptRow]:
        """``find_reusable`` for many work units in one read: (input_hash, runner) → source.

        The deferred writes commit first only when a finish of one of these inputs is among
        them (a sweep's last cell's is not, and stays for the next reservation).
        """
        return self._read(
            lambda c: journal_reads.find_reusable_many(
                c, workflow=workflow, input_hashes=input_hashes, exclude_run_id=exclude_run_id
            ),
            flush=self._defers_inputs(input_hashes),
        )

    def input_of(self, input_hash: str) -> dict[str, Any] | None:
        """The journaled (redacted) input of ``input_hash``; None when it was never recorded."""
        text = self._read(lambda c: journal_reads.input_of(c, input_hash))
        return None if text is None else dict(json.loads(text))

    def price_source_of(self, run_id: str, dispatch_id: str) -> str | None:
        """Where an attempt's cost came from (``genai-prices 0.2.3``, ``runners.x.prices``)."""
        return self._read(lambda c: journal_reads.price_source_of(c, run_id, dispatch_id), run_id)

    def inputs_of(self, input_hashes: set[str]) -> dict[str, str]:
        """The journaled inputs (JSON text) of the given hashes that have one."""
        return self._read(lambda c: journal_reads.inputs_of(c, input_hashes))

    def find_in_run(self, *, run_id: str, input_hash: str, unit_id: str) -> AttemptRow | None:
        """The newest succeeded/reused attempt of ``unit_id`` in ``run_id`` with that input."""
        return self._read(
            lambda c: journal_reads.find_in_run(
                c, run_id=run_id, input_hash=input_hash, unit_id=unit_id
            ),
            run_id,
        )

    def attempt_by_dispatch(self, dispatch_id: str) -> AttemptRow | None:
        """The attempt with ``dispatch_id`` (None when there is none, or it was gc'd)."""
        return self._read(lambda c: journal_reads.attempt_by_dispatch(c, dispatch_id))

    def budget_usage(self, root_run_id: str) -> tuple[int, int, float]:
        """(charged attempts, their tokens, their cost) over a root run and its descendants."""
        return self._read(lambda c: journal_reads.budget_usage(c, root_run_id), root_run_id)

    def budget_use(self, run_id: str) -> BudgetUse:
        """Charged use of ``run_id``'s root (and its descendants) against the root's ceilings.

        Raises:
            UsageError: no such run.
        """
        return self._read(lambda c: journal_reads.budget_use(c, run_id), run_id)

    def events_after(self, run_id: str, after_id: int = 0, limit: int = 10_000) -> list[EventRow]:
        """Events of ``run_id`` newer than ``after_id`` (watch/tail)."""
        return self._read(lambda c: journal_reads.events_after(c, run_id, after_id, limit), run_id)

    # -- writes ----------------------------------------------------------------------------
    def record_event(
        self,
        run_id: str,
        kind: str,
        *,
        step_id: str | None = None,
        unit_id: str | None = None,
        dispatch_id: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Append one event of its own (a drive's warning), its data redacted like the rest."""
        kept = self.scrubber.redactor(run_id).redact_value(data)
        self._write(
            lambda c: journal.append_event_txn(
                c,
                run_id,
                kind,
                step_id=step_id,
                unit_id=unit_id,
                dispatch_id=dispatch_id,
                data=kept,
            ),
            run_id,
        )

    def reserve_attempt(
        self, key: UnitKey, *, charged: bool, payer: str | None = None
    ) -> AttemptRow:
        """Insert a ``running`` attempt with a fresh dispatch_id (charged to sweep ``payer``
        too, when given)."""
        key = self.scrubber.key(key)

        def txn(conn: sqlite3.Connection) -> AttemptRow:
            row = journal.reserve_attempt_txn(conn, key, charged=charged)
            if payer is not None:
                sweeps.record_charges_txn(conn, payer, [row])
            return row

        return self._write(txn, key.run_id)

    def reserve_attempts(
        self, keys: Sequence[tuple[UnitKey, bool]], *, payer: str | None = None
    ) -> list[AttemptRow]:
        """Reserve several ``(key, charged)`` attempts in one transaction (a dispatch batch).

        Each unit is still reserved before it is dispatched: the batch is the units about to
        be handed to the executor together, and the transaction commits before any of them.
        ``payer``: the sweep paying the charged ones, recorded in the same transaction; only
        the first keys that fit its ceilings are reserved (fewer rows come back), counted in
        this transaction, so every driver of the sweep shares them exactly.
        """
        if not keys:
            return []
        keys = [(self.scrubber.key(key), charged) for key, charged in keys]
        run_id = keys[0][0].run_id

        def txn(conn: sqlite3.Connection) -> list[AttemptRow]:
            kept = keys if payer is None else keys[: sweeps.fitting_txn(conn, payer, keys)]
            rows = journal.reserve_attempts_txn(conn, kept) if kept else []
            if payer is not None:
                sweeps.record_charges_txn(conn, payer, rows)
            return rows

        def unbounded(conn: sqlite3.Connection) -> list[AttemptRow]:
            rows = journal.reserve_attempts_txn(conn, keys)
            if not sweeps.charge_if_unbounded_txn(conn, str(payer), rows):
                raise _SweepBounded  # rolled back: the sweep has ceilings now
            return rows

        if payer is not None and payer not in self._bounded_payers:
            # A sweep without ceilings reserves everything: its charges are recorded on
            # condition that it still has none (one statement, no read of its ceilings).
            try:
                return self._write(unbounded, run_id)
            except _SweepBounded:
                self._bounded_payers.add(payer)
        return self._write(txn, run_id)

    def finish_attempt(self, attempt: AttemptRow, finish: Finish) -> bool:
        """Finish a running attempt; False (nothing written) when it was already finished."""
        finish = self.scrubber.finish(attempt.run_id, finish)
        return self._write(lambda c: journal.finish_attempt_txn(c, attempt, finish), attempt.run_id)

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
        key, finish = self.scrubber.key(key), self.scrubber.finish(key.run_id, finish)
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
        *,
        check_run: Callable[[RunRow | None], None] | None = None,
    ) -> UnitKey:
        """Compare-and-set a person's verdict in one transaction.

        ``check_run(run_row)`` may refuse on the run's row first (raising); ``decide(step_row,
        latest_verdict)`` sees the step row and a lookup of the newest verdict of
        ``(unit_id, input_hash)``; it returns the key to journal, or raises to refuse
        (nothing is written). The verdict's texts (a person's feedback) are redacted.
        """

        def txn(conn: sqlite3.Connection) -> UnitKey:
            if check_run is not None:
                check_run(runs.get_run(conn, run_id))
            row = next((s for s in runs.steps_of(conn, run_id) if s.step_id == step_id), None)

            def latest(unit_id: str, input_hash: str) -> AttemptRow | None:
                return journal_reads.latest_verdict(
                    conn, run_id=run_id, unit_id=unit_id, input_hash=input_hash
                )

            key = self.scrubber.key(decide(row, latest))
            kept = self.scrubber.finish(run_id, finish)
            journal.record_terminal_attempt_txn(conn, key, kept, event="human_verdict")
            return key

        return self._write(txn, run_id)

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
        if self._fresh(run_id):
            return {}
        return self._read(lambda c: resume.done_outputs_of_units(c, run_id, unit_ids), run_id)
