"""Runner settings in the reuse identity (issue 22, item 5): answer-changing options are hashed,
the others are not, and a re-run after a settings change re-dispatches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic import Engine, load_workflow, register_runner
from wf_magic.drive.units import StepOutputs, build_units
from wf_magic.hashing import canonical_json
from wf_magic.runners.identity import answer_options, runner_identity
from wf_magic.runners.registry import _factories
from wf_magic.runners.scripted import ScriptedRunner
from wf_magic.spec.plan import Plan

from .openai_server import FakeChatServer, isolate_openai_env

KEY_ENV = "WF_TEST_IDENTITY_KEY"

# The split each built-in runner documents in docs/runners.md, written out independently of
# the runners' own declarations: the test fails if a declaration drifts from the docs.
DOCUMENTED: dict[str, tuple[set[str], set[str]]] = {
    "openai": (
        {"model", "base_url", "json_mode"},
        {"api_key_env", "timeout_s", "prices", "local", "max_tokens_param"},
    ),
    "scripted": ({"rules", "replies", "model"}, {"prices", "local"}),
    "replay": (set(), {"cassette", "journal", "prices", "local"}),
    "exec": (set(), {"output_cap"}),
    "pydantic-ai": (
        {"model", "base_url", "system_prompt", "settings", "temperature", "top_p", "seed"},
        {"timeout_s", "api_key_env", "prices", "local"},
    ),
    "llm": ({"model", "system", "options"}, {"timeout_s", "api_key_env", "prices", "local"}),
}

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(["a", "b", "http://127.0.0.1:1/v1"]),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 2), max_size=2),
)


def _prompt_plan(runner: str, runners: dict[str, dict[str, Any]]) -> Plan:
    base = load_workflow("name: ident\nsteps:\n  - id: a\n    prompt: Say hi.\n").plan
    step = base.steps[0].model_copy(update={"runner": runner})
    return base.model_copy(update={"runners": runners, "steps": [step], "runner": runner})


def unit_hash(runner: str, options: dict[str, Any]) -> str:
    """The input hash of a prompt unit on runner ``runner`` configured with ``options``."""
    plan = _prompt_plan(runner, {runner: options} if options else {})
    units = build_units(
        plan, plan.steps[0], params={}, outputs=StepOutputs(), loop=1, feedback=None
    )
    return units[0].input_hash


@pytest.mark.parametrize("kind", sorted(DOCUMENTED))
def test_each_runner_declares_the_documented_split(kind: str) -> None:
    answer, other = DOCUMENTED[kind]
    options = {name: f"v-{name}" for name in answer | other}
    assert set(answer_options(kind, options)) == answer


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from(sorted(DOCUMENTED)),
    data=st.data(),
)
def test_equal_hash_iff_equal_answer_relevant_options(kind: str, data: st.DataObject) -> None:
    answer, other = DOCUMENTED[kind]
    names = sorted(answer | other)
    options = st.dictionaries(st.sampled_from(names), VALUES, max_size=len(names))
    first, second = data.draw(options), data.draw(options)

    def relevant(opts: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in opts.items() if k in answer}

    # JSON equality, not Python's (False == 0 there, not in a plan).
    same_answers = canonical_json(relevant(first)) == canonical_json(relevant(second))
    assert (unit_hash(kind, first) == unit_hash(kind, second)) is same_answers


def test_a_runner_without_answer_options_keeps_the_old_hash() -> None:
    # Journals recorded before settings were hashed keep their reuse.
    assert unit_hash("openai", {"timeout_s": 5, "api_key_env": "K"}) == unit_hash("openai", {})
    assert runner_identity({"openai": {"timeout_s": 5}}, "openai") == {}


def test_a_named_instance_hashes_its_type_with_its_options() -> None:
    local = runner_identity({"local": {"type": "openai", "model": "m", "timeout_s": 3}}, "local")
    assert local == {"type": "openai", "model": "m"}


def test_a_plugin_without_a_declared_split_hashes_every_option() -> None:
    register_runner("ident-plugin", lambda ctx: ScriptedRunner(), replace=True)
    try:
        assert answer_options("ident-plugin", {"a": 1, "b": 2}) == {"a": 1, "b": 2}

        def declared(ctx: Any) -> ScriptedRunner:
            return ScriptedRunner()

        declared.answer_options = ("a",)  # type: ignore[attr-defined]
        register_runner("ident-plugin", declared, replace=True)
        assert answer_options("ident-plugin", {"a": 1, "b": 2}) == {"a": 1}
    finally:
        _factories.pop("ident-plugin", None)


# -- a re-run after a settings change -----------------------------------------------------------
SCRIPTED = """
name: verdicts
runner: scripted
runners:
  scripted:
    rules:
      - {{match: "(?s)^Judge", reply: {{complete: {verdict}, feedback: "no", missing: []}}}}
      - {{match: "^Write", reply: "{reply}"}}
