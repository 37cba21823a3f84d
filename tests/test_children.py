"""Child workflows (DESIGN.md §3.1, §9, issue 4): embedded plans, idempotent publish, budgets."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import run_wf, write_file
from tests.helpers_flow import (
    children_of,
    journal_counts,
    kill9,
    only_run_id,
    run_cli,
    wait_for_journal,
    wf_process,
)
from wf_magic import DefinitionError, Engine, RunnerError
from wf_magic.drive.children import ChildBlocked, ChildBudgetStop, child_result
from wf_magic.spec.plan import Plan

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

PARENT = """
name: parent
runners:
  scripted:
    rules:
      - {match: '^Pick', reply: owls}
      - {match: '^kid a (\\w+) (\\d)', reply: "facts about {{ groups[1] }} x{{ groups[2] }}"}
      - {match: '^kid b (.*)', reply: "summary of {{ groups[1] }}"}
steps:
  - id: topic
    prompt: Pick a topic
  - id: sub
    workflow: kid
    with: {topic: "{{ steps.topic.output }}", n: 2}
---
name: kid
params:
  topic: {type: string}
  n: {type: integer}
runners:
  scripted:
    rules:
      - {match: '^kid a (\\w+) (\\d)', reply: "facts about {{ groups[1] }} x{{ groups[2] }}"}
      - {match: '^kid b (.*)', reply: "summary of {{ groups[1] }}"}
steps:
  - id: a
    prompt: "kid a {{ params.topic }} {{ params.n }}"
  - id: b
    prompt: "kid b {{ steps.a.output }}"
"""


def test_parent_completes_with_the_child_output(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(PARENT)

    assert run.status == "completed"
    assert run.result == "summary of facts about owls x2"
    [child_id] = children_of(engine, run.run_id)
    child = engine.get_run(child_id)
    assert (child.workflow, child.status, child.invocation_key, child.root_run_id) == (
        "kid",
        "completed",
        "sub",
        run.run_id,
    )
    assert json.loads(child.params_json) == {"topic": "owls", "n": 2}
    assert [(a.unit_id, a.runner, a.charged) for a in engine.attempts(run.run_id)] == [
        ("topic", "scripted", 1),
        ("sub", "workflow", 0),
    ]  # the workflow unit itself is free
    assert [a.unit_id for a in engine.attempts(child_id)] == ["a", "b"]
    assert run.budget_use().units == 3  # the child's dispatches count against the root


def test_redriving_the_parent_does_not_publish_a_second_child(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(PARENT)
    [child_id] = children_of(engine, run.run_id)
    before = (journal_counts(engine, run.run_id), journal_counts(engine, child_id))

    assert engine.drive(run.run_id).status == "completed"
    assert engine.run(PARENT).run_id == run.run_id  # an unchanged source resumes the same run

    assert children_of(engine, run.run_id) == [child_id]
    assert (journal_counts(engine, run.run_id), journal_counts(engine, child_id)) == before


HUMAN_CHILD = """
name: waits
steps:
  - id: sub
    workflow: reviewed
  - id: after
    prompt: "after {{ steps.sub.output }}"
---
name: reviewed
steps:
  - id: draft
    prompt: draft
    gate: {judge: human}
"""


def test_a_blocked_child_blocks_the_parent_and_the_same_child_continues(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(HUMAN_CHILD)
    [child_id] = children_of(engine, run.run_id)

    assert run.status == "blocked"
    assert run.reason == (
        f"step sub: child run {child_id} (reviewed) is blocked: step draft: "
        "waiting for a human verdict on loop 1"
    )
    assert engine.get_run(child_id).status == "blocked"
    assert engine.drive(run.run_id).status == "blocked"

    engine.approve(child_id, "draft")
    done = engine.drive(run.run_id)

    assert done.status == "completed"
    assert children_of(engine, run.run_id) == [child_id]
    assert done.output("sub") == engine.status(child_id).result
    sub = [(a.attempt, a.status) for a in engine.attempts(run.run_id) if a.unit_id == "sub"]
    assert sub == [(1, "succeeded")]  # the in-flight workflow unit was reclaimed


def test_editing_the_child_source_after_the_parent_started_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "kid.yaml").write_text("""
name: kid
steps:
  - id: only
    prompt: "OLD child prompt"
""")
    parent = tmp_path / "parent.yaml"
    parent.write_text("""
name: edited
steps:
  - id: first
    prompt: first
  - id: sub
    workflow: kid
""")
    engine = Engine(tmp_path / "state")
    _started = engine.start(parent)
    run_id = _started.run_id
    assert engine.drive(run_id, max_steps=1).status == "active"
    frozen = engine.get_run(run_id).plan_json

    (tmp_path / "kid.yaml").write_text("""
name: kid
steps:
  - id: only
    prompt: "NEW child prompt"
  - id: extra
    prompt: extra
