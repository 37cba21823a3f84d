"""Retention with receipts (issue 15 item 2): gc deletes whole finished runs and keeps one
receipt row per deleted run, written in the delete's own transaction, so run and token
history stay accurate after gc."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from wf_magic import Engine

from .conftest import db_rows, wf_inproc, write_file

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

PARENT = """\
name: parent
params:
  api_key: {type: string, default: none}
steps:
  - id: topic
    prompt: Pick a topic
  - id: sub
    workflow: kid
    with: {topic: "{{ steps.topic.output }}"}
---
name: kid
params:
  topic: {type: string}
steps:
  - id: a
    map: "{{ [1, 2] }}"
    prompt: "kid {{ params.topic }} {{ item }}"
"""
FAILING = """\
name: broken
steps:
  - id: boom
    exec: [python, -c, "import sys; sys.exit(3)"]
"""


def _totals(engine: Engine, run_id: str) -> tuple[int, int, int, int, int]:
    attempts = engine.attempts(run_id)
    return (
        len({a.unit_id for a in attempts if a.phase == "work"}),
        sum(a.charged for a in attempts),
        sum(a.tokens_in for a in attempts),
        sum(a.tokens_out for a in attempts),
        sum(a.saved_tokens for a in attempts),
    )


def _receipts(state_dir: Path) -> dict[str, tuple[object, ...]]:
    rows = db_rows(
        state_dir,
        "SELECT run_id, workflow, status, parent_run_id, root_run_id, plan_hash, units,"
        " dispatched, tokens_in, tokens_out, saved_tokens, created_at, finished_at, deleted_at"
        " FROM run_receipts",
    )
    return {str(r[0]): r[1:] for r in rows}


def test_gc_keeps_one_receipt_per_deleted_run_with_its_totals(
    engine: Engine, state_dir: Path
) -> None:
    root = engine.run(PARENT)
    [child] = [r for r in engine.list_runs(include_children=True) if r.parent_run_id]
    expected = {rid: _totals(engine, rid) for rid in (root.run_id, child.run_id)}
    rows = {rid: engine.get_run(rid) for rid in expected}

    assert engine.gc(older_than_s=0) == [root.run_id]

    receipts = _receipts(state_dir)
    assert set(receipts) == {root.run_id, child.run_id}
    for rid, got in receipts.items():
        row = rows[rid]
        assert got[:5] == (
            row.workflow,
            "completed",
            row.parent_run_id,
            row.root_run_id,
            row.plan_hash,
        )
        assert got[5:10] == expected[rid]
        assert got[10:12] == (row.created_at, row.finished_at)
        assert isinstance(got[12], float) and got[12] >= (row.finished_at or 0)
    assert expected[child.run_id][:2] == (2, 2) and expected[root.run_id][:2] == (2, 1)
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs") == [(0,)]


def test_runs_include_deleted_shows_receipts_beside_live_runs(engine: Engine) -> None:
    old = engine.run(PARENT, params={"api_key": "hunter2-very-secret"})
    tokens_before = int(engine.tokens(by="run")["tokens"].sum())
    engine.gc(older_than_s=0)
    live = engine.run(FAILING)

    assert engine.runs()["run"].tolist() == [live.run_id]  # the default is the live runs only
    frame = engine.runs(include_deleted=True).set_index("run")
    assert len(frame) == 3 and frame.loc[live.run_id, "status"] == "failed"
    assert frame["deleted_at"].isna().tolist() == [False, False, True]
    assert frame.loc[old.run_id, "params"] == '{"api_key":"***"}'
    assert int(frame["tokens_in"].sum() + frame["tokens_out"].sum()) == tokens_before
    assert frame.loc[live.run_id, ["units", "dispatched", "tokens_in"]].tolist() == [1, 1, 0]
    assert math.isnan(frame.loc[old.run_id, "cost"])  # the scripted runner reports no cost


def test_gc_status_filter_deletes_only_those_statuses(engine: Engine, state_dir: Path) -> None:
    done = engine.run(PARENT)
    failed = engine.run(FAILING)
    assert engine.gc(older_than_s=0, statuses=("failed",)) == [failed.run_id]
    assert [r.run_id for r in engine.list_runs()] == [done.run_id]
    assert set(_receipts(state_dir)) == {failed.run_id}


def test_gc_refuses_a_status_that_is_not_finished(engine: Engine) -> None:
    from wf_magic import UsageError

    with pytest.raises(UsageError, match=r"expected finished statuses .* \(got 'active'\)"):
        engine.gc(older_than_s=0, statuses=("active",))


def test_gc_dry_run_deletes_nothing_and_writes_no_receipt(engine: Engine, state_dir: Path) -> None:
    done = engine.run(PARENT)
    assert engine.gc(older_than_s=0, dry_run=True) == [done.run_id]
    assert [r.run_id for r in engine.list_runs()] == [done.run_id]
    assert _receipts(state_dir) == {}


def test_a_run_resumed_since_listing_is_kept_without_a_receipt(
    engine: Engine, state_dir: Path
) -> None:
    failed = engine.run(FAILING)
    engine.store.set_run_status(failed.run_id, "active")  # re-opened by a resume meanwhile
    assert engine.store.delete_finished_tree(failed.run_id, cutoff=9e18) == []
    assert _receipts(state_dir) == {}


def test_gc_vacuum_compacts_the_file(engine: Engine, state_dir: Path, backend: str) -> None:
    if backend == "postgresql":
        pytest.skip("SQLite file compaction (PostgreSQL's VACUUM keeps its own free space map)")
    engine.run(PARENT)
    engine.gc(older_than_s=0, vacuum=True)
    assert db_rows(state_dir, "PRAGMA freelist_count") == [(0,)]
    assert db_rows(state_dir, "PRAGMA integrity_check") == [("ok",)]


def test_cli_gc_status_dry_run_and_vacuum(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = write_file(tmp_path, "ok.yaml", "name: ok\nsteps:\n  - id: a\n    prompt: hi\n")
    bad = write_file(tmp_path, "bad.yaml", FAILING)
    wf_inproc(capsys, state_dir, "run", str(ok))
    wf_inproc(capsys, state_dir, "run", str(bad))
    [failed] = [
        str(r[0]) for r in db_rows(state_dir, "SELECT run_id FROM runs WHERE status = 'failed'")
    ]

    dry = wf_inproc(
        capsys, state_dir, "gc", "--older-than", "0s", "--status", "failed", "--dry-run"
    )
    assert (dry.returncode, dry.stdout) == (0, f"{failed}\nwould delete 1 finished run(s)\n")
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs") == [(2,)]

    real = wf_inproc(
        capsys, state_dir, "gc", "--older-than", "0s", "--status", "failed", "--vacuum"
    )
    assert (real.returncode, real.stdout) == (
        0,
        f"{failed}\ndeleted 1 finished run(s), receipts kept; vacuumed\n",
    )
    assert db_rows(state_dir, "SELECT status FROM runs") == [("completed",)]
    assert db_rows(state_dir, "SELECT run_id, status FROM run_receipts") == [(failed, "failed")]

    wrong = wf_inproc(capsys, state_dir, "gc", "--older-than", "0s", "--status", "active")
    assert wrong.returncode == 2
