"""Two drivers of one sweep (two ``wf sweep`` processes of one definition, or a sweep and its
``wf sweep-resume``) share its ceiling exactly: ``--max-units 13`` is 13 charged units however
many processes take cells, counted in each reservation's transaction."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import spawn_wf, wait_for

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


def _count(state: Path, sql: str) -> int:
    db = state / "state.db"
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return int(conn.execute(sql).fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _paid(state: Path) -> tuple[int, int]:
    """(units the sweep paid, charged attempts in the whole journal)."""
    return (
        _count(state, "SELECT COUNT(*) FROM sweep_charges"),
        _count(state, "SELECT COUNT(*) FROM attempts WHERE charged = 1"),
    )


@pytest.mark.parametrize("ceiling", [1, 13, 29])
def test_two_wf_sweep_processes_of_one_definition_share_max_units_exactly(
    tmp_path: Path, ceiling: int
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(FLOW)
    rows = tmp_path / "rows.csv"
    rows.write_text("i\n" + "".join(f"{i}\n" for i in range(CELLS)))
    state = tmp_path / "state"
    args = ("sweep", str(flow), "--rows", str(rows), "--max-units", str(ceiling))
    # Both at once: they race to create the sweep, then for its cells and its units.
    first = spawn_wf(state, *args, "--max-concurrency", "3", "--quiet")
    second = spawn_wf(state, *args, "--max-concurrency", "3", "--quiet")
    results = [_finish(first), _finish(second)]
    assert [code for code, _, _ in results] == [1, 1], results
    assert _paid(state) == (ceiling, ceiling)
    for _, out, _ in results:
        assert f"sweep budget max_units reached (used {ceiling} of {ceiling})" in out, out


def test_a_sweep_and_its_sweep_resume_share_the_ceiling_exactly(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(FLOW)
    rows = tmp_path / "rows.csv"
    rows.write_text("i\n" + "".join(f"{i}\n" for i in range(CELLS)))
    state = tmp_path / "state"
    first = spawn_wf(
        state, "sweep", str(flow), "--rows", str(rows), "--max-units", "17",
        "--max-concurrency", "1", "--quiet",
    )  # fmt: skip
    wait_for(lambda: _paid(state)[0] >= 1, timeout=60, what="the sweep's first unit")
    sweep_id = _sweep_id(state)
    resume = spawn_wf(state, "sweep-resume", sweep_id, "--max-concurrency", "2", "--quiet")
    results = [_finish(first), _finish(resume)]
    assert [code for code, _, _ in results] == [1, 1], results
    assert _paid(state) == (17, 17)


def _sweep_id(state: Path) -> str:
    conn = sqlite3.connect(f"file:{state / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        return str(conn.execute("SELECT sweep_id FROM sweeps").fetchone()[0])
    finally:
        conn.close()
