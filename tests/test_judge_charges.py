"""`gate: {charged: true}` and `budget: {charge_judges: true}`: an LLM judge's calls count."""

from __future__ import annotations

import pytest

from wf_magic import DefinitionError, Engine

JUDGED = """
name: judged
budget: BUDGET
runner: scripted
runners:
  scripted:
    rules:
      - {match: "Judge", kind: judge, reply: {complete: true, feedback: "", missing: []},
         tokens_in: 40, tokens_out: 4}
      - {match: "^Draft", reply: drafted, tokens_in: 8, tokens_out: 2}
steps:
  - id: draft
    map: "{{ ['a', 'b'] }}"
    prompt: "Draft {{ item }}"
    gate: GATE
"""


def _source(budget: str, gate: str) -> str:
    return JUDGED.replace("BUDGET", budget).replace("GATE", gate)


def _rows(engine: Engine, run_id: str) -> list[tuple[str, bool, int]]:
    return [
        (a.unit_id, bool(a.charged), a.tokens_in + a.tokens_out)
        for a in engine.attempts(run_id)
        if a.status != "running"
    ]


@pytest.mark.parametrize(
    ("budget", "gate", "charged"),
    [
        ("{max_tokens: 1000}", "{judge: llm, criteria: [ok]}", False),
        ("{max_tokens: 1000}", "{judge: llm, criteria: [ok], charged: true}", True),
        ("{max_tokens: 1000, charge_judges: true}", "{judge: llm, criteria: [ok]}", True),
        (
            "{max_tokens: 1000, charge_judges: true}",
            "{judge: llm, criteria: [ok], charged: false}",
            False,
        ),
    ],
)
def test_a_judge_is_charged_when_its_gate_or_the_workflow_says_so(
    engine: Engine, budget: str, gate: str, charged: bool
) -> None:
    run = engine.run(_source(budget, gate))
    assert run.status == "completed"
    assert _rows(engine, run.run_id) == [
        ("draft[0]", True, 10),
        ("draft[1]", True, 10),
        ("draft.gate:l1", charged, 44),
    ]
    use = run.budget_use()
    assert (use.units, use.tokens) == ((3, 64) if charged else (2, 20))


def test_a_charged_judge_that_would_pass_the_ceiling_stops_the_run_undispatched(
    engine: Engine,
) -> None:
    run = engine.run(_source("{max_units: 2}", "{judge: llm, criteria: [ok], charged: true}"))
    assert run.status == "failed"
    assert "max_units" in (run.reason or "")
    assert [u for u, _, _ in _rows(engine, run.run_id)] == ["draft[0]", "draft[1]"]
    again = engine.resume(run.run_id)  # a budget stop re-stops at once, dispatching nothing
    assert again.status == "failed"
    assert [u for u, _, _ in _rows(engine, run.run_id)] == ["draft[0]", "draft[1]"]


@pytest.mark.parametrize("judge", ["expr", "human"])
def test_charged_is_refused_on_a_judge_that_costs_nothing(engine: Engine, judge: str) -> None:
    check = ", check: 'true'" if judge == "expr" else ""
    with pytest.raises(DefinitionError, match="`charged:` is only read by `judge: llm`"):
        engine.run(_source("{max_units: 5}", f"{{judge: {judge}{check}, charged: true}}"))
