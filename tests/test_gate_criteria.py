"""A judge that cannot read its criteria never lets work through (issue 20, class 6).

A gate's ``criteria`` are templates. One that fails for what the template says (an unknown
filter or test, a name the gate does not have: ``item``, ``index``, ``gate``) is a
definition error at freeze, naming the line and field. One that fails only for this run's
values (an attribute a string lacks, a division by zero) blocks the step as a judge failure:
the judge is never asked, the failure is journaled on the gate unit, no loop is consumed,
and a person may still decide the loop.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers_flow import use_runner
from wf_magic import Engine, load_workflow
from wf_magic.errors import DefinitionError
from wf_magic.runners.base import UnitRequest

FLOW = """\
name: judged
params:
  topic: {type: string, default: cats}
  n: {type: integer, default: 2}
  conf: {type: object, default: {depth: 1}}
runner: RUNNER
steps:
  - id: a
    prompt: "outline {{ params.topic }}"
  - id: b
    MAPprompt: "write about {{ params.topic }}"
    gate:
      judge: JUDGE
      CHECKcriteria: [CRITERIA]
      max_loops: 2
"""
CRITERIA_LINE = 14
"""The line of ``criteria:`` (one more below a ``map:``)."""


def _flow(
    criteria: str, *, judge: str = "llm", runner: str = "scripted", mapped: bool = False
) -> str:
    marks = {
        "RUNNER": runner,
        "MAP": 'map: "{{ [1, 2] }}"\n    ' if mapped else "",
        "JUDGE": judge,
        "CHECK": 'check: "true"\n      ' if judge == "expr" else "",
        "CRITERIA": json.dumps(criteria),
    }
    text = FLOW
    for mark, value in marks.items():
        text = text.replace(mark, value)
    return text


STATIC = [
    ("{{ params.topic | nosuchfilter }}", "template uses unknown filter 'nosuchfilter'"),
    ("{{ params.topic is nosuchtest }}", "template uses unknown test 'nosuchtest'"),
    ("{{ [1, 2] | select('nosuch') | list }}", "template uses unknown test 'nosuch'"),
    ("{{ [1, 2] | map('nosuch') | list }}", "template uses unknown filter 'nosuch'"),
    ("{{ item }} is covered", "template names unknown variable(s) ['item']"),
    ("entry {{ index }}", "template names unknown variable(s) ['index']"),
    ("address {{ gate.feedback }}", "template names unknown variable(s) ['gate']"),
    ("{{ steps.b.output }}", "template refers to its own step 'b'"),
    ("{{ steps.zz.output }}", "template refers to an unknown step 'zz'"),
    ("{{ params.nope }}", "template refers to undeclared param 'nope'"),
    ("{{ params.topic ", "invalid template"),
]
"""Criteria that fail for what they say: refused at freeze, whatever the run's values."""

RUNTIME = [
    ("{{ params.topic.nope }}", "'str object' has no attribute 'nope'"),
    ("{{ params.n / 0 }}", "division by zero"),
    ("{{ params.n + params.topic }}", "unsupported operand type(s) for +: 'int' and 'str'"),
    ("{{ steps.a.output.sections[0] }}", "'str object' has no attribute 'sections'"),
    ("{{ params.conf.missing }}", "'dict object' has no attribute 'missing'"),
]
"""Criteria that fail only for this run's values: the step blocks as a judge failure."""


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize(("criteria", "problem"), STATIC)
def test_criteria_that_cannot_render_for_any_run_are_a_definition_error(
    criteria: str, problem: str, mapped: bool
) -> None:
    with pytest.raises(DefinitionError) as raised:
        load_workflow(_flow(criteria, mapped=mapped))
    message = str(raised.value)
    assert message.startswith(f"steps[1].gate.criteria[0]: {problem}"), message
    assert message.endswith(f"(<workflow>, line {CRITERIA_LINE + mapped})")


