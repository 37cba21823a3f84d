"""kill -9 a real ``wf sweep`` at random points, resume it with ``wf sweep-resume``: every cell
completes, each unit is charged once, and the frame equals an uninterrupted sweep's."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers_flow import REPO, kill9
from wf_magic import Engine

CELLS = 200
WORKFLOW = """
name: crash-sweep
params:
  i: {type: integer}
  style: {type: string}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "long", reply: "long answer", tokens_in: 7, tokens_out: 5, sleep_s: 0.004}
      - {match: ".*", reply: "short answer", tokens_in: 2, tokens_out: 1, sleep_s: 0.004}
steps:
  - id: draft
    prompt: "{{ params.style }} {{ params.i }}"
  - id: score
    prompt: "score {{ params.style }} {{ params.i }}: {{ steps.draft.output }}"
"""
COMPARED = ["style", "row", "repeat", "status", "result", "tokens_paid", "tokens_original"]


def _wf(state: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "wf_magic.cli", "--db", str(state), *args, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        cwd=str(REPO),
    )


def _completed_runs(state: Path) -> int:
    db = state / "state.db"
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return int(
            conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'completed'").fetchone()[0]
        )
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def _kill_when(proc: subprocess.Popen[bytes], state: Path, completed: int) -> bool:
    """SIGKILL ``proc`` once ``completed`` runs are; False when it finished first."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if _completed_runs(state) >= completed:
            kill9(proc)
            proc.communicate()
            return True
        time.sleep(0.005)
    raise AssertionError("the sweep made no progress")


@pytest.mark.parametrize("seed", [1, 2])
def test_kill9_mid_sweep_then_resume_matches_an_uninterrupted_sweep(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    wf_file = tmp_path / "w.yaml"
    wf_file.write_text(WORKFLOW)
    rows = tmp_path / "rows.csv"
    rows.write_text("i\n" + "".join(f"{i}\n" for i in range(CELLS // 2)))
    sweep_args = [
        "sweep",
        str(wf_file),
        "--grid",
        "style=terse,long",
        "--rows",
        str(rows),
        "--max-concurrency",
        "4",
    ]
    state = tmp_path / "killed"
    kills = 0
    points = sorted(rng.sample(range(5, CELLS - 5), 3))
    proc = _wf(state, *sweep_args)
    for point in points:
        if _kill_when(proc, state, point):
            kills += 1
        else:
            proc.communicate()
        with Engine(state) as engine:
            sweep_id = engine.sweeps()["sweep_id"].iloc[0]
        proc = _wf(state, "sweep-resume", sweep_id, "--max-concurrency", "4")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert kills >= 2
    reference = tmp_path / "reference"
    with Engine(reference) as engine:
        want = engine.sweep(
            wf_file,
            grid={"style": ["terse", "long"]},
            rows=rows,
            max_concurrency=4,
            values_from_strings=True,
        )
        want_frame, want_totals = want.frame(), want.totals()
    with Engine(state) as engine:
        got = engine.sweep_handle(sweep_id)
        assert got.sweep_id == want.sweep_id  # the same definition, the same identity
        got_frame, got_totals = got.frame(), got.totals()
        owed = [
            (r.run_id, r.status, r.status_reason)
            for r in engine.list_runs()
            if r.status != "completed"
        ]
        assert got.status == "completed", (got.status_reason, owed)
    assert got_frame[COMPARED].to_dict("records") == want_frame[COMPARED].to_dict("records")
    assert (
        got_totals
        == want_totals
        == {"units": 2 * CELLS, "tokens": 2 * (50 * 3 + 50 * 12) * 2, "cost": 0.0}
    )
    conn = sqlite3.connect(state / "state.db")
    try:
        per_unit = conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT run_id || '/' || unit_id) FROM attempts"
            " WHERE charged = 1"
        ).fetchone()
        runs = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    finally:
        conn.close()
    assert per_unit == (2 * CELLS, 2 * CELLS)  # each unit charged once
    assert runs == CELLS
