"""``%%sweep`` in a real IPython: the cell's YAML over a grid × a notebook variable's rows,
its sweep budget, the grid it shows, and one-line errors."""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_flow import use_runner
from tests.helpers_notebook import ipython_shell, magics_in
from wf_magic import UnitRequest
from wf_magic.notebook.magics import WorkflowMagics
from wf_magic.sweeps.handle import Sweep

YAML = """name: nb-sweep
params:
  style: {type: string}
  topic: {type: string}
  n: {type: integer, default: 1}
runner: scripted
runners:
  scripted:
    rules:
      - {match: ".*", reply: "ok", tokens_in: 2, tokens_out: 3}
steps:
  - id: write
    prompt: "{{ params.style }} {{ params.topic }} {{ params.n }} {{ sweep.repeat }}"
"""


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


@pytest.fixture
def magics(shell: InteractiveShell, tmp_path: Path) -> Iterator[WorkflowMagics]:
    with magics_in(shell, tmp_path / "state") as found:
        yield found


def test_sweep_cell_runs_the_grid_over_a_notebook_frame_and_binds_the_handle(
    shell: InteractiveShell, magics: WorkflowMagics
) -> None:
    shell.user_ns["topics"] = pd.DataFrame({"topic": ["cats", "owls", "rain"]})
    result = shell.run_cell(
        "%%sweep --grid style=terse,long --grid n=1,2 --rows topics --repeat 2 "
        "--max-units 10 --as s\n" + YAML
    )
    result.raise_error()
    sweep = shell.user_ns["s"]
    assert isinstance(sweep, Sweep) and result.result is sweep
    assert sweep.status == "stopped"
    assert sweep.totals()["units"] == 10
    frame = sweep.frame()
    assert len(frame) == 2 * 2 * 3 * 2
    assert frame["n"].tolist()[:6] == [1] * 6  # coerced to the declared integer
    html = sweep._repr_html_()
    assert html.count("<span title=") == 24 and "tokens 50" in html
    # The unchanged cell again is the same sweep; a larger ceiling finishes it.
    again = shell.run_cell(
        "%%sweep --grid style=terse,long --grid n=1,2 --rows topics --repeat 2 "
        "--max-units 100 --as s\n" + YAML
    )
    again.raise_error()
    assert shell.user_ns["s"].sweep_id == sweep.sweep_id
    assert shell.user_ns["s"].status == "completed"
    assert shell.user_ns["s"].totals()["units"] == 24


def test_an_interrupt_stops_the_sweep_between_cells_with_one_line_and_no_traceback(
    shell: InteractiveShell, magics: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []

    def slow(request: UnitRequest) -> object:
        calls.append(request.prompt or "")
        if len(calls) == 1:  # the kernel interrupt arrives while the first cell's unit runs
            threading.Timer(0.05, _thread.interrupt_main).start()
        time.sleep(0.4)
        return "ok"

    use_runner("slowpoke", slow)
    source = YAML.replace("runner: scripted", "runner: slowpoke")
    result = shell.run_cell("%%sweep --grid style=a,b,c,d --grid topic=t --as s\n" + source)

    assert result.error_in_exec is None
    sweep = shell.user_ns["s"]
    assert sweep.status == "stopped"
    assert sweep.status_reason == (
        f"interrupted; 3 cell(s) owed; `wf sweep-resume {sweep.sweep_id}` continues"
    )
    assert len(calls) == 1  # no cell was dispatched after the interrupt
    assert sweep.frame()["status"].tolist() == ["completed", "pending", "pending", "pending"]
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.strip()] == [
        "Interrupted: the sweep dispatches nothing more and stops after the units in flight; "
        "re-run the cell to continue it."
    ]
    again = shell.run_cell("%%sweep --grid style=a,b,c,d --grid topic=t --as s\n" + source)
    again.raise_error()
    assert shell.user_ns["s"].status == "completed"
    assert len(calls) == 4


def test_sweep_cell_spreads_its_cells_over_worker_processes(
    shell: InteractiveShell, magics: WorkflowMagics
) -> None:
    shell.user_ns["topics"] = [{"topic": t} for t in ("cats", "owls", "rain", "snow")]
    result = shell.run_cell(
        "%%sweep --grid style=terse,long --rows topics --workers 2 --max-concurrency 4 --as w\n"
        + YAML
    )
    result.raise_error()
    sweep = shell.user_ns["w"]
    assert sweep.status == "completed", sweep.status_reason
    assert sweep.totals() == {"units": 8, "tokens": 40, "cost": 0.0}
    assert sweep.skipped == []
    refused = shell.run_cell("%%sweep --rows topics --grid style=a --workers 0\n" + YAML)
    assert "--workers" in str(refused.error_in_exec)


