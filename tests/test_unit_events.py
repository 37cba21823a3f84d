"""The attempt row is the single source of truth (issue 25 item 5, DESIGN §3/§7).

A unit's ``unit_started`` / ``unit_finished`` events and the ``units`` projection are read from
its attempt rows instead of being written beside them: the same ids (one counter with the
events of ``event_log``), kinds, times and data, so ``wf events``, the cursors and the frames
read as before, with fewer statements per unit.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import re
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import db_rows, wf_inproc
from wf_magic import Engine
from wf_magic.store.journal import Finish, UnitKey

FIXTURES = Path(__file__).parent / "fixtures"
MAP = """name: seq
params:
  items: {type: array}
execution: {max_concurrency: 1}
steps:
  - id: m
    map: "{{ params.items }}"
    prompt: "say {{ item }}"
"""


# -- a journal written before the change -----------------------------------------------------------
def legacy_state(tmp_path: Path) -> Path:
    """A state dir whose database a wf_magic from before m016 journaled (two runs: a gate
    loop, a failed exec, reuses; tests/fixtures/make_legacy_state.py)."""
    state = tmp_path / "legacy"
    state.mkdir()
    conn = sqlite3.connect(state / "state.db")
    conn.executescript((FIXTURES / "legacy_m015.sql").read_text())
    conn.close()
    return state


def test_the_legacy_fixture_is_a_journal_from_before_the_change(tmp_path: Path) -> None:
    state = legacy_state(tmp_path)
    ledger = [r[0] for r in db_rows(state, "SELECT id FROM schema_migrations ORDER BY position")]
    assert ledger[-1] == "m015_sweep_charges"
    kinds = collections.Counter(r[0] for r in db_rows(state, "SELECT kind FROM events"))
    assert kinds["unit_started"] > 0 and kinds["unit_finished"] > kinds["unit_started"]
    assert kinds["unit_reused"] > 0 and db_rows(state, "SELECT COUNT(*) FROM units")[0][0] > 0


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_events_journaled_before_the_change_read_back_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = legacy_state(tmp_path)
    before: dict[str, dict[str, str]] = json.loads(
        (FIXTURES / "legacy_m015_events.json").read_text()
    )
    old_units = sorted(db_rows(state, "SELECT * FROM units"))
    for run_id, shown in before.items():
        now = wf_inproc(capsys, state, "events", run_id, "--format", "json")
        assert now.returncode == 0, now.stderr
        old = [json.loads(line) for line in shown["json"].splitlines()]
        new = [json.loads(line) for line in now.stdout.splitlines()]
        assert [e["event_id"] for e in new] == [e["event_id"] for e in old]
        for was, is_ in zip(old, new, strict=True):
            # A start's time is now its attempt's started_at: the event row of old was
            # stamped a few microseconds after it, in the same transaction.
            if was["kind"] == "unit_started":
                assert abs(_at(was.pop("at")) - _at(is_.pop("at"))) <= 0.0015
            assert is_ == was
        now_csv = wf_inproc(capsys, state, "events", run_id, "--format", "csv")
        old_rows = list(csv.DictReader(io.StringIO(shown["csv"])))
        new_rows = list(csv.DictReader(io.StringIO(now_csv.stdout)))
        for was_row, is_row in zip(old_rows, new_rows, strict=True):
            if was_row["kind"] == "unit_started":
                gap = pd.Timestamp(was_row.pop("at")) - pd.Timestamp(is_row.pop("at"))
                assert abs(gap.total_seconds()) <= 0.0015
            assert is_row == was_row
    assert ("m016_derived_unit_events",) in db_rows(state, "SELECT id FROM schema_migrations")
    # The projection reads the same (its clock is now the attempt's own finish or start).
    new_units = sorted(db_rows(state, "SELECT * FROM units"))
    assert [u[:-1] for u in new_units] == [u[:-1] for u in old_units]
    assert db_rows(
        state,
        "SELECT COUNT(*) FROM event_log WHERE kind IN ('unit_started', 'unit_finished')"
        " AND dispatch_id IN (SELECT dispatch_id FROM attempts WHERE started_seq IS NOT NULL)",
    ) == [(0,)]


def test_a_run_after_the_migration_continues_the_event_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = legacy_state(tmp_path)
    newest = max(r[0] for r in db_rows(state, "SELECT event_id FROM events"))
    with Engine(state) as engine:
        run = engine.run(MAP, params={"items": [1, 2]})
        events = engine.events(run.run_id)
    assert events["event_id"].min() > newest
    assert list(events["kind"]) == [
        "run_created", "unit_started", "unit_finished", "unit_started", "unit_finished",
        "step_status", "run_status",
    ]  # fmt: skip
    assert events["event_id"].is_monotonic_increasing and events["event_id"].is_unique


# -- new journals ---------------------------------------------------------------------------------
@pytest.mark.backends
def test_unit_events_are_derived_from_the_attempt_rows(state_dir: Path) -> None:
    with Engine(state_dir) as engine:
        run = engine.run(MAP, params={"items": ["a", "b", "c"]})
    rows = db_rows(
        state_dir,
        "SELECT kind, unit_id, data_json FROM events WHERE run_id = ?"
        " AND kind IN ('unit_started', 'unit_finished') ORDER BY event_id",
        (run.run_id,),
    )
    assert [(k, u) for k, u, _ in rows] == [
        (kind, f"m[{i}]") for i in range(3) for kind in ("unit_started", "unit_finished")
    ]
    assert [json.loads(d) for k, _, d in rows if k == "unit_started"] == [
        {"attempt": 1, "loop": 1, "phase": "work"}
    ] * 3
    # The text each kind's data had when it was a row of its own (sorted keys, ", " / ": ").
    assert rows[0][2] == '{"attempt": 1, "loop": 1, "phase": "work"}'
    assert rows[1][2] == (
        '{"attempt": 1, "failure": null, "loop": 1, "phase": "work", "status": "succeeded",'
        ' "tokens": 8}'
    )
    assert db_rows(
        state_dir, "SELECT COUNT(*) FROM event_log WHERE kind IN ('unit_started', 'unit_finished')"
    ) == [(0,)]
    units = db_rows(
        state_dir,
        "SELECT unit_id, status, attempts FROM units WHERE run_id = ? ORDER BY unit_id",
        (run.run_id,),
    )
    assert units == [(f"m[{i}]", "succeeded", 1) for i in range(3)]


@pytest.mark.backends
def test_the_units_projection_is_each_units_newest_attempt(state_dir: Path) -> None:
    flaky = """name: flaky
