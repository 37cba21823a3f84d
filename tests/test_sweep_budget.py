"""One budget over a sweep: a unit is not dispatched when it would pass the sweep's ceiling,
whichever cell it belongs to; the sweep stops (status ``stopped``, a reason naming the
ceiling); a plain resume dispatches nothing more and a new ceiling is set explicitly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from wf_magic import Engine

ONE_UNIT = """
name: cells
params:
  i: {type: integer}
runner: scripted
runners:
  scripted:
    rules:
      - {match: ".*", reply: "done", tokens_in: 6, tokens_out: 4, sleep_s: SLEEP}
steps:
  - id: only
    prompt: "cell {{ params.i }}"
"""

MAP_CELL = """
name: map-cells
params:
  i: {type: integer}
runner: scripted
runners:
  scripted:
    rules:
      - {match: ".*", reply: "ok", tokens_in: 1, tokens_out: 1}
steps:
  - id: each
    map: "{{ [1, 2, 3] }}"
    prompt: "cell {{ params.i }} item {{ item }}"
"""


def one_unit(sleep_s: float = 0.0) -> str:
    return ONE_UNIT.replace("SLEEP", str(sleep_s))


def charged(state: Path) -> list[tuple[str, str, int]]:
    """(run, unit, attempt) of every charged attempt."""
    conn = sqlite3.connect(state / "state.db")
    try:
        rows = conn.execute(
            "SELECT run_id, unit_id, attempt FROM attempts WHERE charged = 1"
        ).fetchall()
    finally:
        conn.close()
    return [tuple(r) for r in rows]


def test_max_units_stops_the_sweep_at_exactly_the_ceiling_and_resumes_explicitly(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(one_unit(), grid={"i": list(range(12))}, budget={"max_units": 7})
        assert sweep.status == "stopped"
        assert sweep.status_reason == (
            f"sweep budget max_units reached (used 7 of 7); 5 cell(s) owed; `wf sweep-resume "
            f"{sweep.sweep_id} --max-units N` sets a new ceiling"
        )
        assert len(charged(state)) == 7
        frame = sweep.frame()
        assert frame["status"].tolist()[:7] == ["completed"] * 7
        assert set(frame["status"].tolist()[7:]) <= {"active", "pending"}
        # A plain resume keeps the ceiling: nothing more is dispatched.
        assert engine.sweep_resume(sweep.sweep_id).status == "stopped"
        assert len(charged(state)) == 7
        # The same definition through engine.sweep without a budget keeps it too.
        assert engine.sweep(one_unit(), grid={"i": list(range(12))}).status == "stopped"
        assert len(charged(state)) == 7
        # A new ceiling is set explicitly and counts what the sweep already paid.
        assert engine.sweep_resume(sweep.sweep_id, budget={"max_units": 10}).status == "stopped"
        assert len(charged(state)) == 10
        done = engine.sweep_resume(sweep.sweep_id, budget={"max_units": 100})
        assert done.status == "completed" and done.status_reason is None
        assert len(charged(state)) == 12
        assert done.budget == {"max_units": 100}
        assert done.totals() == {"units": 12, "tokens": 120, "cost": 0.0}


def test_a_ceiling_mid_cell_leaves_that_cell_owed_and_charges_each_unit_once(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(MAP_CELL, grid={"i": [0, 1, 2, 3]}, budget={"max_units": 5})
        assert sweep.status == "stopped" and len(charged(state)) == 5
        assert sweep.frame()["status"].tolist() == ["completed", "active", "pending", "pending"]
        done = engine.sweep_resume(sweep.sweep_id, budget={"max_units": 12})
        assert done.status == "completed"
        rows = charged(state)
        assert len(rows) == 12 and len(set(rows)) == 12
        assert {attempt for _, _, attempt in rows} == {1}


def test_max_tokens_stops_within_the_units_in_flight_across_concurrent_cells(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    concurrency = 4
    with Engine(state) as engine:
        sweep = engine.sweep(
            one_unit(0.05),
            grid={"i": list(range(40))},
            budget={"max_tokens": 100},
            max_concurrency=concurrency,
        )
        assert sweep.status == "stopped"
        assert sweep.status_reason is not None
        assert sweep.status_reason.startswith("sweep budget max_tokens reached (used ")
        paid = sweep.totals()["tokens"]
        # At most the units in flight when the ceiling was reached overshoot it (10 each).
        assert 100 <= paid <= 100 + 10 * (concurrency - 1)
        before = len(charged(state))
        assert engine.sweep_resume(sweep.sweep_id, max_concurrency=concurrency).status == "stopped"
        assert len(charged(state)) == before
        again = engine.sweep_resume(
            sweep.sweep_id, budget={"max_tokens": 250}, max_concurrency=concurrency
        )
        assert 250 <= again.totals()["tokens"] <= 250 + 10 * (concurrency - 1)
        final = engine.sweep_resume(
            sweep.sweep_id, budget={"max_tokens": 10_000}, max_concurrency=concurrency
        )
        assert final.status == "completed"
        rows = charged(state)
        assert len(rows) == 40 and len(set(rows)) == 40


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_max_units_is_exact_whatever_the_concurrency(tmp_path: Path, concurrency: int) -> None:
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(
            one_unit(0.01),
            grid={"i": list(range(30))},
            budget={"max_units": 13},
            max_concurrency=concurrency,
        )
        assert sweep.status == "stopped"
        assert len(charged(state)) == 13
        assert engine.sweep_resume(sweep.sweep_id, max_concurrency=concurrency).status == "stopped"
        assert len(charged(state)) == 13


def test_a_zero_ceiling_dispatches_nothing(tmp_path: Path) -> None:
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(one_unit(), grid={"i": [1, 2]}, budget={"max_cost": 0})
        assert sweep.status == "stopped"
        assert sweep.status_reason is not None
        assert sweep.status_reason.startswith("sweep budget max_cost reached (used 0 of 0)")
        assert charged(state) == []


def test_each_cells_own_budget_still_holds(tmp_path: Path) -> None:
    source = MAP_CELL.replace("runner: scripted\n", "runner: scripted\nbudget: {max_units: 2}\n", 1)
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(source, grid={"i": [0, 1]}, budget={"max_units": 100})
        assert sweep.status == "failed"
        assert sweep.status_reason == ("2 cell(s) failed, blocked or abandoned (first: cell 0)")
        assert len(charged(state)) == 4
        assert sweep.frame()["status"].tolist() == ["failed", "failed"]


TWO_STEPS = """
name: two-steps
params:
  style: {type: string, default: a}
