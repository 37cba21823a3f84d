"""A sweep spread over worker processes (``--workers N`` / ``workers=N``, issue 32 item 6):
each share of cells driven by its own process, the sweep's budget exact across them, its
secret params handed to them off the command line, and every worker stopped when the driver
is interrupted or killed — nothing owed is lost, a resume finishes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import ROOT, db_rows, run_wf, wf_cmd
from wf_magic import Engine
from wf_magic.errors import UsageError
from wf_magic.sweeps.workers import WORKERS_ENV, concurrency_shares, default_workers

pytestmark = pytest.mark.backends

PIDS = """
name: pids
params:
  i: {type: integer}
steps:
  - id: pid
    exec: [sh, -c, "echo $PPID"]
"""

SLOW = """
name: slow
params:
  i: {type: integer}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "^item", reply: done, tokens_in: 2, tokens_out: 1, sleep_s: 0.05}
steps:
  - id: ask
    prompt: "item {{ params.i }}"
"""

CANARY = "sk-canary-workers-5be1"
SECRET = """
name: secret-workers
params:
  api_key: {type: string}
  i: {type: integer}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "key sk-canary-workers-5b[e]1 ", reply: "authorised"}
      - {match: ".*", reply: "denied"}
steps:
  - id: ask
    prompt: "key {{ params.api_key }} item {{ params.i }}"
  - id: verify
    python: workers_helpers:check
    with: {said: "{{ steps.ask.output }}"}
"""
HELPERS = """
def check(said):
    return {"ok": said == "authorised"}
"""


def rows_file(tmp_path: Path, cells: int) -> Path:
    rows = tmp_path / "rows.csv"
    rows.write_text("i\n" + "".join(f"{i}\n" for i in range(cells)))
    return rows


def workflow(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "flow.yaml"
    path.write_text(text)
    return path


def sweep_id_of(state: Path) -> str:
    [(sweep_id,)] = db_rows(state, "SELECT sweep_id FROM sweeps")
    return str(sweep_id)


def cell_outputs(state: Path) -> dict[int, str]:
    """Cell index → the output of its run's only work attempt."""
    rows = db_rows(
        state,
        "SELECT c.cell_index, a.output_json FROM sweep_cells c"
        " JOIN attempts a ON a.run_id = c.run_id WHERE a.phase = 'work' AND a.status = 'succeeded'",
    )
    return {int(i): json.loads(str(out)) for i, out in rows}  # type: ignore[call-overload]


