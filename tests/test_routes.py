"""Routes (DESIGN.md §2, issue 4): case selection, skip notes, cascades, crash replay, checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers_flow import (
    children_of,
    journal_counts,
    kill9,
    only_run_id,
    run_cli,
    step_statuses,
    wait_for_journal,
    wf_process,
)
from wf_magic import DefinitionError, Engine, load_workflow


def statuses(engine: Engine, run_id: str) -> dict[str, tuple[str, str | None]]:
    return {s.step_id: (s.status, s.note) for s in engine.steps(run_id)}


def worked(engine: Engine, run_id: str) -> list[str]:
    return [a.unit_id for a in engine.attempts(run_id)]


ROUTE = """
name: routed
runners:
  scripted:
    rules:
      - {match: '^Classify (\\w+)', reply: "  {{ groups[1] }}\\n"}
      - {match: '^Branch A', reply: did a}
      - {match: '^Branch B', reply: did b, sleep_s: {sleep}}
      - {match: '^Other', reply: did other}
params:
  pick: {type: string, default: b}
steps:
  - id: classify
    prompt: "Classify {{ params.pick }}"
  - id: decide
    route:
      on: "{{ steps.classify.output }}"
      cases: {a: branch_a, b: branch_b, default: other}
  - id: branch_a
    prompt: Branch A
  - id: branch_b
    prompt: Branch B
  - id: other
    prompt: Other
  - id: summary
    prompt: >-
      Summary: {{ steps.branch_a.output }}|{{ steps.branch_b.output }}|{{ steps.other.output }}
"""


def route_source(sleep: float = 0) -> str:
    return ROUTE.replace("{sleep}", str(sleep))


def test_router_selecting_b_skips_the_other_targets_with_a_note(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(route_source())

    assert run.status == "completed"
    skipped_note = 'Skipped by route: step "decide" selected "b"'
    assert statuses(engine, run.run_id) == {
        "classify": ("completed", None),
        "decide": ("completed", "selected 'branch_b' (case 'b')"),
        "branch_a": ("skipped", skipped_note),
        "branch_b": ("completed", None),
        "other": ("skipped", skipped_note),
        "summary": ("completed", None),
    }
    assert run.output("decide") == {"value": "b", "case": "b", "selected": "branch_b"}
    assert worked(engine, run.run_id) == ["classify", "decide", "branch_b", "summary"]
    summary = engine.attempts(run.run_id)[-1]
    assert summary.status == "succeeded"
    route_row = engine.attempts(run.run_id)[1]
    assert (route_row.runner, route_row.charged) == ("route", 0)


def test_unmatched_value_takes_the_default_case(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(route_source(), params={"pick": "zebra"})

    assert run.status == "completed"
    assert run.output("decide") == {"value": "zebra", "case": "default", "selected": "other"}
    note = 'Skipped by route: step "decide" selected "default"'
    assert statuses(engine, run.run_id)["branch_a"] == ("skipped", note)
    assert statuses(engine, run.run_id)["branch_b"] == ("skipped", note)
    assert worked(engine, run.run_id) == ["classify", "decide", "other", "summary"]


def test_redriving_a_routed_run_writes_nothing(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(route_source())
    before = journal_counts(engine, run.run_id)

    assert engine.drive(run.run_id).status == "completed"
    assert journal_counts(engine, run.run_id) == before


def test_kill_9_after_the_route_resumes_on_the_selected_branch(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = tmp_path / "route.yaml"
    wf.write_text(route_source(sleep=0.25))
    with wf_process(state, wf) as proc:
        wait_for_journal(
            proc,
            state,
            "SELECT COUNT(*) FROM attempts WHERE unit_id = 'branch_b' AND status = 'running'",
        )
        kill9(proc)
    run_id = only_run_id(state)
    engine = Engine(state)
    assert statuses(engine, run_id)["decide"][0] == "completed"
    assert statuses(engine, run_id)["other"] == ("pending", None)  # not reached before the kill

    assert run_cli(state, "resume", run_id) == 0

    note = 'Skipped by route: step "decide" selected "b"'
    assert statuses(engine, run_id) == {
        "classify": ("completed", None),
        "decide": ("completed", "selected 'branch_b' (case 'b')"),
        "branch_a": ("skipped", note),
        "branch_b": ("completed", None),
        "other": ("skipped", note),
        "summary": ("completed", None),
    }
    # The route was decided once; branch_b's in-flight attempt was reclaimed, not repeated.
    assert [(a.unit_id, a.attempt, a.status) for a in engine.attempts(run_id)] == [
        ("classify", 1, "succeeded"),
        ("decide", 1, "succeeded"),
        ("branch_b", 1, "succeeded"),
        ("summary", 1, "succeeded"),
    ]


CASCADE = """
name: cascade
steps:
  - id: first
    route:
      on: "x"
      cases: {x: work, y: second}
  - id: work
    prompt: work
  - id: second
    route:
      on: "p"
      cases: {p: left, q: right}
  - id: third
    route:
      on: "r"
      cases: {r: right}
  - id: left
    prompt: left
  - id: right
    prompt: right
