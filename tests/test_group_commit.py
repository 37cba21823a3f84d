"""Group commit: a finish rides the next reservation's transaction, never past a dependency.

A unit's finish is deferred into the transaction that reserves the next units (one commit per
dispatch instead of two) and flushed before the driver waits on work in flight, so every
finish is durable before anything that depends on it proceeds. The tests watch the journal
from inside running units through a separate read-only connection: what a unit sees there is
what a crash at that moment would leave.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from wf_magic import Engine, UnitRequest
from wf_magic.store.journal import Finish, UnitKey

from .helpers_flow import use_runner


def _durable(db: Path, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """What another process reading the state DB sees right now (committed rows only)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _map(units: int, concurrency: int, runner: str) -> str:
    return (
        f"name: gc\nexecution: {{max_concurrency: {concurrency}}}\nrunner: {runner}\n"
        f"steps:\n  - id: s\n    map: '{{{{ range({units}) | list }}}}'\n"
        "    prompt: 'unit {{ item }}'\n"
    )


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_each_finish_is_durable_before_the_next_unit_runs(engine: Engine, durability: str) -> None:
    seen: list[tuple[int, int]] = []

    def body(request: UnitRequest) -> str:
        done = _durable(
            engine.db_path,
            "SELECT COUNT(*) FROM attempts WHERE run_id = ? AND status = 'succeeded'",
            (request.run_id,),
        )[0][0]
        seen.append((int(request.index or 0), int(str(done))))
        return "ok"

    use_runner("gc_watch", body)
    src = _map(6, 1, "gc_watch").replace(
        "execution: {max_concurrency: 1}",
        f"execution: {{max_concurrency: 1, durability: {durability}}}",
    )
    run = engine.run(src)
    assert run.status == "completed"
    # Unit k runs after units 0..k-1 finished, and sees exactly their k finishes committed.
    assert seen == [(k, k) for k in range(6)]


def test_a_finish_is_flushed_before_the_driver_waits_on_units_still_in_flight(
    engine: Engine,
) -> None:
    """Unit 1 waits (in flight) until unit 0's finish is committed; nothing reserves after it."""
    outcome: dict[str, object] = {}

    def body(request: UnitRequest) -> str:
        if request.index == 0:
            return "fast"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows = _durable(
                engine.db_path,
                "SELECT status FROM attempts WHERE run_id = ? AND item_index = 0",
                (request.run_id,),
            )
            if rows and rows[0][0] == "succeeded":
                outcome["saw"] = "succeeded"
                return "slow"
            time.sleep(0.01)
        outcome["saw"] = "still running after 10 s"
        return "slow"

    use_runner("gc_tail", body)
    run = engine.run(_map(2, 2, "gc_tail"))
    assert run.status == "completed"
    assert outcome == {"saw": "succeeded"}


def test_a_fan_out_reserves_its_free_slots_in_one_transaction(engine: Engine) -> None:
    """The first four units of a c=4 map are all reserved before any of them runs."""
    reserved_at_start: list[int] = []

    def body(request: UnitRequest) -> str:
        if request.index is not None and request.index < 4:
            reserved_at_start.append(
                int(
                    str(
                        _durable(
                            engine.db_path,
                            "SELECT COUNT(*) FROM attempts WHERE run_id = ?",
                            (request.run_id,),
                        )[0][0]
                    )
                )
            )
        return "ok"

    use_runner("gc_batch", body)
    run = engine.run(_map(8, 4, "gc_batch"))
    assert run.status == "completed"
    assert len(reserved_at_start) == 4
    assert min(reserved_at_start) >= 4
    attempts = engine.attempts(run.run_id)
    assert sorted(a.unit_id for a in attempts) == sorted(f"s[{i}]" for i in range(8))
    assert {a.status for a in attempts} == {"succeeded"}
    assert [a.attempt for a in attempts] == [1] * 8


def _key(run_id: str, unit: str) -> UnitKey:
    return UnitKey(
        run_id=run_id,
        workflow="gc",
        step_id="s",
        unit_id=unit,
        phase="work",
        loop=1,
        item_index=None,
        runner="scripted",
        model=None,
        input_hash="h-" + unit,
    )


def test_a_deferred_finish_commits_with_the_next_write_and_events_keep_their_order(
    engine: Engine,
) -> None:
    run_id = engine.start(_map(1, 1, "scripted")).run_id
    store = engine.store
    first = store.reserve_attempts([(_key(run_id, "u1"), True)])[0]
    store.defer_finish(first, Finish(status="succeeded", output_json='"a"', finished_at=1.5))
    assert store.has_deferred
    status = "SELECT status, finished_at FROM attempts WHERE dispatch_id = ?"
    assert _durable(engine.db_path, status, (first.dispatch_id,)) == [("running", None)]

    second = store.reserve_attempts([(_key(run_id, "u2"), True)])[0]
    assert not store.has_deferred
    assert _durable(engine.db_path, status, (first.dispatch_id,)) == [("succeeded", 1.5)]
    kinds = _durable(
        engine.db_path,
        "SELECT kind, unit_id FROM events WHERE run_id = ? AND kind LIKE 'unit_%'"
        " ORDER BY event_id",
        (run_id,),
    )
    assert kinds == [("unit_started", "u1"), ("unit_finished", "u1"), ("unit_started", "u2")]
    assert second.attempt == 1


