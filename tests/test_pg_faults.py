"""Faults of a run journaled on PostgreSQL, with real processes and a real server.

kill -9 mid-map then a resume from another process; a driver paused (SIGSTOP) past its lease
while a second one takes the run over and finishes, then continued (SIGCONT): its next write
fails with LeaseLost, it exits 75 and adds no row; its connections terminated by the server
(``pg_terminate_backend``): one line, nothing half-written, a resume finishes. These need a
server: ``WF_MAGIC_TEST_PG`` (`.ci/run` starts one); without it they skip with that reason.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from .backends import PgState, pg_server
from .conftest import attempts_in, db_rows, run_wf, spawn_wf, wait_for, write_file

pytestmark = pytest.mark.skipif(
    pg_server() is None, reason="needs a PostgreSQL server: set WF_MAGIC_TEST_PG (see .ci/run)"
)

MAP_NAPS = """\
name: naps
steps:
  - id: nap
    map: "{{ range(6) | list }}"
    exec: [python3, -c, "import time, os; time.sleep(float(os.environ.get('NAP', '0.6'))); print(os.environ['WF_DISPATCH_ID'])"]
    pass_env: [NAP]
  - id: last
    prompt: "bye"
"""
TTL_S = 2.0


@pytest.fixture
def pg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PgState:
    server = pg_server()
    assert server is not None
    local = tmp_path / "pg-local"
    monkeypatch.setenv("WF_MAGIC_LOCAL_DIR", str(local))
    monkeypatch.setenv("WF_MAGIC_LEASE_TTL", str(TTL_S))
    monkeypatch.setenv("NAP", "0.6")
    return PgState(server, local)


def _run_id(pg: PgState) -> str:
    return str(db_rows(pg, "SELECT run_id FROM runs")[0][0])


def _succeeded_once(pg: PgState) -> dict[str, int]:
    """Unit → its succeeded attempts (each unit must have exactly one)."""
    out: dict[str, int] = {}
    for unit, _, status, _ in attempts_in(pg):
        if status == "succeeded":
            out[unit] = out.get(unit, 0) + 1
    return out


def test_kill_9_mid_map_then_resume_from_another_process(tmp_path: Path, pg: PgState) -> None:
    path = write_file(tmp_path, "wf.yaml", MAP_NAPS)
    proc = spawn_wf(pg, "run", str(path), "--max-concurrency", "2")
    wait_for(
        lambda: (
            sum(s == "succeeded" for _, _, s, _ in attempts_in(pg)) >= 2
            and any(s == "running" for _, _, s, _ in attempts_in(pg))
        ),
        what="two map units done and one in flight",
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    before = attempts_in(pg)
    in_flight = {u: d for u, _, s, d in before if s == "running"}
    assert in_flight
    done = run_wf(pg, "resume", _run_id(pg))  # another process, at once: the holder is dead
    assert done.returncode == 0, done.stderr
    after = attempts_in(pg)
    assert _succeeded_once(pg) == {**{f"nap[{i}]": 1 for i in range(6)}, "last": 1}
    reclaimed = {u: d for u, _, s, d in after if u in in_flight}
    assert reclaimed == in_flight  # reclaimed in place: the same dispatch ids
    charged = db_rows(
        pg, "SELECT unit_id, COUNT(*) FROM attempts WHERE charged = 1 GROUP BY unit_id"
    )
    assert all(int(n) == 1 for _, n in charged)  # nothing charged twice


def test_a_driver_paused_past_its_lease_loses_it_and_exits_75_writing_nothing(
    tmp_path: Path, pg: PgState
) -> None:
    path = write_file(tmp_path, "wf.yaml", MAP_NAPS)
    first = spawn_wf(pg, "run", str(path), "--max-concurrency", "1")
    wait_for(
        lambda: any(s == "succeeded" for _, _, s, _ in attempts_in(pg)),
        what="the first map unit",
    )
    os.kill(first.pid, signal.SIGSTOP)
    try:
        run_id = _run_id(pg)
        time.sleep(TTL_S + 0.5)  # the lease runs out on the database's clock
        second = run_wf(pg, "resume", run_id, timeout=120)
        assert second.returncode == 0, second.stderr
        assert db_rows(pg, "SELECT status FROM runs")[0][0] == "completed"
        rows_before = db_rows(pg, "SELECT COUNT(*) FROM attempts")[0][0]
        events_before = db_rows(pg, "SELECT COUNT(*) FROM events")[0][0]
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 75, (out, err)
    assert "lost its lease" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1  # one line
    assert db_rows(pg, "SELECT COUNT(*) FROM attempts")[0][0] == rows_before
    assert db_rows(pg, "SELECT COUNT(*) FROM events")[0][0] == events_before
    assert db_rows(pg, "SELECT status FROM runs")[0][0] == "completed"
    assert _succeeded_once(pg) == {**{f"nap[{i}]": 1 for i in range(6)}, "last": 1}


def test_a_driver_whose_connections_are_terminated_fails_in_one_line_and_resumes(
    tmp_path: Path, pg: PgState
) -> None:
    path = write_file(tmp_path, "wf.yaml", MAP_NAPS)
    proc = spawn_wf(pg, "run", str(path), "--max-concurrency", "1")
    wait_for(
        lambda: any(s == "succeeded" for _, _, s, _ in attempts_in(pg)),
        what="the first map unit",
    )
    with pg.connect() as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (f"wf_magic pid {proc.pid}",),
        ).fetchone()[0]
    assert killed >= 1
    out, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    if proc.returncode != 0:
        assert len(lines) == 1, err  # one line, no traceback
        assert "PostgreSQL server" in lines[0] or "lost its lease" in lines[0], lines[0]
    statuses = {s for _, _, s, _ in attempts_in(pg)}
    assert statuses <= {"running", "succeeded"}  # nothing half-written, nothing failed
    done = run_wf(pg, "resume", _run_id(pg), timeout=120)
    assert done.returncode == 0, done.stderr
    assert _succeeded_once(pg) == {**{f"nap[{i}]": 1 for i in range(6)}, "last": 1}


def test_the_lease_names_its_holder_and_a_second_driver_is_refused(
    tmp_path: Path, pg: PgState
) -> None:
    path = write_file(tmp_path, "wf.yaml", MAP_NAPS)
    proc = spawn_wf(pg, "run", str(path), "--max-concurrency", "1")
    try:
        wait_for(lambda: bool(attempts_in(pg)), what="the first attempt")
        run_id = _run_id(pg)
        holder, epoch = db_rows(pg, "SELECT lease_holder, lease_epoch FROM runs")[0]
        assert f'"pid": {proc.pid}' in str(holder) and int(str(epoch)) == 1
        refused = run_wf(pg, "resume", run_id)
        assert refused.returncode == 75
        assert f"pid {proc.pid}" in refused.stderr
        skipped = run_wf(pg, "resume", run_id, "--skip-if-locked")
        assert skipped.returncode == 0
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert db_rows(pg, "SELECT lease_holder, lease_expires FROM runs") == [(None, None)]
