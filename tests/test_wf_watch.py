"""``wf watch RUN``: the CLI name of ``%workflow watch`` (issue 33 item 8), printing the run's
events as ``wf events RUN --follow`` does until the run settles, with real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import db_rows, run_wf, spawn_wf, wait_for, write_file

NAP = """\
name: nap
steps:
  - id: first
    prompt: "hello"
  - id: nap
    exec: [python3, -c, "import time; time.sleep(1.0)"]
  - id: last
    prompt: "bye"
"""


def test_wf_watch_follows_a_run_driven_by_another_process_until_it_settles(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    path = write_file(tmp_path, "nap.yaml", NAP)
    driver = spawn_wf(state, "run", str(path))
    wait_for(lambda: bool(db_rows(state, "SELECT run_id FROM runs")), what="the run")
    run_id = str(db_rows(state, "SELECT run_id FROM runs")[0][0])
    watched = run_wf(state, "watch", run_id)
    driver.communicate(timeout=60)
    assert (driver.returncode, watched.returncode) == (0, 0)
    lines = watched.stdout.splitlines()
    assert "run_status" in lines[-1] and '"status": "completed"' in lines[-1]
    assert any("step_status" in line and " last " in f" {line} " for line in lines)
    following = run_wf(state, "events", run_id, "--follow")
    assert following.stdout == watched.stdout  # the same lines, from the same cursor
    assert watched.stderr == following.stderr == f"cursor: {lines[-1].split()[0]}\n"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("r-nope",), 2, "No run 'r-nope'"),
        ((), 2, "the following arguments are required: run"),
        (("r-x", "--idle", "nan"), 2, "argument --idle"),
        (("r-x", "--idle", "-1"), 2, "argument --idle"),
    ],
)
def test_wf_watch_refuses_bad_input_in_one_line(
    tmp_path: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    state = tmp_path / "state"
    result = run_wf(state, "watch", *args)
    assert result.returncode == code
    assert message in result.stderr.strip().splitlines()[-1]
