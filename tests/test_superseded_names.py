"""A run another took the place of names its successor in `wf list` and `wf status`, as the
README says (issue 31, item 25): a failed run edited and re-run keeps its failure and names
the new run; an unfinished one is abandoned with the reason ``superseded by …``."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import wf_inproc, write_file

FAILING = """\
name: sup
steps:
  - id: boom
    exec: [python3, -c, "import sys; sys.exit('WHY')"]
"""


def _run_id(stdout: str) -> str:
    return stdout.split()[1]


def test_a_failed_run_superseded_by_an_edit_names_its_successor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "s"
    flow = write_file(tmp_path, "f.yaml", FAILING.replace("WHY", "nope"))
    first = wf_inproc(capsys, state, "run", str(flow))
    assert first.returncode == 1
    failed = _run_id(first.stdout)
    flow.write_text(FAILING.replace("WHY", "nope again"))
    second = wf_inproc(capsys, state, "run", str(flow))
    successor = _run_id(second.stdout)
    assert successor != failed

    listed = wf_inproc(capsys, state, "list").stdout.splitlines()
    by_id = {line.split()[0]: line for line in listed}
    assert by_id[failed].endswith(f"stderr: nope  superseded by {successor}")
    assert "superseded" not in by_id[successor]
    status = wf_inproc(capsys, state, "status", failed).stdout.splitlines()
    assert status[:3] == [
        f"Run {failed}  sup  [failed]",
        "  reason: step boom: unit boom failed: exited with status 1; stderr: nope",
        f"  superseded by {successor}",
    ]
    assert "superseded" not in wf_inproc(capsys, state, "status", successor).stdout
    # `wf status` alone lists the runs, and says it there too
    assert f"superseded by {successor}" in wf_inproc(capsys, state, "status").stdout


def test_a_failed_run_nobody_replaced_names_no_successor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "s"
    flow = write_file(tmp_path, "f.yaml", FAILING.replace("WHY", "nope"))
    failed = _run_id(wf_inproc(capsys, state, "run", str(flow)).stdout)
    other = write_file(tmp_path, "g.yaml", FAILING.replace("sup", "other"))
    wf_inproc(capsys, state, "run", str(other))  # another workflow: no supersession
    assert "superseded" not in wf_inproc(capsys, state, "list").stdout
    assert "superseded" not in wf_inproc(capsys, state, "status", failed).stdout
