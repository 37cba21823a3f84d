"""QA review of feature COMBINATIONS (forks × gates, children × stop/budget, map × human gate...).

Bugs are ``xfail(strict=True)`` tests whose reason names what is wrong and where the fix
likely belongs; the plain tests pin combinations verified correct against DESIGN.md.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.helpers_flow import journal_counts, run_cli, use_runner
from wf_magic import Engine, UnitRequest
from wf_magic.store.records import AttemptRow


def rows(engine: Engine, run_id: str) -> list[tuple[str, str, int, str]]:
    """(unit, phase, loop, status) per attempt, in journal order."""
    return [(a.unit_id, a.phase, a.loop, a.status) for a in engine.attempts(run_id)]


def steps(engine: Engine, run_id: str) -> dict[str, str]:
    return {s.step_id: s.status for s in engine.steps(run_id)}


def children(engine: Engine, run_id: str) -> list[str]:
    return [r.run_id for r in engine.list_runs(include_children=True) if r.parent_run_id == run_id]


def work(engine: Engine, run_id: str) -> list[AttemptRow]:
    return [a for a in engine.attempts(run_id) if a.phase == "work"]


# A judge that rejects v1 once ("more"), then the work answers v2 and passes.
LOOPING = """
name: looping
runners:
  scripted:
    rules:
      - {kind: judge, match: '"v1"', reply: {complete: false, feedback: "more", missing: [x]}}
      - {match: "more", reply: "v2"}
      - {match: "^Write", reply: "v1"}
steps:
  - id: a
    prompt: Write A.
    gate: {max_loops: 3}
  - id: b
    prompt: "B {{ steps.a.output }}"
"""


def _counting_judge(calls: list[str]) -> Callable[[UnitRequest], object]:
    def reply(request: UnitRequest) -> object:
        text = request.prompt or ""
        calls.append(request.kind)
        if request.kind == "judge":
            if '"v1"' in text:
                return {"complete": False, "feedback": "more", "missing": ["x"]}
            return {"complete": True, "feedback": "", "missing": []}
        if "more" in text:
            return "v2"
        return "v1" if text.startswith("Write") else f"b:{text}"

    return reply


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


# =========================================================================================
# Bugs
# =========================================================================================
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
    assert steps(engine, fork.run_id) == {"a": "completed", "b": "completed"}


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
    assert [a.unit_id for a in work(engine, fork.run_id)] == ["a", "b"]


def test_fork_prefix_does_not_call_the_llm_judge_again(tmp_path: Path) -> None:
    calls: list[str] = []
    use_runner("qa-count", _counting_judge(calls))
    engine = Engine(tmp_path / "state")
    run = engine.run(COUNTED)
    assert run.status == "completed"
    assert calls.count("judge") == 2
    calls.clear()

    fork = engine.drive(engine.fork(run, from_step="b"))

    assert fork.status == "completed"
    assert calls == ["prompt"]  # only b re-executes; the prefix (work and verdicts) is reused


def test_editing_a_later_step_does_not_re_pay_the_judge_of_an_unchanged_gated_step(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    use_runner("qa-count", _counting_judge(calls))
    engine = Engine(tmp_path / "state")
    assert engine.run(COUNTED).status == "completed"
    calls.clear()

    edited = engine.run(COUNTED.replace('"B {{', '"BB {{'))

    assert edited.status == "completed"
    assert [a.status for a in work(engine, edited.run_id)] == ["reused", "reused", "succeeded"]
    assert calls == ["prompt"]


def test_template_using_only_gate_loop_still_gets_the_feedback_block(tmp_path: Path) -> None:
    prompts: list[str] = []

    def reply(request: UnitRequest) -> object:
        if request.kind == "judge":
            if '"r1"' in (request.prompt or ""):
                return {"complete": False, "feedback": "cite a source", "missing": ["source"]}
            return {"complete": True, "feedback": "", "missing": []}
        prompts.append(request.prompt or "")
        return f"r{len(prompts)}"

    use_runner("qa-loop", reply)
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: loop-only
runner: qa-loop
steps:
  - id: a
    prompt: "Attempt {{ gate.loop }}: write."
    gate: {max_loops: 3}
""")
    assert run.status == "completed"
    assert prompts[0] == "Attempt 1: write."
    assert "cite a source" in prompts[1]
    assert "- source" in prompts[1]


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
    [child] = children(engine, fork.run_id)
    assert [a.status for a in engine.attempts(child)] == ["succeeded", "succeeded"]


