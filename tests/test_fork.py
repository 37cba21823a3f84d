"""Forks (DESIGN.md §3.5): a fork reuses the prefix before its step and re-executes the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers_flow import (
    children_of,
    counting_judge,
    step_statuses,
    use_runner,
    work_attempts,
)
from wf_magic import Engine

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

# The counting_judge runner rejects v1 once ("more"), then the work answers v2 and passes.
COUNTED = """
name: counted
runner: qa-count
steps:
  - id: a
    prompt: Write A.
    gate: {max_loops: 3}
  - id: b
    prompt: "B {{ steps.a.output }}"
"""


def test_fork_reuses_prefix_and_reexecutes_from_step(engine: Engine) -> None:
    src = "name: f\nsteps:\n  - id: a\n    prompt: one\n  - id: b\n    prompt: two\n  - id: c\n    prompt: three\n"
    first = engine.run(src)
    fork_id = engine.fork(first.run_id, from_step="b")
    forked = engine.drive(fork_id)
    assert forked.status == "completed"
    assert [(a.unit_id, a.status) for a in engine.attempts(fork_id)] == [
        ("a", "reused"),
        ("b", "succeeded"),
        ("c", "succeeded"),
    ]


def test_fork_after_an_approved_exhausted_gate_does_not_reblock_the_prefix(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: exhaust
runners:
  scripted:
    rules:
      - {kind: judge, match: ".", reply: {complete: false, feedback: "never good", missing: []}}
steps:
  - id: a
    prompt: Write A.
    gate: {max_loops: 2}
  - id: b
    prompt: "B {{ steps.a.output }}"
""")
    assert run.status == "blocked"
    engine.approve(run, "a")
    assert engine.drive(run).status == "completed"

    fork = engine.drive(engine.fork(run, from_step="b"))

    assert fork.status == "completed", fork.reason
    assert step_statuses(engine, fork.run_id) == {"a": "completed", "b": "completed"}


def test_fork_after_a_human_approved_gate_does_not_wait_for_a_human_again(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: human-prefix
steps:
  - id: a
    prompt: Write A.
    gate: {judge: human}
  - id: b
    prompt: "B {{ steps.a.output }}"
""")
    engine.approve(run, "a")
    assert engine.drive(run).status == "completed"

    fork = engine.drive(engine.fork(run, from_step="b"))

    assert fork.status == "completed", fork.reason
    assert [a.unit_id for a in work_attempts(engine, fork.run_id)] == ["a", "b"]


def test_fork_prefix_does_not_call_the_llm_judge_again(tmp_path: Path) -> None:
    calls: list[str] = []
    use_runner("qa-count", counting_judge(calls))
    engine = Engine(tmp_path / "state")
    run = engine.run(COUNTED)
    assert run.status == "completed"
    assert calls.count("judge") == 2
    calls.clear()

    fork = engine.drive(engine.fork(run, from_step="b"))

    assert fork.status == "completed"
    assert calls == ["prompt"]  # only b re-executes; the prefix (work and verdicts) is reused


def test_forking_an_unfinished_run_keeps_one_unfinished_run_per_scope(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    src = """
name: fork-scope
steps:
  - id: a
    prompt: Write A.
  - id: h
    prompt: Write H.
    gate: {judge: human}
"""
    run = engine.run(src)
    assert run.status == "blocked"
    fork = engine.drive(engine.fork(run, from_step="h"))
    assert fork.status == "blocked"

    newest = engine.run(src, new=True)

    unfinished = [
        r.run_id for r in engine.list_runs() if r.status in ("active", "blocked", "failed")
    ]
    assert unfinished == [newest.run_id]


def test_fork_from_a_workflow_step_re_executes_the_child(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: fork-child
steps:
  - id: pre
    prompt: "Pre."
  - id: sub
    workflow: kid
---
name: kid
steps:
  - id: k1
    prompt: "Kid one."
  - id: k2
    prompt: "Kid two."
""")
    assert run.status == "completed"

    fork = engine.drive(engine.fork(run, from_step="sub"))

    assert fork.status == "completed"
    [child] = children_of(engine, fork.run_id)
    assert [a.status for a in engine.attempts(child)] == ["succeeded", "succeeded"]
