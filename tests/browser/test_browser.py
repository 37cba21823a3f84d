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
    down and the notebook reopened, each view shows its run and none says "model not found"."""
    from .jupyter_browser_check import check_saved_views, jupyter_lab

    with jupyter_lab(HERE / "saved_views.ipynb") as url:
        shown = check_saved_views(
            url,
            [
                "Run completed.",
                "Blocked: waiting on step",
                "stopped-tour",
                "superseded-tour",
                "interrupted-tour",
                "Approve",
            ],
            tmp_path / "saved_views.png",
            timeout_s=90,
            interrupt_when=("interrupted-tour", "driving…"),
        )
    text = "\n".join(shown)
    assert "Error displaying widget" not in text
    with Engine(tmp_path / "home") as engine:
        runs = {r.workflow: r.status for r in engine.list_runs()}
    assert runs["done-tour"] == "completed"
    assert runs["blocked-tour"] == "blocked"
    assert runs["stopped-tour"] == "active"
    assert runs["interrupted-tour"] == "active"
