"""In real JupyterLab + headless Chromium, Approve in the run view completes a human-gate run."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from wf_magic import Engine

HERE = Path(__file__).resolve().parent
CHROMIUM = Path("/usr/bin/chromium")
MISSING = [
    name
    for name in ("playwright", "jupyterlab", "psutil")
    if importlib.util.find_spec(name) is None
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's /usr/bin/chromium (scripts/ci_browser.sh VENV installs it)",
    ),
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"needs {', '.join(MISSING)} in this venv "
        "(scripts/ci_browser.sh VENV installs them)",
    ),
]


def test_approve_in_the_browser_completes_a_blocked_human_gate_run(tmp_path: Path) -> None:
    from .jupyter_browser_check import check_notebook, jupyter_lab

    state = tmp_path / "home"  # conftest's WF_MAGIC_HOME: the kernel inherits it
    screenshot = tmp_path / "human_gate.png"
    started = time.monotonic()
    with jupyter_lab(HERE / "human_gate.ipynb") as url:
        check_notebook(
            url,
            "Approve",
            "Run completed.",
            screenshot,
            timeout_s=60,
            before="Waiting for your decision",
            feedback="Ship it from the browser.",
            reopen=True,  # the saved output is the static run view, not a dead widget
        )
    elapsed = time.monotonic() - started
    assert screenshot.exists()
    with Engine(state) as engine:
        (run,) = engine.list_runs()
        assert run.status == "completed"
        journal = engine.journal(run.run_id)
    human = journal[journal["runner"] == "human"]
    assert list(human["unit"]) == ["signoff.gate:l1"]
    steps = {s.step_id: s for s in engine.steps(run.run_id)}
    assert steps["signoff"].note == "gate passed at loop 1/1 (human): Ship it from the browser."
    assert elapsed < 120


def test_every_saved_run_view_reads_without_a_kernel(tmp_path: Path) -> None:
    """Completed, blocked, stopped, superseded and interrupted runs: saved, the kernel shut
    down and the notebook reopened, each view shows its run and none says "model not found";
    the blocked gate's panel (its widget state saved) shows no button or text box from its
    first paint, and says the decision needs a running kernel, naming the `wf` commands."""
    from .jupyter_browser_check import check_saved_views, jupyter_lab

    views = [
        "Run completed.",
        "Blocked: waiting on step",
        "stopped-tour",
        "superseded-tour",
        "interrupted-tour",
    ]
    with jupyter_lab(HERE / "saved_views.ipynb") as url:
        shown = check_saved_views(
            url,
            [*views, "Approve"],
            tmp_path / "saved_views.png",
            timeout_s=90,
            interrupt_when=("interrupted-tour", "driving…"),
            reopened_texts=[*views, "needs a running kernel"],
            panel_text="Waiting for your decision",
        )
    text = "\n".join(shown)
    assert "Error displaying widget" not in text
    assert "This decision needs a running kernel" in text
    assert "wf approve" in text and "wf reject" in text
    with Engine(tmp_path / "home") as engine:
        runs = {r.workflow: r.status for r in engine.list_runs()}
    assert runs["done-tour"] == "completed"
    assert runs["blocked-tour"] == "blocked"
    assert runs["stopped-tour"] == "active"
    assert runs["interrupted-tour"] == "active"


TOURS = sorted((HERE.parent.parent / "notebooks").glob("*.ipynb"))


def test_run_all_twice_in_one_kernel_on_every_tour(tmp_path: Path) -> None:
    """A teacher's day: each tour opened in JupyterLab, Run All, then Run All again in the
    same kernel; neither leaves an error, stderr, a traceback or an undriven run in any
    cell (the tours that reset their state folder in their first cell reopen it)."""
    from .jupyter_browser_check import check_run_all_twice, jupyter_lab

    assert len(TOURS) >= 6
    started = time.monotonic()
    sizes: dict[str, list[tuple[int, int]]] = {}
    companions = sorted((HERE.parent.parent / "notebooks").glob("*.jsonl"))  # 06's cassette
    with jupyter_lab(TOURS[0], [*TOURS[1:], *companions]) as url:  # state folders beside them
        timings = check_run_all_twice(
            url, [p.name for p in TOURS], tmp_path, timeout_s=120, sizes=sizes, reopen=True
        )
    assert list(timings) == [p.name for p in TOURS]
    assert time.monotonic() - started < 480, timings
    # Saved with its widget state, a tour run twice is at most 10 % larger than run once.
    print({name: passes for name, passes in sizes.items()})
    for name, ((once, models_once), (twice, models_twice)) in sizes.items():
        assert twice <= once * 1.10, (name, once, twice)
        assert models_twice <= models_once + 30, (name, models_once, models_twice)


def test_a_step_drill_down_spans_the_whole_row_of_the_step_table(tmp_path: Path) -> None:
    """Opened from its row's toggle, a step's drill-down (grid-area "auto / 1 / auto / -1") starts at
    the table's left edge and is as wide as the table, between its row and the next one,
    instead of squeezing into the first grid column."""
    from .jupyter_browser_check import check_drill_down, jupyter_lab

    with jupyter_lab(HERE / "drill_down.ipynb") as url:
        boxes = check_drill_down(url, "draft", tmp_path / "drill_down.png", timeout_s=60)
    grid, row, panel, next_row = (boxes[k] for k in ("grid", "row", "panel", "next_row"))
    assert abs(panel["x"] - grid["x"]) <= 2, boxes
    assert panel["width"] >= 0.95 * grid["width"], boxes
    assert panel["x"] + panel["width"] <= grid["x"] + grid["width"] + 2, boxes
    assert panel["y"] >= row["y"] + row["height"] - 1, boxes  # under its own row
    assert next_row["y"] >= panel["y"] + panel["height"] - 1, boxes  # the next row under it


def test_fork_from_here_in_the_browser_drives_the_fork_to_completion(tmp_path: Path) -> None:
    """A gate rejected on every loop blocks the run; Fork from here in its view starts a
    new run from the gated step, which is driven below the view until it completes (its
    gate passes this time); the blocked run is superseded by it."""
    from .jupyter_browser_check import check_notebook, jupyter_lab

    with jupyter_lab(HERE / "fork_from_here.ipynb") as url:
        shown = check_notebook(
            url,
            "Fork from here",
            "Run completed.",
            tmp_path / "fork_from_here.png",
            timeout_s=60,
            before="Gate exhausted",
        )
    with Engine(tmp_path / "home") as engine:
        runs = {r.status: r for r in engine.list_runs()}
        assert sorted(runs) == ["abandoned", "completed"]
        source, fork = runs["abandoned"], runs["completed"]
        assert source.status_reason == f"superseded by {fork.run_id}"
        assert fork.forked_from == source.run_id
        steps = {s.step_id: s for s in engine.steps(fork.run_id)}
        journal = engine.journal(fork.run_id)
    assert [s.status for s in steps.values()] == ["completed"] * 3
    assert list(journal[journal["step"] == "outline"]["status"]) == ["reused"]
    completed = [text for text in shown if "Run completed." in text]
    assert completed and all(fork.run_id in text for text in completed), shown


def test_a_click_on_a_sweep_cell_opens_its_run_view(tmp_path: Path) -> None:
    """The live grid of a ``%%sweep`` cell has one square per cell; once the sweep completed,
    a click on a square opens that cell's run view below the grid."""
    from .jupyter_browser_check import check_sweep_click, jupyter_lab

    with jupyter_lab(HERE / "sweep_grid.ipynb") as url:
        shown = check_sweep_click(url, 6, 2, tmp_path / "sweep_grid.png", timeout_s=60)
    opened = [text for text in shown if "cell 2" in text and "Run completed." in text]
    assert opened, shown


def test_a_view_repaints_after_wf_approve_and_wf_resume_in_a_subprocess(tmp_path: Path) -> None:
    """A blocked run's saved view follows its run while the kernel lives: approved and
    driven from a shell (``wf approve``, ``wf resume``), the view says so without a cell."""
    import os
    import subprocess
    import sys

    from .jupyter_browser_check import check_repaint, jupyter_lab

    state = tmp_path / "home"  # conftest's WF_MAGIC_HOME: the kernel inherits it

    def approve_from_a_shell() -> None:
        with Engine(state) as engine:
            (run,) = engine.list_runs()
        env = {**os.environ, "WF_MAGIC_HOME": str(state)}
        for argv in (["approve", run.run_id, "signoff"], ["resume", run.run_id]):
            subprocess.run([sys.executable, "-m", "wf_magic", *argv], env=env, check=True)

    with jupyter_lab(HERE / "human_gate.ipynb") as url:
        shown = check_repaint(
            url,
            "Blocked: waiting on step",
            "Run completed.",
            approve_from_a_shell,
            tmp_path / "repaint.png",
            timeout_s=60,
        )
    assert any("Run completed." in text for text in shown), shown
