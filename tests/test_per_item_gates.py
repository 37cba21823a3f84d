"""Per-item gates on map steps (issue 24, deliverable 7): each unit's output is judged alone,
only the rejected items loop, the others are reused within the run (never re-paid), and each
item's verdict is in the journal and the sweep frame."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers_flow import kill9, only_run_id, use_runner, wait_for_journal, wf_process
from wf_magic import DefinitionError, Engine, UnitRequest, load_workflow


def gate_and_work(engine: Engine, run_id: str) -> list[tuple[str, int, str]]:
    """(unit, loop, status) of every attempt, in journal order."""
    return [(a.unit_id, a.loop, a.status) for a in engine.attempts(run_id)]


def verdict_of(engine: Engine, run_id: str) -> dict[str, bool]:
    """Gate unit id → the verdict's ``complete``."""
    return {
        a.unit_id: json.loads(a.output_json or "{}")["complete"]
        for a in engine.attempts(run_id)
        if a.phase == "gate" and a.status == "succeeded"
    }


def _fix_odd(request: UnitRequest) -> object:
    """Odd items answer ``bad i`` until they read gate feedback, then ``ok i``."""
    if request.kind == "judge":
        return {"complete": '"ok' in (request.prompt or ""), "feedback": "say ok"}
    item = int(str(request.item))
    fixed = "Gate feedback" in (request.prompt or "") or item % 2 == 0
    return f"{'ok' if fixed else 'bad'} {item}"


EXPR_MAP = """
name: per-item
runner: fixer
budget: {max_units: 6}
steps:
  - id: m
    map: "{{ [0, 1, 2, 3] }}"
    prompt: "Do {{ item }}."
    gate:
      per_item: true
      judge: expr
      check: "output.startswith('ok')"
      criteria: ["starts with ok"]
      max_loops: 3
"""


def test_an_expr_per_item_gate_loops_only_the_rejected_items(tmp_path: Path) -> None:
    rec = use_runner("fixer", _fix_odd)
    with Engine(tmp_path / "state") as engine:
        run = engine.run(EXPR_MAP)

        assert run.status == "completed"
        assert run.result == ["ok 0", "ok 1", "ok 2", "ok 3"]
        assert gate_and_work(engine, run.run_id) == [
            ("m[0]", 1, "succeeded"),
            ("m[1]", 1, "succeeded"),
            ("m[2]", 1, "succeeded"),
            ("m[3]", 1, "succeeded"),
            ("m.gate:l1[0]", 1, "succeeded"),
            ("m.gate:l1[1]", 1, "succeeded"),
            ("m.gate:l1[2]", 1, "succeeded"),
            ("m.gate:l1[3]", 1, "succeeded"),
            ("m[1]", 2, "succeeded"),
            ("m[3]", 2, "succeeded"),
            ("m.gate:l2[1]", 2, "succeeded"),
            ("m.gate:l2[3]", 2, "succeeded"),
        ]
        assert verdict_of(engine, run.run_id) == {
            "m.gate:l1[0]": True,
            "m.gate:l1[1]": False,
            "m.gate:l1[2]": True,
            "m.gate:l1[3]": False,
            "m.gate:l2[1]": True,
            "m.gate:l2[3]": True,
        }
        gates = [a for a in engine.attempts(run.run_id) if a.phase == "gate"]
        assert [a.item_index for a in gates] == [0, 1, 2, 3, 1, 3]
        # Only the re-paid items are charged: budget max_units 6 = 4 + 2.
        assert sum(a.charged for a in engine.attempts(run.run_id)) == 6
        block = (
            "\n\nGate feedback (loop 1 was rejected):\nstarts with ok\nMissing:\n- starts with ok"
        )
        assert rec.prompts() == [
            "Do 0.",
            "Do 1.",
            "Do 2.",
            "Do 3.",
            f"Do 1.{block}",
            f"Do 3.{block}",
        ]
        step = next(s for s in engine.steps(run.run_id) if s.step_id == "m")
        assert (step.status, step.loop) == ("completed", 2)
        assert step.note == "gate passed at loop 2/3 (expr): 4 of 4 items passed"

        calls = len(rec.requests)
        again = engine.drive(run.run_id)
        assert again.status == "completed"
        assert len(rec.requests) == calls