def test_a_read_through_the_same_store_sees_a_deferred_finish(engine: Engine) -> None:
    run_id = engine.start(_map(1, 1, "scripted")).run_id
    store = engine.store
    attempt = store.reserve_attempts([(_key(run_id, "u1"), True)])[0]
    store.defer_finish(attempt, Finish(status="succeeded", output_json='"a"'))
    assert [(a.unit_id, a.status) for a in store.attempts_of(run_id, "s")] == [("u1", "succeeded")]
    assert not store.has_deferred


def test_a_read_or_flush_of_another_run_leaves_a_deferred_finish_queued(
    engine: Engine,
) -> None:
    """A sweep drives many runs through one Store: a run's reads wait for its own deferred
    finishes, not another's; a read naming no run (a sweep's totals) waits for all."""
    mine = engine.start(_map(1, 1, "scripted")).run_id
    other = engine.start(_map(1, 1, "scripted").replace("name: gc", "name: other")).run_id
    store = engine.store
    attempt = store.reserve_attempts([(_key(mine, "u1"), True)])[0]
    store.defer_finish(attempt, Finish(status="succeeded", output_json='"a"'))

    assert store.attempts_of(other, "s") == []
    store.flush(other)
    assert store.has_deferred  # another run's read and flush left it queued
    assert len(store.list_runs()) == 2  # a read naming no run
    assert not store.has_deferred
    status = "SELECT status FROM attempts WHERE dispatch_id = ?"
    assert _durable(engine.db_path, status, (attempt.dispatch_id,)) == [("succeeded",)]

    second = store.reserve_attempts([(_key(mine, "u2"), True)])[0]
    store.defer_finish(second, Finish(status="succeeded", output_json='"b"'))
    store.flush(mine)
    assert not store.has_deferred


def test_a_deferred_finish_that_cannot_commit_stays_queued_and_close_drops_it(
    engine: Engine,
) -> None:
    """A failed write keeps the deferred finish for the next one; close never raises for it."""
    run_id = engine.start(_map(1, 1, "scripted")).run_id
    store = engine.store
    attempt = store.reserve_attempts([(_key(run_id, "u1"), True)])[0]
    store.defer_finish(attempt, Finish(status="succeeded", output_json='"a"'))
    clash = store.reserve_attempts  # the same dispatch batch twice: the UNIQUE index refuses it
    with pytest.raises(Exception, match="UNIQUE|unique"):
        store._write(  # noqa: SLF001 - a write failing inside its transaction
            lambda c: c.execute(
                "INSERT INTO attempts SELECT * FROM attempts WHERE dispatch_id = ?",
                (attempt.dispatch_id,),
            )
        )
    assert store.has_deferred  # rolled back with the failed write, still owed
    assert clash([(_key(run_id, "u2"), True)])[0].attempt == 1  # the next write carries it
    rows = _durable(
        engine.db_path, "SELECT status FROM attempts WHERE dispatch_id = ?", (attempt.dispatch_id,)
    )
    assert rows == [("succeeded",)]


def test_the_wal_is_checkpointed_beside_the_drive_and_the_thread_ends_with_the_store(
    tmp_path: Path,
) -> None:
    """The writer's own checkpoint is only a backstop: a daemon thread copies the WAL."""
    import threading

    from wf_magic.store.checkpoint import BACKSTOP_PAGES

    others = {t for t in threading.enumerate() if t.name == "wf-checkpoint"}  # other stores'
    engine = Engine(tmp_path / "state")
    engine.store.open()
    db = engine.db_path
    before = db.stat().st_size
    run = engine.run(_map(300, 1, "scripted"))
    assert run.status == "completed"
    wal_pages = (db.with_name(db.name + "-wal").stat().st_size) // 4096
    assert wal_pages < BACKSTOP_PAGES  # the writer never reached its own threshold
    deadline = time.monotonic() + 10
    while db.stat().st_size == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert db.stat().st_size > before  # pages reached the database file: a checkpoint ran
    [mine] = [t for t in threading.enumerate() if t.name == "wf-checkpoint" and t not in others]
    engine.close()
    assert not mine.is_alive()


def test_a_store_dropped_without_close_stops_its_checkpoint_thread(tmp_path: Path) -> None:
    import gc
    import threading

    others = {t for t in threading.enumerate() if t.name == "wf-checkpoint"}
    engine = Engine(tmp_path / "state")
    assert engine.run(_map(3, 1, "scripted")).status == "completed"
    [mine] = [t for t in threading.enumerate() if t.name == "wf-checkpoint" and t not in others]
    del engine
    gc.collect()
    mine.join(timeout=10)
    assert not mine.is_alive()
