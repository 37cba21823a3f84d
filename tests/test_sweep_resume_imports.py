"""``wf sweep-resume`` drives cells whose python steps import a helper module beside the
workflow file exactly as ``wf sweep`` did, and the sweep frame's columns keep one dtype
whether a sweep ran uninterrupted or was stopped and resumed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_wf
from wf_magic import Engine

HELPERS = """
def double(n):
    return {"doubled": 2 * int(n)}
"""

FLOW = """
name: imports-sweep
params:
  n: {type: integer, default: 0}
runner: scripted
runners:
  scripted:
    rules:
      - {match: ".*", reply: "ok", tokens_in: 2, tokens_out: 1}
steps:
  - id: ask
    prompt: "n is {{ params.n }}"
  - id: calc
    python: sweep_kill_helpers:double
    with: {n: "{{ params.n }}"}
"""


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "sweep_kill_helpers.py").write_text(HELPERS)
    (folder / "flow.yaml").write_text(FLOW)
    return folder


def test_sweep_resume_imports_the_helper_module_beside_the_workflow(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = tmp_path / "state"
    started = run_wf(
        state,
        "sweep",
        str(folder / "flow.yaml"),
        "--grid",
        "n=1,2,3,4",
        "--max-units",
        "2",
        "--quiet",
        cwd=elsewhere,
    )
    assert started.returncode == 1, started.stderr  # stopped on its ceiling
    assert "sweep budget max_units reached" in started.stdout
    sweep_id = started.stdout.split()[1]
    # A fresh process in another folder: only the sweep's record says where the helpers are.
    resumed = run_wf(state, "sweep-resume", sweep_id, "--max-units", "10", "--quiet", cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "cannot import" not in resumed.stderr
    frame = json.loads(run_wf(state, "sweep-frame", sweep_id, "--format", "json").stdout)
    assert [r["status"] for r in frame] == ["completed"] * 4
    assert [r["doubled"] for r in frame] == [2, 4, 6, 8]


def test_the_frame_has_one_dtype_per_column_whether_resumed_or_not(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    grid = {"n": ["1", "2", "3"]}
    with Engine(tmp_path / "straight") as engine:
        straight = engine.sweep(folder / "flow.yaml", grid=grid, values_from_strings=True)
        assert straight.status == "completed"
        want = straight.frame()
    with Engine(tmp_path / "resumed") as engine:
        stopped = engine.sweep(
            folder / "flow.yaml", grid=grid, values_from_strings=True, budget={"max_units": 1}
        )
        assert stopped.status == "stopped"
        partial = stopped.frame()
        resumed = engine.sweep_resume(stopped.sweep_id, budget={"max_units": 10})
        assert resumed.status == "completed"
        got = resumed.frame()
    assert dict(got.dtypes) == dict(want.dtypes)
    for column in ("tokens_paid", "tokens_original", "cost_paid", "cost_original"):
        assert partial[column].dtype == want[column].dtype, column
    assert str(want["cost_paid"].dtype) == "float64"
    assert str(want["tokens_paid"].dtype) == "int64"
