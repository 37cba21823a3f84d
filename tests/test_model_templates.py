"""`model:` templated from params: rendered once per run at start, frozen into that run's plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wf_magic import Engine
from wf_magic.errors import DefinitionError, UsageError
from wf_magic.spec.freeze import load_workflow

from .conftest import table_counts, wf_inproc, write_file
from .helpers_flow import children_of

SWEEP = """
name: sweep
params:
  model: {type: string, default: small-1}
  topic: {type: string, default: owls}
steps:
  - id: ask
    prompt: "Say something about {{ params.topic }}"
    model: "{{ params.model }}"
  - id: check
    prompt: "Check: {{ steps.ask.output }}"
    gate: {judge: llm, model: "{{ params.model }}-judge", criteria: [short]}
"""


def _work(engine: Engine, run_id: str) -> list[tuple[str, str | None, str]]:
    return [
        (a.step_id, a.model, a.input_hash) for a in engine.attempts(run_id) if a.phase == "work"
    ]


def test_a_sweep_over_two_models_journals_two_models_two_input_hashes_two_plans(
    engine: Engine,
) -> None:
    runs = [engine.run(SWEEP, params={"model": m}) for m in ("small-1", "large-2")]
    assert [r.status for r in runs] == ["completed", "completed"]
    (ask_a, _, hash_a), (ask_b, _, hash_b) = (
        next(w for w in _work(engine, r.run_id) if w[0] == "ask") for r in runs
    )
    models = [next(w[1] for w in _work(engine, r.run_id) if w[0] == "ask") for r in runs]
    assert models == ["small-1", "large-2"]
    assert hash_a != hash_b
    rows = [engine.get_run(r.run_id) for r in runs]
    assert rows[0].plan_hash != rows[1].plan_hash
    plans = [json.loads(row.plan_json) for row in rows]
    assert [p["steps"][0]["model"] for p in plans] == ["small-1", "large-2"]
    assert all(p["steps"][0]["model_template"] == "{{ params.model }}" for p in plans)
    assert [p["steps"][1]["gate"]["model"] for p in plans] == ["small-1-judge", "large-2-judge"]
    judges = [a.model for r in runs for a in engine.attempts(r.run_id) if a.phase == "gate"]
    assert judges == ["small-1-judge", "large-2-judge"]


def test_the_cli_sweep_journals_the_rendered_model(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_file(tmp_path, "sweep.yaml", SWEEP)
    for model in ("small-1", "large-2"):
        done = wf_inproc(capsys, state_dir, "run", str(path), "--param", f"model={model}")
        assert done.returncode == 0, done.stderr
    with Engine(state_dir) as engine:
        models = sorted(
            a.model or ""
            for r in engine.list_runs()
            for a in engine.attempts(r.run_id)
            if a.step_id == "ask"
        )
    assert models == ["large-2", "small-1"]


def test_the_same_params_give_the_same_plan_and_resume_the_same_run(engine: Engine) -> None:
    first = engine.start(SWEEP, params={"model": "m-1"})
    again = engine.start(SWEEP, params={"model": "m-1"})
    other = engine.start(SWEEP, params={"model": "m-2"})
    assert again.run_id == first.run_id and again.created is False
    assert other.run_id != first.run_id
    rows = [engine.get_run(r.run_id) for r in (first, other)]
    assert rows[0].plan_hash != rows[1].plan_hash
    # the default renders too: a start without the param is the default's plan
    default = engine.start(SWEEP)
    assert json.loads(engine.get_run(default.run_id).plan_json)["steps"][0]["model"] == "small-1"


def test_an_unrendered_plan_keeps_the_template_and_no_id() -> None:
    wf = load_workflow(SWEEP)
    step = wf.plan.steps[0]
    assert step.model is None and step.model_template == "{{ params.model }}"


def test_a_plan_without_model_features_keeps_its_json_shape() -> None:
    wf = load_workflow(
        "name: plain\nsteps:\n  - id: a\n    prompt: hi\n    model: m\n"
        "    gate: {judge: llm, model: j}\n"
    )
    data = json.loads(wf.plan_json)
    assert "aliases" not in data
    assert {"model_alias", "model_template"}.isdisjoint(data["steps"][0])
    assert {"model_alias", "model_template"}.isdisjoint(data["steps"][0]["gate"])
    assert data["steps"][0]["model"] == "m"


BAD_TEMPLATES = [
    ("{{ item }}", "cannot read item"),
    ("{{ index }}", "cannot read index"),
    ("{{ steps.first.output }}", "cannot read steps"),
    ("{{ gate.feedback }}", "cannot read gate"),
    ("{{ output }}", "cannot read output"),
    ("{{ params.nope }}", "undeclared param 'nope'"),
    ("{{ params.api_key }}", "secret param 'api_key'"),
    ("{{ params['mo' ~ 'del'] }}", "must name each param"),
    ("{{ params.model ", "invalid template"),
    ("{% if params.model %}x{% endif %}{{ item }}", "cannot read item"),
]


@pytest.mark.parametrize(("template", "problem"), BAD_TEMPLATES)
def test_a_model_template_reading_more_than_params_is_a_definition_error(
    template: str, problem: str
) -> None:
    source = (
        "name: bad\nparams:\n  model: {type: string}\n  api_key: {type: string}\n"
        "steps:\n  - id: first\n    prompt: hi\n  - id: fan\n"
        "    map: \"{{ ['a', 'b'] }}\"\n"
        f'    prompt: "{{{{ item }}}}"\n    model: {json.dumps(template)}\n'
    )
    with pytest.raises(DefinitionError) as caught:
        load_workflow(source)
    assert caught.value.field == "steps[1].model"
    assert caught.value.line == 11
    assert problem in caught.value.problem


def test_a_gate_model_template_reading_the_item_names_the_gate_field() -> None:
    source = (
        'name: bad\nsteps:\n  - id: fan\n    map: "{{ [1] }}"\n    prompt: "{{ item }}"\n'
        '    gate: {judge: llm, model: "{{ item }}"}\n'
    )
    with pytest.raises(DefinitionError) as caught:
        load_workflow(source)
    assert (caught.value.field, caught.value.line) == ("steps[0].gate.model", 6)


@pytest.mark.parametrize(
    ("value", "problem"),
    [("", "empty string"), ("two\nlines", "on one line"), ("x" * 201, "at most 200")],
)
def test_a_param_rendering_an_unusable_model_is_refused_before_anything_is_written(
    engine: Engine, state_dir: Path, value: str, problem: str
) -> None:
    with pytest.raises(UsageError) as caught:
        engine.start(SWEEP, params={"model": value})
    assert "steps.ask.model" in str(caught.value) and problem in str(caught.value)
    assert not (state_dir / "state.db").exists() or table_counts(state_dir)["runs"] == 0


def test_a_model_rendered_from_a_param_holding_a_secret_is_refused(engine: Engine) -> None:
    source = (
        "name: nested\nparams:\n  cfg: {type: object}\nsteps:\n"
        '  - id: a\n    prompt: hi\n    model: "{{ params.cfg }}"\n'
    )
    with pytest.raises(UsageError) as caught:
        engine.start(source, params={"cfg": {"api_key": "hunter2-hunter2"}})
    assert "renders a secret" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_a_child_workflow_renders_its_model_from_the_params_its_parent_binds(
    engine: Engine,
) -> None:
    source = """
