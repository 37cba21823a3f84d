"""Exec and agent units outliving a killed driver (issue 12, item 18): the sidecar and the
reaper.

The crash cases run ``wf run`` in a real process, kill it with SIGKILL while its exec unit
sleeps, and check what :func:`reap_orphan` does to the unit's process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.agent_fakes.bins import git_repo, make_bins
from tests.conftest import run_wf, spawn_wf, wait_for, write_file
from wf_magic.runners.base import UnitRequest
from wf_magic.runners.orphans import (
    UnitProcess,
    read_unit_process,
    reap_orphan,
    record_unit_process,
    sidecar_path,
)
from wf_magic.runners.process import ExecRunner


def _sleeper(tmp_path: Path) -> Path:
    """A workflow whose exec unit starts a background sleep and waits for it."""
    pid_file = tmp_path / "sleep.pid"
    return write_file(
        tmp_path,
        "sleeper.yaml",
        f"""
name: sleeper
steps:
  - id: nap
    exec: [sh, -c, "sleep 60 & echo $! > {pid_file}; wait"]
""",
    )


def _live_members(pgid: int) -> list[int]:
    """The pids in process group ``pgid`` that are not zombies."""
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


def _running_unit(state_dir: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], UnitProcess]:
    """``wf run`` of the sleeper, once its unit's sidecar and background sleep exist."""
    proc = spawn_wf(state_dir, "run", str(_sleeper(tmp_path)))
    procs = state_dir / "procs"
    wait_for(
        lambda: (tmp_path / "sleep.pid").exists() and any(procs.glob("*.json")),
        what="the exec unit to start",
    )
    [sidecar] = procs.glob("*.json")
    record = read_unit_process(state_dir, sidecar.stem)
    assert record is not None
    return proc, record


def _kill9(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)


def test_the_sidecar_names_the_units_group_host_and_driver_while_it_runs(
    tmp_path: Path, state_dir: Path
) -> None:
    proc, record = _running_unit(state_dir, tmp_path)
    try:
        assert record.owner_pid == proc.pid
        assert record.unit_id == "nap"
        assert record.argv0 == "sh"
        assert int((tmp_path / "sleep.pid").read_text()) in _live_members(record.pgid)
    finally:
        _kill9(proc)
        reap_orphan(state_dir, record.dispatch_id)


def test_reap_orphan_kills_the_group_of_a_unit_whose_driver_was_killed(
    tmp_path: Path, state_dir: Path
) -> None:
    proc, record = _running_unit(state_dir, tmp_path)
    _kill9(proc)
    sleep_pid = int((tmp_path / "sleep.pid").read_text())
    assert sleep_pid in _live_members(record.pgid)  # the unit outlived its driver

    message = reap_orphan(state_dir, record.dispatch_id)

    assert message is not None
    assert message.startswith(
        f"killed exec unit nap (dispatch {record.dispatch_id}, process group {record.pgid})"
        f" left running by dead driver pid {proc.pid} (SIGTERM"
    )
    assert _live_members(record.pgid) == []
    assert not sidecar_path(state_dir, record.dispatch_id).exists()
    assert reap_orphan(state_dir, record.dispatch_id) is None  # nothing left to do


def test_reap_orphan_never_kills_the_group_of_a_live_driver(
    tmp_path: Path, state_dir: Path
) -> None:
    proc, record = _running_unit(state_dir, tmp_path)
    try:
        message = reap_orphan(state_dir, record.dispatch_id, grace_s=0.1)

        assert message == (
            f"exec unit nap (dispatch {record.dispatch_id}, process group {record.pgid}) "
            f"left alone: its driver pid {proc.pid} is alive"
        )
        assert int((tmp_path / "sleep.pid").read_text()) in _live_members(record.pgid)
        assert sidecar_path(state_dir, record.dispatch_id).exists()
    finally:
        _kill9(proc)
        reap_orphan(state_dir, record.dispatch_id)


def test_reap_orphan_leaves_a_group_recorded_on_another_host_alone(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        path = record_unit_process(
            tmp_path, dispatch_id="d1", run_id="r-1", unit_id="u", pid=sleeper.pid, argv0="sleep"
        )
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "host": "elsewhere", "owner_pid": 2**22 + 1}))

        message = reap_orphan(tmp_path, "d1")

        assert message is not None
        assert "was started on host elsewhere, not " in message
        assert message.endswith(": not touched; stop it there if it still runs")
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_stale_sidecar_of_an_ended_group_is_removed_quietly(tmp_path: Path) -> None:
    ended = subprocess.Popen(["true"], start_new_session=True)
    ended.wait()
    path = record_unit_process(
        tmp_path, dispatch_id="d2", run_id="r-1", unit_id="u", pid=ended.pid, argv0="true"
    )
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "owner_pid": 2**22 + 1}))  # a dead driver

    assert reap_orphan(tmp_path, "d2") is None
    assert not path.exists()
    assert reap_orphan(tmp_path, "no-such-dispatch") is None