def test_the_journal_frame_shows_each_items_verdict(tmp_path: Path) -> None:
    use_runner("fixer", _fix_odd)
    with Engine(tmp_path / "state") as engine:
        run = engine.run(EXPR_MAP)
        frame = engine.journal(run.run_id)
        gates = frame[frame["phase"] == "gate"]
        assert gates["unit"].tolist() == [
            "m.gate:l1[0]",
            "m.gate:l1[1]",
            "m.gate:l1[2]",
            "m.gate:l1[3]",
            "m.gate:l2[1]",
            "m.gate:l2[3]",
        ]
        assert gates["verdict"].tolist() == [
            "passed",
            "rejected",
            "passed",
            "rejected",
            "passed",
            "passed",
        ]
        assert frame[frame["phase"] == "work"]["verdict"].isna().all()


def test_an_llm_per_item_gate_judges_each_output_alone(tmp_path: Path) -> None:
    rec = use_runner("fixer", _fix_odd)
    with Engine(tmp_path / "state") as engine:
        run = engine.run("""
name: per-item-llm
runner: fixer
steps:
  - id: m
    map: "{{ [0, 1] }}"
    prompt: "Do {{ item }}."
    gate: {per_item: true, criteria: ["says ok"], max_loops: 2}
""")
        assert run.status == "completed"
        judge = rec.prompts("judge")
        assert len(judge) == 3
        assert 'Artifact (1 unit):\n"ok 0"' in judge[0]
        assert 'Artifact (1 unit):\n"bad 1"' in judge[1]
        assert 'Artifact (1 unit):\n"ok 1"' in judge[2]
        assert [a.unit_id for a in engine.attempts(run.run_id)] == [
            "m[0]",
            "m[1]",
            "m.gate:l1[0]",
            "m.gate:l1[1]",
            "m[1]",
            "m.gate:l2[1]",
        ]


def test_a_per_item_gate_loops_only_the_items_failing_the_output_schema(tmp_path: Path) -> None:
    use_runner(
        "typed",
        lambda r: {"n": 1} if "Gate feedback" in (r.prompt or "") or r.item == 0 else {"n": "x"},
    )
    with Engine(tmp_path / "state") as engine:
        run = engine.run("""
name: per-item-schema
runner: typed
steps:
  - id: m
    map: "{{ [0, 1, 2] }}"
    prompt: "Count {{ item }}."
    output: {type: object, properties: {n: {type: integer}}, required: [n]}
    gate: {per_item: true, judge: expr, check: "output.n == 1", max_loops: 2}
""")
        assert run.status == "completed"
        assert run.result == [{"n": 1}, {"n": 1}, {"n": 1}]
        gates = [
            (a.unit_id, a.runner, json.loads(a.output_json or "{}")["complete"])
            for a in engine.attempts(run.run_id)
            if a.phase == "gate"
        ]
        assert gates == [
            ("m.gate:l1[0]", "expr", True),
            ("m.gate:l1[1]", "schema", False),
            ("m.gate:l1[2]", "schema", False),
            ("m.gate:l2[1]", "expr", True),
            ("m.gate:l2[2]", "expr", True),
        ]
        work = [(a.unit_id, a.loop) for a in engine.attempts(run.run_id) if a.phase == "work"]
        assert work == [("m[0]", 1), ("m[1]", 1), ("m[2]", 1), ("m[1]", 2), ("m[2]", 2)]


def test_items_still_rejected_after_max_loops_block_the_step_and_approval_completes_it(
    tmp_path: Path,
) -> None:
    use_runner("stuck", lambda r: f"bad {r.item}" if r.item == 1 else f"ok {r.item}")
    with Engine(tmp_path / "state") as engine:
        run = engine.run("""
name: per-item-stuck
runner: stuck
steps:
  - id: m
    map: "{{ [0, 1, 2] }}"
    prompt: "Do {{ item }}."
    gate:
      per_item: true
      judge: expr
      check: "output.startswith('ok')"
      criteria: [ok]
      max_loops: 2
""")
        assert run.status == "blocked"
        assert run.reason == (
            "step m: gate exhausted after 2 loop(s) on 1 of 3 items (m[1]); last feedback: ok "
            "(missing: ok)"
        )
        assert [a.unit_id for a in engine.attempts(run.run_id) if a.phase == "work"] == [
            "m[0]",
            "m[1]",
            "m[2]",
            "m[1]",
        ]
        engine.approve(run.run_id, "m")
        done = engine.drive(run.run_id)
        assert done.status == "completed"
        assert done.result == ["ok 0", "bad 1", "ok 2"]
        assert [a.unit_id for a in engine.attempts(run.run_id) if a.phase == "gate"][-1] == (
            "m.gate:l2"
        )


