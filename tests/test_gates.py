"""Completion gates (DESIGN.md §3.6, §9): llm / expr / human judges, bounded loops, schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import table_counts, wf_inproc, write_file
from tests.helpers_flow import (
    attempt_rows,
    by_unit,
    counting_judge,
    journal_counts,
    kill9,
    only_run_id,
    run_cli,
    step_statuses,
    use_runner,
    wait_for_journal,
    wf_process,
    work_attempts,
)
from wf_magic import Engine, GateDecisionRefused, RunnerError, UnitRequest, UsageError
from wf_magic.display import plan_text

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL


def journal(engine: Engine, run_id: str) -> list[tuple[str, str, int, int, str, str]]:
    """(unit, phase, loop, attempt, status, runner) per attempt row, in journal order."""
    return [
        (a.unit_id, a.phase, a.loop, a.attempt, a.status, a.runner) for a in engine.attempts(run_id)
    ]


def verdicts(engine: Engine, run_id: str) -> list[dict[str, object]]:
    return [
        json.loads(a.output_json or "null")
        for a in engine.attempts(run_id)
        if a.phase == "gate" and a.status == "succeeded"
    ]


def step_row(engine: Engine, run_id: str, step_id: str):  # noqa: ANN201
    return next(s for s in engine.steps(run_id) if s.step_id == step_id)


# -- llm gate -------------------------------------------------------------------------------
def _three_loop_reply(request: UnitRequest) -> object:
    """Work: v1, then v2/v3 as the feedback arrives. Judge: reject v1 and v2, accept v3."""
    text = request.prompt or ""
    if request.kind == "judge":
        if '"v3"' in text:
            return {"complete": True, "feedback": "", "missing": []}
        if '"v2"' in text:
            return {"complete": False, "feedback": "cite a source", "missing": ["source"]}
        return {"complete": False, "feedback": "too short", "missing": ["length", "tone"]}
    if "cite a source" in text:
        return "v3"
    if "too short" in text:
        return "v2"
    return "v1"


LLM_GATE = """
name: llm-gate
runner: gl3
budget: {max_units: 3}
steps:
  - id: essay
    prompt: Write an essay on {{ params.topic }}.
    gate: {criteria: ["mentions {{ params.topic }}", "has a source"], max_loops: 3}
params:
  topic: {type: string, default: owls}
"""


def test_llm_gate_rejecting_twice_then_accepting_journals_three_loops(tmp_path: Path) -> None:
    rec = use_runner("gl3", _three_loop_reply)
    engine = Engine(tmp_path / "state")
    run = engine.run(LLM_GATE)

    assert run.status == "completed"
    assert run.result == "v3"
    assert journal(engine, run.run_id) == [
        ("essay", "work", 1, 1, "succeeded", "gl3"),
        ("essay.gate:l1", "gate", 1, 1, "succeeded", "gl3"),
        ("essay", "work", 2, 2, "succeeded", "gl3"),
        ("essay.gate:l2", "gate", 2, 1, "succeeded", "gl3"),
        ("essay", "work", 3, 3, "succeeded", "gl3"),
        ("essay.gate:l3", "gate", 3, 1, "succeeded", "gl3"),
    ]
    assert [v["complete"] for v in verdicts(engine, run.run_id)] == [False, False, True]
    # Gate rows are journaled but not charged: max_units 3 covers exactly the 3 work attempts.
    assert [a.charged for a in engine.attempts(run.run_id)] == [1, 0, 1, 0, 1, 0]
    row = step_row(engine, run.run_id, "essay")
    assert (row.status, row.loop, row.max_loops) == ("completed", 3, 3)
    assert row.note == "gate passed at loop 3/3 (llm)"

    work = rec.prompts("prompt")
    assert work[0] == "Write an essay on owls."
    assert work[1] == (
        "Write an essay on owls.\n\nGate feedback (loop 1 was rejected):\n"
        "too short\nMissing:\n- length\n- tone"
    )
    assert work[2] == (
        "Write an essay on owls.\n\nGate feedback (loop 2 was rejected):\n"
        "cite a source\nMissing:\n- source"
    )
    judge = rec.prompts("judge")
    assert len(judge) == 3
    assert judge[0].startswith('Judge the artifact of step "essay"')
    assert "- mentions owls\n- has a source" in judge[0]  # criteria rendered
    assert 'Artifact (1 unit):\n"v1"' in judge[0]


def test_redriving_a_passed_gate_replays_verdicts_without_dispatching(tmp_path: Path) -> None:
    rec = use_runner("gl3", _three_loop_reply)
    engine = Engine(tmp_path / "state")
    run = engine.run(LLM_GATE)
    before = journal_counts(engine, run.run_id)
    calls = len(rec.requests)

    again = engine.drive(run.run_id)

    assert again.status == "completed"
    assert journal_counts(engine, run.run_id) == before
    assert len(rec.requests) == calls


def test_template_placing_gate_feedback_itself_gets_no_appended_block(tmp_path: Path) -> None:
    rec = use_runner("gl3", _three_loop_reply)
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: placed
runner: gl3
steps:
  - id: essay
    prompt: >-
      Essay.{% if gate.feedback %} Fix: {{ gate.feedback }}
      ({{ gate.missing | join(',') }}){% endif %}
    gate: {max_loops: 3}
""")
    assert run.status == "completed"
    assert rec.prompts() == [
        "Essay.",
        "Essay. Fix: too short (length,tone)",
        "Essay. Fix: cite a source (source)",
    ]