name: parent
params:
  size: {type: integer, default: 7}
steps:
  - id: pick
    prompt: pick
  - id: call
    workflow: kid
    with: {model: "child-{{ params.size }}-{{ steps.pick.output | length > 0 }}"}
---
name: kid
params:
  model: {type: string}
steps:
  - id: ask
    prompt: hello
    model: "{{ params.model }}"
"""
    run = engine.run(source)
    assert run.status == "completed"
    (child,) = children_of(engine, run.run_id)
    asked = [a.model for a in engine.attempts(child) if a.step_id == "ask"]
    assert asked == ["child-7-True"]
    assert json.loads(engine.get_run(child).plan_json)["steps"][0]["model"] == asked[0]


def test_a_dry_run_renders_the_model_from_the_given_params(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_file(tmp_path, "sweep.yaml", SWEEP)
    given = wf_inproc(capsys, state_dir, "run", str(path), "--dry-run", "--param", "model=big-9")
    assert given.returncode == 0, given.stderr
    assert "model: big-9 (from {{ params.model }})" in given.stdout
    defaulted = wf_inproc(capsys, state_dir, "run", str(path), "--dry-run")
    assert "model: small-1 (from {{ params.model }})" in defaulted.stdout
    bad = wf_inproc(capsys, state_dir, "run", str(path), "--dry-run", "--param", "nope=1")
    assert bad.returncode == 2
    assert not (state_dir / "state.db").exists() or table_counts(state_dir)["runs"] == 0


def test_a_dry_run_without_the_required_param_shows_the_pending_template(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_file(
        tmp_path,
        "req.yaml",
        "name: req\nparams:\n  model: {type: string}\nsteps:\n"
        '  - id: a\n    prompt: hi\n    model: "{{ params.model }}"\n',
    )
    shown = wf_inproc(capsys, state_dir, "run", str(path), "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "model: {{ params.model }} (rendered from params at run start)" in shown.stdout


def test_a_previewed_workflow_cannot_be_started_with_other_params(engine: Engine) -> None:
    shown = engine.preview(SWEEP, params={"model": "m-1"})
    assert shown.plan.steps[0].model == "m-1"
    with pytest.raises(UsageError, match="already rendered for some params"):
        engine.start(shown, params={"model": "m-2"})
    assert engine.list_runs() == []