steps:
  - id: s
    exec: [python3, -c, "import sys; sys.exit(1)"]
    retry: {max_attempts: 3, backoff_s: 0}
    on_error: continue
"""
    with Engine(state_dir) as engine:
        run = engine.run(flaky)
    attempts = db_rows(
        state_dir, "SELECT attempt, status FROM attempts WHERE run_id = ? ORDER BY attempt",
        (run.run_id,),
    )  # fmt: skip
    assert len(attempts) >= 1 and all(status == "failed" for _, status in attempts)
    assert db_rows(
        state_dir, "SELECT unit_id, status, attempts FROM units WHERE run_id = ?", (run.run_id,)
    ) == [("s", "failed", len(attempts))]


_VERB = re.compile(r"^\s*(INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)", re.I)


def _writes(state: Path, units: int) -> collections.Counter[str]:
    """The writes (verb and table) the Store's writer made for one run of ``units`` units."""
    seen: collections.Counter[str] = collections.Counter()
    last = [""]

    def trace(sql: str) -> None:
        # SQLite reports the start of a trigger's program (the append-only check on
        # attempts) as its statement again: one statement, however often it is reported.
        repeated, last[0] = sql == last[0], sql
        match = _VERB.match(sql)
        if match and not repeated:
            seen[f"{match.group(1).split()[0].upper()} {match.group(2)}"] += 1

    with Engine(state) as engine:
        engine.store.open()
        engine.store._writer.set_trace_callback(trace)  # type: ignore[union-attr]
        engine.run(MAP, params={"items": list(range(units))})
    return seen


def test_a_unit_writes_its_attempt_row_its_input_and_the_counter_only(tmp_path: Path) -> None:
    small = _writes(tmp_path / "a", 10)
    large = _writes(tmp_path / "b", 30)
    per_unit = {k: (large[k] - small[k]) / 20 for k in set(large) | set(small)}
    assert {k: v for k, v in per_unit.items() if v} == {
        "INSERT attempts": 1.0,  # the reservation, its number and start event folded in
        "UPDATE attempts": 1.0,  # the finish, carrying the finish event's id and data
        "INSERT inputs": 1.0,  # the input, once per hash
        "UPDATE journal_seq": 2.0,  # the two event ids
    }


