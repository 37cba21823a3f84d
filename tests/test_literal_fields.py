"""Every string field that is not a template refuses `{{`/`{%` at freeze time (spec/literals.py)."""

from __future__ import annotations

import copy
import json
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from wf_magic.errors import DefinitionError
from wf_magic.spec.freeze import load_workflow
from wf_magic.spec.literals import MODEL_FIELDS, TEMPLATE_FIELDS
from wf_magic.spec.models import WorkflowSpec

from .conftest import wf_inproc, write_file

KID = "name: kid\nsteps:\n  - id: k\n    prompt: k\n"
BASE: dict[str, Any] = {
    "name": "lit",
    "description": "plain words",
    "params": {"topic": {"type": "string", "default": "owls", "description": "what"}},
    "budget": {"max_units": 50, "max_tokens": 10000, "max_cost": 5.0},
    "execution": {"max_concurrency": 2, "durability": "normal"},
    "runner": "scripted",
    "runners": {
        "local": {
            "type": "scripted",
            "replies": {"x": "{{ groups[0] }}"},
            "rules": [
                {"match": "^a", "reply": "{{ prompt }} ({{ groups[0] }})", "model": "m-1"},
                {"match": ".", "reply": {"text": "plain"}},
            ],
            "model": "m-0",
        },
        "scripted": {"rules": [{"match": ".", "reply": "{{ prompt }}"}]},
    },
    "models": {"fast": {"scripted": "tiny"}},
    "steps": [
        {
            "id": "ask",
            "prompt": "about {{ params.topic }}",
            "runner": "local",
            "model": "fast",
            "timeout": 30,
            "retry": {"max_attempts": 2, "backoff_s": 0},
            "on_error": "fail",
            "output": {"type": "string", "description": "text"},
            "gate": {
                "criteria": ["short {{ params.topic }}"],
                "judge": "llm",
                "max_loops": 2,
                "runner": "scripted",
                "model": "{{ params.topic }}",
            },
            "cache": True,
            "options": {"temperature": 0.5, "system_prompt": "be brief"},
            "score": [
                {"name": "eq", "equals": "{{ params.topic }}", "ignore_case": True},
                {"name": "js", "json_schema": {"type": "string", "description": "text"}},
                {
                    "name": "q",
                    "judge": "llm",
                    "rubric": "good on {{ params.topic }}?",
                    "scale": [0, 1],
                    "runner": "scripted",
                    "model": "{{ params.topic }}",
                    "charged": False,
                },
                {"name": "py", "python": "fn"},
                {"name": "rx", "regex": "^{{ params.topic }}"},
                {"name": "ct", "contains": "{{ params.topic }}"},
            ],
        },
        {"id": "lint", "exec": ["python", "-c", "print(1)"], "pass_env": ["LANG"]},
        {
            "id": "fan",
            "map": "{{ ['a'] }}",
            "reduce": "collect",
            "python": "fn",
            "with": {"x": "{{ item }}"},
            "gate": {"judge": "expr", "check": "output | length > 0"},
        },
        {"id": "pick", "route": {"on": "{{ steps.ask.output }}", "cases": {"ok": "kid"}}},
        {"id": "kid", "workflow": "kid"},
    ],
}
T = "{{ params.topic }}"
KEY = "__key__"
"""In a case path: rename the key before it to the template instead of setting a value."""

