"""``%%sweep --background`` in an in-process IPython: the cell returns while its cells run, the
unchanged cell again starts no second driver, ``%sweep stop`` stops the drive gracefully, and
the live grid stays live through later cells until the sweep ended, then settles into the
static grid. (The same in a real kernel, 2 000 cells, interrupts: test_notebook_background_sweep.)
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_flow import Recorder, use_runner
from tests.helpers_notebook import ipython_shell, magics_in
from wf_magic import UnitRequest
from wf_magic.notebook.sweeps import LiveSweep
from wf_magic.sweeps.background import BackgroundSweep

YAML = """name: bg-magic
params:
  style: {type: string}
  topic: {type: string, default: t}
runner: held
steps:
  - id: write
    prompt: "{{ params.style }}"
"""
CELL = "%%sweep --grid style=a,b,c --background --as s\n" + YAML


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Held shut, the ``held`` runner's units wait: the sweep is still running. Opened after."""
    opened = threading.Event()
    yield opened
    opened.set()


@pytest.fixture
def held(gate: threading.Event) -> Recorder:
    def reply(request: UnitRequest) -> str:
        if not gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        return "ok"

    return use_runner("held", reply)


class _Handle:
    """A display handle that keeps what it was updated with."""

    def __init__(self) -> None:
        self.published: list[dict[str, str]] = []

    def update(self, bundle: dict[str, str], raw: bool = False) -> None:
        self.published.append(bundle)


