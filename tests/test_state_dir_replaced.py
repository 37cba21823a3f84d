"""A state dir deleted or replaced under a live Engine: reopened, never journaled into the void."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from wf_magic import Engine, UsageError, register_function

ONE = """
name: one
params:
  n: {type: integer, default: 0}
steps:
  - id: s
    prompt: "Say {{ params.n }}"
"""


def _runs_on_disk(state_dir: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(state_dir / "state.db") as conn:
        return list(conn.execute("SELECT workflow, status FROM runs ORDER BY created_at"))


def test_a_deleted_state_dir_is_reopened_and_the_next_run_lands_on_disk(
    engine: Engine, state_dir: Path
) -> None:
    engine.run(ONE)
    shutil.rmtree(state_dir, ignore_errors=True)  # a tour's first cell, the second time round
    again = engine.run(ONE, params={"n": 1})
    assert again.status == "completed"
    assert _runs_on_disk(state_dir) == [("one", "completed")]
    assert [r.run_id for r in engine.list_runs()] == [again.run_id]


def test_a_replaced_state_dir_is_read_as_it_now_is(engine: Engine, state_dir: Path) -> None:
    first = engine.run(ONE).run_id
    shutil.rmtree(state_dir, ignore_errors=True)  # as a tour does (a checkpoint may race it)
    with Engine(state_dir) as other:
        theirs = other.run(ONE, params={"n": 7}).run_id
    assert [r.run_id for r in engine.list_runs()] == [theirs]
    with pytest.raises(UsageError, match="No run"):
        engine.get_run(first)


def test_a_run_whose_state_dir_vanishes_mid_drive_stops_with_one_line(
    engine: Engine, state_dir: Path
) -> None:
    register_function("wipe_state", lambda: shutil.rmtree(state_dir, ignore_errors=True) or "wiped")
    source = """
name: wiper
steps:
  - id: wipe
    python: wipe_state
  - id: after
    prompt: "After"
"""
    with pytest.raises(UsageError) as caught:
        engine.run(source)
    message = str(caught.value)
    assert "was deleted or replaced while the run was open" in message
    assert "\n" not in message
    # Nothing was written into the unlinked file as if it were still there, and the new
    # state dir holds no half of the lost run.
    assert not (state_dir / "state.db").exists() or _runs_on_disk(state_dir) == []
    assert engine.run(ONE).status == "completed"
