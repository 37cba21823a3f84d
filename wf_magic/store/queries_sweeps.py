"""The Store's named queries and writes over sweeps and their cells (mixin ``SweepQueries``)."""

from __future__ import annotations

from collections.abc import Sequence

from . import cellstarts, sweeps
from .access import StoreAccess
from .cellstarts import CellStart
from .sweeps import CellItemsRow, CellSpec, CellStepRow, SweepCellRow, SweepRow, SweepStatus


class SweepQueries(StoreAccess):
    """Sweeps: create one with its cells, find one, its cells' runs and use, status writes."""

    # -- reads -----------------------------------------------------------------------------
    def get_sweep(self, sweep_id: str) -> SweepRow | None:
        """The sweep ``sweep_id`` (None when there is none)."""
        return self._read(lambda c: sweeps.get_sweep(c, sweep_id))

    def sweep_by_key(self, key: str) -> SweepRow | None:
        """The sweep launched with ``key``, if any."""
        return self._read(lambda c: sweeps.sweep_by_key(c, key))

    def find_sweep_prefix(self, prefix: str, *, limit: int = 5) -> list[str]:
        """Sweep ids starting with ``prefix``."""
        return self._read(lambda c: sweeps.find_sweep_prefix(c, prefix, limit=limit))

    def list_sweeps(self) -> list[SweepRow]:
        """Every sweep, newest first."""
        return self._read(sweeps.list_sweeps)

    def sweep_cells(self, sweep_id: str) -> list[SweepCellRow]:
        """Every cell of a sweep, with its run and what this sweep paid for it."""
        return self._read(lambda c: sweeps.sweep_cells(c, sweep_id))

    def sweep_usage(self, sweep_id: str) -> tuple[int, int, float]:
        """(charged attempts, tokens, cost) this sweep paid (its ``sweep_charges``)."""
        return self._read(lambda c: sweeps.sweep_usage(c, sweep_id))

    def sweep_rescores(self, sweep_id: str) -> set[str]:
        """The sweep's cell runs with a score unit no attempt measured (all failed)."""
        return self._read(lambda c: sweeps.sweep_rescores(c, sweep_id))

    def sweep_flow(self, sweep_id: str) -> tuple[int, list[tuple[float, str]]]:
        """(attempts running in the sweep's cells, (at, data_json) of its throttle events)."""
        return self._read(lambda c: sweeps.sweep_flow(c, sweep_id))

    def sweep_cell_steps(self, sweep_id: str, step_ids: list[str]) -> list[CellStepRow]:
        """The rows of ``step_ids`` in every cell's run (the frame's gate columns)."""
        return self._read(lambda c: sweeps.sweep_cell_steps(c, sweep_id, step_ids))

    def sweep_cell_items(self, sweep_id: str, step_ids: list[str]) -> list[CellItemsRow]:
        """Per-item gate verdicts counted per cell and step (the frame's item columns)."""
        return self._read(lambda c: sweeps.sweep_cell_items(c, sweep_id, step_ids))

    # -- writes ----------------------------------------------------------------------------
    def create_sweep(self, row: SweepRow, cells: list[CellSpec]) -> None:
        """Insert a sweep and its cells in one transaction."""
        self._write(lambda c: sweeps.create_sweep_txn(c, row, cells))

    def start_cells(self, sweep_id: str, starts: Sequence[CellStart]) -> list[int]:
        """Insert the fresh runs of a batch of cells (those whose scope has no run) with
        their step rows, events and cell links, in one transaction; the cells started."""
        if not starts:
            return []
        return self._write(lambda c: cellstarts.start_cells_txn(c, sweep_id, starts))

    def unstart_cells(self, sweep_id: str, run_ids: Sequence[str]) -> None:
        """Delete batch-started runs of ``sweep_id`` never driven (no attempt), their cells
        unlinked, in one transaction."""
        if run_ids:
            self._write(lambda c: cellstarts.unstart_cells_txn(c, sweep_id, run_ids))

    def set_sweep_status(
        self,
        sweep_id: str,
        status: SweepStatus,
        reason: str | None,
        *,
        budget_json: str | None = None,
    ) -> None:
        """Write a sweep's status (and new ceilings, when given)."""
        self._write(lambda c: sweeps.set_sweep_status_txn(c, sweep_id, status, reason, budget_json))

    def set_cell_run(
        self, sweep_id: str, cell_index: int, run_id: str, *, note: str | None = None
    ) -> None:
        """Record the run a cell settled on."""
        self._write(lambda c: sweeps.set_cell_run_txn(c, sweep_id, cell_index, run_id, note))