""")
    assert run_cli(tmp_path / "state", "resume", run_id) == 0

    run = engine.get_run(run_id)
    assert run.status == "completed"
    assert run.plan_json == frozen
    [child_id] = children_of(engine, run_id)
    child = engine.get_run(child_id)
    assert (
        Plan.model_validate_json(child.plan_json)
        == Plan.model_validate_json(frozen).children["kid"]
    )
    assert [s.step_id for s in engine.steps(child_id)] == ["only"]
    assert json.loads(run.result_json or "null").endswith(": OLD child prompt")

    # Running the file again picks up the edit as a new run (the plan changed).
    newer = engine.run(parent)
    assert newer.run_id != run_id
    assert newer.result.endswith(": extra")


def test_child_dispatches_count_against_the_parent_budget(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: thrifty
budget: {max_units: 2}
steps:
  - id: sub
    workflow: spender
---
name: spender
budget: {max_units: 100}
steps:
  - id: a
    prompt: a
  - id: b
    prompt: b
  - id: c
    prompt: c
""")
    [child_id] = children_of(engine, run.run_id)

    assert run.status == "failed"
    assert run.reason is not None
    assert "Budget exceeded" in run.reason
    assert "max_units used 2 of 2; unit c was not dispatched" in run.reason
    assert [a.unit_id for a in engine.attempts(child_id)] == ["a", "b"]
    assert run.budget_use().units == 2

    again = engine.drive(run.run_id)  # a budget stop re-stops at once
    assert again.status == "failed"
    assert [a.unit_id for a in engine.attempts(child_id)] == ["a", "b"]
    assert children_of(engine, run.run_id) == [child_id]


