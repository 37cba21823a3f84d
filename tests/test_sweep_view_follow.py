"""Sweep views follow their sweep while the kernel lives: a ``%%sweep`` cell's static grid is an
output with a display id that repaints (polled, one aggregate read a tick) when the sweep
changes elsewhere — ``wf sweep-resume`` in a subprocess — and stops following once the sweep
settled with nothing owed; it holds no widget model. In a real kernel (nbclient applies the
display updates, as JupyterLab does)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests.helpers_notebook import Kernel, RecordingHandle, until
from wf_magic import Engine
from wf_magic.notebook.sweepfollow import SweepOutput

CELLS = """\
name: cells
params:
  i: {type: integer}
runner: scripted
steps:
  - id: write
    prompt: "cell {{ params.i }}"
"""

RESUME_AND_WAIT = """\
import os, subprocess, sys, time
_done = subprocess.run(
    [sys.executable, "-m", "wf_magic", "sweep-resume", s.sweep_id, "--max-units", "100"],
    capture_output=True, text=True, env={**os.environ},
)
assert _done.returncode == 0, _done.stderr
_deadline = time.monotonic() + 20
while s.output.is_following and time.monotonic() < _deadline:
    time.sleep(0.1)  # the grid's clock repaints it from its thread meanwhile
time.sleep(0.5)
print(s.status, s.output.is_following)
"""


def _grid_text(node: nbformat.NotebookNode) -> list[str]:
    """The HTML of each rich output of a cell, tags stripped."""
    return [
        re.sub(r"<[^>]+>", " ", o["data"]["text/html"])
        for o in node.outputs
        if "text/html" in o.get("data", {})
    ]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    k = Kernel(tmp_path_factory.mktemp("kernel"))
    with k.client.setup_kernel(cleanup_kc=True):
        k.run(f"%env WF_MAGIC_HOME={k.workdir / 'home'}\n%load_ext wf_magic")
        k.run("from wf_magic.notebook.teardown import live_models")
        yield k


def test_a_stopped_sweeps_grid_repaints_after_wf_sweep_resume_in_a_subprocess(
    kernel: Kernel,
) -> None:
    before = kernel.value("live_models()")
    cell = kernel.run(
        "%%sweep --grid i=1,2,3,4,5,6 --max-units 2 --max-concurrency 1 --as s\n" + CELLS
    )
    # No execute_result: a static result would never change; the grid is a display output.
    assert [o["output_type"] for o in cell.outputs] == ["display_data", "display_data"]
    live_grid, shown = _grid_text(cell)
    assert "live sweep grid" in live_grid and "stopped · 6 cells" in shown
    assert kernel.value("s.output.is_following") is True  # stopped: a resume may come
    printed = kernel.run(RESUME_AND_WAIT).outputs[-1]["text"]
    assert printed.split() == ["completed", "False"]  # settled, nothing owed: it stopped
    kernel.run("print('a later cell')")  # the live grid above settles as a cell runs
    live, grid = cell.outputs
    assert live["data"] == {"text/plain": ""}
    assert "completed · 6 cells" in re.sub(r"<[^>]+>", " ", grid["data"]["text/html"])
    assert "stopped" not in grid["data"]["text/plain"]
    assert kernel.value("live_models()") == before  # neither grid left a widget model


def test_the_cell_shown_again_is_the_static_grid_of_that_moment(kernel: Kernel) -> None:
    node = kernel.run("s")
    (shown,) = _grid_text(node)
    assert "completed · 6 cells" in shown


def test_an_unchanged_sweep_is_not_repainted_and_a_settled_one_is_not_followed(
    tmp_path: Path,
) -> None:
    with Engine(tmp_path / "state") as engine:
        sweep = engine.sweep(CELLS, grid={"i": [1, 2, 3]}, budget={"max_units": 1})
        output = SweepOutput(sweep, poll_s=0.05)
        output.attach(RecordingHandle())
        assert output.is_following and output.repaints == 1
        time.sleep(0.3)  # several polls of a sweep nobody drives
        assert output.repaints == 1
        env = {**os.environ, "WF_MAGIC_HOME": str(tmp_path / "state")}
        subprocess.run(
            [sys.executable, "-m", "wf_magic", "sweep-resume", sweep.sweep_id, "--max-units", "9"],
            env=env,
            check=True,
            capture_output=True,
        )
        until(lambda: not output.is_following)
        assert "completed · 3 cells" in output.handle.published[-1]["text/html"]
        settled = SweepOutput(sweep, poll_s=0.05)
        settled.attach(RecordingHandle())
        assert not settled.is_following  # completed with nothing owed: never polled
