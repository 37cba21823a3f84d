"""``engine.sweep(..., background=True)``: the call returns at once with a live handle.

The handle reads the journal like any sweep's, so its status follows the cells; ``wait()``
ends with the drive (re-raising what ended it), ``stop()`` stops it gracefully and leaves the
owed cells for ``sweep_resume``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from wf_magic import Engine, UnitRequest, UnitResult, register_runner
from wf_magic.runners.base import BaseRunner
from wf_magic.sweeps.background import BackgroundSweep


class Gate(BaseRunner):
    """Answers only once the test opens the gate: the sweep cannot finish before it does."""

    def __init__(self, gate: threading.Event, seen: list[str]) -> None:
        self.gate = gate
        self.seen = seen

    def run(self, request: UnitRequest) -> UnitResult:
        self.seen.append(request.prompt or "")
        if not self.gate.wait(20):
            raise RuntimeError("the test never opened the gate")
        return UnitResult(output=f"re: {request.prompt}")


WORKFLOW = """name: bg
runner: gated
params:
  topic: {type: string}
steps:
  - id: say
    prompt: "about {{ params.topic }}"
"""


def _rows(n: int) -> list[dict[str, str]]:
    return [{"topic": f"t{i}"} for i in range(n)]


def test_a_background_sweep_returns_at_once_and_its_handle_follows_the_cells(
    tmp_path: Path,
) -> None:
    gate, seen = threading.Event(), []
    register_runner("gated", lambda ctx: Gate(gate, seen), replace=True)
    with Engine(tmp_path / "s") as engine:
        started = time.monotonic()
        sweep = engine.sweep(WORKFLOW, rows=_rows(6), max_concurrency=2, background=True)
        assert time.monotonic() - started < 5  # it did not wait for a gated cell
        assert isinstance(sweep, BackgroundSweep)
        assert sweep.running
        assert sweep.status == "running"
        assert engine.sweeps()["sweep_id"].tolist() == [sweep.sweep_id]  # the engine answers
        gate.set()
        assert sweep.wait(30) is sweep
        assert not sweep.running
        assert sweep.status == "completed"
        assert sorted(sweep.frame()["status"]) == ["completed"] * 6
    assert sorted(seen) == sorted(f"about t{i}" for i in range(6))


def test_stop_ends_a_background_sweep_gracefully_and_resume_finishes_it(tmp_path: Path) -> None:
    gate, seen = threading.Event(), []
    register_runner("gated", lambda ctx: Gate(gate, seen), replace=True)
    with Engine(tmp_path / "s") as engine:
        sweep = engine.sweep(WORKFLOW, rows=_rows(8), max_concurrency=2, background=True)
        deadline = time.monotonic() + 20
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(seen) == 2  # two cells in flight, waiting at the gate
        stopper = threading.Thread(target=sweep.stop)
        stopper.start()
        time.sleep(0.2)
        gate.set()  # the cells in flight finish and are journaled; no new one starts
        stopper.join(30)
        assert not sweep.running
        statuses = sweep.frame()["status"].tolist()
        assert statuses.count("completed") == 2
        assert len(seen) == 2
        resumed = engine.sweep_resume(sweep.sweep_id)
        assert resumed.status == "completed"
    assert len(seen) == 8  # each cell dispatched once in all


def test_wait_re_raises_what_ended_the_drive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wf_magic.errors import StateDBError
    from wf_magic.sweeps import driver

    def broken(*args: object, **kwargs: object) -> None:
        raise StateDBError("full", detail="database or disk is full", db_path="state.db")

    register_runner("gated", lambda ctx: Gate(threading.Event(), []), replace=True)
    monkeypatch.setattr(driver, "drive_sweep", broken)
    with Engine(tmp_path / "s") as engine:
        sweep = engine.sweep(WORKFLOW, rows=_rows(1), background=True)
        with pytest.raises(StateDBError, match="database or disk is full"):
            sweep.wait(30)
        assert isinstance(sweep.error, StateDBError)