"""


def test_a_skipped_router_cascades_to_its_targets_unless_another_router_chose_them(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(CASCADE)

    assert run.status == "completed"
    assert statuses(engine, run.run_id) == {
        "first": ("completed", "selected 'work' (case 'x')"),
        "work": ("completed", None),
        "second": ("skipped", 'Skipped by route: step "first" selected "x"'),
        "third": ("completed", "selected 'right' (case 'r')"),
        "left": ("skipped", 'Skipped by route: router step "second" was skipped'),
        "right": ("completed", None),  # protected: "third" selected it
    }
    assert worked(engine, run.run_id) == ["first", "work", "third", "right"]


def test_a_value_matching_no_case_and_no_default_fails_the_step(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: nomatch
steps:
  - id: ask
    prompt: anything
  - id: decide
    route:
      on: "{{ steps.ask.output | truncate(14, True, '') }}"
      cases: {yes: a, no: b}
  - id: a
    prompt: a
  - id: b
    prompt: b
""")
    assert run.status == "failed"
    message = (
        "unit decide failed: route value 'scripted reply' matches no case ['no', 'yes'] "
        "and there is no default; add a case or a default"
    )
    assert statuses(engine, run.run_id)["decide"] == ("failed", message)
    assert run.reason == f"step decide: {message}"
    assert [s.status for s in engine.steps(run.run_id)] == [
        "completed",
        "failed",
        "pending",
        "pending",
    ]


def test_yaml_on_key_and_yes_no_cases_stay_strings() -> None:
    wf = load_workflow("""
name: yaml12
steps:
  - id: r
    route:
      on: "yes"
      cases: {yes: a, no: b, off: c}
  - id: a
    prompt: a
  - id: b
    prompt: b
  - id: c
    prompt: c
""")
    route = wf.plan.step("r").route
    assert route is not None
    assert route.on == "yes"
    assert route.cases == {"yes": "a", "no": "b", "off": "c"}


@pytest.mark.parametrize(
    ("cases", "problem"),
    [
        ("{x: nowhere}", "route target 'nowhere' is not a step id"),
        ("{x: early}", "route target 'early' must come after the router 'decide'"),
        ("{x: decide}", "route target 'decide' must come after the router 'decide'"),
    ],
)
def test_route_targets_are_checked_when_freezing(tmp_path: Path, cases: str, problem: str) -> None:
    source = f"""
name: badroute
steps:
  - id: early
    prompt: e
  - id: decide
    route:
      on: "x"
      cases: {cases}
  - id: late
    prompt: l
"""
    with pytest.raises(DefinitionError) as info:
        load_workflow(source)
    assert problem in str(info.value)
    assert info.value.line == 9  # the source opens with a newline
    assert info.value.field == "steps[1].route.cases.x"
    assert not (tmp_path / "state").exists()


def test_targets_of_a_router_that_failed_and_continued_are_skipped(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: failed-router
steps:
  - id: decide
    on_error: continue
    route:
      on: "zzz"
      cases: {a: a, b: b}
  - id: a
    prompt: a
  - id: b
    prompt: b
""")
    assert run.status == "completed"
    assert [s.status for s in engine.steps(run.run_id)] == ["failed", "skipped", "skipped"]


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fanout_route.yaml"


@pytest.mark.parametrize(
    ("args", "ran", "skipped"),
    [
        ((), "ship", "rework"),
        (("--param", "strict=true"), "rework", "ship"),
    ],
)
def test_example_fanout_route_runs_offline(
    tmp_path: Path, args: tuple[str, ...], ran: str, skipped: str
) -> None:
    state = tmp_path / "state"

    assert run_cli(state, "run", str(EXAMPLE), *args) == 0

    engine = Engine(state)
    run_id = only_run_id(state)
    steps = statuses(engine, run_id)
    assert steps[ran][0] == "completed"
    assert steps[skipped][0] == "skipped"
    assert len([a for a in engine.attempts(run_id) if a.step_id == "review"]) == 6


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
    [child] = children_of(engine, run.run_id)
    assert step_statuses(engine, child) == {
        "decide": "completed",
        "bad": "skipped",
        "good": "completed",
    }
    assert str(run.output("sub")).endswith("Good path.")


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
    assert step_statuses(engine, run.run_id) == {
        "pick": "completed",
        "t": "failed",
        "other": "skipped",
        "last": "completed",
    }
    before = journal_counts(engine, run.run_id)
    assert engine.drive(run.run_id).status == "completed"
    assert journal_counts(engine, run.run_id) == before
