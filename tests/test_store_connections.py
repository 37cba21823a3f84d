"""The Store's connections: views read through WAL readers and never wait for the writer."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from wf_magic import Engine, GateDecisionRefused
from wf_magic.store import Store
from wf_magic.store.db import _set_journal_mode

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


class _Flaky:
    """A connection whose journal-mode switch meets ``busy`` lock conflicts first."""

    def __init__(self, busy: int, error: str = "database is locked") -> None:
        self.busy, self.error, self.tries = busy, error, 0

    def execute(self, sql: str) -> _Flaky:
        assert sql == "PRAGMA journal_mode = WAL"
        self.tries += 1
        if self.tries <= self.busy:
            exc = sqlite3.OperationalError(self.error)
            exc.sqlite_errorcode = (  # type: ignore[attr-defined]
                sqlite3.SQLITE_BUSY if "locked" in self.error else sqlite3.SQLITE_ERROR
            )
            raise exc
        return self

    def fetchall(self) -> list[tuple[str]]:
        return [("wal",)]


def test_the_journal_mode_switch_waits_out_other_openers() -> None:
    # SQLite reports a conflicting switch (another opener switching a new database to WAL)
    # at once, without the busy handler: fifty threads opening one new state dir met it.
    flaky = _Flaky(busy=3)
    _set_journal_mode(flaky, "WAL")  # type: ignore[arg-type]
    assert flaky.tries == 4


def test_any_other_journal_mode_failure_is_raised_at_once() -> None:
    flaky = _Flaky(busy=1, error="disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        _set_journal_mode(flaky, "WAL")  # type: ignore[arg-type]
    assert flaky.tries == 1


def test_threads_opening_one_new_state_dir_all_get_a_store(tmp_path: Path) -> None:
    barrier = threading.Barrier(24)
    errors: list[BaseException] = []

    def opener() -> None:
        store = Store(tmp_path / "state")
        try:
            barrier.wait(30)
            store.open()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=opener) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