# =========================================================================================
# Verified-correct combinations
# =========================================================================================
def test_human_reject_with_missing_reaches_every_map_unit_then_approve_resumes(
    tmp_path: Path,
) -> None:
    rec = use_runner("qa-map", lambda r: f"out:{(r.prompt or '')[:12]}")
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: map-human
runner: qa-map
steps:
  - id: m
    map: "{{ ['x', 'y', 'z'] }}"
    prompt: "Do {{ item }}."
    gate: {judge: human, max_loops: 3}
  - id: after
    prompt: "Sum {{ steps.m.output | length }}"
""")
    assert run.status == "blocked"
    engine.reject(run, "m", feedback="shorter", missing=["brevity", "tone"])
    rec.requests.clear()
    run = engine.drive(run)
    assert (run.status, run.reason) == ("blocked", "step m: waiting for a human verdict on loop 2")
    block = "\n\nGate feedback (loop 1 was rejected):\nshorter\nMissing:\n- brevity\n- tone"
    assert rec.prompts() == [f"Do {i}.{block}" for i in "xyz"]

    engine.approve(run, "m")
    rec.requests.clear()
    done = engine.drive(run)
    assert done.status == "completed"
    assert rec.prompts() == ["Sum 3"]  # approval re-dispatches no map unit
    assert [(u, lp) for u, ph, lp, _ in rows(engine, run.run_id) if ph == "gate"] == [
        ("m.gate:l1", 1),
        ("m.gate:l2", 2),
    ]


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
    [child] = children(engine, started.run_id)
    assert engine.get_run(child).status == "active"
    assert [a.unit_id for a in engine.attempts(child)] == ["k1"]

    done = engine.drive(started.run_id)

    assert done.status == "completed"
    assert children(engine, started.run_id) == [child]
    assert [(a.unit_id, a.attempt) for a in engine.attempts(child)] == [("k1", 1), ("k2", 1)]


CHILD_GATE_BUDGET = """
name: child-gate-budget
budget: {max_units: 4}
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
      - {kind: judge, match: ".", reply: {complete: false, feedback: "again", missing: []}}
steps:
  - id: w
    prompt: "Kid work."
    gate: {max_loops: 5}
"""


def test_budget_exhausted_inside_a_childs_gate_loop_fails_the_parent_and_re_stops(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(CHILD_GATE_BUDGET)
    assert run.status == "failed"
    assert "max_units used 4 of 4; unit w was not dispatched" in (run.reason or "")
    [child] = children(engine, run.run_id)
    assert [a.charged for a in work(engine, child)] == [1, 1, 1]
    assert [a.unit_id for a in engine.attempts(child)][-1] == "w.gate:l3"
    assert steps(engine, run.run_id)["post"] == "pending"
    before = [(a.dispatch_id, a.status) for a in engine.attempts(child)]

    again = engine.drive(run.run_id)

    assert (again.status, again.reason) == ("failed", run.reason)
    assert children(engine, run.run_id) == [child]
    assert [(a.dispatch_id, a.status) for a in engine.attempts(child)] == before
    assert again.budget_use().units == 4


def test_redriving_a_parent_stopped_by_its_childs_budget_writes_nothing(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(CHILD_GATE_BUDGET)
    assert run.status == "failed"
    [child] = children(engine, run.run_id)
    before = (journal_counts(engine, run.run_id), journal_counts(engine, child))

    assert engine.drive(run.run_id).status == "failed"

    assert (journal_counts(engine, run.run_id), journal_counts(engine, child)) == before
    assert [a.attempt for a in engine.attempts(run.run_id) if a.unit_id == "sub"] == [1]


def test_child_approved_and_driven_directly_still_obeys_the_root_budget(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: direct-child
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
    gate: {judge: human}
  - id: k2
    prompt: "two"
""")
    assert run.status == "blocked"
    [child] = children(engine, run.run_id)
    engine.approve(child, "k1")

    direct = engine.drive(child)

    assert direct.status == "failed"
    assert "max_units used 2 of 2; unit k2 was not dispatched" in (direct.reason or "")
    assert [a.unit_id for a in work(engine, child)] == ["k1"]
    assert engine.drive(run.run_id).status == "failed"