runner: scripted
runners:
  scripted:
    rules:
      - {match: ".*", reply: "ok", tokens_in: 3, tokens_out: 2}
steps:
  - id: first
    prompt: "First {{ params.style }}"
  - id: second
    prompt: "Second {{ params.style }} {{ steps.first.output }}"
"""


def test_overlapping_sweeps_each_count_only_what_they_paid(tmp_path: Path) -> None:
    """Sweep A stops with cell b half done; sweep B (cells b, c) finishes b's run. Each sweep
    counts the dispatches it paid for (``sweep_charges``): A's are not B's, and A's total
    never grows past its ceiling because another sweep drove one of its runs."""
    with Engine(tmp_path / "st") as engine:
        first = engine.sweep(TWO_STEPS, grid={"style": ["a", "b"]}, budget={"max_units": 3})
        assert first.status == "stopped"
        assert first.totals() == {"units": 3, "tokens": 15, "cost": 0.0}
        second = engine.sweep(TWO_STEPS, grid={"style": ["b", "c"]})
        assert second.status == "completed"
        b_run = first.frame()["run_id"].tolist()[1]
        assert second.frame()["run_id"].tolist()[0] == b_run  # the same run, finished by B
        assert second.totals() == {"units": 3, "tokens": 15, "cost": 0.0}
        again = engine.sweep_handle(first.sweep_id)
        assert again.totals() == {"units": 3, "tokens": 15, "cost": 0.0}
        assert again.frame()["tokens_paid"].tolist() == [10, 5]
        assert second.frame()["tokens_paid"].tolist() == [5, 10]
        # A resumed under a larger ceiling has nothing of b left to pay.
        resumed = engine.sweep_resume(first.sweep_id, budget={"max_units": 10})
        assert resumed.status == "completed"
        assert resumed.totals()["units"] == 3


def test_m015_backfills_the_charges_of_sweeps_made_before_it(tmp_path: Path) -> None:
    """A state DB from before ``sweep_charges``: the migration gives each charged attempt of a
    sweep's cells (since it was created) to the earliest sweep that counted it."""
    from wf_magic.store.migrations import MIGRATIONS, migration_ids

    m015_sweep_charges = MIGRATIONS[migration_ids().index("m015_sweep_charges")]

    with Engine(tmp_path / "st") as engine:
        first = engine.sweep(TWO_STEPS, grid={"style": ["a", "b"]}, budget={"max_units": 3})
        engine.sweep(TWO_STEPS, grid={"style": ["b", "c"]})
        db = engine.db_path
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("DROP TABLE sweep_charges")
        # m015 itself, as the ledger ran it on a database from before it (later migrations
        # have run here since; they did not touch what it reads).
        conn.execute("BEGIN IMMEDIATE")
        m015_sweep_charges(conn)
        conn.execute("COMMIT")
        rows = conn.execute(
            "SELECT sweep_id, COUNT(*) FROM sweep_charges GROUP BY sweep_id ORDER BY 2 DESC"
        ).fetchall()
    finally:
        conn.close()
    # The old rule gave the first sweep 4 (its b run was finished by the second); the second
    # sweep keeps only the attempts the first had not claimed.
    assert rows[0] == (first.sweep_id, 4)
    assert [count for _, count in rows] == [4, 2]
