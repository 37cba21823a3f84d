"""Exec resource limits hold against hostile children (issue 12, items 4 and 6).

Every case drives ``wf run`` in a real process with a hard subprocess timeout, so a limit
that does not hold fails the test instead of hanging the suite. The time bounds are
correctness bounds (a 2 s timeout against a 30 s sleep), not speed benchmarks.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from tests.conftest import db_rows, run_wf, wait_for, write_file


def _is_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _attempts(state_dir: Path) -> list[tuple[str, int, str, str]]:
    return [
        (str(u), int(n), str(s), str(f or ""))
        for u, n, s, f in db_rows(
            state_dir,
            "SELECT unit_id, attempt, status, failure FROM attempts ORDER BY attempt_pk",
        )
    ]


def test_a_background_child_holding_stdout_ends_with_the_unit_not_at_the_timeout(
    tmp_path: Path,
) -> None:
    """Issue 31 item 16: the child's exit ends the attempt and what it left in its group."""
    pid_file = tmp_path / "bg.pid"
    wf = write_file(
        tmp_path,
        "bg.yaml",
        f"""
name: bg-child
steps:
  - id: s
    exec: [sh, -c, "sleep 30 & echo $! > {pid_file}; echo started"]
    timeout: 20
""",
    )
    started = time.monotonic()
    done = run_wf(tmp_path / "state", "run", str(wf), timeout=60)
    elapsed = time.monotonic() - started

    assert done.returncode == 0, done.stderr
    assert elapsed < 15  # never the 20 s timeout nor the 30 s sleep
    [(unit, attempt, status, failure)] = _attempts(tmp_path / "state")
    assert (unit, attempt, status, failure) == ("s", 1, "succeeded", "")
    bg_pid = int(pid_file.read_text())
    wait_for(lambda: not _is_alive(bg_pid), timeout=5, what="the background sleep to be killed")


