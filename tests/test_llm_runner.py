"""The ``llm`` runner (issue 22, item 2): a plugin model registered through llm's own plugin
hook, and an OpenAI-compatible model from ``extra-openai-models.yaml`` pointed at the loopback
chat server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llm
import pytest
from llm.plugins import pm

from tests.openai_server import FakeChatServer, isolate_openai_env
from wf_magic import Engine
from wf_magic.bus import Event
from wf_magic.store.records import AttemptRow

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


class ServerSaid(Exception):
    """What an SDK raises for an HTTP error: it carries the status."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


class EchoModel(llm.Model):
    """A plugin model: echoes the prompt word by word; scripted failures first."""

    model_id = "wf-echo"
    can_stream = True
    supports_schema = True
    failures: list[Exception] = []
    seen: list[dict[str, Any]] = []

    def execute(self, prompt: Any, stream: bool, response: Any, conversation: Any) -> Iterator[str]:
        EchoModel.seen.append(
            {
                "prompt": prompt.prompt,
                "schema": prompt.schema,
                "system": prompt.system,
                "stream": stream,
            }
        )
        if EchoModel.failures:
            raise EchoModel.failures.pop(0)
        text = json.dumps({"n": 7}) if prompt.schema else f"echo {prompt.prompt}"
        words = text.split(" ")
        for i, word in enumerate(words):
            yield word if i == 0 else f" {word}"
        response.set_usage(input=len(prompt.prompt.split()), output=len(words))


class EchoPlugin:
    @llm.hookimpl
    def register_models(self, register: Any) -> None:
        register(EchoModel())


@pytest.fixture(autouse=True)
def llm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "llm-home"
    home.mkdir()
    monkeypatch.setenv("LLM_USER_PATH", str(home))
    isolate_openai_env(monkeypatch, "WF_TEST_LLM_KEY", "llm-test-key")
    EchoModel.failures, EchoModel.seen = [], []
    pm.register(EchoPlugin(), name="wf-test-echo")
    try:
        yield home
    finally:
        pm.unregister(name="wf-test-echo")


def source(model: str, *, step: str = "", options: str = "") -> str:
    return (
        f"name: viallm\nrunner: llm\nrunners:\n  llm: {{model: {model}{options}}}\n"
        "steps:\n  - id: a\n    prompt: count the words\n"
        + "".join(f"    {line}\n" for line in step.splitlines())
    )


def attempts(engine: Engine, run_id: str) -> list[AttemptRow]:
    return [a for a in engine.attempts(run_id) if a.phase == "work"]


# -- a plugin model -----------------------------------------------------------------------------
def test_a_plugin_model_answers_with_its_usage(engine: Engine) -> None:
    run = engine.run(source("wf-echo", options=", system: be brief"))
    assert run.status == "completed", run.reason
    (a,) = attempts(engine, run.run_id)
    assert (json.loads(a.output_json or ""), a.tokens_in, a.tokens_out, a.model) == (
        "echo count the words",
        3,
        4,
        "wf-echo",
    )
    assert a.cost is None  # genai-prices does not know wf-echo: null, never 0
    assert EchoModel.seen[0]["system"] == "be brief"


def test_a_plugin_model_gets_the_schema_natively(engine: Engine) -> None:
    run = engine.run(source("wf-echo", step=f"output: {json.dumps(SCHEMA)}"))
    assert run.status == "completed", run.reason
    assert run.result == {"n": 7}
    assert EchoModel.seen[0]["schema"] == SCHEMA
    assert "JSON Schema" not in EchoModel.seen[0]["prompt"]


def test_a_status_carrying_error_is_transient_a_plain_one_permanent(engine: Engine) -> None:
    EchoModel.failures = [ServerSaid(503, "busy"), ValueError("bad option")]
    run = engine.run(source("wf-echo", step="retry: {max_attempts: 3, backoff_s: 0}"))
    assert run.status == "failed"
    first, second = attempts(engine, run.run_id)
    assert (first.transient, second.transient) == (1, 0)
    assert "HTTP 503: busy" in (first.failure or "")
    assert "ValueError: bad option" in (second.failure or "")


def test_a_watched_plugin_unit_streams(engine: Engine) -> None:
    run = engine.start(source("wf-echo"))
    events: list[Event] = []
    unsubscribe = engine.subscribe(events.append)
    try:
        engine.drive(run.run_id)
    finally:
        unsubscribe()
    texts = [e.data["text"] for e in events if e.kind == "unit_text"]
    assert texts and texts[-1] == "echo count the words"
    assert EchoModel.seen[0]["stream"] is True


def test_an_unknown_model_is_permanent_and_says_how_to_find_one(engine: Engine) -> None:
    run = engine.run(source("no-such-llm-model"))
    assert run.status == "failed"
    assert "llm knows no model 'no-such-llm-model'; `llm models` lists them" in (run.reason or "")


# -- an OpenAI-compatible model from extra-openai-models.yaml -----------------------------------
@pytest.fixture
def server(llm_home: Path) -> Iterator[FakeChatServer]:
    with FakeChatServer() as running:
        (llm_home / "extra-openai-models.yaml").write_text(
            f"- model_id: loopback\n  model_name: loop-1\n  api_base: '{running.url}'\n",
            encoding="utf-8",
        )
        yield running


def test_an_openai_compatible_model_at_the_loopback_server(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push_reply("tides rise", prompt_tokens=12, completion_tokens=2)
    run = engine.run(source("loopback"))
    assert run.status == "completed", run.reason
    (a,) = attempts(engine, run.run_id)
    assert (json.loads(a.output_json or ""), a.tokens_in, a.tokens_out) == ("tides rise", 12, 2)
    assert server.requests[0].body["model"] == "loop-1"
    assert server.requests[0].prompt == "count the words"


def test_a_model_without_schema_support_gets_the_schema_as_an_instruction(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push_reply('```json\n{"n": 3}\n```')
    run = engine.run(source("loopback", step=f"output: {json.dumps(SCHEMA)}"))
    assert run.status == "completed", run.reason
    assert run.result == {"n": 3}
    assert "matching this JSON Schema" in server.requests[0].prompt


def test_a_401_from_the_server_is_permanent_with_its_message(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push(401, {"error": {"message": "Incorrect API key provided"}})
    run = engine.run(source("loopback", step="retry: {max_attempts: 3, backoff_s: 0}"))
    assert run.status == "failed"
    (a,) = attempts(engine, run.run_id)
    assert a.transient == 0
    assert "HTTP 401: Incorrect API key provided" in (a.failure or "")