def test_per_item_on_a_step_without_map_is_a_definition_error_naming_the_field() -> None:
    with pytest.raises(DefinitionError) as info:
        load_workflow("""
name: bad
runner: scripted
steps:
  - id: s
    prompt: Do.
    gate: {per_item: true, judge: expr, check: "true"}
""")
    assert str(info.value) == (
        "steps[0].gate.per_item: `per_item: true` judges each item of a map step; step s has "
        "no `map:` (<workflow>, line 7)"
    )


def test_a_human_per_item_gate_is_refused_at_freeze() -> None:
    with pytest.raises(DefinitionError) as info:
        load_workflow("""
name: bad
runner: scripted
steps:
  - id: s
    map: "{{ [1] }}"
    prompt: Do.
    gate: {per_item: true, judge: human}
""")
    assert "`per_item:` needs `judge: llm` or `judge: expr`" in str(info.value)
    assert "\n" not in str(info.value)


def test_plans_without_per_item_keep_their_json_and_hash() -> None:
    source = """
name: plain
runner: scripted
steps:
  - id: m
    map: "{{ [1] }}"
    prompt: Do.
    gate: {judge: expr, check: "true"}
"""
    plain = load_workflow(source).plan
    assert "per_item" not in plain.model_dump_json()
    flagged = load_workflow(source.replace("{judge: expr", "{per_item: true, judge: expr")).plan
    assert json.loads(flagged.model_dump_json())["steps"][0]["gate"]["per_item"] is True
    assert flagged.steps[0].gate is not None and flagged.steps[0].gate.per_item


def _looped_reply(request: UnitRequest) -> object:
    """An item's output names it and the loop it was rendered for (from its feedback)."""
    found = re.search(r"loop (\d+) was rejected", request.prompt or "")
    return {"i": request.item, "n": int(found.group(1)) + 1 if found else 1}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bad=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    max_loops=st.integers(1, 4),
)
def test_exactly_the_rejected_items_are_redispatched_each_loop(
    bad: list[int], max_loops: int
) -> None:
    """Item i is rejected in its first ``bad[i]`` loops: loop L re-dispatches exactly the
    items rejected at L-1; the others are reused within the run and charged once."""
    rec = use_runner("looped", _looped_reply)
    source = f"""
name: per-item-prop
runner: looped
steps:
  - id: m
    map: "{{{{ {list(range(len(bad)))} }}}}"
    prompt: "Do {{{{ item }}}}."
    gate:
      per_item: true
      judge: expr
      check: "output.n > {bad}[output.i]"
      max_loops: {max_loops}
"""
    with tempfile.TemporaryDirectory() as tmp, Engine(Path(tmp) / "state") as engine:
        run = engine.run(source)
        work = [(a.loop, a.item_index) for a in engine.attempts(run.run_id) if a.phase == "work"]
        expected = [
            (loop, i)
            for loop in range(1, max_loops + 1)
            for i in range(len(bad))
            if bad[i] >= loop - 1
        ]
        assert work == expected
        assert sum(a.charged for a in engine.attempts(run.run_id)) == len(expected)
        assert len(rec.requests) == len(expected)
        judged = [(a.loop, a.item_index) for a in engine.attempts(run.run_id) if a.phase == "gate"]
        assert judged == expected
        if max(bad) < max_loops:
            assert run.status == "completed"
            assert run.result == [{"i": i, "n": b + 1} for i, b in enumerate(bad)]
        else:
            assert run.status == "blocked"
        again = engine.drive(run.run_id)
        assert again.status == run.status
        assert len(rec.requests) == len(expected)


