"""A one-unit sweep cell's statements, counted (never timed) through bench/statements.py's
hook: N and 2N cells subtracted, every SQLite connection's statements (writer and readers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bench.statements import per_n, sweep_run

CELLS = 128
"""One start batch per 128 cells: N and 2N cells start in one and two batches."""
MOST_PER_CELL = 12.1
"""Statements per one-unit cell: the 12 each cell writes and reads, and its share of its
batch's start (36 before cells started in batches)."""


def test_a_one_unit_cell_costs_one_transaction_and_one_read(tmp_path: Path) -> None:
    states: Iterator[Path] = iter([tmp_path / "n", tmp_path / "2n"])
    counted = per_n(lambda: str(next(states)), CELLS, sweep_run, readers=True, unit="cell")
    per_cell = {k: round(v) for k, v in counted["by_statement"].items() if v >= 0.5}
    assert per_cell == {
        "BEGIN": 1,  # the reservation, carrying the cell before's finish, step and status
        "COMMIT": 1,
        "INSERT attempts": 1,
        "INSERT inputs": 1,
        "INSERT sweep_charges": 1,  # recorded on condition that the sweep has no ceiling
        "UPDATE attempts": 1,  # the finish
        "UPDATE steps": 1,
        "UPDATE runs": 1,
        "INSERT event_log": 1,  # step_status and run_status in one insert
        "UPDATE journal_seq": 2,  # the reservation's; the finish's and the two events' in one
        "SELECT": 1,  # the reuse lookup (the run was locked before its insert: no view)
    }, counted["by_statement"]
    # What a batch of starts costs (runs, steps, events, cell links: nine statements for
    # 128 cells) is all that is left, a fraction of a statement per cell.
    assert counted["statements_per_cell"] <= MOST_PER_CELL, counted
