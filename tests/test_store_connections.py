"""The Store's connections: views read through WAL readers and never wait for the writer."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from wf_magic import Engine, GateDecisionRefused
from wf_magic.store import Store

HUMAN = """
name: review
steps:
  - id: draft
    prompt: write it
  - id: signoff
    prompt: sign it
    gate: {judge: human, max_loops: 2}
"""


def test_a_frame_read_does_not_wait_for_an_open_write_transaction(engine: Engine) -> None:
    run = engine.run(HUMAN)
    assert run.status == "blocked"
    inside, release = threading.Event(), threading.Event()

    def held_open(row: object, latest: object) -> object:
        inside.set()  # the writer now holds BEGIN IMMEDIATE on the engine's own connection
        release.wait(30)
        raise GateDecisionRefused("rolled back on purpose")

    def writer() -> None:
        with pytest.raises(GateDecisionRefused):
            engine.store.record_decision(run.run_id, "signoff", held_open, finish=None)  # type: ignore[arg-type]

    write_thread = threading.Thread(target=writer)
    write_thread.start()
    try:
        assert inside.wait(10)
        seen: dict[str, object] = {}

        def reader() -> None:
            seen["journal"] = len(engine.journal(run.run_id))
            seen["steps"] = [s.status for s in engine.status(run.run_id).steps]
            seen["budget"] = engine.status(run.run_id).budget_use().units

        read_thread = threading.Thread(target=reader)
        read_thread.start()
        read_thread.join(10)  # a reader that waited for the writer would still be blocked here
        assert not read_thread.is_alive()
        assert seen == {"journal": 2, "steps": ["completed", "blocked"], "budget": 2}
    finally:
        release.set()
        write_thread.join(30)
    assert engine.status(run.run_id).status == "blocked"  # the held write rolled back


def test_each_thread_reads_through_its_own_connection_and_close_closes_them_all(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "state.db")
    seen: list[int] = []

    def read() -> None:
        seen.append(len(store.list_runs()))

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    read()
    assert seen == [0, 0, 0, 0]
    assert len(store._readers) == 4  # one WAL reader per reading thread
    store.close()
    assert store._readers == [] and store._writer is None
    assert store.list_runs() == []  # reopens on demand
    store.close()


def test_a_reader_sees_each_committed_write_at_once(tmp_path: Path) -> None:
    engine = Engine(tmp_path)
    try:
        first = engine.start("name: a\nsteps:\n  - id: x\n    prompt: hi\n")
        assert [r.run_id for r in engine.list_runs()] == [first.run_id]
        engine.drive(first)
        assert engine.status(first).status == "completed"
        assert engine.list_runs()[0].status == "completed"
    finally:
        engine.close()