EXHAUST = """
name: exhaust
runners:
  scripted:
    rules:
      - match: '"(v\\d)"'
        kind: judge
        reply: '{"complete": false, "feedback": "fix {{ groups[1] }}", "missing": ["depth"]}'
      - {match: 'Gate feedback', reply: v2}
      - {match: 'Draft', reply: v1}
steps:
  - id: draft
    prompt: Draft it.
    gate: {criteria: [deep], max_loops: 2}
  - id: after
    prompt: never reached
"""


def test_gate_exhausted_blocks_with_last_feedback_and_exit_3(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "exhaust.yaml"
    wf.write_text(EXHAUST)

    assert run_cli(state, "run", str(wf)) == 3

    engine = Engine(state)
    run_id = only_run_id(state)
    run = engine.status(run_id)
    assert run.status == "blocked"
    assert run.reason == (
        "step draft: gate exhausted after 2 loop(s); last feedback: fix v2 (missing: depth)"
    )
    assert journal(engine, run_id) == [
        ("draft", "work", 1, 1, "succeeded", "scripted"),
        ("draft.gate:l1", "gate", 1, 1, "succeeded", "scripted"),
        ("draft", "work", 2, 2, "succeeded", "scripted"),
        ("draft.gate:l2", "gate", 2, 1, "succeeded", "scripted"),
    ]
    assert [s.status for s in engine.steps(run_id)] == ["blocked", "pending"]


def test_redriving_an_exhausted_gate_writes_nothing_and_exits_3_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "exhaust.yaml"
    wf.write_text(EXHAUST)
    assert run_cli(state, "run", str(wf)) == 3
    engine = Engine(state)
    run_id = only_run_id(state)
    before = journal_counts(engine, run_id)
    reason = engine.get_run(run_id).status_reason

    assert run_cli(state, "run", str(wf)) == 3  # the unchanged file resumes the same run
    assert run_cli(state, "resume", run_id) == 3
    again = engine.drive(run_id)

    assert only_run_id(state) == run_id
    assert again.status == "blocked"
    assert again.reason == reason
    assert journal_counts(engine, run_id) == before


def test_approving_an_exhausted_gate_completes_with_the_last_artifact(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(EXHAUST)
    assert run.status == "blocked"

    assert engine.approve(run.run_id, "draft", feedback="good enough") == 2
    done = engine.drive(run.run_id)

    assert done.status == "completed"
    assert done.output("draft") == "v2"
    rows = journal(engine, run.run_id)
    assert rows[4] == ("draft.gate:l2", "gate", 2, 2, "succeeded", "human")
    assert rows[5][0] == "after"
    assert len(rows) == 6  # no extra loop of draft


# -- judge failures -------------------------------------------------------------------------
JUDGE_MODE = {"mode": "broken"}


def _flaky_judge(request: UnitRequest) -> object:
    if request.kind != "judge":
        return "the work"
    mode = JUDGE_MODE["mode"]
    if mode == "not json":
        return "not json"
    if mode == "permanent":
        raise RunnerError("judge endpoint said 400", transient=False)
    if mode == "transient":
        raise RunnerError("judge endpoint is down", transient=True)
    return {"complete": True, "feedback": "fine", "missing": []}


@pytest.mark.parametrize("mode", ["not json", "permanent", "transient"])
def test_judge_failure_blocks_without_consuming_a_loop_then_rejudges_after_fix(
    tmp_path: Path, mode: str
) -> None:
    JUDGE_MODE["mode"] = mode
    rec = use_runner("switch_judge", _flaky_judge)
    engine = Engine(tmp_path / "state")
    src = """
name: judged
runner: switch_judge
steps:
  - id: work
    prompt: Do the work.
    gate: {criteria: [done], max_loops: 3}
"""
    run = engine.run(src)

    assert run.status == "blocked"
    assert run.reason is not None and run.reason.startswith("step work: judge failed on loop 1: ")
    assert "no loop was consumed" in run.reason
    row = step_row(engine, run.run_id, "work")
    assert (row.status, row.loop) == ("blocked", 1)
    assert journal(engine, run.run_id) == [
        ("work", "work", 1, 1, "succeeded", "switch_judge"),
        ("work.gate:l1", "gate", 1, 1, "failed", "switch_judge"),
    ]

    JUDGE_MODE["mode"] = "fixed"
    done = engine.drive(run.run_id)

    assert done.status == "completed"
    assert done.result == "the work"
    assert journal(engine, run.run_id) == [
        ("work", "work", 1, 1, "succeeded", "switch_judge"),
        ("work.gate:l1", "gate", 1, 1, "failed", "switch_judge"),
        ("work.gate:l1", "gate", 1, 2, "succeeded", "switch_judge"),
    ]
    assert [r.kind for r in rec.requests] == ["prompt", "judge", "judge"]
    assert step_row(engine, run.run_id, "work").note == "gate passed at loop 1/3 (llm): fine"


def test_judge_failure_via_scripted_rule_exits_3(tmp_path: Path) -> None:
    wf = tmp_path / "bad_judge.yaml"
    wf.write_text("""
name: bad-judge
runners:
  scripted:
    rules:
      - {match: 'Judge the artifact', kind: judge, reply: "not json"}
steps:
  - id: s
    prompt: hello
    gate: {max_loops: 2}
""")
    assert run_cli(tmp_path / "state", "run", str(wf)) == 3
    engine = Engine(tmp_path / "state")
    run_id = only_run_id(tmp_path / "state")
    assert "judge reply is not JSON: 'not json'" in (engine.get_run(run_id).status_reason or "")
    assert [(a.unit_id, a.status) for a in engine.attempts(run_id)] == [
        ("s", "succeeded"),
        ("s.gate:l1", "failed"),
    ]


# -- expr gate ------------------------------------------------------------------------------
def test_expr_gate_rejection_feeds_rendered_criteria_back(tmp_path: Path) -> None:
    rec = use_runner(
        "grow",
        lambda r: (
            "x"
            * (
                5 * (r.prompt or "").count("Gate feedback")
                + (10 if "at least" in (r.prompt or "") else 1)
            )
        ),
    )
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: expr-gate
runner: grow
params:
  n: {type: integer, default: 8}
steps:
  - id: s
    prompt: Write.
    gate:
      judge: expr
      check: "output | length >= params.n"
      criteria: ["at least {{ params.n }} characters"]
      max_loops: 2
""")
    assert run.status == "completed"
    assert rec.prompts() == [
        "Write.",
        "Write.\n\nGate feedback (loop 1 was rejected):\n"
        "at least 8 characters\nMissing:\n- at least 8 characters",
    ]
    assert journal(engine, run.run_id) == [
        ("s", "work", 1, 1, "succeeded", "grow"),
        ("s.gate:l1", "gate", 1, 1, "succeeded", "expr"),
        ("s", "work", 2, 2, "succeeded", "grow"),
        ("s.gate:l2", "gate", 2, 1, "succeeded", "expr"),
    ]
    assert [
        a.tokens_in + a.tokens_out for a in engine.attempts(run.run_id) if a.phase == "gate"
    ] == [0, 0]


# -- output schemas -------------------------------------------------------------------------
SCHEMA_STEP = """
name: typed
runner: typed_runner
steps:
  - id: s
    prompt: Count.
    output:
      type: object
      properties: {n: {type: integer, minimum: 1}}
      required: [n]
    {gate}
"""


def test_schema_mismatch_feeds_the_loop_with_validation_errors(tmp_path: Path) -> None:
    rec = use_runner(
        "typed_runner",
        lambda r: (
            {"complete": True}
            if r.kind == "judge"
            else {"n": 3}
            if "Gate feedback" in (r.prompt or "")
            else "three"
        ),
    )
    engine = Engine(tmp_path / "state")
    run = engine.run(SCHEMA_STEP.replace("{gate}", "gate: {max_loops: 2}"))

    assert run.status == "completed"
    assert run.result == {"n": 3}
    second = rec.prompts()[1]
    assert second.startswith(
        "Count.\n\nGate feedback (loop 1 was rejected):\n"
        "The output does not match the required schema: "
    )
    assert "s: (root): 'three' is not of type 'object'" in second
    rows = journal(engine, run.run_id)
    assert rows == [
        ("s", "work", 1, 1, "succeeded", "typed_runner"),
        ("s.gate:l1", "gate", 1, 1, "succeeded", "schema"),
        ("s", "work", 2, 2, "succeeded", "typed_runner"),
        ("s.gate:l2", "gate", 2, 1, "succeeded", "typed_runner"),
    ]
    assert verdicts(engine, run.run_id)[0]["judge"] == "schema"
    assert [r.kind for r in rec.requests] == ["prompt", "prompt", "judge"]  # no judge on loop 1


def test_final_schema_mismatch_fails_the_step_with_the_validation_errors(tmp_path: Path) -> None:
    use_runner("typed_runner", lambda r: {"n": 0})
    engine = Engine(tmp_path / "state")
    run = engine.run(SCHEMA_STEP.replace("{gate}", "gate: {max_loops: 2}"))

    assert run.status == "failed"
    row = step_row(engine, run.run_id, "s")
    assert (row.status, row.loop) == ("failed", 2)
    assert row.note == (
        "output failed its schema after 2 loop(s): s: n: 0 is less than the minimum of 1"
    )
    assert run.reason == f"step s: {row.note}"
    assert [r[:3] for r in journal(engine, run.run_id)] == [
        ("s", "work", 1),
        ("s.gate:l1", "gate", 1),
        ("s", "work", 2),
        ("s.gate:l2", "gate", 2),
    ]


def test_schema_mismatch_without_a_gate_fails_at_once(tmp_path: Path) -> None:
    use_runner("typed_runner", lambda r: "three")
    engine = Engine(tmp_path / "state")
    run = engine.run(SCHEMA_STEP.replace("{gate}", ""))

    assert run.status == "failed"
    assert step_row(engine, run.run_id, "s").note == (
        "output failed its schema after 1 loop(s): s: (root): 'three' is not of type 'object'"
    )
    assert len([a for a in engine.attempts(run.run_id) if a.phase == "work"]) == 1


# -- human gate -----------------------------------------------------------------------------
HUMAN = """
name: human-gate
runner: human_work
steps:
  - id: post
    prompt: Write a post.
    gate: {judge: human, criteria: [on brand], max_loops: 3}
  - id: publish
    prompt: Publish {{ steps.post.output }}
"""


def _human_work(request: UnitRequest) -> object:
    text = request.prompt or ""
    if text.startswith("Publish"):
        return "published"
    return "post v2" if "Gate feedback" in text else "post v1"


def test_human_gate_blocks_until_approved_and_redrive_dispatches_nothing(tmp_path: Path) -> None:
    rec = use_runner("human_work", _human_work)
    engine = Engine(tmp_path / "state")
    run = engine.run(HUMAN)

    assert run.status == "blocked"
    assert run.exit_code == 3
    assert run.reason == "step post: waiting for a human verdict on loop 1"
    before = journal_counts(engine, run.run_id)

    still = engine.drive(run.run_id)

    assert still.status == "blocked"
    assert journal_counts(engine, run.run_id) == before
    assert len(rec.requests) == 1

    assert engine.approve(run.run_id, "post") == 1
    done = engine.drive(run.run_id)

    assert done.status == "completed"
    assert done.result == "published"
    assert journal(engine, run.run_id) == [
        ("post", "work", 1, 1, "succeeded", "human_work"),
        ("post.gate:l1", "gate", 1, 1, "succeeded", "human"),
        ("publish", "work", 1, 1, "succeeded", "human_work"),
    ]
    assert verdicts(engine, run.run_id) == [
        {"complete": True, "feedback": "", "missing": [], "judge": "human"}
    ]


def test_human_decisions_are_compare_and_set(tmp_path: Path) -> None:
    use_runner("human_work", _human_work)
    engine = Engine(tmp_path / "state")
    run = engine.run(HUMAN)
    engine.approve(run.run_id, "post", loop=1)

    with pytest.raises(GateDecisionRefused, match="loop 1 was already decided"):
        engine.approve(run.run_id, "post")
    with pytest.raises(GateDecisionRefused, match="already decided"):
        engine.reject(run.run_id, "post", feedback="changed my mind")
    with pytest.raises(GateDecisionRefused, match="not waiting for a decision"):
        engine.approve(run.run_id, "publish")
    assert len([a for a in engine.attempts(run.run_id) if a.runner == "human"]) == 1

    engine.drive(run.run_id)
    with pytest.raises(
        GateDecisionRefused, match=r"not waiting for a decision \(status completed\)"
    ):
        engine.approve(run.run_id, "post")


def test_human_rejection_loops_with_the_feedback_and_stale_loop_is_refused(tmp_path: Path) -> None:
    rec = use_runner("human_work", _human_work)
    engine = Engine(tmp_path / "state")
    run = engine.run(HUMAN)
    with pytest.raises(UsageError, match="needs feedback"):
        engine.reject(run.run_id, "post", feedback="  ")

    assert engine.reject(run.run_id, "post", feedback="warmer tone", missing=["emoji"]) == 1
    looped = engine.drive(run.run_id)

    assert looped.status == "blocked"
    assert looped.reason == "step post: waiting for a human verdict on loop 2"
    assert rec.prompts()[-1] == (
        "Write a post.\n\nGate feedback (loop 1 was rejected):\nwarmer tone\nMissing:\n- emoji"
    )
    with pytest.raises(GateDecisionRefused, match="waits on loop 2, not loop 1"):
        engine.approve(run.run_id, "post", loop=1)

    assert engine.approve(run.run_id, "post", loop=2) == 2
    done = engine.drive(run.run_id)

    assert done.status == "completed"
    assert done.output("post") == "post v2"
    assert journal(engine, run.run_id) == [
        ("post", "work", 1, 1, "succeeded", "human_work"),
        ("post.gate:l1", "gate", 1, 1, "succeeded", "human"),
        ("post", "work", 2, 2, "succeeded", "human_work"),
        ("post.gate:l2", "gate", 2, 1, "succeeded", "human"),
        ("publish", "work", 1, 1, "succeeded", "human_work"),
    ]


def test_human_gate_through_the_cli(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "human.yaml"
    wf.write_text("""
name: human-cli
steps:
  - id: post
    prompt: Write a post.
    gate: {judge: human, max_loops: 2}
""")
    assert run_cli(state, "run", str(wf)) == 3
    run_id = only_run_id(state)
    assert run_cli(state, "reject", run_id, "post", "--feedback", "shorter") == 0
    assert run_cli(state, "reject", run_id, "post", "--feedback", "again") == 2  # refused
    assert run_cli(state, "resume", run_id) == 3
    assert run_cli(state, "approve", run_id, "post", "--loop", "1") == 2  # stale loop
    assert run_cli(state, "approve", run_id, "post", "--loop", "2") == 0
    assert run_cli(state, "resume", run_id) == 0
    engine = Engine(state)
    assert [(a.unit_id, a.runner) for a in engine.attempts(run_id) if a.phase == "gate"] == [
        ("post.gate:l1", "human"),
        ("post.gate:l2", "human"),
    ]


# -- crash resume ---------------------------------------------------------------------------
def test_kill_9_after_a_rejection_resumes_at_the_next_loop_with_stored_feedback(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "gate_crash.yaml"
    wf.write_text("""
name: gate-crash
runners:
  scripted:
    rules:
      - {match: '"v1"', kind: judge, reply: {complete: false, feedback: "needs more", missing: []}}
      - {match: '"v2"', kind: judge, reply: {complete: true}}
      - match: 'Gate feedback \\(loop 1 was rejected\\):\\nneeds more'
        reply: v2
        sleep_s: 0.25
      - {match: 'Write', reply: v1}
steps:
  - id: w
    prompt: Write.
    gate: {criteria: [full], max_loops: 3}
""")
    with wf_process(state, wf) as proc:
        wait_for_journal(
            proc,
            state,
            "SELECT COUNT(*) FROM attempts WHERE unit_id = 'w' AND loop = 2 AND status = 'running'",
        )
        kill9(proc)
    run_id = only_run_id(state)
    engine = Engine(state)
    in_flight = [a for a in engine.attempts(run_id) if a.status == "running"]
    assert [(a.unit_id, a.loop, a.attempt) for a in in_flight] == [("w", 2, 2)]

    done = engine.drive(run_id)

    assert done.status == "completed"
    assert done.result == "v2"
    assert journal(engine, run_id) == [
        ("w", "work", 1, 1, "succeeded", "scripted"),
        ("w.gate:l1", "gate", 1, 1, "succeeded", "scripted"),
        ("w", "work", 2, 2, "succeeded", "scripted"),
        ("w.gate:l2", "gate", 2, 1, "succeeded", "scripted"),
    ]
    assert by_unit(engine.attempts(run_id))["w"][1].dispatch_id == in_flight[0].dispatch_id
    assert step_row(engine, run_id, "w").loop == 2


def test_kill_9_after_the_final_rejection_reproduces_exhaustion_without_an_extra_loop(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "final.yaml"
    wf.write_text(EXHAUST)
    with wf_process(state, wf) as proc:
        wait_for_journal(
            proc,
            state,
            "SELECT COUNT(*) FROM attempts WHERE"
            " unit_id = 'draft.gate:l2' AND status = 'succeeded'",
        )
        if proc.poll() is None:
            kill9(proc)
    run_id = only_run_id(state)
    engine = Engine(state)

    again = engine.drive(run_id)

    assert again.status == "blocked"
    assert (
        again.reason is not None
        and "gate exhausted after 2 loop(s); last feedback: fix v2" in again.reason
    )
    assert len(engine.attempts(run_id)) == 4


# -- loop caps ------------------------------------------------------------------------------
def test_exec_and_workflow_gates_are_capped_at_one_loop(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    wf = engine.load("""
name: capped
steps:
  - id: x
    exec: [python, -c, "print('hi')"]
    gate: {judge: expr, check: "output | trim == 'bye'", criteria: [says bye], max_loops: 3}
  - id: c
    workflow: kid
    gate: {max_loops: 4}
  - id: p
    prompt: p
    gate: {max_loops: 3}
---
name: kid
steps:
  - id: k
    prompt: k
""")
    x, c, p = wf.plan.steps
    assert (x.max_loops, x.loops_capped) == (1, True)
    assert (c.max_loops, c.loops_capped) == (1, True)
    assert (p.max_loops, p.loops_capped) == (3, False)
    text = plan_text(wf.plan)
    assert "max_loops 1 (capped from 3: exec steps cannot read feedback)" in text
    assert "max_loops 1 (capped from 4: workflow steps cannot read feedback)" in text

    run = engine.run(wf)

    assert run.status == "blocked"
    assert run.reason == (
        "step x: gate exhausted after 1 loop(s); last feedback: says bye (missing: says bye)"
    )
    assert [(a.unit_id, a.loop) for a in engine.attempts(run.run_id)] == [
        ("x", 1),
        ("x.gate:l1", 1),
    ]


def test_gate_on_a_map_step_judges_the_whole_list_and_reloops_every_unit(tmp_path: Path) -> None:
    rec = use_runner(
        "map_gate",
        lambda r: (
            {"complete": "fixed" in (r.prompt or ""), "feedback": "fix all"}
            if r.kind == "judge"
            else ("fixed " if "Gate feedback" in (r.prompt or "") else "") + str(r.item)
        ),
    )
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: map-gate
runner: map_gate
steps:
  - id: m
    map: "{{ [1, 2, 3] }}"
    prompt: "item {{ item }}"
    gate: {max_loops: 2}
""")
    assert run.status == "completed"
    assert run.result == ["fixed 1", "fixed 2", "fixed 3"]
    assert [(a.unit_id, a.loop) for a in engine.attempts(run.run_id)] == [
        ("m[0]", 1),
        ("m[1]", 1),
        ("m[2]", 1),
        ("m.gate:l1", 1),
        ("m[0]", 2),
        ("m[1]", 2),
        ("m[2]", 2),
        ("m.gate:l2", 2),
    ]
    judge = rec.prompts("judge")
    assert 'Artifact (3 units):\n["1","2","3"]' in judge[0]
    assert rec.prompts()[3:] == [
        f"item {i}\n\nGate feedback (loop 1 was rejected):\nfix all" for i in (1, 2, 3)
    ]


def test_expr_check_that_errors_is_a_judge_failure_not_a_pass(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: expr-error
steps:
  - id: x
    prompt: text
    gate: {judge: expr, check: "output.foo > 1"}
  - id: y
    prompt: after
""")
    assert run.status == "blocked"
    assert run.reason == (
        "step x: judge failed on loop 1: gate check `output.foo > 1` failed: 'str object' has "
        "no attribute 'foo'; no loop was consumed. Fix the judge and resume to re-judge this "
        "work."
    )
    assert [(a.unit_id, a.status) for a in engine.attempts(run.run_id)] == [
        ("x", "succeeded"),
        ("x.gate:l1", "failed"),
    ]


def test_approving_a_gate_exhausted_by_a_human_rejection_completes_it(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: human-exhausted
steps:
  - id: post
    prompt: Write.
    gate: {judge: human, max_loops: 1}
""")
    engine.reject(run.run_id, "post", feedback="meh")
    exhausted = engine.drive(run.run_id)
    assert exhausted.reason == "step post: gate exhausted after 1 loop(s); last feedback: meh"

    engine.approve(run.run_id, "post", feedback="fine after all")  # DESIGN.md §9
    done = engine.drive(run.run_id)

    assert done.status == "completed"


def test_kill_9_during_a_judge_call_reclaims_the_gate_attempt(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "judge_crash.yaml"
    wf.write_text("""
name: judge-crash
runners:
  scripted:
    rules:
      - {match: 'Judge', kind: judge, reply: {complete: true}, sleep_s: 0.25}
steps:
  - id: w
    prompt: Write.
    gate: {max_loops: 2}
""")
    with wf_process(state, wf) as proc:
        wait_for_journal(
            proc,
            state,
            "SELECT COUNT(*) FROM attempts WHERE unit_id = 'w.gate:l1' AND status = 'running'",
        )
        kill9(proc)
    run_id = only_run_id(state)
    engine = Engine(state)
    killed = next(a for a in engine.attempts(run_id) if a.status == "running")

    assert engine.drive(run_id).status == "completed"

    gate_rows = by_unit(engine.attempts(run_id))["w.gate:l1"]
    assert [(a.attempt, a.status, a.dispatch_id) for a in gate_rows] == [
        (1, "succeeded", killed.dispatch_id)
    ]


def test_example_gate_loop_runs_offline_through_three_loops(tmp_path: Path) -> None:
    state = tmp_path / "state"
    example = Path(__file__).resolve().parent.parent / "examples" / "gate_loop.yaml"

    assert run_cli(state, "run", str(example)) == 0

    engine = Engine(state)
    run_id = only_run_id(state)
    assert [r[:3] for r in journal(engine, run_id)] == [
        ("abstract", "work", 1),
        ("abstract.gate:l1", "gate", 1),
        ("abstract", "work", 2),
        ("abstract.gate:l2", "gate", 2),
        ("abstract", "work", 3),
        ("abstract.gate:l3", "gate", 3),
        ("title", "work", 1),
    ]
    assert engine.status(run_id).output("abstract").startswith("draft 3: write-ahead logging")


def test_the_judge_may_use_its_own_runner_and_model(tmp_path: Path) -> None:
    work = use_runner("writer", lambda r: "text")
    judge = use_runner("critic", lambda r: {"complete": True, "feedback": f"ok by {r.model}"})
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: two-runners
runner: writer
steps:
  - id: s
    prompt: write
    model: small
    gate: {runner: critic, model: big}
""")
    assert run.status == "completed"
    assert [(a.unit_id, a.runner, a.model) for a in engine.attempts(run.run_id)] == [
        ("s", "writer", "small"),
        ("s.gate:l1", "critic", "big"),
    ]
    assert [r.kind for r in work.requests] == ["prompt"]
    assert [r.kind for r in judge.requests] == ["judge"]
    assert step_row(engine, run.run_id, "s").note == "gate passed at loop 1/1 (llm): ok by big"


def test_gate_exhausted_rerun_of_the_file_writes_nothing_and_exits_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = write_file(
        tmp_path,
        "g.yaml",
        "name: g\nsteps:\n  - id: a\n    prompt: 'Write {{ gate.feedback }}'\n"
        "    gate: {judge: expr, check: 'false', criteria: [be perfect], max_loops: 2}\n",
    )
    assert wf_inproc(capsys, state_dir, "run", str(wf)).returncode == 3
    before = table_counts(state_dir)
    res = wf_inproc(capsys, state_dir, "run", str(wf))
    assert res.returncode == 3 and "gate exhausted" in res.stdout
    assert table_counts(state_dir) == before


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


def test_editing_a_later_step_does_not_re_pay_the_judge_of_an_unchanged_gated_step(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    use_runner("qa-count", counting_judge(calls))
    engine = Engine(tmp_path / "state")
    assert engine.run(COUNTED).status == "completed"
    calls.clear()

    edited = engine.run(COUNTED.replace('"B {{', '"BB {{'))

    assert edited.status == "completed"
    assert [a.status for a in work_attempts(engine, edited.run_id)] == [
        "reused",
        "reused",
        "succeeded",
    ]
    assert calls == ["prompt"]


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


def test_max_steps_stops_after_a_whole_gate_loop_and_resume_dispatches_only_the_rest(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    first = engine.run(LOOPING, max_steps=1)
    assert first.status == "active"
    assert step_statuses(engine, first.run_id) == {"a": "completed", "b": "pending"}
    assert [u for u, *_ in attempt_rows(engine, first.run_id)] == [
        "a",
        "a.gate:l1",
        "a",
        "a.gate:l2",
    ]

    done = engine.drive(first.run_id)

    assert done.status == "completed"
    assert [u for u, *_ in attempt_rows(engine, first.run_id)][4:] == ["b"]
    assert str(done.result).endswith("B v2")


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
    assert [(u, lp) for u, ph, lp, _ in attempt_rows(engine, run.run_id) if ph == "gate"] == [
        ("m.gate:l1", 1),
        ("m.gate:l2", 2),
    ]
