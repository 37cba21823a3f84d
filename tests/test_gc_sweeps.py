"""After ``wf gc`` deletes a sweep's cell runs, the sweep reads as what it is (issue 33 item 7):
its cells ``deleted`` (not ``pending``, which is a cell never run), the sweep ``deleted`` once
every cell's run is gone, and a reason naming how many went when only some did; in the
handle, its frame and grid, ``wf sweep-status``, ``wf sweeps`` and ``wf list``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from wf_magic import Engine

from .conftest import wf_inproc

pytestmark = pytest.mark.backends

WORKFLOW = """\
name: evalbench
params:
  k: {type: integer, default: 0}
runners:
  scripted:
    rules:
      - {match: "^cell 2!$", error: permanent}
steps:
  - id: say
    prompt: "cell {{ params.k }}!"
"""


def test_gc_of_every_cell_run_reads_deleted_everywhere(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    with Engine(state_dir) as engine:
        sweep = engine.sweep(WORKFLOW, grid={"k": [1, 2, 3, 4]})
        assert (sweep.status, sorted(c.status for c in sweep.cells())) == (
            "failed",
            ["completed", "completed", "completed", "failed"],
        )
        time.sleep(0.01)
        assert len(engine.gc(older_than_s=0)) == 4
        handle = engine.sweep_handle(sweep.sweep_id)
        assert handle.status == "deleted"
        assert handle.status_reason == "`wf gc` deleted the runs of all 4 cells"
        assert [c.status for c in handle.cells()] == ["deleted"] * 4
        assert list(handle.frame()["status"]) == ["deleted"] * 4
        assert "pending" not in handle._repr_html_() and " · deleted · 4 cells" in (
            handle._repr_html_()
        )
        assert repr(handle) == f"<Sweep {sweep.sweep_id} evalbench deleted (4 cells)>"
        assert list(engine.sweeps()["status"]) == ["deleted"]
    status = wf_inproc(capsys, state_dir, "sweep-status", sweep.sweep_id).stdout.splitlines()
    assert status[:3] == [
        f"sweep {sweep.sweep_id} evalbench: deleted · 4 cells",
        "  `wf gc` deleted the runs of all 4 cells",
        "  cells: 4 deleted",
    ]
    [line] = wf_inproc(capsys, state_dir, "sweeps").stdout.splitlines()
    assert line.split()[2:5] == ["deleted", "4", "cells"]
    listed = wf_inproc(capsys, state_dir, "list").stdout.splitlines()
    assert listed == [f"sweep {sweep.sweep_id} evalbench: 4 cells · 4 deleted"]
    cells = wf_inproc(capsys, state_dir, "list", "--sweep", sweep.sweep_id).stdout.splitlines()
    assert [line.split()[2] for line in cells] == ["deleted"] * 4
    assert sorted(line.rsplit("cell ", 1)[1] for line in cells) == ["0", "1", "2", "3"]


def test_gc_of_some_cell_runs_keeps_the_sweeps_status_and_names_them(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    with Engine(state_dir) as engine:
        sweep = engine.sweep(WORKFLOW, grid={"k": [1, 2, 3, 4]})
        time.sleep(0.01)
        assert len(engine.gc(older_than_s=0, statuses=["failed"])) == 1
        handle = engine.sweep_handle(sweep.sweep_id)
        assert handle.status == "failed"
        assert handle.status_reason == (
            "1 cell(s) failed, blocked or abandoned (first: cell 1); "
            "`wf gc` deleted the runs of 1 of its 4 cells"
        )
        assert list(handle.frame()["status"]) == ["completed", "deleted", "completed", "completed"]
    listed = wf_inproc(capsys, state_dir, "list").stdout.splitlines()
    assert listed == [f"sweep {sweep.sweep_id} evalbench: 4 cells · 3 completed · 1 deleted"]


def test_cells_never_run_stay_pending_beside_the_deleted_ones(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    with Engine(state_dir) as engine:
        sweep = engine.sweep(
            WORKFLOW.replace("^cell 2!$", "^never$"),
            grid={"k": [1, 2, 3, 4]},
            budget={"max_units": 2},
        )
        assert sweep.status == "stopped"
        time.sleep(0.01)
        assert len(engine.gc(older_than_s=0)) == 2
        handle = engine.sweep_handle(sweep.sweep_id)
        # The third cell's run started and met the ceiling (active); the fourth never started.
        assert [c.status for c in handle.cells()] == ["deleted", "deleted", "active", "pending"]
        assert handle.status == "stopped"
        assert (handle.status_reason or "").endswith("`wf gc` deleted the runs of 2 of its 4 cells")
    listed = wf_inproc(capsys, state_dir, "list").stdout.splitlines()
    assert listed == [
        f"sweep {sweep.sweep_id} evalbench: 4 cells · 1 active · 1 pending · 2 deleted"
    ]


def test_resuming_a_sweep_after_gc_settles_without_paying_its_deleted_cells_again(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    """A cell whose run gc deleted is owed nothing: a resume (or the same sweep run again)
    settles the sweep — never ``running`` with cells owed that no drive starts — and starts
    no run for it; what the deleted runs paid still counts."""
    with Engine(state_dir) as engine:
        sweep = engine.sweep(WORKFLOW, grid={"k": [1, 2, 3, 4]})
        paid = sweep.totals()
        time.sleep(0.01)
        assert len(engine.gc(older_than_s=0)) == 4
        again = engine.sweep_resume(sweep.sweep_id)
        assert (again.status, [c.status for c in again.cells()]) == ("deleted", ["deleted"] * 4)
        assert engine.list_runs() == []  # nothing driven again
        assert again.totals() == paid == {"units": 4, "tokens": paid["tokens"], "cost": 0.0}
        rerun = engine.sweep(WORKFLOW, grid={"k": [1, 2, 3, 4]})
        assert (rerun.sweep_id, rerun.status) == (sweep.sweep_id, "deleted")
        assert engine.list_runs() == []
    status = wf_inproc(capsys, state_dir, "sweep-status", sweep.sweep_id).stdout.splitlines()
    assert status[0] == f"sweep {sweep.sweep_id} evalbench: deleted · 4 cells"
    assert f"paid: 4 units, {paid['tokens']} tokens" in "\n".join(status)


def test_a_sweeps_ceiling_still_counts_what_runs_gc_deleted_had_paid(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    """gc deletes the cell runs' charges with them; the sweep keeps their totals, so a
    resume under the same ceiling spends nothing more (it spent past it before)."""
    source = WORKFLOW.replace("^cell 2!$", "^never$")
    with Engine(state_dir) as engine:
        sweep = engine.sweep(source, grid={"k": [1, 2, 3, 4]}, budget={"max_units": 2})
        assert sweep.status == "stopped" and sweep.totals()["units"] == 2
        time.sleep(0.01)
        assert len(engine.gc(older_than_s=0)) == 2
        resumed = engine.sweep_resume(sweep.sweep_id)
        assert resumed.totals()["units"] == 2
        assert resumed.status == "stopped"
        spent = db_units(engine)
        assert spent == 0  # the two deleted runs' units are gone; no new unit was paid
        wider = engine.sweep_resume(sweep.sweep_id, budget={"max_units": 3})
        assert wider.totals()["units"] == 3 and db_units(engine) == 1


def db_units(engine: Engine) -> int:
    """Charged attempts in the journal (the live runs' only)."""
    return sum(a.charged for r in engine.list_runs() for a in engine.attempts(r.run_id))
