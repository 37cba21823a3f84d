"""The replay runner: answers from the journal or a cassette by input hash, never from thin air."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from wf_magic.errors import RunnerError, UsageError
from wf_magic.runners.base import RunnerContext, UnitRequest
from wf_magic.runners.replay import ReplayRunner, export_cassette, load_cassette
from wf_magic.store import Store
from wf_magic.store.db import connect
from wf_magic.store.migrations import apply_migrations

HASH_A = "a" * 64
HASH_B = "b" * 64
_pk = count(1)


@pytest.fixture
def conn(state_dir: Path) -> Iterator[sqlite3.Connection]:
    db = connect(state_dir / "state.db")
    apply_migrations(db)
    yield db
    db.close()


@pytest.fixture
def store(conn: sqlite3.Connection, state_dir: Path) -> Iterator[Store]:
    opened = Store(state_dir / "state.db")  # the rows `conn` writes, read as the CLI reads them
    yield opened
    opened.close()


def add_run(conn: sqlite3.Connection, run_id: str, *, root: str | None = None) -> None:
    conn.execute(
        "INSERT INTO runs (run_id, workflow, plan_json, plan_hash, plan_version, source_hash,"
        " params_json, params_hash, status, scope_key, parent_run_id, invocation_key,"
        " root_run_id, created_at, updated_at)"
        " VALUES (?, 'digest', '{}', 'p', 1, 's', '{}', 'q', 'completed', 'k', ?, ?, ?, 0, 0)",
        (run_id, root, run_id if root else None, root or run_id),
    )


def add_attempt(
    conn: sqlite3.Connection,
    run_id: str,
    *,
    input_hash: str,
    output: Any,
    status: str = "succeeded",
    phase: str = "work",
    unit_id: str = "outline",
    runner: str = "openai",
    tokens: tuple[int, int] = (120, 30),
) -> None:
    number = next(_pk)
    conn.execute(
        "INSERT INTO attempts (run_id, workflow, step_id, unit_id, attempt, dispatch_id, phase,"
        " loop, runner, model, status, input_hash, charged, tokens_in, tokens_out,"
        " output_json, started_at, finished_at)"
        " VALUES (?, 'digest', ?, ?, ?, ?, ?, 1, ?, 'gpt-test', ?, ?, 1, ?, ?, ?, 0, 1)",
        (
            run_id,
            unit_id.split(".")[0],
            unit_id,
            number,
            f"d-{number}",
            phase,
            runner,
            status,
            input_hash,
            *tokens,
            None if output is None else json.dumps(output),
        ),
    )


def replay_runner(state_dir: Path, **options: Any) -> ReplayRunner:
    ctx = RunnerContext(name="replay", options=options, state_dir=str(state_dir), workflow="digest")
    return ReplayRunner.from_context(ctx)


def unit(input_hash: str = HASH_A, **overrides: Any) -> UnitRequest:
    fields: dict[str, Any] = {
        "run_id": "r-new",
        "step_id": "outline",
        "unit_id": "outline",
        "dispatch_id": "d-new",
        "input_hash": input_hash,
        "attempt": 1,
        "kind": "prompt",
        "prompt": "Outline tides.",
        "model": "gpt-test",
    }
    fields.update(overrides)
    return UnitRequest(**fields)


def test_the_journal_answers_with_the_newest_succeeded_attempt_and_charges_nothing(
    conn: sqlite3.Connection, state_dir: Path
) -> None:
    add_run(conn, "r-1")
    add_attempt(conn, "r-1", input_hash=HASH_A, output={"sections": ["old"]})
    add_attempt(conn, "r-1", input_hash=HASH_A, output={"sections": ["new"]})
    add_attempt(conn, "r-1", input_hash=HASH_A, output=None, status="failed")
    add_attempt(conn, "r-1", input_hash=HASH_B, output={"sections": ["other"]})
    runner = replay_runner(state_dir)

    result = runner.run(unit())
    runner.close()

    assert result.output == {"sections": ["new"]}
    assert (result.tokens_in, result.tokens_out, result.cost) == (0, 0, 0.0)
    assert result.model == "gpt-test"


def test_a_judge_unit_is_answered_from_gate_recordings_only(
    conn: sqlite3.Connection, state_dir: Path
) -> None:
    add_run(conn, "r-1")
    add_attempt(conn, "r-1", input_hash=HASH_A, output="work output")
    verdict = {"complete": True, "feedback": "", "missing": []}
    add_attempt(
        conn, "r-1", input_hash=HASH_A, output=verdict, phase="gate", unit_id="outline.gate:l1"
    )
    runner = replay_runner(state_dir)

    judged = runner.run(unit(kind="judge", unit_id="outline.gate:l1"))
    worked = runner.run(unit())
    runner.close()

    assert (judged.output, worked.output) == (verdict, "work output")


def test_a_miss_is_permanent_and_names_the_unit_and_hash(
    conn: sqlite3.Connection, state_dir: Path
) -> None:
    add_run(conn, "r-1")
    add_attempt(conn, "r-1", input_hash=HASH_B, output="not this one")
    runner = replay_runner(state_dir)

    with pytest.raises(RunnerError) as caught:
        runner.run(unit(unit_id="draft[2]"))
    runner.close()

    assert caught.value.transient is False
    assert str(caught.value) == (
        f"replay runner: no recorded answer for unit draft[2] (input_hash aaaaaaaaaaaa…); "
        f"record it by running against a real runner first "
        f"(searched: journal {state_dir / 'state.db'})."
    )


def test_a_state_dir_without_a_database_is_a_miss(tmp_path: Path) -> None:
    runner = replay_runner(tmp_path / "empty")
    with pytest.raises(RunnerError, match="no recorded answer for unit outline"):
        runner.run(unit())
    runner.close()


def test_a_unit_without_an_input_hash_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunnerError, match="came without an input_hash"):
        replay_runner(tmp_path).run(unit(input_hash=""))


def test_cassette_round_trip(conn: sqlite3.Connection, store: Store, tmp_path: Path) -> None:
    add_run(conn, "r-1")
    add_attempt(conn, "r-1", input_hash=HASH_A, output={"sections": ["a", "b"]})
    add_attempt(conn, "r-1", input_hash=HASH_B, output="draft text", unit_id="draft[0]")
    add_attempt(conn, "r-1", input_hash=HASH_B, output=None, status="failed", unit_id="draft[1]")
    cassette = tmp_path / "digest.jsonl"
    with cassette.open("w", encoding="utf-8") as f:
        for line in export_cassette(store, "r-1"):
            print(line, file=f)

    runner = replay_runner(tmp_path / "elsewhere", cassette=str(cassette), journal=False)
    outline, draft = runner.run(unit(HASH_A)), runner.run(unit(HASH_B, unit_id="draft[0]"))
    runner.close()

    assert (outline.output, draft.output) == ({"sections": ["a", "b"]}, "draft text")
    assert (outline.tokens_in, outline.tokens_out) == (0, 0)
    lines = cassette.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {
        "input_hash": HASH_A,
        "step": "outline",
        "unit": "outline",
        "phase": "work",
        "runner": "openai",
        "model": "gpt-test",
        "output": {"sections": ["a", "b"]},
        "tokens_in": 120,
        "tokens_out": 30,
    }
    assert len(lines) == 2


def test_export_keeps_the_newest_recording_per_input_and_includes_child_runs(
    conn: sqlite3.Connection, store: Store
) -> None:
    add_run(conn, "r-1")
    add_run(conn, "r-1.child", root="r-1")
    add_run(conn, "r-other")
    add_attempt(conn, "r-1", input_hash=HASH_A, output="first")
    add_attempt(conn, "r-1.child", input_hash=HASH_B, output="child")
    add_attempt(conn, "r-1", input_hash=HASH_A, output="second")
    add_attempt(conn, "r-other", input_hash="c" * 64, output="not in this run")

    lines = [json.loads(line) for line in export_cassette(store, "r-1")]

    assert [(d["input_hash"][0], d["output"]) for d in lines] == [("b", "child"), ("a", "second")]


def test_export_takes_a_reused_attempts_output_from_its_source(
    conn: sqlite3.Connection, store: Store
) -> None:
    add_run(conn, "r-1")
    add_run(conn, "r-2")
    add_attempt(conn, "r-1", input_hash=HASH_A, output="paid once")
    add_attempt(conn, "r-2", input_hash=HASH_A, output=None, status="reused", tokens=(0, 0))

    lines = [json.loads(line) for line in export_cassette(store, "r-2")]

    assert [(d["output"], d["tokens_in"]) for d in lines] == [("paid once", 0)]


def test_export_of_an_unknown_run_is_a_usage_error(store: Store) -> None:
    with pytest.raises(UsageError, match="No run r-404"):
        list(export_cassette(store, "r-404"))


def test_the_cassette_is_searched_before_the_journal(
    conn: sqlite3.Connection, state_dir: Path, tmp_path: Path
) -> None:
    add_run(conn, "r-1")
    add_attempt(conn, "r-1", input_hash=HASH_A, output="from the journal")
    add_attempt(conn, "r-1", input_hash=HASH_B, output="journal only")
    cassette = tmp_path / "c.jsonl"
    cassette.write_text(json.dumps({"input_hash": HASH_A, "output": "from the cassette"}) + "\n")
    runner = replay_runner(state_dir, cassette=str(cassette))

    outputs = [runner.run(unit(HASH_A)).output, runner.run(unit(HASH_B)).output]
    runner.close()

    assert outputs == ["from the cassette", "journal only"]


def test_a_missing_cassette_says_how_to_make_one(tmp_path: Path) -> None:
    runner = replay_runner(tmp_path, cassette=str(tmp_path / "nope.jsonl"), journal=False)
    with pytest.raises(
        RunnerError, match=r"does not exist; write one with `wf export-cassette RUN"
    ):
        runner.run(unit())


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "is not JSON"),
        ('["a list"]', "expected a JSON object with an input_hash string"),
        ('{"input_hash": "abc"}', "the recording has no output"),
    ],
)
def test_a_malformed_cassette_line_is_named(tmp_path: Path, line: str, problem: str) -> None:
    cassette = tmp_path / "bad.jsonl"
    cassette.write_text(json.dumps({"input_hash": HASH_A, "output": 1}) + "\n\n" + line + "\n")
    with pytest.raises(RunnerError) as caught:
        load_cassette(cassette)
    assert f"replay cassette {cassette} line 3" in str(caught.value)
    assert problem in str(caught.value)
    assert caught.value.transient is False


def test_unknown_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RunnerError, match=r"runners.replay: unknown option\(s\) casette"):
        replay_runner(tmp_path, casette="typo.jsonl")
