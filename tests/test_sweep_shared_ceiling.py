"""Two drivers of one sweep (two ``wf sweep`` processes of one definition, or a sweep and its
``wf sweep-resume``) share its ceiling exactly: ``--max-units 13`` is 13 charged units however
many processes take cells, counted in each reservation's transaction."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.backends import pg_state_of
from tests.conftest import db_rows, spawn_wf, wait_for

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

CELLS = 40
FLOW = """
name: shared-ceiling
params:
  i: {type: integer}
runner: scripted
runners:
  scripted:
    rules:
      - {match: ".*", reply: "ok", tokens_in: 2, tokens_out: 1, sleep_s: 0.3}
steps:
  - id: one
    prompt: "cell {{ params.i }}"
  - id: two
    prompt: "again {{ params.i }}: {{ steps.one.output }}"
"""


def _files(tmp_path: Path) -> tuple[Path, Path]:
    flow = tmp_path / "flow.yaml"
    flow.write_text(FLOW)
    rows = tmp_path / "rows.csv"
    rows.write_text("i\n" + "".join(f"{i}\n" for i in range(CELLS)))
    return flow, rows


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _paid(state: Path) -> tuple[int, int]:
    """(units the sweep paid, charged attempts in the whole journal), as another process
    reads them."""
    if pg_state_of(state) is None and not (state / "state.db").exists():
        return 0, 0
    try:
        charges = db_rows(state, "SELECT COUNT(*) FROM sweep_charges")
        charged = db_rows(state, "SELECT COUNT(*) FROM attempts WHERE charged = 1")
    except sqlite3.OperationalError:  # tables not created yet
        return 0, 0
    return int(charges[0][0]), int(charged[0][0])  # type: ignore[call-overload]


@pytest.mark.parametrize("ceiling", [1, 13, 29])
def test_two_wf_sweep_processes_of_one_definition_share_max_units_exactly(
    state_dir: Path, tmp_path: Path, ceiling: int
) -> None:
    flow, rows = _files(tmp_path)
    args = ("sweep", str(flow), "--rows", str(rows), "--max-units", str(ceiling))
    # Both at once: they race to create the sweep, then for its cells and its units.
    procs = [spawn_wf(state_dir, *args, "--max-concurrency", "3", "--quiet") for _ in range(2)]
    results = [_finish(p) for p in procs]
    assert [code for code, _, _ in results] == [1, 1], results
    assert _paid(state_dir) == (ceiling, ceiling)
    for _, out, _ in results:
        assert f"sweep budget max_units reached (used {ceiling} of {ceiling})" in out, results


def test_a_sweep_and_its_sweep_resume_share_the_ceiling_exactly(
    state_dir: Path, tmp_path: Path
) -> None:
    flow, rows = _files(tmp_path)
    first = spawn_wf(
        state_dir, "sweep", str(flow), "--rows", str(rows), "--max-units", "17",
        "--max-concurrency", "1", "--quiet",
    )  # fmt: skip
    wait_for(lambda: _paid(state_dir)[0] >= 1, timeout=60, what="the sweep's first unit")
    sweep_id = str(db_rows(state_dir, "SELECT sweep_id FROM sweeps")[0][0])
    resume = spawn_wf(state_dir, "sweep-resume", sweep_id, "--max-concurrency", "2", "--quiet")
    results = [_finish(first), _finish(resume)]
    assert [code for code, _, _ in results] == [1, 1], results
    assert _paid(state_dir) == (17, 17)
