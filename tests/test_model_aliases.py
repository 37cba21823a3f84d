"""Model aliases: `models:` and models.yaml files resolve an alias per runner at freeze time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wf_magic import Engine
from wf_magic.errors import DefinitionError, UsageError

from .conftest import table_counts, wf_inproc, write_file

TWO_STEPS = """
name: aliased
runners:
  local: {type: scripted}
steps:
  - id: first
    prompt: one
    model: fast
  - id: second
    prompt: "two {{ steps.first.output }}"
    runner: local
    model: fast
"""


def _models(engine: Engine, run_id: str) -> dict[str, str | None]:
    return {a.step_id: a.model for a in engine.attempts(run_id) if a.phase == "work"}


def _plan(engine: Engine, run_id: str) -> dict[str, object]:
    plan: dict[str, object] = json.loads(engine.get_run(run_id).plan_json)
    return plan


def test_an_alias_resolves_per_runner_name_then_type_then_default(engine: Engine) -> None:
    source = TWO_STEPS.replace(
        "steps:",
        "models:\n  fast: {local: by-name, scripted: by-type, default: any}\n"
        "  plain: everywhere\nsteps:",
        1,
    )
    source += "  - id: third\n    prompt: three\n    runner: other\n    model: fast\n"
    source += "  - id: fourth\n    prompt: four\n    model: plain\n"
    source = source.replace(
        "  local: {type: scripted}", "  local: {type: scripted}\n  other: {type: replay}"
    )
    wf = engine.load(source)
    assert [(s.model, s.model_alias) for s in wf.plan.steps] == [
        ("by-type", "fast"),
        ("by-name", "fast"),
        ("any", "fast"),
        ("everywhere", "plain"),
    ]


def test_an_alias_is_recorded_in_the_plan_and_the_id_is_journaled(engine: Engine) -> None:
    source = TWO_STEPS.replace("steps:", "models:\n  fast: tiny-1\nsteps:", 1)
    run = engine.run(source)
    assert run.status == "completed"
    assert _models(engine, run.run_id) == {"first": "tiny-1", "second": "tiny-1"}
    steps = _plan(engine, run.run_id)["steps"]
    assert isinstance(steps, list)
    assert [(s["model"], s["model_alias"]) for s in steps] == [("tiny-1", "fast")] * 2


def test_an_unknown_alias_is_an_exact_model_id(engine: Engine) -> None:
    run = engine.run(TWO_STEPS)
    assert _models(engine, run.run_id) == {"first": "fast", "second": "fast"}
    steps = _plan(engine, run.run_id)["steps"]
    assert isinstance(steps, list) and all("model_alias" not in s for s in steps)


def test_a_gate_model_alias_resolves_for_the_judge_runner(engine: Engine) -> None:
    source = (
        "name: g\nmodels:\n  judge: {scripted: careful-1}\nsteps:\n  - id: a\n    prompt: hi\n"
        "    gate: {judge: llm, model: judge, criteria: [short]}\n"
    )
    run = engine.run(source)
    judged = [a.model for a in engine.attempts(run.run_id) if a.phase == "gate"]
    assert judged == ["careful-1"]
    gate = engine.load(source).plan.steps[0].gate
    assert gate is not None and (gate.model, gate.model_alias) == ("careful-1", "judge")


PRECEDENCE = [
    # (workflow models:, beside file, state dir file, $WF_MAGIC_HOME file, expected id)
    ("m-workflow", "m-beside", "m-state", "m-env", "m-workflow"),
    (None, "m-beside", "m-state", "m-env", "m-beside"),
    (None, None, "m-state", "m-env", "m-state"),
    (None, None, None, "m-env", "m-env"),
    (None, None, None, None, "fast"),
]


@pytest.mark.parametrize(("in_workflow", "beside", "state", "env_home", "expected"), PRECEDENCE)
def test_the_workflow_wins_over_the_beside_file_over_the_state_dir_over_home(
    tmp_path: Path,
    state_dir: Path,
    in_workflow: str | None,
    beside: str | None,
    state: str | None,
    env_home: str | None,
    expected: str,
) -> None:
    folder = tmp_path / "flows"
    folder.mkdir()
    source = TWO_STEPS
    if in_workflow:
        source = source.replace("steps:", f"models:\n  fast: {in_workflow}\nsteps:", 1)
    path = write_file(folder, "flow.yaml", source)
    for where, model in ((folder, beside), (state_dir, state), (tmp_path / "home", env_home)):
        if model:
            where.mkdir(parents=True, exist_ok=True)
            write_file(where, "models.yaml", f"fast: {model}\nother: unused\n")
    with Engine(state_dir) as engine:
        wf = engine.load(path)
    assert [s.model for s in wf.plan.steps] == [expected, expected]


def test_a_higher_source_replaces_a_whole_alias_entry(tmp_path: Path, state_dir: Path) -> None:
    state_dir.mkdir(parents=True)
    write_file(state_dir, "models.yaml", "fast: {local: home-local, default: home-any}\n")
    source = TWO_STEPS.replace("steps:", "models:\n  fast: {replay: wf-replay}\nsteps:", 1)
    with Engine(state_dir) as engine, pytest.raises(DefinitionError) as caught:
        engine.load(source)
    assert caught.value.field == "steps[0].model"
    assert "names no model for runner 'scripted' (it names: replay)" in caught.value.problem


BAD_TABLES = [
    ("fast: ''", "fast", "empty string"),
    ("fast: {}", "fast", "non-empty mapping"),
    ("fast: [a, b]", "fast", "non-empty mapping"),
    ("fast: {openai: 3}", "fast.openai", "expected a model id (got int)"),
    ("fast: {openai: a, scripted: '{{ params.x }}'}", "fast.scripted", "not a template"),
    ("'two words ': x", "two words ", "alias name"),
    ("[a, b]", "(top level)", "mapping of alias"),
]


@pytest.mark.parametrize(("text", "field", "problem"), BAD_TABLES)
def test_a_bad_models_yaml_names_its_file_line_and_field(
    tmp_path: Path, state_dir: Path, text: str, field: str, problem: str
) -> None:
    path = write_file(tmp_path, "flow.yaml", TWO_STEPS)
    aliases = write_file(tmp_path, "models.yaml", f"# aliases\n{text}\n")
    with Engine(state_dir) as engine, pytest.raises(DefinitionError) as caught:
        engine.load(path)
    assert caught.value.source_name == str(aliases)
    assert caught.value.field == field.strip()  # messages name a field without its spaces
    assert caught.value.line == 2
    assert problem in caught.value.problem
    assert not (state_dir / "state.db").exists() or table_counts(state_dir)["runs"] == 0


@pytest.mark.parametrize(("text", "field", "problem"), BAD_TABLES[:-1])
def test_a_bad_models_table_in_the_workflow_names_its_line(
    engine: Engine, text: str, field: str, problem: str
) -> None:
    source = TWO_STEPS.replace("steps:", f"models:\n  {text}\nsteps:", 1)
    with pytest.raises(DefinitionError) as caught:
        engine.load(source)
    assert caught.value.field == f"models.{field}".strip()
    assert caught.value.line == 6


def test_an_alias_without_this_runner_or_a_default_is_a_definition_error(engine: Engine) -> None:
    source = TWO_STEPS.replace("steps:", "models:\n  fast: {openai: gpt-4o-mini}\nsteps:", 1)
    with pytest.raises(DefinitionError) as caught:
        engine.load(source)
    assert (caught.value.field, caught.value.line) == ("steps[0].model", 10)
    assert "add `scripted: MODEL` or `default: MODEL`" in caught.value.problem


def test_a_templated_model_may_name_an_alias(engine: Engine) -> None:
    source = (
        "name: t\nparams:\n  tier: {type: string, default: fast}\n"
        "models:\n  fast: {default: quick-3}\n  slow: {default: deep-9}\n"
        'steps:\n  - id: a\n    prompt: hi\n    model: "{{ params.tier }}"\n'
    )
    fast, slow, exact = (
        engine.run(source, params=p) for p in ({}, {"tier": "slow"}, {"tier": "gpt-x"})
    )
    assert [_models(engine, r.run_id)["a"] for r in (fast, slow, exact)] == [
        "quick-3",
        "deep-9",
        "gpt-x",
    ]
    stored = _plan(engine, slow.run_id)
    assert "aliases" not in stored  # the run's plan records what it uses, not the table
    steps = stored["steps"]
    assert isinstance(steps, list)
    assert (steps[0]["model"], steps[0]["model_alias"]) == ("deep-9", "slow")
    assert steps[0]["model_template"] == "{{ params.tier }}"


def test_a_templated_alias_without_this_runner_fails_the_start(engine: Engine) -> None:
    source = (
        "name: t\nparams:\n  tier: {type: string}\nmodels:\n  fast: {openai: o}\n"
        'steps:\n  - id: a\n    prompt: hi\n    model: "{{ params.tier }}"\n'
    )
    with pytest.raises(UsageError, match=r"steps\.a\.model: model alias 'fast' names no model"):
        engine.start(source, params={"tier": "fast"})


def test_a_changed_alias_file_changes_a_new_runs_plan_not_an_existing_runs(
    tmp_path: Path, state_dir: Path
) -> None:
    aliases = write_file(tmp_path, "models.yaml", "fast: before-1\n")
    path = write_file(tmp_path, "flow.yaml", TWO_STEPS)
    with Engine(state_dir) as engine:
        first = engine.run(path, max_steps=1)
        assert first.status == "active"
        frozen = engine.get_run(first.run_id).plan_hash
        aliases.write_text("fast: after-2\n", encoding="utf-8")
        resumed = engine.resume(first.run_id)
        assert resumed.status == "completed"
        assert engine.get_run(first.run_id).plan_hash == frozen
        assert _models(engine, first.run_id) == {"first": "before-1", "second": "before-1"}
        second = engine.run(path, new=True)
        assert engine.get_run(second.run_id).plan_hash != frozen
        assert _models(engine, second.run_id) == {"first": "after-2", "second": "after-2"}


def test_an_unchanged_source_with_a_changed_alias_file_starts_a_new_run(
    tmp_path: Path, state_dir: Path
) -> None:
    aliases = write_file(tmp_path, "models.yaml", "fast: before-1\n")
    path = write_file(tmp_path, "flow.yaml", TWO_STEPS)
    with Engine(state_dir) as engine:
        first = engine.run(path, max_steps=1)
        again = engine.start(path)
        assert again.run_id == first.run_id and again.created is False
        aliases.write_text("fast: after-2\n", encoding="utf-8")
        changed = engine.start(path)
        assert changed.created is True
        assert engine.get_run(first.run_id).status == "abandoned"
        assert engine.get_run(first.run_id).status_reason == f"superseded by {changed.run_id}"


def test_a_dry_run_shows_each_alias_and_its_id(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_file(tmp_path, "models.yaml", "fast: {local: near-1, default: far-2}\n")
    path = write_file(tmp_path, "flow.yaml", TWO_STEPS)
    shown = wf_inproc(capsys, state_dir, "run", str(path), "--dry-run")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(
        line.split()[0] == "first" and "model: far-2 (alias fast)" in line for line in lines[1:]
    )
    assert any(
        line.split()[0] == "second" and "model: near-1 (alias fast)" in line for line in lines[1:]
    )
    assert not (state_dir / "state.db").exists() or table_counts(state_dir)["runs"] == 0


def test_a_workflow_file_named_models_yaml_is_not_read_as_aliases(
    tmp_path: Path, state_dir: Path
) -> None:
    path = write_file(tmp_path, "models.yaml", TWO_STEPS)
    with Engine(state_dir) as engine:
        assert [s.model for s in engine.load(path).plan.steps] == ["fast", "fast"]


def test_a_cell_dry_run_shows_the_alias_resolution_and_the_rendered_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers_notebook import cell, ipython_shell, magics_in

    state = tmp_path / "cellstate"
    state.mkdir()
    write_file(state, "models.yaml", "fast: {default: quick-3}\n")
    body = (
        "name: celled\nparams:\n  tier: {type: string, default: slow}\n"
        "steps:\n  - id: a\n    prompt: hi\n    model: fast\n"
        '  - id: b\n    prompt: ho\n    model: "{{ params.tier }}"\n'
    )
    shells = ipython_shell()
    shell = next(shells)
    try:
        with magics_in(shell, state) as magics:
            assert cell(shell, "--dry-run --param tier=fast", body) is None
            out = capsys.readouterr().out
            assert "model: quick-3 (alias fast)" in out
            assert "model: quick-3 (from {{ params.tier }}, alias fast)" in out
            assert magics.engine.list_runs() == []
    finally:
        next(shells, None)


def test_the_readme_models_example_runs_offline_as_a_sweep(engine: Engine) -> None:
    from .conftest import ROOT

    section = (ROOT / "README.md").read_text().split("### Models: params templates and aliases")[1]
    source = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    fast, exact = (engine.run(source, params=p) for p in ({}, {"model": "gpt-4o"}))
    assert [r.status for r in (fast, exact)] == ["completed", "completed"]
    assert [_models(engine, r.run_id)["ask"] for r in (fast, exact)] == ["scripted-1", "gpt-4o"]
    judged = [a.model for a in engine.attempts(fast.run_id) if a.phase == "gate"]
    assert judged == ["o3-mini"]
