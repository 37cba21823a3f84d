"""Authoring → plan: YAML 1.2 scalars, definition errors with line and field, frozen plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic import DefinitionError, Engine, load_workflow
from wf_magic.hashing import canonical_json, sha256_text

from .conftest import table_counts

GOOD = """\
name: digest
params:
  topic: {type: string}
  sections: {type: integer, default: 3, minimum: 1}
steps:
  - id: outline
    prompt: "Outline {{ params.topic }} in {{ params.sections }} sections."
  - id: decide
    route:
      on: "{{ steps.outline.output | trim }}"
      cases: {on: publish, yes: publish, default: publish}
  - id: publish
    prompt: "Publish {{ steps.outline.output }}"
"""


def test_plan_is_canonical_json_with_hashes() -> None:
    wf = load_workflow(GOOD)
    assert wf.plan_json == canonical_json(json.loads(wf.plan_json))
    assert wf.plan_hash == sha256_text(wf.plan_json)
    assert wf.source_hash == sha256_text(GOOD)
    assert json.loads(wf.plan_json)["plan_version"] == 1


def test_yaml_12_keeps_on_yes_no_as_strings() -> None:
    wf = load_workflow(GOOD)
    route = wf.plan.step("decide").route
    assert route is not None
    assert set(route.cases) == {"on", "yes", "default"}


def test_comments_do_not_change_the_plan_hash() -> None:
    assert load_workflow(GOOD).plan_hash == load_workflow("# a comment\n" + GOOD).plan_hash


MALFORMED = [
    # (source, expected field, expected line, words in the message)
    ("name: x\nsteps:\n  - id: a\n    prompt: [unclosed\n", "(yaml)", 5, "invalid YAML"),
    (
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n    colour: red\n",
        "steps[0].colour",
        5,
        "unknown key",
    ),
    (
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n  - id: a\n    prompt: again\n",
        "steps[1].id",
        5,
        "duplicate step id",
    ),
    (
        "name: x\nsteps:\n  - id: a\n    prompt: '{{ steps.b.output }}'\n  - id: b\n    prompt: hi\n",
        "steps[0].prompt",
        4,
        "later step 'b'",
    ),
    (
        "name: x\nparams:\n  n: {type: integer, default: many}\nsteps:\n  - id: a\n    prompt: hi\n",
        "params.n.default",
        3,
        "does not match",
    ),
    (
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n    gate: {max_loops: 0}\n",
        "steps[0].gate.max_loops",
        5,
        "must be >= 1",
    ),
    (
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n    exec: [ls]\n",
        "steps[0]",
        3,
        "exactly one of",
    ),
    ("name: Bad Name\nsteps:\n  - id: a\n    prompt: hi\n", "name", 1, "expected a name"),
    (
        "name: x\nsteps:\n  - id: a\n    prompt: '{{ params.nope }}'\n",
        "steps[0].prompt",
        4,
        "undeclared param 'nope'",
    ),
    (
        "name: x\nsteps:\n  - id: a\n    prompt: '{{ oops }}'\n",
        "steps[0].prompt",
        4,
        "unknown variable",
    ),
    (
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n    runner: nosuch\n",
        "steps[0].runner",
        5,
        "unknown runner 'nosuch'",
    ),
    (
        "name: x\nsteps:\n  - id: r\n    route: {on: x, cases: {a: ghost}}\n",
        "steps[0].route.cases.a",
        4,
        "not a step id",
    ),
    (
        "name: x\nsteps:\n  - id: a\n    exec: [ls]\n    pass_env: [WF_SECRET]\n",
        "steps[0].pass_env",
        5,
        "not starting with WF_",
    ),
    (
        "name: x\nsteps:\n  - id: a\n    prompt: '{% if %}'\n",
        "steps[0].prompt",
        4,
        "invalid template",
    ),
    ("name: x\nsteps: []\n", "steps", 2, "at least 1"),
    ("- just\n- a list\n", "(top level)", 1, "expected a mapping"),
]


@pytest.mark.parametrize(("source", "field", "line", "words"), MALFORMED)
def test_malformed_workflow_names_line_and_field_and_writes_nothing(
    engine: Engine, state_dir: Path, source: str, field: str, line: int, words: str
) -> None:
    engine.store.open()  # create the database first: a failed start must leave it unchanged
    before = table_counts(state_dir)
    with pytest.raises(DefinitionError) as info:
        engine.start(source)
    err = info.value
    assert err.field == field
    assert err.line == line
    assert words in str(err)
    assert "\n" not in str(err)
    assert f"line {line}" in str(err)
    assert table_counts(state_dir) == before


def test_child_workflow_is_embedded_from_a_second_document() -> None:
    src = (
        "name: parent\nsteps:\n  - id: c\n    workflow: kid\n    with: {x: 1}\n---\n"
        "name: kid\nparams: {x: {type: integer}}\nsteps:\n  - id: k\n    prompt: 'k {{ params.x }}'\n"
    )
    wf = load_workflow(src)
    assert set(wf.plan.children) == {"kid"}
    assert wf.plan.children["kid"].steps[0].prompt == "k {{ params.x }}"


def test_unknown_child_workflow_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError, match="unknown child workflow 'ghost'"):
        load_workflow("name: p\nsteps:\n  - id: c\n    workflow: ghost\n")


def test_exec_gate_loops_are_capped_to_one() -> None:
    wf = load_workflow(
        "name: p\nsteps:\n  - id: e\n    exec: [ls]\n    gate: "
        "{judge: expr, check: 'true', max_loops: 3}\n"
    )
    step = wf.plan.step("e")
    assert (step.max_loops, step.loops_capped) == (1, True)


def test_python_target_source_hash_is_frozen() -> None:
    wf = load_workflow("name: p\nsteps:\n  - id: f\n    python: 'json:dumps'\n")
    assert (
        wf.plan.step("f").target_hash is not None and len(wf.plan.step("f").target_hash or "") == 64
    )


def test_secret_values_in_runner_config_are_refused() -> None:
    with pytest.raises(DefinitionError, match="environment variable"):
        load_workflow(
            "name: p\nrunners:\n  openai: {api_key: sk-abcdefabcdef}\nsteps:\n"
            "  - id: a\n    prompt: hi\n"
        )


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes_the_loader(text: str) -> None:
    try:
        load_workflow(text if "\n" in text or not text.endswith((".yaml", ".yml")) else text + "\n")
    except DefinitionError as exc:
        assert "\n" not in str(exc)


def test_error_in_a_child_document_names_the_files_own_line() -> None:
    src = (
        "name: parent\nsteps:\n  - id: c\n    workflow: kid\n---\nname: kid\nsteps:\n"
        "  - id: k\n    prompt: hi\n    gate: {max_loops: 0}\n"
    )
    with pytest.raises(DefinitionError) as info:
        load_workflow(src, source_name="wf.yaml")
    assert str(info.value) == (
        "steps[0].gate.max_loops: in child workflow 'kid': must be >= 1 (got 0) (wf.yaml, line 10)"
    )


def test_yaml_12_numbers_and_dates_stay_as_written() -> None:
    wf = load_workflow(
        "name: x\ndescription: 1_000\nparams:\n  d: {type: string, default: 2020-01-01}\n"
        "  o: {type: integer, default: 017}\n"
        "steps:\n  - id: a\n    prompt: hi\n"
    )
    assert wf.plan.description == "1_000"
    plan = json.loads(wf.plan_json)
    assert plan["params"]["d"]["default"] == "2020-01-01"
    assert plan["params"]["o"]["default"] == 17


def test_unknown_attribute_of_a_step_is_a_freeze_time_error() -> None:
    with pytest.raises(DefinitionError) as info:
        load_workflow(
            "name: x\nsteps:\n  - id: a\n    prompt: hi\n"
            "  - id: b\n    prompt: '{{ steps.a.outputs }}'\n"
        )
    assert info.value.field == "steps[1].prompt"


def test_infinite_budget_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError) as info:
        load_workflow("name: x\nbudget: {max_cost: .inf}\nsteps:\n  - id: a\n    prompt: hi\n")
    assert info.value.field is not None and "budget" in info.value.field


def test_nan_param_default_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        load_workflow(
            "name: x\nparams:\n  f: {type: number, default: .nan}\n"
            "steps:\n  - id: a\n    prompt: hi\n"
        )


def test_pass_env_on_a_non_exec_step_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        load_workflow("name: x\nsteps:\n  - id: a\n    prompt: hi\n    pass_env: [HOME]\n")


@pytest.mark.parametrize("name", ["WF_TOKEN", "1ABC", "A-B", "A B"])
def test_pass_env_names_are_validated(name: str) -> None:
    with pytest.raises(DefinitionError) as info:
        load_workflow(
            f"name: x\nsteps:\n  - id: a\n    exec: [env]\n    pass_env: [{json.dumps(name)}]\n"
        )
    assert info.value.field == "steps[0].pass_env" and info.value.line == 5


def test_reduce_without_map_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        load_workflow("name: x\nsteps:\n  - id: a\n    prompt: hi\n    reduce: vote\n")
