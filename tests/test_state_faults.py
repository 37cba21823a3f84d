"""State-DB faults and hand-edited rows end in one clear line, never a traceback (issue 12).

Each test breaks the state directory the way a full disk, a stuck writer, a bad sector or a
person with the sqlite3 shell would, then runs the real ``wf`` entry point and checks the exit
code and that stderr is one ``error: ...`` line naming the run and what to do next.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from wf_magic import Engine, register_function
from wf_magic.hashing import sha256_text
from wf_magic.spec.plan import OLDEST_PLAN_VERSION
from wf_magic.store import db as state_db
from wf_magic.store import store as store_module

from .conftest import CliResult, attempts_in, db_rows, tamper, wf_inproc

FLOW = """\
name: faulty
steps:
  - id: a
    prompt: "hello"
  - id: b
    prompt: "uses {{ steps.a.output }}"
"""

BIG = """\
name: big
steps:
  - id: a
    python: big_text
  - id: b
    prompt: "after {{ steps.a.output | length }}"
"""


def big_text() -> str:
    return "x" * 400_000  # needs fresh pages: the write that journals it grows the file


register_function("big_text", big_text)


def _one_line_error(result: CliResult, code: int, *needles: str) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


def _half_run(engine: Engine, source: str = FLOW) -> str:
    run = engine.run(source, max_steps=1)
    assert run.status == "active"
    engine.close()
    return run.run_id


def _status(state_dir: Path, run_id: str) -> str:
    return str(db_rows(state_dir, "SELECT status FROM runs WHERE run_id = ?", (run_id,))[0][0])


# -- the disk and the write lock ----------------------------------------------------------------
def test_a_full_disk_mid_drive_says_free_space_and_resume_and_leaves_the_run_resumable(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    run_id = engine.start(BIG).run_id
    engine.close()
    real_open = store_module.open_state_db

    def full_disk(path: Path, *, durability: str = "normal") -> sqlite3.Connection:
        conn = real_open(path, durability=durability)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")  # any growth is now SQLITE_FULL
        return conn

    monkeypatch.setattr(store_module, "open_state_db", full_disk)
    result = wf_inproc(capsys, state_dir, "resume", run_id)
    _one_line_error(
        result, 1, f"Run {run_id}:", "database or disk is full", f"`wf resume {run_id}`"
    )
    assert _status(state_dir, run_id) == "active"
    assert [s for _u, _n, s, _d in attempts_in(state_dir)] == ["running"]  # nothing half-written

    monkeypatch.setattr(store_module, "open_state_db", real_open)
    assert wf_inproc(capsys, state_dir, "resume", run_id).returncode == 0
    assert _status(state_dir, run_id) == "completed"
    done = Counter((u, s) for u, _n, s, _d in attempts_in(state_dir))
    assert done == {("a", "succeeded"): 1, ("b", "succeeded"): 1}


def test_a_write_lock_held_past_the_busy_timeout_says_so_and_keeps_the_run(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    run_id = engine.start(FLOW).run_id
    engine.close()
    monkeypatch.setattr(state_db, "BUSY_TIMEOUT_MS", 200)
    holder = sqlite3.connect(state_dir / "state.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        result = wf_inproc(capsys, state_dir, "resume", run_id)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    _one_line_error(result, 1, f"Run {run_id}:", "database is locked", f"`wf resume {run_id}`")
    assert _status(state_dir, run_id) == "active"
    assert wf_inproc(capsys, state_dir, "resume", run_id).returncode == 0


READ_VERBS = ("status", "list", "journal", "tokens")


def test_read_verbs_never_wait_for_the_write_lock(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    run_id = _half_run(engine)
    monkeypatch.setattr(state_db, "BUSY_TIMEOUT_MS", 200)
    holder = sqlite3.connect(state_dir / "state.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        for verb in READ_VERBS:
            args = (verb,) if verb == "list" else (verb, run_id)
            result = wf_inproc(capsys, state_dir, *args)
            assert result.returncode == 0, (verb, result.stderr)
            assert result.stderr == ""
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_read_verbs_work_on_a_read_only_filesystem(
    engine: Engine, state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _half_run(engine)
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(
        ["mount", "--bind", "-o", "ro", str(state_dir), str(ro)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip("needs a read-only bind mount (root)")
    try:
        for verb in READ_VERBS:
            args = (verb,) if verb == "list" else (verb, run_id)
            result = wf_inproc(capsys, ro, *args)
            assert result.returncode == 0, (verb, result.stderr)
            assert result.stderr == ""
        resumed = wf_inproc(capsys, ro, "resume", run_id)
        _one_line_error(resumed, 2, f"Run {run_id}:", "Read-only file system", "writable")
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True, check=False)


@pytest.mark.filterwarnings("default")
def test_an_empty_state_db_is_a_new_database_and_says_so_once(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir.mkdir()
    (state_dir / "state.db").write_bytes(b"")
    os.utime(state_dir / "state.db", (1, 1))  # left empty long ago, not being created now
    result = wf_inproc(capsys, state_dir, "list")
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        f"warning: {state_dir / 'state.db'} is empty (0 bytes); treating it as a new state "
        "database (no runs)."
    ]
    assert wf_inproc(capsys, state_dir, "list").stderr == ""


def test_a_file_that_is_not_a_database_is_the_one_to_move_aside(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir.mkdir()
    (state_dir / "state.db").write_bytes(b"this is a shopping list, not a database" * 200)
    _one_line_error(wf_inproc(capsys, state_dir, "list"), 2, "Move it aside")


# -- damaged pages and hand-edited rows ---------------------------------------------------------
def test_garbage_in_the_middle_of_state_db_names_the_damage_and_integrity_check(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _half_run(engine)
    conn = sqlite3.connect(state_dir / "state.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the pages are in the file, not the WAL
    conn.close()
    path = state_dir / "state.db"
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(size // 4)
        f.write(b"\xa5" * (size // 2))
    for args in (("status", run_id), ("resume", run_id)):
        line = _one_line_error(wf_inproc(capsys, state_dir, *args), 1, f"Run {run_id}:")
        assert "malformed" in line and "integrity_check:" in line and ".recover" in line
    line = _one_line_error(wf_inproc(capsys, state_dir, "list"), 1, "integrity_check:")
    assert "Move it aside" not in line


def test_an_undecodable_rehashed_plan_is_one_warning_line_for_status(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 19: status reports the run from its row (exit 0); the plan is never decoded.
    run_id = _half_run(engine)
    plan = '{"name": 5}'
    tamper(
        engine,
        "UPDATE runs SET plan_json = ?, plan_hash = ? WHERE run_id = ?",
        (plan, sha256_text(plan), run_id),
    )
    result = wf_inproc(capsys, state_dir, "status", run_id)
    assert result.returncode == 0
    assert result.stdout.startswith(f"Run {run_id}  faulty  [active]")
    assert result.stderr.splitlines() == [
        f"warning: Run {run_id}: its stored plan does not decode (name: expected a string "
        "(got 5)); it was edited outside wf_magic and cannot be driven; start afresh with "
        "`wf run FILE --new`"
    ]


def test_a_broken_step_output_is_refused_before_anything_dispatches(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _half_run(engine)
    tamper(engine, "UPDATE steps SET output_json = '{broken' WHERE step_id = 'a'")
    before = attempts_in(state_dir)
    result = wf_inproc(capsys, state_dir, "resume", run_id)
    _one_line_error(result, 1, f"Run {run_id}:", "step a's stored output_json is not valid JSON")
    assert attempts_in(state_dir) == before
    assert _status(state_dir, run_id) == "active"


def test_a_deleted_step_row_is_refused_before_anything_dispatches(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _half_run(engine)
    tamper(engine, "DELETE FROM steps WHERE step_id = 'b'")
    before = attempts_in(state_dir)
    result = wf_inproc(capsys, state_dir, "resume", run_id)
    _one_line_error(result, 1, f"Run {run_id}:", "step row(s) ['b'] are missing")
    assert attempts_in(state_dir) == before


def test_a_locks_path_that_is_a_file_says_move_it_aside(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _half_run(engine)
    locks = state_dir / "locks"
    for child in locks.iterdir():
        child.unlink()
    locks.rmdir()
    locks.write_text("not a directory")
    result = wf_inproc(capsys, state_dir, "resume", run_id)
    _one_line_error(result, 2, f"Run {run_id}:", "is not a directory", "move that file aside")


# -- abandoned and older runs -------------------------------------------------------------------
def test_abandoning_twice_exits_1_naming_the_first_reason(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _half_run(engine)
    first = wf_inproc(capsys, state_dir, "abandon", run_id)
    assert (first.returncode, first.stdout) == (0, f"run {run_id} abandoned\n")
    again = wf_inproc(capsys, state_dir, "abandon", run_id)
    _one_line_error(again, 1, f"Run {run_id} is already abandoned (reason: abandoned by user)")
    assert again.stdout == ""


def test_resuming_an_abandoned_run_says_how_to_start_afresh_on_stderr(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _half_run(engine)
    assert wf_inproc(capsys, state_dir, "abandon", run_id).returncode == 0
    result = wf_inproc(capsys, state_dir, "resume", run_id)
    _one_line_error(
        result, 1, f"Run {run_id} was abandoned", "`wf run FILE --new`", f"`wf fork {run_id}"
    )
    assert attempts_in(state_dir)[-1][0] == "a"  # nothing dispatched


def test_an_older_supported_plan_version_is_driven(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # DESIGN.md §7: every version from OLDEST_PLAN_VERSION to PLAN_VERSION is driven.
    run_id = _half_run(engine)
    tamper(
        engine, "UPDATE runs SET plan_version = ? WHERE run_id = ?", (OLDEST_PLAN_VERSION, run_id)
    )
    assert wf_inproc(capsys, state_dir, "resume", run_id).returncode == 0
    assert _status(state_dir, run_id) == "completed"


def test_an_older_plan_version_that_cannot_decode_abandons_with_guidance(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _half_run(engine)
    old = '{"name":"faulty","plan_version":0,"tasks":[]}'
    tamper(
        engine,
        "UPDATE runs SET plan_json = ?, plan_hash = ?, plan_version = 0 WHERE run_id = ?",
        (old, sha256_text(old), run_id),
    )
    result = wf_inproc(capsys, state_dir, "resume", run_id)
    _one_line_error(result, 1, f"Run {run_id}:", "no longer supported", "--new", "abandoned")
    assert _status(state_dir, run_id) == "abandoned"
