"""Concurrent starts of one scope settle on one run, and gc never deletes under a resume.

Finding the scope's run and inserting a new one is one ``BEGIN IMMEDIATE`` transaction, so
starts at the same instant — threads of one kernel or separate ``wf`` processes — agree on one
run; the losers get the winner's run back and either drive it after the winner or are refused
with ``RunLockHeld`` (exit 75) while the winner drives. No unit is dispatched twice.

gc deletes a run only under its lock and re-checks the status inside the delete (issue 12).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from wf_magic import Engine, RunLockHeld

from .conftest import ROOT, attempts_in, db_rows

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

RACERS = 50
FLOW = """\
name: racy
steps:
  - id: first
    prompt: "hello"
  - id: second
    prompt: "world"
"""


def _assert_one_run_each_unit_once(state_dir: Path) -> str:
    runs = db_rows(state_dir, "SELECT run_id, status FROM runs")
    assert len(runs) == 1, runs
    assert runs[0][1] == "completed"
    units = Counter((u, status) for u, _n, status, _d in attempts_in(state_dir))
    assert units == {("first", "succeeded"): 1, ("second", "succeeded"): 1}
    return str(runs[0][0])


def test_concurrent_starts_in_threads_create_one_run(state_dir: Path) -> None:
    barrier = threading.Barrier(RACERS)
    started: list[tuple[str, bool]] = []
    errors: list[BaseException] = []

    def racer() -> None:
        eng = Engine(state_dir)
        try:
            wf = eng.load(FLOW)
            eng.store.open()  # every racer is past opening when the barrier drops
            barrier.wait(30)
            run = eng.start(wf)
            started.append((run.run_id, run.created))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            eng.close()

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len({rid for rid, _ in started}) == 1
    assert sorted(created for _, created in started) == [False] * (RACERS - 1) + [True]


def test_concurrent_runs_in_threads_dispatch_each_unit_once(state_dir: Path) -> None:
    barrier = threading.Barrier(RACERS)
    outcomes: list[str] = []

    def racer() -> None:
        eng = Engine(state_dir)
        try:
            wf = eng.load(FLOW)
            eng.store.open()
            barrier.wait(30)
            outcomes.append(eng.run(wf).status)
        except RunLockHeld:
            outcomes.append("locked")
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcomes.append(f"{type(exc).__name__}: {exc}")
        finally:
            eng.close()

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(outcomes) <= {"completed", "locked"}, Counter(outcomes)
    assert "completed" in outcomes
    _assert_one_run_each_unit_once(state_dir)


RACER = """\
import os, pickle, sys, time
from pathlib import Path
from wf_magic import Engine, WorkflowError
from wf_magic.exits import error_exit_code
wf_pickle, state, ready, go = sys.argv[1:]
wf = pickle.loads(Path(wf_pickle).read_bytes())
engine = Engine(state)
engine.store.open()
Path(ready, str(os.getpid())).touch()
while not Path(go).exists():
    time.sleep(0.001)
try:
    run = engine.run(wf)
except WorkflowError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(error_exit_code(exc))
print(run.run_id, "new" if run.created else "existing")
sys.exit(run.exit_code)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes")
def test_concurrent_run_processes_create_one_run(tmp_path: Path, state_dir: Path) -> None:
    # The workflow is frozen once and handed over pickled: the race is in the start and the
    # drive, and 50 processes freezing the same source would only make the test slow.
    engine = Engine(state_dir)
    (tmp_path / "wf.pickle").write_bytes(pickle.dumps(engine.load(FLOW)))
    engine.close()
    ready, go = tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    args = [str(tmp_path / "wf.pickle"), str(state_dir), str(ready), str(go)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(RACERS)
    ]
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < RACERS and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()  # every process is imported, opened and waiting: all start at once
    results = [(*p.communicate(timeout=120), p.returncode) for p in procs]
    codes = Counter(code for _out, _err, code in results)
    assert set(codes) <= {0, 75}, [err for _o, err, code in results if code not in (0, 75)]
    assert codes[0] >= 1
    run_id = _assert_one_run_each_unit_once(state_dir)
    said = Counter(out.strip() for out, _err, code in results if code == 0)
    assert said[f"{run_id} new"] + said[f"{run_id} existing"] == codes[0]
    for _out, err, code in results:
        if code == 75:
            assert err.startswith(f"error: Run {run_id} is being driven by "), err


# -- gc against a resume ----------------------------------------------------------------------
FAILING = """\
name: flaky
steps:
  - id: a
    exec: [python3, -c, "import sys; sys.exit(3)"]
"""


def test_gc_skips_a_run_whose_lock_is_held_and_removes_the_lock_files_of_what_it_deletes(
    engine: Engine, state_dir: Path
) -> None:
    run_id = engine.run(FAILING).run_id
    assert engine.get_run(run_id).status == "failed"
    with engine.store.run_lock(run_id):  # a resume is driving it
        assert engine.gc(older_than_s=0) == []
    assert engine.get_run(run_id).status == "failed"
    assert engine.gc(older_than_s=0) == [run_id]
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs") == [(0,)]
    assert not engine.lock_dir.exists() or sorted(p.name for p in engine.lock_dir.iterdir()) == []


def test_gc_rechecks_the_status_inside_its_delete(
    engine: Engine, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = engine.run(FAILING).run_id
    listed = engine.store.finished_runs_before(time.time())
    assert listed == [run_id]
    engine.store.set_run_status(run_id, "active")  # a resume re-opened it after gc listed it
    monkeypatch.setattr(engine.store, "finished_runs_before", lambda cutoff: listed)
    assert engine.gc(older_than_s=0) == []
    assert db_rows(state_dir, "SELECT status FROM runs") == [("active",)]
