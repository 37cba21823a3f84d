"""Streaming: the openai runner streams when a unit is watched, and the journal stays the same.

The runner streams only when its request carries ``on_text``; the drive sets it for prompt
units while somebody listens on the engine's bus, and the live view shows the growing text.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.openai_server import FakeChatServer, chat_runner, isolate_openai_env, unit_request
from wf_magic import Engine
from wf_magic.bus import Event
from wf_magic.notebook.widgets import RunView
from wf_magic.runners.base import UnitRequest
from wf_magic.runners.openai_chat import OpenAIChatRunner
from wf_magic.runners.scripted import ScriptedRunner

KEY_ENV = "WF_TEST_OPENAI_KEY"
REPLY = " ".join(f"word{i}" for i in range(30))


@pytest.fixture(autouse=True)
def openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_openai_env(monkeypatch, KEY_ENV, "sk-test-streaming-0000")


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as running:
        yield running


@pytest.fixture
def runner(server: FakeChatServer, tmp_path: Path) -> Iterator[OpenAIChatRunner]:
    made = chat_runner({"base_url": server.url, "api_key_env": KEY_ENV, "model": "m1"}, tmp_path)
    yield made
    made.close()


ESSAY: dict[str, Any] = {
    "step_id": "essay",
    "unit_id": "essay",
    "dispatch_id": "d-1",
    "prompt": "Write an essay",
}


def request(**overrides: Any) -> UnitRequest:
    return unit_request(**{**ESSAY, **overrides})


def workflow(url: str) -> str:
    return (
        "name: streamed\n"
        "runner: openai\n"
        f"runners:\n  openai: {{base_url: '{url}', api_key_env: {KEY_ENV}, model: m1}}\n"
        "steps:\n"
        "  - id: essay\n"
        "    prompt: Write an essay\n"
    )


def assert_growing(texts: list[str], final: str) -> None:
    assert len(texts) >= 2
    for shorter, longer in zip(texts, texts[1:], strict=False):
        assert longer.startswith(shorter) and len(longer) > len(shorter)
    assert texts[-1] == final


def test_a_watched_unit_streams_and_its_tokens_come_from_the_usage_chunk(
    server: FakeChatServer, runner: OpenAIChatRunner
) -> None:
    server.chunk_delay_s = 0.02
    server.push_reply(REPLY, prompt_tokens=11, completion_tokens=31)
    texts: list[str] = []
    started = time.monotonic()
    result = runner.run(request(on_text=texts.append))
    elapsed = time.monotonic() - started
    body = server.requests[0].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (result.output, result.tokens_in, result.tokens_out) == (REPLY, 11, 31)
    assert result.session_id == "chatcmpl-fake"
    assert_growing(texts, REPLY)
    assert len(texts) <= 10 * elapsed + 2  # throttled: ~10 a second, plus the final text


def test_an_unwatched_unit_is_not_streamed(
    server: FakeChatServer, runner: OpenAIChatRunner
) -> None:
    server.push_reply(REPLY, prompt_tokens=11, completion_tokens=31)
    result = runner.run(request())
    assert "stream" not in server.requests[0].body
    assert (result.output, result.tokens_in, result.tokens_out) == (REPLY, 11, 31)


def test_a_server_that_ignores_stream_still_answers(
    server: FakeChatServer, runner: OpenAIChatRunner
) -> None:
    server.streams = False
    server.push_reply(REPLY, prompt_tokens=11, completion_tokens=31)
    texts: list[str] = []
    result = runner.run(request(on_text=texts.append))
    assert server.requests[0].body["stream"] is True
    assert (result.output, result.tokens_in, result.tokens_out) == (REPLY, 11, 31)
    assert texts == []


def test_a_streamed_json_answer_is_parsed_like_a_plain_one(
    server: FakeChatServer, runner: OpenAIChatRunner
) -> None:
    server.push_reply('{"sections": ["a", "b"]}', prompt_tokens=5, completion_tokens=4)
    schema = {"type": "object", "required": ["sections"]}
    result = runner.run(request(output_schema=schema, on_text=lambda _t: None))
    assert server.requests[0].body["response_format"] == {"type": "json_object"}
    assert (result.output, result.tokens_in, result.tokens_out) == ({"sections": ["a", "b"]}, 5, 4)


def test_a_failing_text_callback_never_fails_the_unit(
    server: FakeChatServer, runner: OpenAIChatRunner
) -> None:
    server.push_reply(REPLY)

    def broken(_text: str) -> None:
        raise RuntimeError("view bug")

    assert runner.run(request(on_text=broken)).output == REPLY


def test_a_runner_that_cannot_stream_ignores_on_text() -> None:
    scripted = ScriptedRunner([{"match": "essay", "reply": "fine"}])
    texts: list[str] = []
    assert scripted.run(request(on_text=texts.append)).output == "fine"
    assert texts == []


def test_on_text_is_not_part_of_a_requests_identity() -> None:
    assert request(on_text=print) == request()
    assert "on_text" not in repr(request(on_text=print))


def test_a_watched_drive_emits_growing_text_and_journals_the_same_tokens(
    server: FakeChatServer, engine: Engine
) -> None:
    server.chunk_delay_s = 0.02
    server.push_reply(REPLY, prompt_tokens=11, completion_tokens=31)
    server.push_reply(REPLY, prompt_tokens=11, completion_tokens=31)
    quiet = engine.start(workflow(server.url))
    engine.drive(quiet.run_id)
    events: list[Event] = []
    watched = engine.start(workflow(server.url), new=True, no_cache=True)
    unsubscribe = engine.subscribe(events.append)
    try:
        engine.drive(watched.run_id)
    finally:
        unsubscribe()
    assert "stream" not in server.requests[0].body
    assert server.requests[1].body["stream"] is True
    texts = [e.data["text"] for e in events if e.kind == "unit_text"]
    assert_growing(texts, REPLY)
    assert {(e.step_id, e.unit_id) for e in events if e.kind == "unit_text"} == {("essay", "essay")}
    tokens = [
        [(a.tokens_in, a.tokens_out, a.output_json) for a in engine.attempts(run.run_id)]
        for run in (quiet, watched)
    ]
    assert tokens[0] == tokens[1] == [(11, 31, f'"{REPLY}"')]


def test_the_run_view_shows_the_in_flight_text_growing(
    server: FakeChatServer, engine: Engine
) -> None:
    server.chunk_delay_s = 0.03
    server.push_reply(REPLY, prompt_tokens=11, completion_tokens=31)
    run = engine.start(workflow(server.url))
    view = RunView(engine, run.run_id)
    row = view.rows["essay"]
    shown: list[str] = []
    row.live.observe(lambda change: shown.append(change["new"]), "value")
    try:
        engine.drive(run.run_id)
        view.flush()
    finally:
        view.close()
    growing = [s for s in shown if "word" in s]
    assert len(growing) >= 2
    assert len(growing[-1]) > len(growing[0])
    assert "word29" in growing[-1]
    assert row.live.value == ""  # the unit finished: its row shows the outcome, not the text
