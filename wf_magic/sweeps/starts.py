"""Starts a sweep's owed cells in batches: one transaction inserts a batch's fresh runs,
each locked by this driver before it exists, so its drive reads nothing to find it fresh."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections.abc import Mapping
from typing import Any

from .. import lifecycle
from ..drive.budget import SharedBudget
from ..drive.root import FreshRun
from ..errors import RunLockHeld, StateDBError
from ..sealing import unseal
from ..spec.workflow import Workflow
from ..store import Store
from ..store.cellstarts import CellStart
from ..store.sweeps import SweepCellRow, SweepRow

START_BATCH = 128
"""Cells whose fresh runs one transaction starts (one at a time under a sweep ceiling); on
SQLite their lock files are held open from their start to their drive's end."""


class CellStarts:
    """Starts the owed cells that have no run yet in batches, in the order they are driven:
    one transaction inserts a batch's fresh runs (``Store.start_cells``); a cell whose scope
    has a run already is left to a start of its own (``lifecycle.start``).

    On SQLite each fresh run is locked before its insert and handed locked to its cell's
    drive (``FreshRun``): nobody can have driven it meanwhile, so the drive knows its run,
    its pending steps and its empty journal without a read. On PostgreSQL a lease is a row
    of the run, so the drive takes it and reads the run as for any run.
    """

    def __init__(
        self,
        store: Store,
        sweep: SweepRow,
        wf: Workflow,
        owed: list[SweepCellRow],
        shared: SharedBudget,
        *,
        secrets: Mapping[str, Any],
    ):
        self.store, self.sweep, self.wf, self.shared = store, sweep, wf, shared
        self.secrets = secrets
        self.unstarted = [c for c in owed if c.run_id is None]
        self.position = {c.cell_index: i for i, c in enumerate(self.unstarted)}
        self.batch_of: dict[int, threading.Event] = {}
        """Cell index → set once its batch's start has committed (or failed)."""
        self.fresh: dict[int, FreshRun] = {}
        self.lock = threading.Lock()

    def fresh_run(self, cell: SweepCellRow) -> FreshRun | None:
        """The fresh run started for ``cell`` (its batch started first when it is not yet);
        None when the cell has a run already or is left to a start of its own."""
        if cell.run_id is not None:
            return None
        with self.lock:
            done = self.batch_of.get(cell.cell_index)
            batch: list[SweepCellRow] = []
            if done is None:  # this thread starts the batch; the others wait for it
                first = self.position[cell.cell_index]
                rest = (c for c in self.unstarted[first:] if c.cell_index not in self.batch_of)
                batch = list(itertools.islice(rest, self._size()))
                done = threading.Event()
                self.batch_of.update((c.cell_index, done) for c in batch)
        if batch:
            try:
                self._start_batch(batch)
            finally:
                done.set()
        done.wait()
        with self.lock:
            return self.fresh.pop(cell.cell_index, None)

    def take_back(self) -> None:
        """Delete the started runs no cell was driven with (the sweep stopped first), each
        under its lock (a run another driver of the sweep took is left to it)."""
        with self.lock, contextlib.ExitStack() as held:
            idle = []
            for fresh in self.fresh.values():
                lock = fresh.lock
                if lock is None:
                    try:
                        lock = self.store.run_lock(fresh.run.run_id).acquire()
                    except RunLockHeld:
                        continue
                held.callback(lock.release)
                idle.append(fresh.run.run_id)
            self.fresh.clear()
            # A state DB that fails now leaves them as runs owed (a resume drives them); the
            # locks go back in any case.
            with contextlib.suppress(StateDBError):
                self.store.unstart_cells(self.sweep.sweep_id, idle)

    def _size(self) -> int:
        shared = self.shared
        if (shared.max_units, shared.max_tokens, shared.max_cost) != (None, None, None):
            # Under a ceiling each cell starts when it is driven: a sweep stopped by it
            # leaves no run that was never driven (its owed cells stay without one).
            return 1
        return START_BATCH

    def _start_batch(self, batch: list[SweepCellRow]) -> None:
        sweep_id = self.sweep.sweep_id
        planned = lifecycle.cell_starts(
            self.store,
            self.wf,
            [
                # A cell stores its secret params as seals: its run starts from the values
                # (and seals them again, to the same seals, under the state dir's key).
                (c.cell_index, unseal(json.loads(c.params_json), self.secrets, run_id=sweep_id))
                for c in batch
            ],
        )
        with contextlib.ExitStack() as held:
            locks = {}
            if self.store.pg is None:  # a lock file needs no run row: taken before the insert
                for start in planned:
                    lock = self.store.run_lock(start.run.run_id).acquire()
                    held.callback(lock.release)
                    locks[start.cell_index] = lock
            started = set(self.store.start_cells(sweep_id, planned))
            fresh = {s.cell_index: _fresh(s, locks.get(s.cell_index)) for s in planned}
            for index, lock in locks.items():
                if index not in started:
                    lock.release()
            held.pop_all()  # the started runs' locks go to their drives
        with self.lock:
            self.fresh.update((i, f) for i, f in fresh.items() if i in started)


def _fresh(start: CellStart, lock: Any) -> FreshRun:
    return FreshRun(run=start.run, steps=start.step_rows(), lock=lock)