steps:
  - id: draft
    prompt: Write a line.
    gate: {{criteria: [short], max_loops: 1}}
"""


def statuses(engine: Engine, run_id: str) -> dict[str, str]:
    return {f"{a.phase}:{a.unit_id}": a.status for a in engine.attempts(run_id)}


def test_fixing_a_scripted_rule_re_dispatches_the_work_and_re_judges(engine: Engine) -> None:
    first = engine.run(SCRIPTED.format(verdict="false", reply="one"))
    assert first.status == "blocked"  # the gate exhausted its loops
    fixed = engine.run(SCRIPTED.format(verdict="true", reply="one"), new=True)
    # The judge's rule changed: both the work (same runner) and the verdict are fresh.
    assert fixed.status == "completed", fixed.reason
    assert set(statuses(engine, fixed.run_id).values()) == {"succeeded"}
    again = engine.run(SCRIPTED.format(verdict="true", reply="one"), new=True)
    assert set(statuses(engine, again.run_id).values()) == {"reused"}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeChatServer]:
    isolate_openai_env(monkeypatch, KEY_ENV, "identity-key")
    with FakeChatServer() as running:
        yield running


def openai_source(url: str, options: str) -> str:
    return (
        "name: tuned\nrunner: openai\n"
        f"runners: {{openai: {{base_url: '{url}', api_key_env: {KEY_ENV}{options}}}}}\n"
        "steps:\n  - id: a\n    model: m1\n    prompt: Say hi.\n"
    )


@pytest.mark.parametrize(
    ("change", "dispatched"),
    [
        (", timeout_s: 7", False),
        (", prices: {m1: {input_per_mtok: 1, output_per_mtok: 2}}", False),
        (", max_tokens_param: max_completion_tokens", False),
        (", json_mode: false", True),
        (", model: other", True),
    ],
)
def test_an_openai_settings_change_re_dispatches_only_when_it_can_change_the_answer(
    state_dir: Path, server: FakeChatServer, change: str, dispatched: bool
) -> None:
    with Engine(state_dir) as engine:
        first = engine.run(openai_source(server.url, ""))
        assert first.status == "completed", first.reason
        second = engine.run(openai_source(server.url, change), new=True)
        assert second.status == "completed", second.reason
        assert [a.status for a in engine.attempts(second.run_id)] == [
            "succeeded" if dispatched else "reused"
        ]
    assert len(server.requests) == (2 if dispatched else 1)


def test_another_base_url_re_dispatches(state_dir: Path, server: FakeChatServer) -> None:
    with FakeChatServer() as other, Engine(state_dir) as engine:
        engine.run(openai_source(server.url, ""))
        second = engine.run(openai_source(other.url, ""), new=True)
        assert [a.status for a in engine.attempts(second.run_id)] == ["succeeded"]
        assert (len(server.requests), len(other.requests)) == (1, 1)
