"""``--skip-if-locked`` (issue 19): a run another driver holds is one line and exit 0, for cron.

Each holder is a real other process: either one that only takes the run's lock file, or a real
``wf resume`` stuck in a slow unit. A skipped verb names the holder's pid and touches nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from wf_magic import Engine
from wf_magic.exits import EXIT_LOCKED

from .conftest import ROOT, db_rows, spawn_wf, table_counts, wait_for, wf_inproc, write_file

FLOW = "name: cron\nsteps:\n  - id: a\n    prompt: one\n  - id: b\n    prompt: two\n"
SLOW = (
    "name: slow\nsteps:\n"
    "  - id: wait\n    exec: [python, -c, 'import time; time.sleep(60)']\n"
    "  - id: after\n    prompt: done\n"
)
HOLD = """
import sys
from pathlib import Path
from wf_magic.locking import RunLock
lock = RunLock(Path(sys.argv[1]), sys.argv[2]).acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
lock.release()
"""


@contextmanager
def lock_holder(engine: Engine, run_id: str) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``run_id``'s lock until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(engine.lock_dir), run_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        wait_for(lambda: engine.is_driving(run_id), what="the holder's lock")
        yield proc
    finally:
        proc.communicate(timeout=30)  # closes its stdin (it lets go) and reads it out


def skipped_line(run_id: str, pid: int) -> str:
    """The line a skipped verb prints, up to the holder's start time."""
    return f"run {run_id} is being driven by pid {pid} on {socket.gethostname()} since "


def run_row(state_dir: Path, run_id: str) -> tuple[object, ...]:
    return db_rows(state_dir, "SELECT * FROM runs WHERE run_id = ?", (run_id,))[0]


def snapshot(state_dir: Path, run_id: str) -> tuple[object, ...]:
    """Everything a skipped verb must not change: the run row, its steps, the table sizes."""
    steps = db_rows(state_dir, "SELECT * FROM steps WHERE run_id = ?", (run_id,))
    return run_row(state_dir, run_id), steps, table_counts(state_dir)


@pytest.fixture
def flow(tmp_path: Path) -> Path:
    return write_file(tmp_path, "cron.yaml", FLOW)


@pytest.fixture
def half_run(engine: Engine, flow: Path) -> str:
    run = engine.run(flow, max_steps=1)
    assert run.status == "active"
    return run.run_id


def test_resume_skips_a_held_run_naming_the_holder_and_touches_nothing(
    engine: Engine, state_dir: Path, half_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with lock_holder(engine, half_run) as holder:
        before = snapshot(state_dir, half_run)
        result = wf_inproc(capsys, state_dir, "resume", half_run, "--skip-if-locked")
        assert result.returncode == 0
        (line,) = result.stdout.splitlines()
        assert line.startswith(skipped_line(half_run, holder.pid))
        assert line.endswith("; skipped (--skip-if-locked)")
        assert result.stderr == ""
        assert snapshot(state_dir, half_run) == before
        refused = wf_inproc(capsys, state_dir, "resume", half_run)
        assert refused.returncode == EXIT_LOCKED
        assert f"is being driven by pid {holder.pid}" in refused.stderr
        assert snapshot(state_dir, half_run) == before


def test_run_skips_its_held_run_naming_the_holder(
    engine: Engine, state_dir: Path, flow: Path, half_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with lock_holder(engine, half_run) as holder:
        before = snapshot(state_dir, half_run)
        result = wf_inproc(capsys, state_dir, "run", str(flow), "--skip-if-locked", "--quiet")
        assert result.returncode == 0
        found, skipped = result.stdout.splitlines()
        assert found == f"run {half_run} (existing)"
        assert skipped.startswith(skipped_line(half_run, holder.pid))
        assert snapshot(state_dir, half_run) == before
        assert wf_inproc(capsys, state_dir, "run", str(flow)).returncode == EXIT_LOCKED


def test_run_of_a_changed_source_skips_when_the_run_to_supersede_is_held(
    engine: Engine, state_dir: Path, flow: Path, half_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flow.write_text(FLOW.replace("prompt: two", "prompt: three"))
    with lock_holder(engine, half_run) as holder:
        before = snapshot(state_dir, half_run)
        result = wf_inproc(capsys, state_dir, "run", str(flow), "--skip-if-locked")
        assert result.returncode == 0
        (line,) = result.stdout.splitlines()
        assert line.startswith(skipped_line(half_run, holder.pid))
        assert snapshot(state_dir, half_run) == before
        assert len(db_rows(state_dir, "SELECT run_id FROM runs")) == 1  # no new run either


def test_resume_skips_a_run_a_real_driver_is_driving(
    engine: Engine, state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = engine.start(write_file(tmp_path, "slow.yaml", SLOW)).run_id
    driver = spawn_wf(state_dir, "resume", run_id, "--quiet")
    try:
        wait_for(lambda: engine.is_driving(run_id), what="the driver's lock")
        wait_for(
            lambda: bool(db_rows(state_dir, "SELECT 1 FROM attempts WHERE unit_id = 'wait'")),
            what="the slow unit to start",
        )
        attempts = db_rows(state_dir, "SELECT * FROM attempts")
        result = wf_inproc(capsys, state_dir, "resume", run_id, "--skip-if-locked")
        assert result.returncode == 0
        assert result.stdout.startswith(skipped_line(run_id, driver.pid))
        assert db_rows(state_dir, "SELECT * FROM attempts") == attempts
    finally:
        driver.kill()  # the process this test started, by its handle
        driver.communicate(timeout=30)


def test_skip_if_locked_drives_a_run_nobody_holds(
    state_dir: Path, half_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    result = wf_inproc(capsys, state_dir, "resume", half_run, "--skip-if-locked", "--quiet")
    assert result.returncode == 0
    assert "skipped" not in result.stdout
    assert db_rows(state_dir, "SELECT status FROM runs") == [("completed",)]


def test_other_errors_are_not_skipped(
    state_dir: Path, half_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert wf_inproc(capsys, state_dir, "abandon", half_run).returncode == 0
    result = wf_inproc(capsys, state_dir, "resume", half_run, "--skip-if-locked")
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: Run {half_run} was abandoned")


def test_the_magic_resume_skips_a_held_run(
    engine: Engine, state_dir: Path, half_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from IPython.core.error import UsageError

    from tests.helpers_notebook import ipython_shell, magics_in

    shells = ipython_shell()
    shell = next(shells)
    try:
        with magics_in(shell, state_dir, widgets="off"), lock_holder(engine, half_run) as holder:
            before = snapshot(state_dir, half_run)
            capsys.readouterr()
            assert shell.run_line_magic("workflow", f"resume {half_run} --skip-if-locked") is None
            (line,) = capsys.readouterr().out.splitlines()
            assert line.startswith(skipped_line(half_run, holder.pid))
            with pytest.raises(UsageError, match=f"is being driven by pid {holder.pid}"):
                shell.run_line_magic("workflow", f"resume {half_run}")
            assert snapshot(state_dir, half_run) == before
    finally:
        next(shells, None)
