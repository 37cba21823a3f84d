"""Map fan-out (DESIGN.md §2, issue 4): real concurrency, item order, crash resume, reduce."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.helpers_flow import by_unit, kill9, only_run_id, use_runner, wait_for_journal, wf_process
from wf_magic import DefinitionError, Engine, RunnerError, UnitRequest

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

FAN = """
name: fan
execution: {max_concurrency: 8}
runners:
  scripted:
    rules:
      - {match: '^item', reply: "out {{ item }}", sleep_s: SLEEP}
steps:
  - id: m
    map: "{{ range(N) | list }}"
    prompt: "item {{ item }}"
"""


def fan(n: int, sleep: float) -> str:
    return (
        FAN.replace("SLEEP", str(sleep)).replace("N", str(n), 1).replace("range(N)", f"range({n})")
    )


def timed_drive(engine: Engine, source: str, *, max_concurrency: int | None) -> tuple[str, float]:
    _started = engine.start(source, new=True, no_cache=True)
    run_id = _started.run_id
    started = time.monotonic()
    run = engine.drive(run_id, max_concurrency=max_concurrency)
    elapsed = time.monotonic() - started
    assert run.status == "completed"
    return run_id, elapsed


def test_fifty_items_run_really_concurrently_once_each_in_item_order(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    source = fan(50, 0.02)
    engine.run(fan(2, 0), new=True)  # warm up: runner registry, templates, connection

    sequential_id, sequential = timed_drive(engine, source, max_concurrency=1)
    concurrent_id, concurrent = timed_drive(engine, source, max_concurrency=None)

    assert concurrent <= 0.5 * sequential, (concurrent, sequential)
    for run_id in (sequential_id, concurrent_id):
        units = by_unit(engine.attempts(run_id))
        assert sorted(units) == sorted(f"m[{i}]" for i in range(50))
        assert all(len(rows) == 1 and rows[0].status == "succeeded" for rows in units.values())
        assert engine.status(run_id).result == [f"out {i}" for i in range(50)]


def test_in_flight_units_never_exceed_the_cap(tmp_path: Path) -> None:
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def body(request: UnitRequest) -> object:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return request.item

    use_runner("counting", body)
    engine = Engine(tmp_path / "state", max_concurrency=3)
    run = engine.run("""
name: capped-fan
runner: counting
execution: {max_concurrency: 8}
steps:
  - id: m
    map: "{{ range(9) | list }}"
    prompt: "n {{ item }}"
""")
    assert run.result == list(range(9))
    assert state["peak"] == 3  # min(caller's 3, plan's 8)


def test_kill_9_mid_fan_out_redispatches_only_unfinished_items(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "fan.yaml"
    wf.write_text(fan(5, 0.1).replace("max_concurrency: 8", "max_concurrency: 1"))
    with wf_process(state, wf) as proc:
        wait_for_journal(
            proc,
            state,
            "SELECT COUNT(*) FROM attempts WHERE item_index >= 2 AND status = 'running'",
        )
        kill9(proc)
    run_id = only_run_id(state)
    engine = Engine(state)
    before = engine.attempts(run_id)
    done = len(before) - 1  # items finished before the kill (at least 2), then one in flight
    assert [(a.unit_id, a.status) for a in before] == [
        *((f"m[{i}]", "succeeded") for i in range(done)),
        (f"m[{done}]", "running"),
    ]
    assert 2 <= done < 5

    run = engine.drive(run_id)

    assert run.status == "completed"
    assert run.result == [f"out {i}" for i in range(5)]
    units = by_unit(engine.attempts(run_id))
    assert {u: [(a.attempt, a.status) for a in rows] for u, rows in units.items()} == {
        f"m[{i}]": [(1, "succeeded")] for i in range(5)
    }
    for i in range(done + 1):  # finished ones untouched; the in-flight one reclaimed in place
        assert units[f"m[{i}]"][0].dispatch_id == before[i].dispatch_id


def test_an_empty_list_completes_with_an_empty_artifact(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: empty
steps:
  - id: m
    map: "{{ [] }}"
    prompt: "item {{ item }}"
  - id: after
    prompt: "got {{ steps.m.output | length }}"
""")
    assert run.status == "completed"
    assert run.output("m") == []
    assert [a.unit_id for a in engine.attempts(run.run_id)] == ["after"]
    assert run.result.endswith(": got 0")


def _fail_odd(request: UnitRequest) -> object:
    if request.item is None:
        return "next done"
    if request.item % 2:
        raise RunnerError(f"item {request.item} is odd", transient=False)
    return request.item * 10


def test_on_error_continue_records_failures_and_completes(tmp_path: Path) -> None:
    use_runner("odd_fails", _fail_odd)
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: tolerant
runner: odd_fails
steps:
  - id: m
    map: "{{ [0, 1, 2, 3] }}"
    prompt: "n {{ item }}"
    on_error: continue
  - id: after
    prompt: "next"