def test_sweep_cell_errors_are_one_line_usage_errors(
    shell: InteractiveShell, magics: WorkflowMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    for line, message in [
        ("%%sweep --grid colour=red", "sweep grid axis 'colour' is not a param of workflow"),
        ("%%sweep --grid style", "--grid expects K=V1,V2 (got 'style')"),
        (
            "%%sweep --grid style=a --rows nowhere.csv",
            "sweep rows: no file 'nowhere.csv' (No such file or directory)",
        ),
    ]:
        result = shell.run_cell(f"{line}\n{YAML}")
        assert result.error_in_exec is not None
        assert message in str(result.error_in_exec)
        assert "\n" not in str(result.error_in_exec)
    blank = shell.run_cell("%%sweep --grid style=a\n   \n")
    assert "the cell is empty" in str(blank.error_in_exec)


def test_in_a_kernel_the_live_grid_goes_when_the_sweep_ends_and_its_static_grid_stays(
    tmp_path: Path,
) -> None:
    import nbformat

    from tests.helpers_notebook import execute_notebook

    nb = nbformat.v4.new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}
        }
    )
    nb.cells = [
        nbformat.v4.new_code_cell(src)
        for src in (
            f"%env WF_MAGIC_HOME={tmp_path / 'state'}\n%load_ext wf_magic",
            "%%sweep --grid style=a,b,c --grid topic=x,y --as s\n" + YAML,
            "print(s.status, len(s.frame()))",
        )
    ]
    execute_notebook(nb, tmp_path)
    kinds = [o["output_type"] for o in nb.cells[1].outputs]
    assert kinds == ["display_data", "display_data"]
    live, final = nb.cells[1].outputs
    # The live grid's output was emptied at the end (a reopened notebook has no widget
    # to miss); below it, the static grid (an output that follows the sweep: no
    # execute_result, which could never be updated).
    assert live["data"] == {"text/plain": ""}
    html = final["data"]["text/html"]
    assert html.count("<span title=") == 6 and "completed · 6 cells" in html
    assert nb.cells[2].outputs[0]["text"].strip() == "completed 6"


def test_the_live_grid_has_a_square_per_cell_and_a_click_opens_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wf_magic import Engine
    from wf_magic.display import STATUS_COLOURS
    from wf_magic.notebook import sweepview
    from wf_magic.notebook.sweepview import SweepGridView

    with Engine(tmp_path / "state") as engine:
        sweep = engine.sweep(YAML, grid={"style": ["a", "b", "c"], "topic": ["x", "y"]})
        runs = list(sweep.frame()["run_id"])
        view = SweepGridView(engine, sweep.sweep_id)
        view._redraw()
        assert len(view.buttons) == 6 and view.grid.children == tuple(view.buttons)
        # A cell's colour is its status class (the header's CSS maps it); the buttons share
        # one layout and one style model.
        assert {tuple(b._dom_classes) for b in view.buttons} == {
            ("wf-sweep-cell", "wf-sc-completed")
        }
        assert f".wf-sc-completed{{background:{STATUS_COLOURS['completed']}" in view.header.value
        assert len({id(b.style) for b in view.buttons} | {id(b.layout) for b in view.buttons}) == 2
        assert view.buttons[2].tooltip == (
            f'cell 2 {{"style":"b","topic":"x"}} repeat 0: completed {runs[2]}'
        )
        assert "completed · 6 cells · tokens 30" in view.header.value
        view.buttons[2].click()
        assert view.view is not None and view.view.run_id == runs[2]
        assert f"run <code>{runs[2]}</code>" in view.opened.value
        view.pick.value = 4
        view.pick_button.click()
        assert view.view.run_id == runs[4]
        view.open_cell(99)
        assert view.opened.value == "<i>no cell 99 in this sweep</i>"
        view.close()
        # A sweep too big for buttons is one picture; its cells open by number.
        monkeypatch.setattr(sweepview, "MAX_BUTTONS", 5)
        big = SweepGridView(engine, sweep.sweep_id)
        big._redraw()
        assert big.buttons == [] and big.picture.value.count("<span title=") == 6
        big.open_cell(5)
        assert big.view is not None and big.view.run_id == runs[5]
        big.close()