@pytest.mark.parametrize(
    ("check", "names"),
    [("steps.a.output == output", "['steps']"), ("gate.loop > 1", "['gate']")],
)
def test_an_expr_check_names_only_output_and_params(check: str, names: str) -> None:
    flow = _flow("fine", judge="expr").replace('check: "true"', f"check: {json.dumps(check)}")
    with pytest.raises(DefinitionError) as raised:
        load_workflow(flow)
    assert str(raised.value).startswith(
        f"steps[1].gate.check: template names unknown variable(s) {names}; "
        "in scope: ['output', 'params']"
    )


def _judge(request: UnitRequest) -> object:
    if request.kind == "judge":
        return {"complete": True, "feedback": "", "missing": []}
    return "work"


@pytest.mark.parametrize("judge", ["llm", "expr", "human"])
@pytest.mark.parametrize(("criteria", "problem"), RUNTIME)
def test_criteria_that_fail_for_this_run_block_the_step_without_consuming_a_loop(
    state_dir: Path, criteria: str, problem: str, judge: str
) -> None:
    seen = use_runner("criteria-judge", _judge)
    flow = _flow(criteria, judge=judge, runner="criteria-judge")
    with Engine(state_dir) as engine:
        run = engine.run(flow)
        again = engine.drive(run.run_id)  # the next drive re-judges: still blocked, loop 1
        gate = [a for a in engine.attempts(run.run_id) if a.phase == "gate"]
        step = engine.steps(run.run_id)[1]

    reason = (
        f"step b: judge failed on loop 1: criteria failed to render: {problem}; no loop was "
        "consumed. The criteria are frozen in the plan: fix them and start afresh (`--new`), "
        "or decide the step by hand (`wf approve` / `wf reject`)."
    )
    assert (run.status, run.exit_code, run.row.status_reason) == ("blocked", 3, reason)
    assert (again.status, again.row.status_reason) == ("blocked", reason)
    assert (step.status, step.loop) == ("blocked", 1)
    assert json.loads(step.output_json or "{}")["waiting"]["judge"] == "failed"
    assert [(a.unit_id, a.status, a.failure) for a in gate] == [
        ("b.gate:l1", "failed", f"criteria failed to render: {problem}")
    ] * 2
    assert [r.kind for r in seen.requests] == ["prompt", "prompt"]  # no judge was asked


def test_a_person_may_decide_a_gate_whose_criteria_failed(state_dir: Path) -> None:
    use_runner("criteria-judge", _judge)
    flow = _flow("{{ params.topic.nope }}", runner="criteria-judge")
    with Engine(state_dir) as engine:
        run_id = engine.run(flow).run_id
        assert engine.approve(run_id, "b") == 1
        done = engine.drive(run_id)
    assert done.status == "completed"


_TEXT = st.text(alphabet=string.ascii_letters + " ,.", max_size=16)


@settings(max_examples=25, deadline=None)
@given(
    before=_TEXT,
    after=_TEXT,
    piece=st.sampled_from([*(c for c, _ in STATIC), *(c for c, _ in RUNTIME), "{{ params.n }}"]),
)
def test_every_criteria_template_is_refused_blocks_or_is_judged(
    tmp_path_factory: pytest.TempPathFactory, before: str, after: str, piece: str
) -> None:
    seen = use_runner("criteria-judge", _judge)
    criteria = f"{before}{piece}{after}"
    static = {c: p for c, p in STATIC}
    if piece in static:
        with pytest.raises(DefinitionError, match=re.escape(static[piece])):
            load_workflow(_flow(criteria, runner="criteria-judge"))
        return
    with Engine(tmp_path_factory.mktemp("state")) as engine:
        run = engine.run(_flow(criteria, runner="criteria-judge"))
    judged = [r.prompt or "" for r in seen.requests if r.kind == "judge"]
    if piece == "{{ params.n }}":
        assert run.status == "completed"
        assert f"- {before}2{after}\n" in judged[0]  # the judge read the rendered criteria
    else:
        assert (run.status, judged) == ("blocked", [])
        assert "judge failed on loop 1: criteria failed to render: " in (
            run.row.status_reason or ""
        )