""")
    assert run.status == "completed"
    assert run.output("m") == [0, None, 20, None]
    row = next(s for s in engine.steps(run.run_id) if s.step_id == "m")
    assert row.status == "completed"
    assert row.note == "2 of 4 units failed; first: m[1]: item 1 is odd"
    assert [(a.unit_id, a.status, a.failure) for a in engine.attempts(run.run_id)] == [
        ("m[0]", "succeeded", None),
        ("m[1]", "failed", "item 1 is odd"),
        ("m[2]", "succeeded", None),
        ("m[3]", "failed", "item 3 is odd"),
        ("after", "succeeded", None),
    ]


def test_a_failed_item_fails_the_step_after_units_in_flight_finish(tmp_path: Path) -> None:
    def body(request: UnitRequest) -> object:
        if request.item == 0:
            raise RunnerError("item 0 broke")
        time.sleep(0.05)
        return request.item

    use_runner("first_fails", body)
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: strict
runner: first_fails
execution: {max_concurrency: 3}
steps:
  - id: m
    map: "{{ range(10) | list }}"
    prompt: "n {{ item }}"
""")
    assert run.status == "failed"
    assert run.reason == "step m: unit m[0] failed: item 0 broke"
    rows = engine.attempts(run.run_id)
    assert all(a.status != "running" for a in rows)  # in-flight units were journaled
    assert {a.unit_id for a in rows} == {"m[0]", "m[1]", "m[2]"}  # nothing new after the failure


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ("['a', 'b', 'a']", ("completed", "A")),
        ("['a', 'b', 'b', 'c', 'b']", ("completed", "B")),
        (
            "['a', 'b']",
            (
                "failed",
                "vote tied (1 votes each for the top outputs); add items or use reduce: collect",
            ),
        ),
    ],
)
def test_reduce_vote_takes_the_majority_and_fails_on_a_tie(
    tmp_path: Path, items: str, expected: tuple[str, str]
) -> None:
    use_runner("upper", lambda r: str(r.item).upper())
    engine = Engine(tmp_path / "state")
    run = engine.run(f"""
name: voting
runner: upper
steps:
  - id: m
    map: "{{{{ {items} }}}}"
    prompt: "n {{{{ item }}}}"
    reduce: vote
""")
    row = next(s for s in engine.steps(run.run_id) if s.step_id == "m")
    if expected[0] == "completed":
        assert (row.status, run.result) == expected
    else:
        assert (row.status, row.note) == expected


def test_map_items_index_and_unit_ids(tmp_path: Path) -> None:
    rec = use_runner("echo_req", lambda r: {"item": r.item, "index": r.index})
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: indexed
runner: echo_req
steps:
  - id: m
    map: '{{ [{"k": 1}, "two"] }}'
    prompt: "{{ index }}: {{ item }}"
""")
    assert run.result == [{"item": {"k": 1}, "index": 0}, {"item": "two", "index": 1}]
    assert sorted(rec.prompts()) == ['0: {"k": 1}', "1: two"]
    assert [(a.unit_id, a.item_index) for a in engine.attempts(run.run_id)] == [
        ("m[0]", 0),
        ("m[1]", 1),
    ]


@pytest.mark.parametrize(
    ("map_expr", "message"),
    [
        ('"{{ 42 }}"', "map must evaluate to a list (got int: '42')"),
        ('"{{ range(10001) | list }}"', "map expands to 10001 units, more than the bound of 10000"),
    ],
)
def test_a_map_that_is_not_a_list_or_too_big_fails_the_step(
    tmp_path: Path, map_expr: str, message: str
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(f"""
name: badmap
steps:
  - id: m
    map: {map_expr}
    prompt: "x"
""")
    assert run.status == "failed"
    assert message in (run.reason or "")
    assert engine.attempts(run.run_id) == []


def test_a_param_named_items_can_be_mapped_over(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    source = """
name: items-param
params:
  items: {type: array, default: [a, b]}
steps:
  - id: m
    map: "{{ params.items }}"
    prompt: "n {{ item }}"
"""
    try:
        run = engine.run(source)
    except DefinitionError as exc:  # or refused when frozen, naming the param: also a fix
        assert exc.field == "params.items"
        assert engine.list_runs() == []
        return
    assert run.status == "completed"
    assert len(run.result) == 2


def _odd_fails_judge_rejects(request: UnitRequest) -> object:
    if request.kind == "judge":
        return {"complete": False, "feedback": "never good enough"}
    if request.item % 2:
        raise RunnerError(f"item {request.item} is odd")
    return "even"


def test_a_tolerant_map_with_failures_still_passes_its_gate(tmp_path: Path) -> None:
    use_runner("tolerant_gate", _odd_fails_judge_rejects)
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: tolerant-gate
runner: tolerant_gate
steps:
  - id: m
    map: "{{ [0, 1, 2] }}"
    prompt: "n {{ item }}"
    on_error: continue
    gate: {max_loops: 2}
  - id: after
    prompt: after
""")
    assert run.status == "blocked"
    assert run.reason == (
        "step m: gate exhausted after 2 loop(s); last feedback: never good enough"
    )
    assert [a.unit_id for a in engine.attempts(run.run_id) if a.phase == "gate"] == [
        "m.gate:l1",
        "m.gate:l2",
    ]