def _until(check: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def _err_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_the_cell_returns_while_the_sweep_runs_and_the_same_cell_again_starts_no_driver(
    shell: InteractiveShell,
    tmp_path: Path,
    gate: threading.Event,
    held: Recorder,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with magics_in(shell, tmp_path / "state", widgets="off") as magics:
        result = shell.run_cell(CELL)
        result.raise_error()
        sweep = shell.user_ns["s"]
        assert isinstance(sweep, BackgroundSweep) and result.result is sweep
        assert [sweep.running, sweep.status] == [True, "running"]
        _until(lambda: len(held.requests) == 1)  # the first cell's unit waits at the gate
        capsys.readouterr()

        again = shell.run_cell(CELL)
        again.raise_error()
        assert again.result is sweep and shell.user_ns["s"] is sweep
        assert _err_lines(capsys) == [
            f"sweep {sweep.sweep_id} is already being driven in the background by this "
            f"kernel; this cell started nothing and follows it (`%sweep stop {sweep.sweep_id}` "
            "stops it)"
        ]
        assert magics.sweep_drives.running() == [sweep]
        gate.set()
        sweep.wait(10)
        assert sweep.status == "completed"
        assert held.prompts() == ["a", "b", "c"]  # one driver: each cell's unit once
        assert magics.sweep_drives.running() == []


def test_sweep_stop_stops_the_background_drive_after_its_units_in_flight(
    shell: InteractiveShell,
    tmp_path: Path,
    gate: threading.Event,
    held: Recorder,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with magics_in(shell, tmp_path / "state", widgets="off"):
        shell.run_cell(CELL).raise_error()
        sweep = shell.user_ns["s"]
        _until(lambda: len(held.requests) == 1)
        capsys.readouterr()
        shell.run_line_magic("sweep", f"stop {sweep.sweep_id[:8]}")
        assert capsys.readouterr().out.splitlines() == [
            f"stop requested for sweep {sweep.sweep_id}; it stops after the units in flight "
            "(re-run its cell or `wf sweep-resume` to continue it)"
        ]
        assert sweep.running  # it waits for the unit in flight, which waits at the gate
        gate.set()
        sweep.wait(10)
        assert sweep.status == "stopped"
        assert sweep.status_reason == (
            f"interrupted; 2 cell(s) owed; `wf sweep-resume {sweep.sweep_id}` continues"
        )
        assert sweep.frame()["status"].tolist() == ["completed", "pending", "pending"]

        shell.run_line_magic("sweep", "stop")
        shell.run_line_magic("sweep", f"stop {sweep.sweep_id}")
        assert capsys.readouterr().out.splitlines() == [
            "no sweep is being driven in the background by this kernel; nothing to stop",
            f"sweep {sweep.sweep_id} is not being driven in the background by this kernel; "
            "nothing was stopped (a `wf sweep` in a terminal stops on Ctrl-C)",
        ]
        # The cell again continues the owed cells, in the background again.
        shell.run_cell(CELL).raise_error()
        shell.user_ns["s"].wait(10)
        assert shell.user_ns["s"].status == "completed"
        assert held.prompts() == ["a", "b", "c"]


def test_sweep_stop_without_a_sweep_stops_every_background_sweep_of_the_kernel(
    shell: InteractiveShell,
    tmp_path: Path,
    gate: threading.Event,
    held: Recorder,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with magics_in(shell, tmp_path / "state", widgets="off"):
        shell.run_cell(CELL).raise_error()
        first = shell.user_ns["s"]
        shell.run_cell(CELL.replace("style=a,b,c", "style=x,y")).raise_error()
        second = shell.user_ns["s"]
        assert first.sweep_id != second.sweep_id
        capsys.readouterr()
        shell.run_line_magic("sweep", "stop")
        assert capsys.readouterr().out.splitlines() == [
            f"stop requested for sweep {s.sweep_id}; it stops after the units in flight "
            "(re-run its cell or `wf sweep-resume` to continue it)"
            for s in (first, second)
        ]
        gate.set()
        assert [first.wait(10).status, second.wait(10).status] == ["stopped", "stopped"]


def test_the_live_grid_stays_live_through_later_cells_and_settles_into_the_static_grid(
    shell: InteractiveShell, tmp_path: Path, gate: threading.Event, held: Recorder
) -> None:
    with magics_in(shell, tmp_path / "state", widgets="on") as magics:
        result = shell.run_cell(CELL)
        result.raise_error()
        sweep = shell.user_ns["s"]
        assert isinstance(sweep, LiveSweep) and result.result is sweep
        view = sweep.view
        view.handle = _Handle()
        _until(lambda: len(held.requests) == 1)
        # The grid above is its display: the cell's value is one line, no second grid.
        data, _ = shell.display_formatter.format(sweep)
        assert data == {
            "text/plain": f"<Sweep {sweep.sweep_id} bg-magic running (3 cells) driving>"
        }

        shell.run_cell("1").raise_error()  # a later cell while the sweep runs
        assert not view.is_settled and view.handle.published == []
        assert view in magics._grids
        gate.set()
        sweep.wait(10)
        assert [sweep.running, sweep.status] == [False, "completed"]
        shell.run_cell("2").raise_error()  # the first cell after the sweep ended
        assert view.is_settled and view not in magics._grids
        (shown,) = view.handle.published
        assert shown["text/plain"] == f"<Sweep {sweep.sweep_id} bg-magic completed (3 cells)>"
        assert shown["text/html"].count("<span title=") == 3
        assert "completed · 3 cells" in shown["text/html"]
        assert sweep._repr_html_() == shown["text/html"]


def test_the_live_grid_of_a_sweep_with_shared_params_shows_that_sweep(
    shell: InteractiveShell, tmp_path: Path, gate: threading.Event, held: Recorder
) -> None:
    """The shared params are part of the sweep's identity, so the grid must count them to
    find its sweep (else it would say "sweep starting…" to the end)."""
    gate.set()
    with magics_in(shell, tmp_path / "state", widgets="on") as magics:
        shell.run_cell(CELL.replace("--background", "--param topic=owls")).raise_error()
        (view,) = magics._grids
        assert view.sweep.sweep_id == shell.user_ns["s"].sweep_id
        assert "completed · 3 cells" in view.header.value


def test_in_a_kernel_the_saved_background_cell_keeps_the_final_static_grid(
    tmp_path: Path,
) -> None:
    import nbformat

    from tests.helpers_notebook import execute_notebook, new_notebook

    nb = new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(src)
        for src in (
            f"%env WF_MAGIC_HOME={tmp_path / 'state'}\n%load_ext wf_magic",
            CELL.replace("runner: held", "runner: scripted"),
            "s.wait(60).status",
            "print(s.status)",
        )
    ]
    execute_notebook(nb, tmp_path)
    live, value = nb.cells[1].outputs
    assert [live["output_type"], value["output_type"]] == ["display_data", "execute_result"]
    # The live grid's output became the static grid once a cell ran after the sweep ended;
    # the cell's value is one line (a grid drawn as the cell returned would be stale).
    assert "application/vnd.jupyter.widget-view+json" not in live["data"]
    html = live["data"]["text/html"]
    assert html.count("<span title=") == 3 and "completed · 3 cells" in html
    assert list(value["data"]) == ["text/plain"]
    # Its status is whatever it was as the cell returned (three quick cells may be done).
    assert re.fullmatch(
        r"<Sweep sw-[0-9a-f]{16} bg-magic (running|completed) \(3 cells\) (driving|driven)>",
        value["data"]["text/plain"],
    )
    assert nb.cells[3].outputs[0]["text"] == "completed\n"
