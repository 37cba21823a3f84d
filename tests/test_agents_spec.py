"""Agent steps (issue 21): the YAML keys, their errors, the input hash, reuse, registered harnesses."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import wf_magic
from tests.agent_fakes.bins import git_repo, make_bins
from tests.test_agents import work, workflow
from wf_magic import DefinitionError, Engine, UsageError
from wf_magic.agents.harness import AgentCall, Outcome, Watch
from wf_magic.drive.units import build_units


def _load(text: str) -> Any:
    return wf_magic.load_workflow(text)


STEP = "name: a\nsteps:\n  - id: fix\n    agent: claude\n    prompt: Fix it.\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("    agent: nope\n", "unknown agent harness 'nope'"),
        ("    permission: write\n", "permission"),
        ("    isolation: docker\n", "isolation"),
        ("    session: resume\n", "session"),
        ("    max_turns: 0\n", "max_turns"),
        ("    timeout: 30 minutes\n", "expected seconds or a duration like 90s, 30m or 2h"),
        ("    workdir: ../elsewhere\n", "expected a relative folder inside the workflow's folder"),
        ("    workdir: /etc\n", "expected a relative folder inside the workflow's folder"),
        ("    pass_env: [WF_RUN_ID]\n", "not starting with WF_"),
    ],
)
def test_bad_agent_keys_are_one_line_errors_naming_the_field(extra: str, message: str) -> None:
    text = STEP.replace("    agent: claude\n", "") if extra.startswith("    agent:") else STEP
    with pytest.raises(DefinitionError) as caught:
        _load(
            text + extra
            if not extra.startswith("    agent:")
            else text.replace("    prompt:", extra + "    prompt:")
        )
    assert message in str(caught.value)
    assert "line" in str(caught.value)


@pytest.mark.parametrize(
    "key",
    ["permission: read", "isolation: worktree", "session: continue", "workdir: .", "max_turns: 3"],
)
def test_agent_only_keys_are_refused_on_other_kinds(key: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        _load(f"name: a\nsteps:\n  - id: p\n    prompt: hi\n    {key}\n")
    assert f"`{key.split(':')[0]}:` is read only by agent steps (this is a prompt step)" in str(
        caught.value
    )


def test_an_agent_step_needs_a_prompt() -> None:
    with pytest.raises(DefinitionError) as caught:
        _load("name: a\nsteps:\n  - id: fix\n    agent: claude\n")
    assert "an agent step needs `prompt:`" in str(caught.value)


def test_the_frozen_agent_step_has_its_defaults_and_durations_parse() -> None:
    step = _load(STEP + "    timeout: 45m\n").plan.steps[0]
    assert (step.kind, step.runner, step.timeout_s, step.cache) == (
        "agent",
        "claude",
        2700.0,
        False,
    )
    assert step.agent.model_dump() == {
        "harness": "claude", "permission": "edits", "workdir": ".", "isolation": "none",
        "session": "fresh", "max_turns": None, "bridge": None,
    }  # fmt: skip
    assert step.max_loops == 1 and not step.loops_capped
    gated = _load(STEP + "    gate: {judge: expr, check: 'true', max_loops: 3}\n").plan.steps[0]
    assert (gated.max_loops, gated.loops_capped) == (3, False)  # agent steps read feedback


def test_runner_settings_of_a_harness_are_checked_at_freeze_time() -> None:
    with pytest.raises(DefinitionError) as caught:
        _load(STEP + "runners:\n  claude: {bin: claude, homes: user}\n")
    assert "unknown option(s) ['homes'] for harness 'claude'" in str(caught.value)
    with pytest.raises(DefinitionError) as caught:
        _load(STEP + "runners:\n  claude: {home: shared}\n")
    assert "home: expected isolated or user (got 'shared')" in str(caught.value)


def _input(text: str, **kw: Any) -> dict[str, Any]:
    plan = _load(text).plan
    [unit] = build_units(plan, plan.steps[0], params={}, outputs={}, loop=1, feedback=None, **kw)
    return unit.input


@pytest.mark.parametrize(
    "change",
    [
        ("Fix it.", "Fix that."),
        ("    agent: claude\n", "    agent: codex\n"),
        ("    prompt: Fix it.\n", "    prompt: Fix it.\n    permission: full\n"),
        ("    prompt: Fix it.\n", "    prompt: Fix it.\n    isolation: worktree\n"),
        ("    prompt: Fix it.\n", "    prompt: Fix it.\n    workdir: src\n"),
        ("    prompt: Fix it.\n", "    prompt: Fix it.\n    session: continue\n"),
        ("    prompt: Fix it.\n", "    prompt: Fix it.\n    model: claude-sonnet-4-5\n"),
        ("    prompt: Fix it.\n", "    prompt: Fix it.\n    output: {type: object}\n"),
    ],
)
def test_the_input_hash_covers_each_agent_setting(change: tuple[str, str]) -> None:
    plan = _load(STEP).plan
    [unit] = build_units(plan, plan.steps[0], params={}, outputs={}, loop=1, feedback=None)
    other_plan = _load(STEP.replace(*change)).plan
    [other] = build_units(
        other_plan, other_plan.steps[0], params={}, outputs={}, loop=1, feedback=None
    )
    assert unit.input_hash != other.input_hash
    assert "session_id" not in json.dumps(unit.input)


def test_agent_units_are_not_reused_across_runs_unless_cache_true(
    engine: Engine, tmp_path: Path
) -> None:
    bins = make_bins(tmp_path / "bin")
    repo = git_repo(tmp_path / "repo")
    path = workflow(repo, bins, "claude", "Say hello.")
    first, second = engine.run(str(path)), engine.run(str(path), new=True)
    assert [a.status for a in work(engine, second.run_id)] == ["succeeded"]
    assert work(engine, first.run_id)[0].input_hash == work(engine, second.run_id)[0].input_hash
    cached = workflow(repo, bins, "claude", "Say hello.", extra="cache: true")
    engine.run(str(cached))
    third = engine.run(str(cached), new=True)
    assert [a.status for a in work(engine, third.run_id)] == ["reused"]


class _EchoHarness:
    """A minimal registered harness: ``sh -c 'printf …'`` printing one JSON result line."""

    name = "echo"
    default_bin = "sh"
    presets_session = False
    resumes_anywhere = True

    def argv(self, call: AgentCall) -> list[str]:
        reply = json.dumps({"text": call.prompt.upper(), "session": "echo-1"})
        return ["-c", f"printf '%s\\n' '{reply}'"]

    def quiet_env(self, call: AgentCall) -> dict[str, str]:
        return {}

    def watch(self, event: Mapping[str, Any], seen: Watch) -> None:
        seen.session_id = event.get("session")

    def outcome(
        self,
        events: Sequence[Mapping[str, Any]],
        stdout: str,
        stderr: str,
        code: int,
        call: AgentCall,
    ) -> Outcome:
        return Outcome(text=events[-1]["text"], session_id=events[-1]["session"], tokens_in=3)


def test_a_registered_harness_runs_agent_steps(engine: Engine, tmp_path: Path) -> None:
    wf_magic.register_harness("echo", _EchoHarness(), replace=True)
    with pytest.raises(UsageError, match="already registered"):
        wf_magic.register_harness("echo", _EchoHarness())
    with pytest.raises(UsageError, match="lacks argv, quiet_env, watch, outcome"):
        wf_magic.register_harness("broken", object())  # type: ignore[arg-type]
    path = tmp_path / "echo.yaml"
    path.write_text("name: e\nsteps:\n  - id: s\n    agent: echo\n    prompt: shout\n")
    run = engine.run(str(path))
    assert run.result == "SHOUT"
    [attempt] = work(engine, run.run_id)
    assert (attempt.session_id, attempt.tokens_in, attempt.runner) == ("echo-1", 3, "echo")


@pytest.mark.parametrize(
    ("text", "objects"),
    [
        ('{"a": 1}\n{"b": 2}\n', [{"a": 1}, {"b": 2}]),  # JSONL
        ('{\n  "c": {\n    "d": 3\n  }\n}\n', [{"c": {"d": 3}}]),  # one pretty-printed object
        (
            'Warning: x\n  at f (file.js:1)\n{\n "error": {"code": 401}\n}\n',
            [{"error": {"code": 401}}],
        ),  # Gemini's stderr: notices, a stack, then the object
        ('{broken\n{"e": 5}', [{"e": 5}]),
        ('[1, 2]\n"text"\n', []),
        ("", []),
    ],
)
def test_json_objects_are_read_from_jsonl_or_pretty_printed_output(
    text: str, objects: list[dict[str, Any]]
) -> None:
    from wf_magic.agents.harness import parse_lines

    assert parse_lines(text) == objects


@pytest.mark.parametrize(
    ("text", "error_class"),
    [
        ("Failed to authenticate. API Error: 401 invalid x-api-key", "auth"),
        ("API Error: 529 Overloaded. This is a server-side issue", "overloaded"),
        ("429 Too Many Requests", "rate_limited"),
        (
            "We're currently experiencing high demand, which may cause temporary errors.",
            "server_error",
        ),
        ("connect ECONNREFUSED 127.0.0.1:9", "network"),
        ("No conversation found with session ID: abc", "unknown_session"),
        ("Error: Session ID abc is already in use.", "session_in_use"),
        ("--dangerously-skip-permissions cannot be used with root/sudo privileges", "refused"),
        ("error: unexpected argument '--sandbox' found", "bad_flag"),
        ("something else went wrong", "failed"),
    ],
)
def test_error_text_classes(text: str, error_class: str) -> None:
    from wf_magic.agents.harness import TRANSIENT, classify_text

    assert classify_text(text) == error_class
    assert (error_class in TRANSIENT) == (
        error_class in ("overloaded", "rate_limited", "server_error", "network")
    )
