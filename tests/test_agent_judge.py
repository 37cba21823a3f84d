"""The llm judge of an agent step (issue 21): examples/agent_fix.yaml as shipped, its agent
played by the fake Claude CLI and its judge by a loopback OpenAI-compatible server.

An agent step's model names the agent's model (``claude-sonnet-4-5``); its judge runs on the
workflow's runner, so it must be sent ``gate.model`` or nothing (the runner's own ``model``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_fakes.bins import git_repo, make_bins
from tests.conftest import ROOT
from tests.openai_server import FakeChatServer, isolate_openai_env
from wf_magic import Engine

EXAMPLE = ROOT / "examples" / "agent_fix.yaml"
NOT_YET = '{"complete": false, "feedback": "run the test", "missing": ["the test passes"]}'
PASSED = '{"complete": true, "feedback": "", "missing": []}'


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as running:
        yield running


def example_in(repo: Path, *, claude_bin: Path, url: str, gate_model: str | None = None) -> Path:
    """examples/agent_fix.yaml copied into ``repo`` with only its endpoints pointed at fakes."""
    text = EXAMPLE.read_text()
    edits = {
        "    api_key_env: OPENAI_API_KEY\n": (
            f"    api_key_env: OPENAI_API_KEY\n    base_url: '{url}'\n"
        ),
        "claude: {bin: claude,": f"claude: {{bin: '{claude_bin}',",
    }
    if gate_model is not None:
        edits["gate: {judge: llm,"] = f"gate: {{judge: llm, model: {gate_model},"
    for old, new in edits.items():
        assert text.count(old) == 1, old  # the example's shape is what this test runs
        text = text.replace(old, new)
    path = repo / "agent_fix.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    isolate_openai_env(monkeypatch, "OPENAI_API_KEY", "sk-test-judge")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-judge")  # the example's api_key_env
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")  # its pass_env
    return git_repo(tmp_path / "repo")


def test_agent_fix_example_sends_its_judge_the_judge_runners_model_not_the_agents(
    engine: Engine, repo: Path, tmp_path: Path, server: FakeChatServer
) -> None:
    server.push_reply(NOT_YET, model="gpt-4o-mini", prompt_tokens=50, completion_tokens=9)
    server.push_reply(PASSED, model="gpt-4o-mini", prompt_tokens=52, completion_tokens=7)
    claude = make_bins(tmp_path / "bin")["claude"]
    run = engine.run(str(example_in(repo, claude_bin=claude, url=server.url)))
    assert run.status == "completed"
    judged = [r.body for r in server.requests]
    assert [body["model"] for body in judged] == ["gpt-4o-mini", "gpt-4o-mini"]
    attempts = engine.store.attempts_of(run.run_id)
    assert [(a.phase, a.loop, a.runner, a.model) for a in attempts] == [
        ("work", 1, "claude", "claude-sonnet-4-5"),
        ("gate", 1, "openai", "gpt-4o-mini"),
        ("work", 2, "claude", "claude-sonnet-4-5"),
        ("gate", 2, "openai", "gpt-4o-mini"),
    ]
    work = [json.loads(a.output_json or "null") for a in attempts if a.phase == "work"]
    assert work[0].startswith("TRIED") and work[1].startswith("FIXED")


def test_an_agent_steps_gate_model_is_what_its_judge_is_sent(
    engine: Engine, repo: Path, tmp_path: Path, server: FakeChatServer
) -> None:
    server.push_reply(PASSED, model="gpt-4.1", prompt_tokens=50, completion_tokens=7)
    claude = make_bins(tmp_path / "bin")["claude"]
    path = example_in(repo, claude_bin=claude, url=server.url, gate_model="gpt-4.1")
    run = engine.run(str(path))
    assert run.status == "completed"
    assert [r.body["model"] for r in server.requests] == ["gpt-4.1"]
    [gate] = [a for a in engine.store.attempts_of(run.run_id) if a.phase == "gate"]
    assert (gate.runner, gate.model) == ("openai", "gpt-4.1")


def test_a_prompt_steps_judge_still_falls_back_to_the_steps_model(
    engine: Engine, repo: Path, server: FakeChatServer
) -> None:
    server.push_reply("Tides follow the moon.", model="m-step")
    server.push_reply(PASSED, model="m-step")
    source = (
        "name: essay\nrunner: openai\n"
        f"runners:\n  openai: {{base_url: '{server.url}', api_key_env: OPENAI_API_KEY, "
        "model: m-runner}\n"
        "steps:\n  - id: essay\n    prompt: Write about tides.\n    model: m-step\n"
        "    gate: {judge: llm, criteria: [mentions the moon]}\n"
    )
    run = engine.run(source)
    assert run.status == "completed"
    assert [r.body["model"] for r in server.requests] == ["m-step", "m-step"]
