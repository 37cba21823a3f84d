"""A background sweep of 2 000 cells in a real kernel (nbclient): the cell that starts it
returns at once, another cell runs meanwhile and returns, ``stop()`` from the notebook ends
the sweep cleanly (nothing left ``running`` in the journal, the owed cells ``pending`` or
``active``), and a resume finishes the rest, charging each unit once (issue 32).

Timings are measured and kept generous (30 s): speed belongs in bench/.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nbclient.exceptions import CellExecutionError

from tests.helpers_notebook import Kernel, cell_text

CELLS = 2000
CONCURRENCY = 8
GENEROUS_S = 30.0
WORKFLOW = """name: bg-sweep
params:
  i: {type: integer}
runner: scripted
runners:
  scripted:
    rules:
      - {match: ".*", reply: "ok", tokens_in: 2, tokens_out: 1, sleep_s: 0.005}
steps:
  - id: only
    prompt: "cell {{ params.i }}"
"""
OTHER = """name: other
runner: scripted
steps:
  - id: a
    prompt: "first"
  - id: b
    prompt: "then {{ steps.a.output }}"
"""
START = {
    "engine": f"s = eng.sweep(Y, rows=rows, max_concurrency={CONCURRENCY}, background=True)",
    "magic": (f"%%sweep --rows rows --max-concurrency {CONCURRENCY} --background --as s\n"),
}
"""How each test starts the sweep: ``engine.sweep(..., background=True)``, or the cell magic."""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    k = Kernel(tmp_path_factory.mktemp("kernel"))
    with k.client.setup_kernel(cleanup_kc=True):
        k.run(f"%env WF_MAGIC_HOME={k.workdir / 'home'}\n%load_ext wf_magic")
        k.run(f"Y = {WORKFLOW!r}\nrows = [{{'i': i}} for i in range({CELLS})]")
        yield k


def timed(kernel: Kernel, source: str) -> float:
    """Run one cell; the seconds it took to return."""
    started = time.monotonic()
    kernel.run(source)
    return time.monotonic() - started


def journal(state: Path) -> tuple[dict[str, int], dict[str, int], list[tuple[str, str, int]]]:
    """(run status → count, attempt status → count, charged (run, unit, attempt)) of a state."""
    conn = sqlite3.connect(state / "state.db", timeout=30)
    try:
        runs = dict(conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall())
        attempts = dict(
            conn.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status").fetchall()
        )
        charged = conn.execute(
            "SELECT run_id, unit_id, attempt FROM attempts WHERE charged = 1"
        ).fetchall()
    finally:
        conn.close()
    return runs, attempts, [tuple(r) for r in charged]


@pytest.mark.parametrize("start", ["engine", "magic"])
def test_a_background_sweep_stopped_from_the_notebook_stops_cleanly_and_resumes(
    kernel: Kernel, start: str
) -> None:
    name = f"bg-{start}"
    state = kernel.workdir / name
    kernel.home(name)
    kernel.run("eng = get_ipython().magics_manager.registry['WorkflowMagics'].engine")
    source = START[start] + (WORKFLOW if start == "magic" else "")
    started_s = timed(kernel, source)
    assert started_s < GENEROUS_S
    assert kernel.value("[s.running, s.status]") == [True, "running"]

    # Another cell, a whole run of its own, while the sweep goes on.
    other_s = timed(kernel, f"%%workflow --as o\n{OTHER}")
    assert other_s < GENEROUS_S
    status, running = kernel.value("[o.status, s.running]")
    assert status == "completed"
    assert running, "the sweep ended before the other cell did: it did not run meanwhile"
    # The kernel's interrupt stops the cell it lands in, not the sweep behind it.
    timer = threading.Timer(0.5, kernel.interrupt)
    timer.start()
    with pytest.raises(CellExecutionError):
        kernel.run("import time; time.sleep(20)")
    timer.join()
    errors = [o.get("ename") for o in kernel.nb.cells[-1].outputs if o.get("ename")]
    assert errors == ["KeyboardInterrupt"]
    assert kernel.value("s.running")

    stop_s = timed(kernel, "s.stop(timeout=60)")
    running, status, reason, sweep_id = kernel.value(
        "[s.running, s.status, s.status_reason, s.sweep_id]"
    )
    assert not running
    assert status == "stopped"
    assert reason.startswith("interrupted; ") and reason.endswith(
        f"`wf sweep-resume {sweep_id}` continues"
    )
    owed = int(reason.split()[1])
    runs, attempts, charged = journal(state)
    assert "running" not in attempts  # every unit in flight finished and was journaled
    assert set(runs) <= {"completed", "active"}
    done = runs["completed"] - 1  # the other cell's run
    assert 0 < done < CELLS
    assert done + owed == CELLS
    frame_status = kernel.value("s.frame()['status'].value_counts().to_dict()")
    assert frame_status.get("completed") == done
    assert set(frame_status) <= {"completed", "active", "pending"}

    resume_s = timed(kernel, f"r = eng.sweep_resume(s.sweep_id, max_concurrency={CONCURRENCY})")
    assert kernel.value("[r.status, r.totals()['units']]") == ["completed", CELLS]
    runs, attempts, charged = journal(state)
    assert runs == {"completed": CELLS + 1}
    assert attempts == {"succeeded": CELLS + 2}
    sweep_units = [c for c in charged if c[1] == "only"]
    assert len(sweep_units) == len(set(sweep_units)) == CELLS  # each unit charged once
    assert {attempt for _, _, attempt in sweep_units} == {1}
    print(
        f"start {started_s:.2f}s · other cell {other_s:.2f}s · stop {stop_s:.2f}s"
        f" ({done} done, {owed} owed) · resume {resume_s:.2f}s"
    )


def test_a_kernel_interrupt_stops_a_2000_cell_sweep_cell_cleanly_and_the_cell_continues_it(
    kernel: Kernel,
) -> None:
    name = "interrupted"
    state = kernel.workdir / name
    kernel.home(name)
    cell = f"%%sweep --rows rows --max-concurrency {CONCURRENCY} --as s\n{WORKFLOW}"
    timer = threading.Timer(1.5, kernel.interrupt)
    timer.start()
    first_s = timed(kernel, cell)  # the interrupt is handled: the cell does not fail
    timer.join()
    text = cell_text(kernel.nb.cells[-1])
    assert "Interrupted: the sweep dispatches nothing more" in text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    status, reason = kernel.value("[s.status, s.status_reason]")
    assert status == "stopped" and reason.startswith("interrupted; ")
    runs, attempts, _ = journal(state)
    assert "running" not in attempts
    assert set(runs) <= {"completed", "active"}
    assert 0 < runs["completed"] < CELLS

    again_s = timed(kernel, cell)
    assert kernel.value("[s.status, s.totals()['units']]") == ["completed", CELLS]
    runs, attempts, charged = journal(state)
    assert runs == {"completed": CELLS}
    assert attempts == {"succeeded": CELLS}
    assert len(set(charged)) == len(charged) == CELLS
    print(f"interrupted after {first_s:.2f}s · continued in {again_s:.2f}s")
