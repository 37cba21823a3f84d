"""Families of runs (issue 20, class 3): a parent and its child workflow runs, driven at once.

Abandoning a parent abandons its unfinished children (so gc never deletes a live child);
a tree abandoned before that (a live child under a finished root) is kept by gc, and a
second `wf abandon` ends it; a child held by another driver leaves the parent's unit owed
and the parent's drive exits 75 naming the holder, never marking the parent failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import db_rows
from tests.helpers_flow import REPO, run_cli
from wf_magic import Engine

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

FAMILY = """
name: fam
steps:
  - id: sub
    workflow: kid
  - id: after
    prompt: After {{ steps.sub.output }}
---
name: kid
steps:
  - id: b
    prompt: Draft
    gate: {judge: human, criteria: [clear]}
"""


def _rows(state_dir: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    return db_rows(state_dir, sql, args)


def _statuses(state_dir: Path) -> dict[str, tuple[object, object]]:
    return {
        str(r): (s, why)
        for r, s, why in _rows(state_dir, "SELECT run_id, status, status_reason FROM runs")
    }


def _blocked_family(state_dir: Path, source: str = FAMILY) -> tuple[str, str]:
    """A parent blocked on its child, which waits for a human verdict: (parent, child)."""
    with Engine(state_dir) as engine:
        parent = engine.run(source)
        [child] = [r.run_id for r in engine.list_runs(include_children=True) if r.parent_run_id]
        assert (parent.status, engine.get_run(child).status) == ("blocked", "blocked")
        return parent.run_id, child


@contextmanager
def held_elsewhere(state_dir: Path, run_id: str) -> Iterator[int]:
    """Another process holding ``run_id``'s lock, as a driver there would; yields its pid."""
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom wf_magic.locking import RunLock\n"
        "lock = RunLock(Path(sys.argv[1]), sys.argv[2]).acquire()\nprint('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(state_dir / "locks"), run_id],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.communicate(timeout=10)


def test_abandoning_a_parent_abandons_its_unfinished_child_and_gc_deletes_the_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    parent, child = _blocked_family(state)
    capsys.readouterr()

    assert run_cli(state, "abandon", parent) == 0
    assert capsys.readouterr().out == (
        f"run {parent} abandoned with its unfinished child run(s) {child}\n"
    )
    assert _statuses(state) == {
        parent: ("abandoned", "abandoned by user"),
        child: ("abandoned", f"parent run {parent} was abandoned"),
    }
    assert run_cli(state, "approve", child, "b") == 2  # the child waits on nothing now
    assert "(status abandoned)" in capsys.readouterr().err

    assert run_cli(state, "gc", "--older-than", "0s") == 0
    assert "deleted 1 finished run(s)" in capsys.readouterr().out
    assert _rows(state, "SELECT COUNT(*) FROM runs") == [(0,)]
    assert sorted(_rows(state, "SELECT run_id, status FROM run_receipts")) == sorted(
        [(parent, "abandoned"), (child, "abandoned")]
    )


def test_gc_keeps_a_tree_with_a_live_child_and_a_second_abandon_ends_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A parent abandoned alone (as before abandoning cascaded) leaves a live child."""
    state = tmp_path / "state"
    parent, child = _blocked_family(state)
    with Engine(state) as engine:
        engine.store.set_run_status(parent, "abandoned", reason="abandoned by user")
    capsys.readouterr()

    assert run_cli(state, "gc", "--older-than", "0s") == 0
    said = capsys.readouterr()
    assert said.err == (
        f"kept {parent}: its child run {child} is blocked; `wf abandon {parent}` ends the "
        "family, then gc deletes it\n"
    )
    assert "deleted 0 finished run(s)" in said.out
    assert set(_statuses(state)) == {parent, child}
    assert run_cli(state, "gc", "--older-than", "0s", "--dry-run") == 0
    assert "would delete 0" in capsys.readouterr().out

    assert run_cli(state, "abandon", parent) == 0  # what the first abandon should have done
    assert capsys.readouterr().out == (
        f"run {parent} was already abandoned; abandoned its unfinished child run(s) {child}\n"
    )
    assert run_cli(state, "abandon", parent) == 1  # and now there is nothing left to do
    assert "is already abandoned" in capsys.readouterr().err
    assert run_cli(state, "gc", "--older-than", "0s") == 0
    assert _rows(state, "SELECT COUNT(*) FROM runs") == [(0,)]


def test_a_child_held_by_another_driver_leaves_the_parent_owed_and_exits_75(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    parent, child = _blocked_family(state)
    assert run_cli(state, "approve", child, "b") == 0
    before = _statuses(state)
    parent_attempts = (
        "SELECT unit_id, attempt, status FROM attempts WHERE run_id = ? ORDER BY attempt_pk"
    )
    owed = _rows(state, parent_attempts, parent)
    assert owed == [("sub", 1, "running")]  # in flight while the child is blocked
    capsys.readouterr()

    with held_elsewhere(state, child) as pid:
        assert run_cli(state, "resume", parent) == 75
        err = capsys.readouterr().err
        assert err.startswith(
            f"error: Run {parent}: step sub waits on its child run {child}, which is being "
            f"driven by pid {pid}"
        )
        assert err.rstrip().endswith(f"then `wf resume {parent}`.") and err.count("\n") == 1
        assert _statuses(state) == before  # the parent is not failed: its unit is owed
        assert _rows(state, parent_attempts, parent) == owed

        assert run_cli(state, "abandon", parent) == 75  # nothing is abandoned meanwhile
        assert f"Run {parent} was not abandoned: its child Run {child} is being driven by pid" in (
            capsys.readouterr().err
        )
        assert _statuses(state) == before
        assert run_cli(state, "gc", "--older-than", "0s") == 0
        assert _statuses(state) == before

    assert run_cli(state, "resume", parent) == 0  # the holder is gone: what the first should do
    assert _statuses(state)[parent][0] == "completed"
    assert _statuses(state)[child][0] == "completed"
    assert _rows(state, parent_attempts, parent) == [
        ("sub", 1, "succeeded"),
        ("after", 1, "succeeded"),
    ]  # the owed unit was reclaimed in place


def test_superseding_a_parent_abandons_its_unfinished_child_too(tmp_path: Path) -> None:
    state = tmp_path / "state"
    parent, child = _blocked_family(state)
    with Engine(state) as engine:
        started = engine.start(FAMILY.replace("After {{", "Then {{"))
        assert started.created
    assert _statuses(state)[parent] == ("abandoned", f"superseded by {started.run_id}")
    assert _statuses(state)[child] == ("abandoned", f"parent run {parent} was abandoned")


def test_abandoning_a_child_alone_leaves_its_parent_to_fail_on_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    parent, child = _blocked_family(state)
    with Engine(state) as engine:
        assert engine.abandon(child) == [child]
        run = engine.drive(parent)
        assert run.status == "failed"
        assert f"child run {child} (kid) abandoned: abandoned by user" in (run.reason or "")