def worker_processes(session: int) -> list[int]:
    """The live worker processes started from the process group/session ``session``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if b"wf_magic.sweep_worker" in cmdline and os.getsid(int(entry.name)) == session:
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":  # a zombie has ended
                    found.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    return found


def test_each_share_of_cells_is_driven_by_its_own_process(state_dir: Path, tmp_path: Path) -> None:
    cells, workers = 24, 3
    done = run_wf(
        state_dir,
        "sweep",
        str(workflow(tmp_path, PIDS)),
        "--rows",
        str(rows_file(tmp_path, cells)),
        "--workers",
        str(workers),
        "--max-concurrency",
        "6",
        "--quiet",
    )
    assert done.returncode == 0, done.stderr
    assert "completed · 24 cells · 24 units" in done.stdout
    pids = {i: out.strip() for i, out in cell_outputs(state_dir).items()}
    assert sorted(pids) == list(range(cells))
    by_share: dict[int, set[str]] = defaultdict(set)
    for index, pid in pids.items():
        by_share[index % workers].add(pid)
    # Cell i was driven by share i % 3's process, and the three processes are distinct.
    assert all(len(found) == 1 for found in by_share.values()), by_share
    assert len({next(iter(found)) for found in by_share.values()}) == workers
    attempts = db_rows(state_dir, "SELECT COUNT(*) FROM attempts WHERE phase = 'work'")
    assert attempts == [(cells,)]


def test_the_sweep_budget_is_exact_across_workers(state_dir: Path, tmp_path: Path) -> None:
    flow, rows = workflow(tmp_path, SLOW), rows_file(tmp_path, 30)
    stopped = run_wf(
        state_dir,
        *("sweep", str(flow), "--rows", str(rows), "--workers", "3", "--max-concurrency", "6"),
        *("--max-units", "7", "--quiet"),
    )
    assert stopped.returncode == 1, stopped.stderr
    assert "sweep budget max_units reached (used 7 of 7)" in stopped.stdout
    charged = db_rows(
        state_dir, "SELECT COUNT(*) FROM attempts WHERE phase = 'work' AND charged = 1"
    )
    assert charged == [(7,)]
    assert db_rows(state_dir, "SELECT COUNT(*) FROM sweep_charges") == [(7,)]

    sweep_id = sweep_id_of(state_dir)
    resumed = run_wf(
        state_dir, "sweep-resume", sweep_id, "--max-units", "100", "--workers", "2", "--quiet"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "completed · 30 cells · 30 units, 90 tokens paid" in resumed.stdout
    per_unit = db_rows(
        state_dir,
        "SELECT unit_id, COUNT(*) FROM attempts WHERE phase = 'work' GROUP BY run_id, unit_id",
    )
    assert len(per_unit) == 30 and {n for _, n in per_unit} == {1}


def test_secret_params_reach_every_worker_off_the_command_line(
    state_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "workers_helpers.py").write_text(HELPERS)
    done = run_wf(
        state_dir,
        *("sweep", str(workflow(tmp_path, SECRET)), "--rows", str(rows_file(tmp_path, 12))),
        *("--param", f"api_key={CANARY}", "--workers", "3", "--max-concurrency", "3"),
    )
    assert done.returncode == 0, done.stderr
    assert "completed · 12 cells" in done.stdout
    verdicts = db_rows(
        state_dir,
        "SELECT a.output_json FROM attempts a WHERE a.phase = 'work' AND a.step_id = 'verify'",
    )
    assert [json.loads(str(v)) for (v,) in verdicts] == [{"ok": True}] * 12
    stored = db_rows(state_dir, "SELECT definition_json FROM sweeps")
    assert CANARY not in str(stored)


def spawn(state: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        wf_cmd(state, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
        start_new_session=True,
    )


def wait_for_cells(state: Path, settled: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            found = db_rows(state, "SELECT COUNT(*) FROM runs WHERE status = 'completed'")
        except Exception:  # noqa: BLE001 - the state is not created yet (either backend)
            found = []
        if found and int(found[0][0]) >= settled:  # type: ignore[call-overload]
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {settled} cells settled in 60 s")


def wait_gone(session: int) -> None:
    deadline = time.monotonic() + 20
    while worker_processes(session):
        assert time.monotonic() < deadline, f"workers still alive: {worker_processes(session)}"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["sigint", "kill9"])
def test_workers_stop_with_their_driver_and_a_resume_finishes(
    state_dir: Path, tmp_path: Path, how: str
) -> None:
    cells = 60
    flow, rows = workflow(tmp_path, SLOW), rows_file(tmp_path, cells)
    proc = spawn(
        state_dir,
        "sweep",
        str(flow),
        "--rows",
        str(rows),
        "--workers",
        "3",
        "--max-concurrency",
        "3",
    )
    wait_for_cells(state_dir, 6, proc)
    assert len(worker_processes(proc.pid)) == 2
    os.kill(proc.pid, signal.SIGINT if how == "sigint" else signal.SIGKILL)  # the driver only
    _, err = proc.communicate(timeout=60)
    if how == "sigint":
        assert proc.returncode == 130, err.decode()
    else:
        assert proc.returncode == -signal.SIGKILL
    wait_gone(proc.pid)  # each worker saw its driver stop or vanish, and ended
    settled = db_rows(state_dir, "SELECT COUNT(*) FROM runs WHERE status = 'completed'")
    assert int(settled[0][0]) < cells  # type: ignore[call-overload]
    if how == "sigint":
        [(status, reason)] = db_rows(state_dir, "SELECT status, status_reason FROM sweeps")
        assert status == "stopped" and str(reason).startswith("interrupted;"), reason

    resumed = run_wf(state_dir, "sweep-resume", sweep_id_of(state_dir), "--workers", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert f"completed · {cells} cells" in resumed.stdout
    assert sorted(cell_outputs(state_dir)) == list(range(cells))


def test_workers_from_python_and_the_environment_default(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = workflow(tmp_path, SLOW)
    with Engine(state_dir) as engine:
        sweep = engine.sweep(flow, rows=[{"i": i} for i in range(10)], workers=2, max_concurrency=4)
        assert sweep.status == "completed"
        assert sweep.totals() == {"units": 10, "tokens": 30, "cost": 0.0}
    monkeypatch.setenv(WORKERS_ENV, "2")
    assert default_workers() == 2
    with Engine(state_dir) as engine:
        again = engine.sweep(flow, rows=[{"i": i} for i in range(10, 16)], max_concurrency=2)
        assert again.status == "completed"
        assert sorted(again.frame()["result"].tolist()) == ["done"] * 6


def test_more_workers_than_the_cap_on_units_in_flight_says_how_many_ran(
    state_dir: Path, tmp_path: Path
) -> None:
    flow, rows = workflow(tmp_path, SLOW), rows_file(tmp_path, 8)
    done = run_wf(state_dir, "sweep", str(flow), "--rows", str(rows), "--workers", "3")
    assert done.returncode == 0, done.stderr
    assert "completed · 8 cells · 8 units" in done.stdout
    assert (
        "warning: workers: 1 of the 3 asked for drive this sweep: max_concurrency 1 is split "
        "between them and none runs with 0; raise it (`--max-concurrency 24`) to use 3"
    ) in done.stderr


@pytest.mark.parametrize("text", ["0", "65", "two", "-1", "1.5"])
def test_a_bad_workers_setting_is_refused_in_one_line(
    state_dir: Path, tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WORKERS_ENV, text)
    with pytest.raises(UsageError, match=rf"{WORKERS_ENV}=.*from 1 to 64"):
        default_workers()
    flow, rows = workflow(tmp_path, SLOW), rows_file(tmp_path, 3)
    refused = run_wf(state_dir, "sweep", str(flow), "--rows", str(rows))
    assert refused.returncode == 2 and WORKERS_ENV in refused.stderr, refused.stderr
    monkeypatch.delenv(WORKERS_ENV)
    bad_flag = run_wf(state_dir, "sweep", str(flow), "--rows", str(rows), "--workers", text)
    assert bad_flag.returncode == 2 and "--workers" in bad_flag.stderr


def test_what_a_worker_process_cannot_drive_is_refused(state_dir: Path, tmp_path: Path) -> None:
    def local(**_: object) -> dict[str, bool]:
        return {"ok": True}

    bare = "name: bare\nparams:\n  i: {type: integer}\nsteps:\n  - id: s\n    python: local\n"
    with Engine(state_dir, namespace={"local": local}) as engine:
        with pytest.raises(UsageError, match="python target 'local' lives in this process"):
            engine.sweep(bare, rows=[{"i": 1}, {"i": 2}], workers=2)
        scored = SLOW + "    score:\n      - {name: mine, python: local}\n"
        with pytest.raises(UsageError, match="python target 'local' lives in this process"):
            engine.sweep(scored, rows=[{"i": 1}, {"i": 2}], workers=2)
        assert engine.store.list_sweeps() == []  # refused before anything was stored
        with pytest.raises(UsageError, match="workers must be a whole number from 1 to 64"):
            engine.sweep(bare, rows=[{"i": 1}], workers=0)
    with ThreadPoolExecutor(2) as pool, Engine(state_dir, executor=pool) as engine:
        with pytest.raises(UsageError, match="workers and an executor both spread"):
            engine.sweep(workflow(tmp_path, SLOW), rows=[{"i": 1}, {"i": 2}], workers=2)


@pytest.mark.parametrize(
    ("cap", "workers", "shares"),
    [(32, 2, [16, 16]), (5, 2, [3, 2]), (2, 4, [1, 1]), (7, 3, [3, 2, 2]), (1, 8, [1])],
)
def test_the_cap_on_units_in_flight_is_split_between_shares(
    cap: int, workers: int, shares: list[int]
) -> None:
    assert concurrency_shares(cap, workers) == shares


def test_a_worker_that_cannot_start_leaves_its_cells_owed_and_says_why(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that dies before driving anything (here: its interpreter cannot start) is one
    warning line naming it and its exit code; its cells stay owed for a resume."""
    import wf_magic.sweeps.workers as workers

    monkeypatch.setattr(workers, "WORKER_MODULE", "wf_magic.no_such_worker_module")
    with Engine(state_dir) as engine:
        sweep = engine.sweep(
            workflow(tmp_path, SLOW),
            rows=[{"i": i} for i in range(6)],
            workers=2,
            max_concurrency=2,
        )
        assert sweep.status == "running", sweep.status_reason
        [line] = sweep.skipped
        assert line.startswith("worker 1/2 exited with code 1: ")
        assert "No module named wf_magic.no_such_worker_module" in line
        assert line.endswith(f"`wf sweep-resume {sweep.sweep_id}` drives them")
        assert sorted(sweep.frame()["status"]) == ["completed"] * 3 + ["pending"] * 3
    monkeypatch.undo()
    with Engine(state_dir) as engine:
        assert engine.sweep_resume(sweep.sweep_id, workers=2, max_concurrency=2).status == (
            "completed"
        )