def test_kill_9_mid_loop_redispatches_only_the_unfinished_items(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "per_item_crash.yaml"
    wf.write_text("""
name: per-item-crash
runners:
  scripted:
    rules:
      - {match: 'Do 1\\.\\n\\nGate feedback', reply: "ok 1", sleep_s: 1.5}
      - {match: 'Do 3\\.\\n\\nGate feedback', reply: "ok 3"}
      - {match: 'Do 1\\.', reply: "bad 1"}
      - {match: 'Do 3\\.', reply: "bad 3"}
      - {match: 'Do (\\d)\\.', reply: "ok"}
steps:
  - id: m
    map: "{{ [0, 1, 2, 3] }}"
    prompt: "Do {{ item }}."
    gate: {per_item: true, judge: expr, check: "output.startswith('ok')", max_loops: 2}
""")
    with wf_process(state, wf) as proc:
        wait_for_journal(
            proc,
            state,
            "SELECT COUNT(*) FROM attempts WHERE unit_id = 'm[1]' AND loop = 2"
            " AND status = 'running'",
        )
        kill9(proc)
    run_id = only_run_id(state)
    with Engine(state) as engine:
        in_flight = [a for a in engine.attempts(run_id) if a.status == "running"]
        assert ("m[1]", 2) in [(a.unit_id, a.loop) for a in in_flight]

        done = engine.drive(run_id)

        assert done.status == "completed"
        assert done.result == ["ok", "ok 1", "ok", "ok 3"]
        work = [(a.unit_id, a.loop) for a in engine.attempts(run_id) if a.phase == "work"]
        assert sorted(work) == [
            ("m[0]", 1),
            ("m[1]", 1),
            ("m[1]", 2),
            ("m[2]", 1),
            ("m[3]", 1),
            ("m[3]", 2),
        ]
        m1 = next(a for a in engine.attempts(run_id) if (a.unit_id, a.loop) == ("m[1]", 2))
        reclaimed = next(a for a in in_flight if a.unit_id == "m[1]")
        assert m1.dispatch_id == reclaimed.dispatch_id
        assert m1.attempt == reclaimed.attempt


def test_the_sweep_frame_counts_each_cells_items_as_the_journal_judged_them(
    tmp_path: Path,
) -> None:
    use_runner("fixer", _fix_odd)
    source = """
name: per-item-sweep
runner: fixer
params:
  n: {type: integer, default: 2}
steps:
  - id: m
    map: "{{ range(params.n) | list }}"
    prompt: "Do {{ item }}."
    gate:
      per_item: true
      judge: expr
      check: "output.startswith('ok')"
      max_loops: "{loops}"
"""
    with Engine(tmp_path / "state") as engine:
        sweep = engine.sweep(source.replace('"{loops}"', "1"), grid={"n": [1, 2, 4]})
        frame = sweep.frame()
        assert list(frame.columns)[-4:] == [
            "gate_m",
            "gate_m_loops",
            "gate_m_items",
            "gate_m_passed_items",
        ]
        assert frame["gate_m"].tolist() == ["passed", "blocked", "blocked"]
        assert frame["gate_m_items"].tolist() == [1, 2, 4]
        assert frame["gate_m_passed_items"].tolist() == [1, 1, 2]
        for run_id, passed in zip(frame["run_id"], frame["gate_m_passed_items"], strict=True):
            journal = engine.journal(run_id)
            assert (journal["verdict"] == "passed").sum() == passed


def test_the_sweeps_doc_score_each_row_example_runs(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "sweeps.md").read_text()
    section = doc.split("## Score each row", 1)[1]
    steps = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    source = (
        "name: scored\nrunner: words\nparams:\n"
        "  questions: {type: array, default: [sky, sea, a long question]}\n" + steps
    )
    use_runner(
        "words",
        lambda r: "blue" if "Gate feedback" in (r.prompt or "") else f"the {r.item} is blue",
    )
    with Engine(tmp_path / "state") as engine:
        run = engine.run(source)
        assert run.status == "completed"
        assert run.result == ["the sky is blue", "the sea is blue", "blue"]
        work = [a.unit_id for a in engine.attempts(run.run_id) if a.phase == "work"]
        assert work == ["answer[0]", "answer[1]", "answer[2]", "answer[2]"]