def test_the_reapers_line_names_an_agent_unit_as_one(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        path = record_unit_process(
            tmp_path,
            dispatch_id="d4",
            run_id="r-1",
            unit_id="fix",
            pid=sleeper.pid,
            argv0="claude",
            kind="agent",
        )
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "owner_pid": 2**22 + 1}))  # a dead driver

        message = reap_orphan(tmp_path, "d4", grace_s=0.5)

        assert message is not None
        assert message.startswith(
            f"killed agent unit fix (dispatch d4, process group {sleeper.pid}) "
            f"left running by dead driver pid {2**22 + 1} (SIGTERM"
        )
        assert sleeper.wait(5) == -signal.SIGTERM
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_sidecar_written_before_kinds_were_kept_reads_as_an_exec_units(tmp_path: Path) -> None:
    path = record_unit_process(
        tmp_path, dispatch_id="d5", run_id="r-1", unit_id="u", pid=2**22 + 2, argv0="sh"
    )
    data = json.loads(path.read_text())
    assert data["kind"] == "exec"
    del data["kind"]
    path.write_text(json.dumps(data))
    record = read_unit_process(tmp_path, "d5")
    assert record is not None and record.kind == "exec"


def test_a_running_agent_units_sidecar_says_agent_and_its_reaping_says_so(
    tmp_path: Path, state_dir: Path
) -> None:
    bins = make_bins(tmp_path / "bin")
    flow = git_repo(tmp_path / "repo") / "agent.yaml"  # the agent works in the file's folder
    flow.write_text(
        "name: napper\nsteps:\n  - id: fix\n    agent: claude\n"
        "    prompt: 'Wait [[sleep 60]]'\n"
        f"runners:\n  claude: {{bin: {bins['claude']}}}\n"
    )
    proc = spawn_wf(state_dir, "run", str(flow))
    wait_for(lambda: any((state_dir / "procs").glob("*.json")), what="the agent unit to start")
    [sidecar] = (state_dir / "procs").glob("*.json")
    record = read_unit_process(state_dir, sidecar.stem)
    assert record is not None
    assert (record.kind, record.unit_id, record.argv0) == ("agent", "fix", str(bins["claude"]))
    _kill9(proc)

    message = reap_orphan(state_dir, record.dispatch_id)

    assert message is not None
    assert message.startswith(
        f"killed agent unit fix (dispatch {record.dispatch_id}, process group {record.pgid})"
    )
    assert _live_members(record.pgid) == []


def test_a_finished_exec_unit_leaves_no_sidecar(tmp_path: Path) -> None:
    runner = ExecRunner(state_dir=str(tmp_path))
    request = UnitRequest(
        run_id="r-1",
        step_id="s",
        unit_id="s",
        dispatch_id="d3",
        attempt=1,
        kind="exec",
        argv=("sh", "-c", "echo ok"),
        env={"PATH": os.environ["PATH"]},
    )

    assert runner.run(request).output == "ok\n"
    assert list((tmp_path / "procs").glob("*")) == []


def test_a_resume_reaps_the_dead_drivers_exec_group_before_it_reruns_the_unit(
    tmp_path: Path, state_dir: Path
) -> None:
    """The reclaim path calls the reaper: the old group is gone before the unit runs again."""
    pid_file, marker = tmp_path / "sleep.pid", tmp_path / "ran-once"
    flow = write_file(
        tmp_path,
        "once.yaml",
        f"""
name: once
steps:
  - id: nap
    exec: [sh, -c, "if [ -e {marker} ]; then echo again; else touch {marker};
      sleep 60 & echo $! > {pid_file}; wait; fi"]
""",
    )
    proc = spawn_wf(state_dir, "run", str(flow))
    wait_for(
        lambda: pid_file.exists() and any((state_dir / "procs").glob("*.json")),
        what="the exec unit to start",
    )
    [sidecar] = (state_dir / "procs").glob("*.json")
    record = read_unit_process(state_dir, sidecar.stem)
    assert record is not None
    _kill9(proc)
    assert int(pid_file.read_text()) in _live_members(record.pgid)

    [run_id] = [
        line.split()[0]
        for line in run_wf(state_dir, "list").stdout.splitlines()
        if line.startswith("r-")
    ]
    resumed = run_wf(state_dir, "resume", run_id)

    assert resumed.returncode == 0, resumed.stderr
    assert _live_members(record.pgid) == []
    assert f"killed exec unit nap (dispatch {record.dispatch_id}" in resumed.stderr
    assert not any((state_dir / "procs").glob("*.json"))