def test_on_postgresql_a_unit_costs_two_round_trips(tmp_path: Path) -> None:
    from tests.backends import PgState, pg_server

    server = pg_server()
    if server is None:
        pytest.skip("PostgreSQL leg: set WF_MAGIC_TEST_PG=postgresql://USER@HOST:PORT/DB")
    import psycopg

    trips = [0]
    execute = psycopg.Connection.execute

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        trips[0] += 1
        return execute(self, *args, **kwargs)

    def run_trips(units: int) -> int:
        with Engine(PgState(server, tmp_path / f"l{units}")) as engine:
            engine.store.open()
            trips[0] = 0
            psycopg.Connection.execute = counted  # type: ignore[method-assign]
            try:
                engine.run(MAP, params={"items": list(range(units))})
            finally:
                psycopg.Connection.execute = execute  # type: ignore[method-assign]
            return trips[0]

    per_unit = (run_trips(60) - run_trips(20)) / 40
    # BEGIN with the writers' lock, the lease fence (checked by the server: it fails the
    # transaction rather than answering) and the previous unit's finish, sent with the attempt
    # insert (its number read back); then the COMMIT carrying its input and event ids. The
    # loop's reuse lookups are one read for all its units. Before the unit events were
    # derived it was 8 (bench/statements.py); the lease's renewal adds a little.
    assert 1.9 <= per_unit <= 2.3


# -- one cursor over both kinds of events ------------------------------------------------------
OPS = st.lists(
    st.tuples(st.sampled_from(["reserve", "finish", "reuse", "event"]), st.integers(0, 1)),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_every_event_gets_the_next_id_in_write_order(tmp_path_factory: Any, ops: Any) -> None:
    state = tmp_path_factory.mktemp("cursor")
    with Engine(state) as engine:
        runs = [engine.start("name: w\nsteps:\n  - id: s\n    prompt: hi\n", params={}).run_id]
        runs.append(engine.start("name: v\nsteps:\n  - id: s\n    prompt: hi\n", params={}).run_id)
        store = engine.store
        created = sorted(
            (e.event_id, e.run_id, e.kind, e.dispatch_id)
            for r in runs
            for e in store.events_after(r)
        )
        written = [(r, k, d) for _, r, k, d in created]
        running: dict[int, list[Any]] = {0: [], 1: []}
        for n, (op, which) in enumerate(ops):
            run_id = runs[which]
            key = UnitKey(
                run_id=run_id, workflow="w", step_id="s", unit_id=f"u{n}", phase="work", loop=1,
                item_index=None, runner="scripted", model=None, input_hash=f"h{n}",
            )  # fmt: skip
            if op == "reserve" or (op == "finish" and not running[which]):
                row = store.reserve_attempt(key, charged=True)
                running[which].append(row)
                written.append((run_id, "unit_started", row.dispatch_id))
            elif op == "finish":
                row = running[which].pop(0)
                assert store.finish_attempt(row, Finish(status="succeeded", output_json='"x"'))
                written.append((run_id, "unit_finished", row.dispatch_id))
            elif op == "reuse":
                row = store.record_terminal_attempt(
                    key, Finish(status="reused"), event="unit_reused"
                )
                written.append((run_id, "unit_reused", row.dispatch_id))
            else:
                store.record_event(run_id, "note", data={"n": n})
                written.append((run_id, "note", None))
        everything = sorted(
            (e.event_id, e.run_id, e.kind, e.dispatch_id)
            for r in runs
            for e in store.events_after(r)
        )
        # One counter: ids are unique across runs and follow the order things were written.
        assert [(r, k, d) for _, r, k, d in everything] == written
        assert len({e[0] for e in everything}) == len(everything)
        # A cursor pages through a run's events without a gap or a repeat.
        for run_id in runs:
            whole = store.events_after(run_id)
            paged, cursor = [], 0
            while batch := store.events_after(run_id, cursor, limit=2):
                paged += batch
                cursor = batch[-1].event_id
            assert paged == whole


@pytest.mark.backends
def test_an_event_inserted_into_the_events_view_lands_in_the_log_with_the_next_id(
    state_dir: Path,
) -> None:
    from tests.conftest import db_execute

    with Engine(state_dir) as engine:
        run = engine.run(MAP, params={"items": ["a"]})
    newest = max(r[0] for r in db_rows(state_dir, "SELECT event_id FROM events"))
    db_execute(
        state_dir,
        "INSERT INTO events (run_id, at, kind, data_json) VALUES (?, ?, ?, ?)",
        (run.run_id, 1.5, "note", '{"by": "hand"}'),
    )
    assert db_rows(
        state_dir, "SELECT event_id, kind, data_json FROM events WHERE event_id > ?", (newest,)
    ) == [(newest + 1, "note", '{"by": "hand"}')]
    assert db_rows(state_dir, "SELECT n FROM journal_seq") == [(newest + 1,)]