def test_a_failed_child_fails_the_parent_step_with_its_reason(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: fragile
steps:
  - id: sub
    workflow: breaks
---
name: breaks
steps:
  - id: boom
    exec: [python, -c, "import sys; sys.exit(4)"]
""")
    [child_id] = children_of(engine, run.run_id)
    assert run.status == "failed"
    assert run.reason == (
        f"step sub: unit sub failed: child run {child_id} (breaks) failed: "
        "step boom: unit boom failed: exited with status 4"
    )


def test_kill_9_inside_a_child_resumes_the_same_child(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "nested.yaml"
    wf.write_text("""
name: nested
steps:
  - id: sub
    workflow: slowkid
---
name: slowkid
runners:
  scripted:
    rules:
      - {match: '^slow', reply: slow done, sleep_s: 0.25}
steps:
  - id: quick
    prompt: quick
  - id: slow
    prompt: slow
""")
    with wf_process(state, wf) as proc:
        wait_for_journal(
            proc,
            state,
            "SELECT COUNT(*) FROM attempts WHERE unit_id = 'slow' AND status = 'running'",
        )
        kill9(proc)
    run_id = only_run_id(state)
    engine = Engine(state)
    [child_id] = children_of(engine, run_id)

    assert run_cli(state, "resume", run_id) == 0

    assert children_of(engine, run_id) == [child_id]
    assert [(a.unit_id, a.attempt, a.status) for a in engine.attempts(child_id)] == [
        ("quick", 1, "succeeded"),
        ("slow", 1, "succeeded"),
    ]
    assert engine.status(run_id).result == "slow done"


def test_example_child_workflow_runs_offline(tmp_path: Path) -> None:
    state = tmp_path / "state"
    example = Path(__file__).resolve().parent.parent / "examples" / "child_workflow.yaml"

    assert run_cli(state, "run", str(example)) == 0

    engine = Engine(state)
    run_id = only_run_id(state)
    [child_id] = children_of(engine, run_id)
    assert engine.get_run(child_id).workflow == "summarise"
    assert engine.status(run_id).result == (
        "Release 1.2.0 is out. Faster resume. Human gates in the cli. Exec timeouts."
    )


def test_a_map_of_child_workflows_publishes_one_child_per_item(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    source = """
name: many
steps:
  - id: sub
    map: "{{ ['a', 'b', 'c'] }}"
    workflow: echo
    with: {x: "{{ item }}"}
---
name: echo
params: {x: {type: string}}
runners:
  scripted:
    rules:
      - {match: '^echo (.*)', reply: "{{ groups[1] | upper }}"}
steps:
  - id: k
    prompt: "echo {{ params.x }}"
"""
    run = engine.run(source)

    assert run.status == "completed"
    assert run.result == ["A", "B", "C"]
    kids = {engine.get_run(c).invocation_key: c for c in children_of(engine, run.run_id)}
    assert sorted(kids) == ["sub[0]", "sub[1]", "sub[2]"]
    assert engine.run(source).run_id == run.run_id
    assert len(children_of(engine, run.run_id)) == 3


def test_with_bindings_that_do_not_fit_the_child_params_are_definition_errors(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    source = """
name: misbound
steps:
  - id: sub
    workflow: kid
    with: {nope: 1}
---
name: kid
params: {x: {type: string}}
steps:
  - id: k
    prompt: "kid {{ params.x }}"
"""
    with pytest.raises(DefinitionError) as info:
        engine.run(source)
    assert str(info.value) == (
        "steps[0].with: child workflow 'kid' declares no param(s) "
        "['nope']; declared: ['x'] (<workflow>, line 6)"
    )
    with pytest.raises(DefinitionError, match=r"needs param\(s\) \['x'\]"):
        engine.run(source.replace("with: {nope: 1}", "with: {}"))
    assert engine.list_runs() == []


def test_recursive_child_workflow_is_named_as_recursion(tmp_path: Path, state_dir: Path) -> None:
    wf = write_file(
        tmp_path, "self_call.yaml", "name: loopy\nsteps:\n  - id: a\n    workflow: loopy\n"
    )
    res = run_wf(state_dir, "run", str(wf))  # named loopy.yaml it does say "cycle"
    assert res.returncode == 2
    text = res.stderr.replace(str(tmp_path), "").lower()  # the tmp path names the test
    assert "unknown child workflow" not in text
    assert "recurs" in text or "cycle" in text or "itself" in text


def test_stop_while_a_child_runs_resumes_the_same_child_without_redispatch(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    started = engine.start("""
name: stop-child
steps:
  - id: pre
    prompt: "Pre."
  - id: sub
    workflow: kid
  - id: post
    prompt: "Post."
---
name: kid
runners:
  scripted:
    rules:
      - {match: "slow", sleep_s: 0.5}
steps:
  - id: k1
    prompt: "slow one"
  - id: k2
    prompt: "two"
""")
    timer = threading.Timer(0.2, engine.stop, args=(started.run_id,))
    timer.start()
    try:
        stopped = engine.drive(started)
    finally:
        timer.join()
    assert stopped.status == "active"
    [child] = children_of(engine, started.run_id)
    assert engine.get_run(child).status == "active"
    assert [a.unit_id for a in engine.attempts(child)] == ["k1"]

    done = engine.drive(started.run_id)

    assert done.status == "completed"
    assert children_of(engine, started.run_id) == [child]
    assert [(a.unit_id, a.attempt) for a in engine.attempts(child)] == [("k1", 1), ("k2", 1)]


def test_no_cache_new_run_re_pays_the_child_units(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    src = """
name: nocache-parent
steps:
  - id: sub
    workflow: kid
---
name: kid
steps:
  - id: k
    prompt: "Kid."
"""
    assert engine.run(src).status == "completed"
    cached = engine.run(src, new=True)
    assert [a.status for a in engine.attempts(cached.run_id)] == ["reused"]

    fresh = engine.run(src, new=True, no_cache=True)

    assert [a.status for a in engine.attempts(fresh.run_id)] == ["succeeded"]
    [child] = children_of(engine, fresh.run_id)
    assert [(a.status, a.charged) for a in engine.attempts(child)] == [("succeeded", 1)]


# -- child_result: the parent unit's outcome from a driven child run --------------------------
def test_a_completed_childs_result_is_the_parent_units_output(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(PARENT)
    [child_id] = children_of(engine, run.run_id)
    assert child_result(engine.store, engine.get_run(child_id)).output == (
        "summary of facts about owls x2"
    )


def test_a_blocked_or_stopped_child_keeps_the_parent_unit_in_flight(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(PARENT)
    [child_id] = children_of(engine, run.run_id)
    child = engine.get_run(child_id)
    with pytest.raises(ChildBlocked) as blocked:
        child_result(engine.store, replace(child, status="blocked", status_reason="step a: why"))
    assert str(blocked.value) == f"child run {child_id} (kid) is blocked: step a: why"
    with pytest.raises(ChildBlocked) as stopped:
        child_result(engine.store, replace(child, status="active", status_reason=None))
    assert str(stopped.value) == (
        f"child run {child_id} (kid) was stopped before it finished; resume the parent"
    )


def test_a_failed_or_abandoned_child_is_a_runner_error_of_the_parent_unit(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(PARENT)
    [child_id] = children_of(engine, run.run_id)
    child = engine.get_run(child_id)
    for status in ("failed", "abandoned"):
        with pytest.raises(RunnerError) as info:
            child_result(engine.store, replace(child, status=status, status_reason="step b: boom"))
        assert not isinstance(info.value, ChildBudgetStop)
        assert str(info.value) == f"child run {child_id} (kid) {status}: step b: boom"


def test_a_child_stopped_by_the_shared_budget_is_a_hard_stop_for_the_parent(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: parent-budget
budget: {max_units: 2}
steps:
  - id: pre
    prompt: "Pre."
  - id: sub
    workflow: kid
---
name: kid
steps:
  - id: k1
    prompt: "one"
  - id: k2
    prompt: "two"
""")
    [child_id] = children_of(engine, run.run_id)
    child = engine.get_run(child_id)
    assert child.status == "failed"
    with pytest.raises(ChildBudgetStop) as info:
        child_result(engine.store, child)
    assert str(info.value) == f"child run {child_id} (kid) failed: {child.status_reason}"
    assert run.reason == f"step sub: {info.value}"
