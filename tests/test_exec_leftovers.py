"""What an exec unit leaves in its process group is ended when its attempt ends (issue 31,
item 16): on the normal path, on failure, and after a ``kill -9`` of the driver (by resume,
or by ``wf gc`` of a run that was abandoned instead).

Each case starts real processes and checks from outside, with ``os.killpg(pgid, 0)`` and
``/proc``, that no member of the unit's group is left alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run_wf, spawn_wf, wait_for, write_file
from wf_magic.errors import RunnerError
from wf_magic.runners.base import UnitRequest
from wf_magic.runners.orphans import TERM_GRACE_S, end_group
from wf_magic.runners.process import PIPE_GRACE_S, ExecRunner


def _live_members(pgid: int) -> list[int]:
    """The pids of process group ``pgid`` that are not zombies (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return out


def _group_gone(pgid: int) -> bool:
    if _live_members(pgid):
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return True  # only zombies not yet reaped by init are left: nothing runs


def _pgids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def _request(script: str, *, timeout_s: float | None = None) -> UnitRequest:
    return UnitRequest(
        run_id="r-1",
        step_id="s",
        unit_id="s",
        dispatch_id="d-1",
        attempt=1,
        kind="exec",
        argv=("sh", "-c", script),
        env={"PATH": os.environ["PATH"]},
        timeout_s=timeout_s,
    )


# (what the unit leaves behind, the script after it wrote its pgid, expected output or error)
LEFTOVERS = [
    ("a background sleep holding stdout", "sleep 300 & echo done", "done\n"),
    ("one with its pipes closed", "sleep 300 >/dev/null 2>&1 & echo done", "done\n"),
    ("one holding only stderr", "sleep 300 >/dev/null & echo done", "done\n"),
    ("a double fork in the group", "(sleep 300 &) ; echo done", "done\n"),
    ("several", "sleep 300 & sleep 301 & (sleep 302 &); echo done", "done\n"),
    ("one ignoring SIGTERM", "sh -c 'trap \"\" TERM; sleep 300' & sleep 0.2; echo done", "done\n"),
    ("a failed unit's", "sleep 300 & echo gone >&2; exit 3", "exited with status 3; stderr: gone"),
]


@pytest.mark.parametrize(("what", "script", "expected"), LEFTOVERS, ids=[c[0] for c in LEFTOVERS])
def test_what_an_exec_unit_leaves_in_its_group_ends_with_its_attempt(
    tmp_path: Path, what: str, script: str, expected: str
) -> None:
    pg_file = tmp_path / "pgid"
    runner = ExecRunner(state_dir=str(tmp_path / "state"))
    started = time.monotonic()
    try:
        result = runner.run(_request(f"echo $$ > {pg_file}; {script}", timeout_s=60))
        got = str(result.output)
    except RunnerError as exc:
        got = str(exc)
    elapsed = time.monotonic() - started
    [pgid] = _pgids(pg_file)
    assert got == expected
    assert _group_gone(pgid), f"{what}: {_live_members(pgid)} still alive"
    assert elapsed < TERM_GRACE_S + PIPE_GRACE_S + 5  # never the 300 s nor the 60 s timeout
    assert list((tmp_path / "state" / "procs").glob("*")) == []


def test_a_unit_without_leftovers_is_not_slowed_by_ending_its_group(tmp_path: Path) -> None:
    runner = ExecRunner()
    started = time.monotonic()
    for _ in range(10):
        assert runner.run(_request("echo ok")).output == "ok\n"
    assert time.monotonic() - started < 5


def test_end_group_of_an_empty_group_says_nothing_and_of_a_live_one_how() -> None:
    done = subprocess.Popen(["true"], start_new_session=True)
    done.wait()
    assert end_group(done.pid) is None
    live = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert end_group(live.pid, grace_s=2) == "SIGTERM"
        assert live.wait(5) == -signal.SIGTERM
    finally:
        live.kill()
        live.wait()


def test_wf_run_of_a_step_leaving_sleep_300_ends_it_with_the_attempt(tmp_path: Path) -> None:
    pg_file = tmp_path / "pgid"
    flow = write_file(
        tmp_path,
        "bg.yaml",
        f"""
name: bg
steps:
  - id: s
    exec: [sh, -c, "echo $$ > {pg_file}; sleep 300 & echo done"]
""",
    )
    started = time.monotonic()
    done = run_wf(tmp_path / "state", "run", str(flow), timeout=60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    assert "done" in done.stdout
    [pgid] = _pgids(pg_file)
    assert _group_gone(pgid), _live_members(pgid)


def _killed_mid_unit(tmp_path: Path, state_dir: Path) -> tuple[str, Path]:
    """``wf run`` SIGKILLed while its unit (which leaves a sleep 300) runs; the run id and
    the file of process groups, one line per launch."""
    pg_file, marker = tmp_path / "pgids", tmp_path / "ran-once"
    flow = write_file(
        tmp_path,
        "once.yaml",
        f"""
name: once
steps:
  - id: nap
    exec: [sh, -c, "echo $$ >> {pg_file}; sleep 300 & if [ -e {marker} ]; then echo done;
      else touch {marker}; sleep 300; fi"]
""",
    )
    proc = spawn_wf(state_dir, "run", str(flow))
    wait_for(
        lambda: marker.exists() and any((state_dir / "procs").glob("*.json")),
        what="the exec unit to start",
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    [pgid] = _pgids(pg_file)
    assert len(_live_members(pgid)) >= 2  # the unit and its leftover outlived the driver
    [run_id] = [
        line.split()[0]
        for line in run_wf(state_dir, "list").stdout.splitlines()
        if line.startswith("r-")
    ]
    return run_id, pg_file


def test_after_kill_9_a_resume_ends_the_old_group_and_the_rerun_ends_its_own(
    tmp_path: Path, state_dir: Path
) -> None:
    run_id, pg_file = _killed_mid_unit(tmp_path, state_dir)
    resumed = run_wf(state_dir, "resume", run_id, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    first, second = _pgids(pg_file)
    assert _group_gone(first), _live_members(first)
    assert _group_gone(second), _live_members(second)
    assert not any((state_dir / "procs").glob("*.json"))


def test_after_kill_9_gc_of_the_abandoned_run_ends_the_group(
    tmp_path: Path, state_dir: Path
) -> None:
    run_id, pg_file = _killed_mid_unit(tmp_path, state_dir)
    [pgid] = _pgids(pg_file)
    try:
        abandoned = run_wf(state_dir, "abandon", run_id)
        assert abandoned.returncode == 0, abandoned.stderr
        gone = run_wf(state_dir, "gc", "--older-than", "0s")
        assert gone.returncode == 0, gone.stderr
        assert _group_gone(pgid), _live_members(pgid)
        assert not any((state_dir / "procs").glob("*.json"))
    finally:
        end_group(pgid, grace_s=0.5)