# (path to set, the field the error names, a phrase of the message)
CASES: list[tuple[tuple[Any, ...], str, str]] = [
    (("name",), "name", "not a template"),
    (("description",), "description", "not a template"),
    (("params", "topic", "default"), "params.topic.default", "not a template"),
    (("params", "topic", "description"), "params.topic.description", "not a template"),
    (("params", "topic", KEY), "params.{{ params.topic }}", "a key is not a template"),
    (("budget", "max_units"), "budget.max_units", "not a template"),
    (("budget", "max_tokens"), "budget.max_tokens", "not a template"),
    (("budget", "max_cost"), "budget.max_cost", "not a template"),
    (("budget", "charge_judges"), "budget.charge_judges", "not a template"),
    (("execution", "max_concurrency"), "execution.max_concurrency", "not a template"),
    (("execution", "durability"), "execution.durability", "not a template"),
    (("runner",), "runner", "`runner:` is not a template"),
    (("runners", "local", KEY), "runners.{{ params.topic }}", "a key is not a template"),
    (("runners", "local", "type"), "runners.local.type", "not a template"),
    (("runners", "local", "replies", KEY), "runners.local.{{ params.topic }}", "a key"),
    # Runner options pass as written: only the scripted runner's string replies are rendered.
    (("runners", "local", "model"), "runners.local.model", "is a runner option"),
    (("runners", "local", "rules", 0, "match"), "runners.local.rules[0].match", "runner option"),
    (("runners", "local", "rules", 0, "model"), "runners.local.rules[0].model", "runner option"),
    (
        ("runners", "local", "rules", 1, "reply", "text"),
        "runners.local.rules[1].reply.text",
        "runner",
    ),
    (("runners", "scripted", "rules", 0, "match"), "runners.scripted.rules[0].match", "runner"),
    (("models", "fast", "scripted"), "models.fast.scripted", "not a template"),
    (("models", "fast", KEY), "models.{{ params.topic }}", "a key is not a template"),
    (("steps", 0, "id"), "steps[0].id", "not a template"),
    (("steps", 0, "runner"), "steps[0].runner", "`runner:` is not a template"),
    (("steps", 0, "timeout"), "steps[0].timeout", "not a template"),
    (("steps", 0, "retry", "max_attempts"), "steps[0].retry.max_attempts", "not a template"),
    (("steps", 0, "retry", "backoff_s"), "steps[0].retry.backoff_s", "not a template"),
    (("steps", 0, "on_error"), "steps[0].on_error", "not a template"),
    (("steps", 0, "output", "description"), "steps[0].output.description", "not a template"),
    (("steps", 0, "output", "type"), "steps[0].output.type", "not a template"),
    (("steps", 0, "gate", "judge"), "steps[0].gate.judge", "not a template"),
    (("steps", 0, "gate", "max_loops"), "steps[0].gate.max_loops", "not a template"),
    (("steps", 0, "gate", "charged"), "steps[0].gate.charged", "not a template"),
    (("steps", 0, "gate", "per_item"), "steps[0].gate.per_item", "not a template"),
    (("steps", 0, "gate", "runner"), "steps[0].gate.runner", "`runner:` is not a template"),
    (("steps", 0, "cache"), "steps[0].cache", "not a template"),
    (("steps", 0, "agent"), "steps[0].agent", "not a template"),
    (("steps", 0, "permission"), "steps[0].permission", "not a template"),
    (("steps", 0, "workdir"), "steps[0].workdir", "not a template"),
    (("steps", 0, "isolation"), "steps[0].isolation", "not a template"),
    (("steps", 0, "session"), "steps[0].session", "not a template"),
    (("steps", 0, "max_turns"), "steps[0].max_turns", "not a template"),
    (("steps", 0, "bridge"), "steps[0].bridge", "not a template"),
    (("steps", 0, "score", 0, "name"), "steps[0].score[0].name", "not a template"),
    (("steps", 0, "score", 0, "ignore_case"), "steps[0].score[0].ignore_case", "not a template"),
    (
        ("steps", 0, "score", 1, "json_schema", "description"),
        "steps[0].score[1].json_schema.description",
        "not a template",
    ),
    (("steps", 0, "score", 2, "judge"), "steps[0].score[2].judge", "not a template"),
    (("steps", 0, "score", 2, "scale"), "steps[0].score[2].scale", "not a template"),
    (("steps", 0, "score", 2, "runner"), "steps[0].score[2].runner", "`runner:` is not a"),
    (("steps", 0, "score", 2, "charged"), "steps[0].score[2].charged", "not a template"),
    (("steps", 0, "score", 3, "python"), "steps[0].score[3].python", "not a template"),
    (("steps", 0, "options", "system_prompt"), "steps[0].options.system_prompt", "not a template"),
    (("steps", 1, "exec", 2), "steps[1].exec[2]", "never templated"),
    (("steps", 1, "pass_env", 0), "steps[1].pass_env[0]", "not a template"),
    (("steps", 2, "python"), "steps[2].python", "not a template"),
    (("steps", 2, "reduce"), "steps[2].reduce", "not a template"),
    (("steps", 2, "with", "x", KEY), "steps[2].with.{{ params.topic }}", "a key is not a template"),
    (("steps", 3, "route", "cases", "ok"), "steps[3].route.cases.ok", "not a template"),
    (("steps", 3, "route", "cases", "ok", KEY), "steps[3].route.cases.{{ params.topic }}", "a key"),
    (("steps", 4, "workflow"), "steps[4].workflow", "not a template"),
]