def test_max_steps_stops_after_a_whole_gate_loop_and_resume_dispatches_only_the_rest(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    first = engine.run(LOOPING, max_steps=1)
    assert first.status == "active"
    assert steps(engine, first.run_id) == {"a": "completed", "b": "pending"}
    assert [u for u, *_ in rows(engine, first.run_id)] == ["a", "a.gate:l1", "a", "a.gate:l2"]

    done = engine.drive(first.run_id)

    assert done.status == "completed"
    assert [u for u, *_ in rows(engine, first.run_id)][4:] == ["b"]
    assert str(done.result).endswith("B v2")


def test_abandoned_blocked_run_rerun_reuses_work_and_blocks_again(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    src = """
name: abandon-rerun
steps:
  - id: a
    prompt: Write A.
  - id: h
    prompt: Write H.
    gate: {judge: human}
"""
    run = engine.run(src)
    engine.abandon(run)

    again = engine.run(src)

    assert again.run_id != run.run_id and again.created
    assert again.status == "blocked"  # human approvals are never cached
    assert [(a.unit_id, a.status, a.charged) for a in engine.attempts(again.run_id)] == [
        ("a", "reused", 0),
        ("h", "reused", 0),
    ]


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


def test_route_inside_a_child_selects_and_the_parent_gets_the_routed_result(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: routed-parent
steps:
  - id: sub
    workflow: kid
    with: {flag: "ok"}
---
name: kid
params:
  flag: {type: string}
steps:
  - id: decide
    route: {on: "{{ params.flag }}", cases: {ok: good, default: bad}}
  - id: bad
    prompt: "Bad path."
  - id: good
    prompt: "Good path."
""")
    assert run.status == "completed"
    [child] = children(engine, run.run_id)
    assert steps(engine, child) == {"decide": "completed", "bad": "skipped", "good": "completed"}
    assert str(run.output("sub")).endswith("Good path.")


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
    [child] = children(engine, fresh.run_id)
    assert [(a.status, a.charged) for a in engine.attempts(child)] == [("succeeded", 1)]


def test_on_error_continue_route_target_failing_skips_the_other_and_completes(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: route-continue
runners:
  scripted:
    rules:
      - {match: "^Bad", error: permanent}
steps:
  - id: pick
    route: {on: "x", cases: {x: t, default: other}}
  - id: t
    prompt: "Bad target."
    on_error: continue
  - id: other
    prompt: "Other."
  - id: last
    prompt: "Last."
""")
    assert run.status == "completed"
    assert steps(engine, run.run_id) == {
        "pick": "completed",
        "t": "failed",
        "other": "skipped",
        "last": "completed",
    }
    before = journal_counts(engine, run.run_id)
    assert engine.drive(run.run_id).status == "completed"
    assert journal_counts(engine, run.run_id) == before


def test_cli_params_defaults_scope_and_fork_of_a_blocked_run(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "p.yaml"
    wf.write_text("""
name: cli-params
params:
  n: {type: integer, default: 2}
steps:
  - id: a
    prompt: "N {{ params.n }}"
  - id: h
    prompt: "H"
    gate: {judge: human}
""")
    assert run_cli(state, "run", str(wf)) == 3
    engine = Engine(state)
    [first] = [r.run_id for r in engine.list_runs()]
    # The explicit default is the same scope: it resumes, writing nothing.
    before = journal_counts(engine, first)
    assert run_cli(state, "run", str(wf), "--param", "n=2") == 3
    assert [r.run_id for r in engine.list_runs()] == [first]
    assert journal_counts(engine, first) == before
    assert run_cli(state, "run", str(wf), "--param", "m=2") == 2
    # A fork of the blocked run re-blocks on its own human gate (exit 3), prefix reused.
    assert run_cli(state, "fork", first, "--from", "h") == 3
    fork = next(r.run_id for r in engine.list_runs() if r.run_id != first)
    assert [(a.unit_id, a.status) for a in engine.attempts(fork)] == [
        ("a", "reused"),
        ("h", "succeeded"),
    ]
    # Overriding the default is a different scope: a new run.
    assert run_cli(state, "run", str(wf), "--param", "n=3") == 3
    assert len(engine.list_runs()) == 3
    assert json.loads(engine.get_run(engine.list_runs()[0].run_id).params_json) == {"n": 3}


def test_stop_request_is_cleared_so_the_next_drive_runs(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    started = engine.start("""
name: stop-clear
runners:
  scripted:
    rules:
      - {match: "slow", sleep_s: 0.3}
steps:
  - id: a
    prompt: "slow"
  - id: b
    prompt: "fast"
""")
    timer = threading.Timer(0.1, engine.stop, args=(started.run_id,))
    timer.start()
    try:
        t0 = time.monotonic()
        assert engine.drive(started).status == "active"
    finally:
        timer.join()
    assert time.monotonic() - t0 < 5
    assert engine.drive(started.run_id).status == "completed"