def test_a_tolerant_map_checks_the_schema_of_the_items_that_succeeded(tmp_path: Path) -> None:
    use_runner("tolerant_schema", _odd_fails_judge_rejects)
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: tolerant-schema
runner: tolerant_schema
steps:
  - id: m
    map: "{{ [0, 1] }}"
    prompt: "n {{ item }}"
    on_error: continue
    output: {type: integer}
""")
    row = next(s for s in engine.steps(run.run_id) if s.step_id == "m")
    assert row.status == "failed"
    assert row.note == (
        "output failed its schema after 1 loop(s): m[0]: (root): 'even' is not "
        "of type 'integer'; 1 of 2 units failed; first: m[1]: item 1 is odd"
    )


def test_failed_items_cast_no_vote(tmp_path: Path) -> None:
    use_runner("tolerant_vote", lambda r: r.item if r.item != "x" else _raise("no vote"))
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: tolerant-vote
runner: tolerant_vote
steps:
  - id: m
    map: "{{ ['a', 'x', 'x', 'x'] }}"
    prompt: "n {{ item }}"
    on_error: continue
    reduce: vote
""")
    row = next(s for s in engine.steps(run.run_id) if s.step_id == "m")
    assert (row.status, row.output_json) == ("completed", '"a"')
    assert row.note == "3 of 4 units failed; first: m[1]: no vote"


def _raise(message: str) -> object:
    raise RunnerError(message)


def test_a_budget_stop_stops_the_run_even_in_a_tolerant_step(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: tolerant-budget
budget: {max_units: 2}
steps:
  - id: m
    map: "{{ [0, 1, 2] }}"
    prompt: "n {{ item }}"
    on_error: continue
  - id: after
    prompt: after
    on_error: continue
""")
    assert run.status == "failed"
    assert "max_units used 2 of 2" in (run.reason or "")
    again = engine.drive(run.run_id)  # a budget stop re-stops at once
    assert again.status == "failed"
    assert len(engine.attempts(run.run_id)) == 2


def test_replaying_a_judged_loop_does_not_redispatch_its_tolerated_failures(tmp_path: Path) -> None:
    stop = threading.Event()

    def body(request: UnitRequest) -> object:
        prompt = request.prompt or ""
        if request.kind == "judge":
            return {"complete": '"fixed' in prompt, "feedback": "fix"}
        if "Gate feedback" in prompt:
            if request.item == 0:
                stop.set()  # stop the drive inside loop 2
            return "fixed"
        if request.item == 1:
            raise RunnerError("item 1 fails in loop 1")
        return "v1"

    use_runner("replay_tolerant", body)
    engine = Engine(tmp_path / "state")
    _started = engine.start("""
name: replay-tolerant
runner: replay_tolerant
steps:
  - id: m
    map: "{{ [0, 1, 2] }}"
    prompt: "n {{ item }}"
    on_error: continue
    gate: {max_loops: 2}
""")
    run_id = _started.run_id
    assert engine.drive(run_id, signal=stop).stopped_by == "signal"

    assert engine.drive(run_id).status == "completed"

    loop1 = [
        (a.unit_id, a.attempt, a.status)
        for a in engine.attempts(run_id)
        if a.phase == "work" and a.loop == 1
    ]
    assert loop1 == [("m[0]", 1, "succeeded"), ("m[1]", 1, "failed"), ("m[2]", 1, "succeeded")]


def test_ten_thousand_and_one_items_is_a_clear_bound_error(engine: Engine) -> None:
    src = "name: big\nsteps:\n  - id: m\n    map: '{{ range(10001) | list }}'\n    prompt: x\n"
    run = engine.run(src)
    assert run.status == "failed"
    assert "10000" in (run.reason or "") and "10001" in (run.reason or "")
    assert engine.attempts(run.run_id) == []


def test_a_map_over_a_previous_maps_output_with_vote(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: map-vote
runners:
  scripted:
    rules:
      - {match: "^Draft (.*)", reply: "d-{{ groups[1] }}"}
      - {match: "^Vote d-[ab]", reply: "A"}
      - {match: "^Vote d-c", reply: "B"}
steps:
  - id: draft
    map: "{{ ['a', 'b', 'c'] }}"
    prompt: "Draft {{ item }}"
  - id: vote
    map: "{{ steps.draft.output }}"
    prompt: "Vote {{ item }}"
    reduce: vote
  - id: use
    prompt: "Use {{ steps.vote.output }}"
""")
    assert run.status == "completed"
    assert run.output("draft") == ["d-a", "d-b", "d-c"]
    assert run.output("vote") == "A"
    assert str(run.result).endswith("Use A")