def _with(path: tuple[Any, ...], value: str) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    *parents, last = path
    holder: Any = data
    if last == KEY:  # rename the key at the end of ``parents``
        *parents, last = parents
        for part in parents:
            holder = holder[part]
        holder[value] = holder.pop(last)
        return data
    for part in parents:
        holder = holder[part]
    holder[last] = value
    return data


def _freeze(data: dict[str, Any], *, as_json: bool = False) -> None:
    # JSON is YAML 1.2 and quotes every string (PyYAML's dumper leaves `0E0` bare, a float
    # to YAML 1.2); block YAML gives the line numbers the table checks.
    text = (
        json.dumps(data, ensure_ascii=False) if as_json else yaml.safe_dump(data, sort_keys=False)
    )
    load_workflow(
        text,
        library={"kid": KID},
        namespace={"fn": lambda x=None: x},
    )


def test_the_base_workflow_freezes_with_templates_where_they_are_read() -> None:
    _freeze(BASE)


@pytest.mark.parametrize(("path", "field", "phrase"), CASES, ids=[c[1] for c in CASES])
def test_a_template_in_a_field_that_is_not_one_is_refused_naming_the_field(
    path: tuple[Any, ...], field: str, phrase: str
) -> None:
    with pytest.raises(DefinitionError) as caught:
        _freeze(_with(path, T))
    assert caught.value.field == field
    assert caught.value.line is not None
    assert phrase in caught.value.problem