def test_the_timeout_still_kills_a_group_whose_child_does_not_exit(tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    wf = write_file(
        tmp_path,
        "bg.yaml",
        f"""
name: bg-child
steps:
  - id: s
    exec: [sh, -c, "sleep 30 & echo $! > {pid_file}; echo started; wait"]
    timeout: 2
""",
    )
    started = time.monotonic()
    done = run_wf(tmp_path / "state", "run", str(wf), timeout=60)
    elapsed = time.monotonic() - started

    assert done.returncode == 1, done.stderr
    assert elapsed < 15  # 2 s timeout + interpreter start-up, never the 30 s sleep
    [(unit, attempt, status, failure)] = _attempts(tmp_path / "state")
    assert (unit, attempt, status) == ("s", 1, "failed")
    assert failure == "timed out after 2s and was killed: sh"
    bg_pid = int(pid_file.read_text())
    wait_for(lambda: not _is_alive(bg_pid), timeout=5, what="the background sleep to be killed")


def test_an_endless_producer_fails_at_the_output_cap(tmp_path: Path) -> None:
    wf = write_file(
        tmp_path,
        "yes.yaml",
        """
name: endless
steps:
  - id: s
    exec: ["yes"]
""",
    )
    started = time.monotonic()
    done = run_wf(tmp_path / "state", "run", str(wf), timeout=60)
    elapsed = time.monotonic() - started

    assert done.returncode == 1, done.stderr
    assert elapsed < 20  # no timeout is set: only the cap can stop `yes`
    [(unit, attempt, status, failure)] = _attempts(tmp_path / "state")
    assert (unit, attempt, status) == ("s", 1, "failed")
    assert re.fullmatch(
        r"stdout passed the cap of 1048576 bytes \((\d+) bytes read before the process group "
        r"was killed\); write large results to a file and print its path",
        failure,
    ), failure


def test_output_a_little_over_the_cap_reports_its_exact_size(tmp_path: Path) -> None:
    wf = write_file(
        tmp_path,
        "big.yaml",
        """
name: big
steps:
  - id: s
    exec: [python, -c, "import sys; sys.stdout.write('x' * 2000000)"]
""",
    )
    done = run_wf(tmp_path / "state", "run", str(wf), timeout=60)

    assert done.returncode == 1, done.stderr
    assert _attempts(tmp_path / "state") == [
        (
            "s",
            1,
            "failed",
            "stdout was 2000000 bytes, over the cap of 1048576 bytes; write large results to "
            "a file and print its path",
        )
    ]


def test_the_cap_is_configurable_and_kills_the_whole_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    wf = write_file(
        tmp_path,
        "cap.yaml",
        f"""
name: small-cap
runners:
  exec: {{output_cap: 1000}}
steps:
  - id: s
    exec: [sh, -c, "sleep 30 & echo $! > {pid_file}; yes"]
""",
    )
    done = run_wf(tmp_path / "state", "run", str(wf), timeout=60)

    assert done.returncode == 1, done.stderr
    [(_, _, status, failure)] = _attempts(tmp_path / "state")
    assert status == "failed"
    assert failure.startswith("stdout passed the cap of 1000 bytes (")
    bg_pid = int(pid_file.read_text())
    wait_for(lambda: not _is_alive(bg_pid), timeout=5, what="the group to be killed")


def test_a_normal_exec_with_a_timeout_still_succeeds(tmp_path: Path) -> None:
    wf = write_file(
        tmp_path,
        "ok.yaml",
        """
name: normal
steps:
  - id: s
    exec: [python, -c, "import sys; sys.stderr.write('noise' * 50000); print('{\\"n\\": 3}')"]
    output: {type: object, properties: {n: {type: integer}}, required: [n]}
    timeout: 20
""",
    )
    done = run_wf(tmp_path / "state", "run", str(wf), timeout=60)

    assert done.returncode == 0, done.stderr
    assert _attempts(tmp_path / "state") == [("s", 1, "succeeded", "")]
    [(output,)] = db_rows(tmp_path / "state", "SELECT output_json FROM attempts")
    assert output == '{"n": 3}'


def test_a_child_that_exits_non_zero_reports_the_tail_of_stderr(tmp_path: Path) -> None:
    wf = write_file(
        tmp_path,
        "bad.yaml",
        """
name: bad
steps:
  - id: s
    exec: [sh, -c, "yes noise | head -c 199998 >&2; echo last words >&2; exit 4"]
    timeout: 20
""",
    )
    done = run_wf(tmp_path / "state", "run", str(wf), timeout=60)

    assert done.returncode == 1, done.stderr
    [(_, _, status, failure)] = _attempts(tmp_path / "state")
    assert status == "failed"
    assert failure.startswith("exited with status 4; stderr: ")
    assert failure.endswith("noise\nlast words")


def test_a_setsid_grandchild_escapes_the_kill_but_does_not_hold_the_attempt(
    tmp_path: Path,
) -> None:
    """The documented limit: it leaves the group and survives, yet the attempt ends when the
    unit's child exits, although the grandchild still holds stdout open."""
    pid_file = tmp_path / "escaped.pid"
    wf = write_file(
        tmp_path,
        "setsid.yaml",
        f"""
name: escaped
steps:
  - id: s
    exec: [sh, -c, "setsid sh -c 'echo $$ > {pid_file}; exec sleep 30' & echo started; sleep 0.5"]
    timeout: 20
""",
    )
    started = time.monotonic()
    try:
        done = run_wf(tmp_path / "state", "run", str(wf), timeout=60)
        elapsed = time.monotonic() - started

        assert done.returncode == 0, done.stderr
        assert elapsed < 15
        [(_, _, status, failure)] = _attempts(tmp_path / "state")
        assert (status, failure) == ("succeeded", "")
        assert _is_alive(int(pid_file.read_text()))  # out of the group: not killed
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