def _leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field path of the authoring models (``*`` for a list index)."""
    out: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        key = (info.alias or name,)
        nested, listed = _model_of(info.annotation)
        if nested is None:
            out.append((*prefix, *key))
        else:
            out.extend(_leaves(nested, (*prefix, *key, *(("*",) if listed else ()))))
    return out


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        found, _ = _model_of(arg)
        if found is not None:
            return found, origin is list
    return None, False


def test_every_authoring_field_is_a_template_a_model_or_a_refusing_case() -> None:
    covered = {tuple("*" if isinstance(x, int) else x for x in c[0]) for c in CASES}
    missing = []
    for leaf in _leaves(WorkflowSpec):
        if any(leaf == p[: len(leaf)] for p in (*TEMPLATE_FIELDS, *MODEL_FIELDS)):
            continue
        if not any(c[: len(leaf)] == leaf for c in covered):
            missing.append(".".join(leaf))
    assert missing == [], f"classify these fields in spec/literals.py and CASES: {missing}"


_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20)


@settings(max_examples=60, deadline=None)
@given(
    case=st.sampled_from([c for c in CASES if c[0][-1] != KEY]),
    before=_TEXT,
    marker=st.sampled_from(["{{", "{%"]),
    after=_TEXT,
)
def test_any_text_with_jinja_syntax_is_refused_in_any_literal_field(
    case: tuple[tuple[Any, ...], str, str], before: str, marker: str, after: str
) -> None:
    with pytest.raises(DefinitionError) as caught:
        _freeze(_with(case[0], before + marker + after), as_json=True)
    assert caught.value.field == case[1]


@settings(max_examples=60, deadline=None)
@given(text=_TEXT.filter(lambda t: "{{" not in t and "{%" not in t))
def test_text_without_jinja_syntax_is_kept_in_a_description(text: str) -> None:
    _freeze(_with(("description",), text), as_json=True)


@pytest.mark.parametrize(
    ("line", "field", "phrase"),
    [
        ("description: 'about {{ params.x }}'", "description", "is not a template"),
        ("runner: '{{ params.x }}'", "runner", "`runner:` is not a template"),
        (
            "runners: {openai: {base_url: 'http://{{ params.x }}/v1'}}",
            "runners.openai.base_url",
            "is a runner option, passed to the runner as written",
        ),
        (
            "runners: {llm: {options: {temperature: '{% if 1 %}0{% endif %}'}}}",
            "runners.llm.options.temperature",
            "is a runner option",
        ),
    ],
)
def test_wf_check_names_the_line_of_a_template_in_a_literal_field(
    tmp_path: Path,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    line: str,
    field: str,
    phrase: str,
) -> None:
    path = write_file(
        tmp_path,
        "bad.yaml",
        f"name: b\nparams:\n  x: {{type: string}}\n{line}\nsteps:\n  - id: a\n    prompt: hi\n",
    )
    done = wf_inproc(capsys, state_dir, "check", str(path))
    assert done.returncode == 2
    assert done.stdout.startswith(f"{path}:4: error: {field}: {phrase}")


def test_wf_check_names_the_line_of_a_model_template_reading_the_item(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_file(
        tmp_path,
        "item.yaml",
        'name: b\nsteps:\n  - id: a\n    map: "{{ [1, 2] }}"\n    prompt: "{{ item }}"\n'
        '    model: "{{ item }}"\n',
    )
    done = wf_inproc(capsys, state_dir, "check", str(path))
    assert done.returncode == 2
    assert done.stdout.startswith(f"{path}:6: error: steps[0].model: a `model:` template is")
    assert "cannot read item" in done.stdout


# (the runners: table, the path of the template it holds): templates a runner renders itself.
RUNNER_TEMPLATES_KEPT = [
    ({"scripted": {"rules": [{"match": ".", "reply": T}]}}, "rules[0].reply"),
    ({"scripted": {"replies": {"hi": T}}}, "replies.hi"),
    ({"fake": {"type": "scripted", "rules": [{"match": ".", "reply": T}]}}, "rules[0].reply"),
]
RUNNER_TEMPLATES_REFUSED = [
    # The same paths under a runner that does not render them, or a reply that is JSON.
    ({"replay": {"rules": [{"match": ".", "reply": T}]}}, "runners.replay.rules[0].reply"),
    ({"fake": {"type": "openai", "replies": {"hi": T}}}, "runners.fake.replies.hi"),
    ({"scripted": {"rules": [{"match": ".", "reply": [T]}]}}, "runners.scripted.rules[0].reply[0]"),
]


@pytest.mark.parametrize(("runners", "where"), RUNNER_TEMPLATES_KEPT)
def test_the_scripted_runners_string_replies_are_its_own_templates(
    runners: dict[str, Any], where: str
) -> None:
    data = {"name": "r", "params": {"topic": {"type": "string", "default": "owls"}}}
    data |= {
        "runners": runners,
        "runner": next(iter(runners)),
        "steps": [{"id": "a", "prompt": "hi"}],
    }
    _freeze(data)


@pytest.mark.parametrize(("runners", "field"), RUNNER_TEMPLATES_REFUSED)
def test_a_template_a_runner_does_not_render_is_refused_whatever_the_path(
    runners: dict[str, Any], field: str
) -> None:
    data = {"name": "r", "params": {"topic": {"type": "string", "default": "owls"}}}
    data |= {"runners": runners, "steps": [{"id": "a", "prompt": "hi"}]}
    with pytest.raises(DefinitionError) as caught:
        _freeze(data)
    assert caught.value.field == field
    assert "is a runner option, passed to the runner as written" in caught.value.problem
