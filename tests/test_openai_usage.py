"""The openai runner's server quirks (issue 22, item 4): usage always asked for in streams, the
last usage seen kept (never a sum), and an unreported count never read as 0 nor estimated
(issue 31, item 9: it is None)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.openai_server import (
    FakeChatServer,
    chat_runner,
    completion_body,
    isolate_openai_env,
    unit_request,
)
from wf_magic.runners.openai_chat import OpenAIChatRunner

KEY_ENV = "WF_TEST_USAGE_KEY"
REPLY = " ".join(f"word{i}" for i in range(12))
PRICES = {"m1": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeChatServer]:
    isolate_openai_env(monkeypatch, KEY_ENV, "usage-test-key")
    with FakeChatServer() as running:
        yield running


@pytest.fixture
def runner(server: FakeChatServer, tmp_path: Path) -> Iterator[OpenAIChatRunner]:
    options = {"base_url": server.url, "api_key_env": KEY_ENV, "model": "m1", "prices": PRICES}
    made = chat_runner(options, tmp_path)
    yield made
    made.close()


def run(runner: OpenAIChatRunner, *, streamed: bool, prompt: str = "Say it") -> Any:
    on_text = (lambda _text: None) if streamed else None
    return runner.run(
        unit_request(step_id="a", unit_id="a", dispatch_id="d-1", prompt=prompt, on_text=on_text)
    )


def test_running_usage_totals_are_not_summed(
    server: FakeChatServer, runner: OpenAIChatRunner
) -> None:
    server.running_usage = True
    server.push_reply(REPLY, prompt_tokens=9, completion_tokens=24)
    result = run(runner, streamed=True)
    body = server.requests[0].body
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})
    # Twelve chunks of running totals and a final one: the sum would be 9 * 13 prompt tokens.
    assert (result.output, result.tokens_in, result.tokens_out) == (REPLY, 9, 24)
    assert result.cost == pytest.approx((9 * 1.0 + 24 * 2.0) / 1e6)


@pytest.mark.parametrize("streamed", [False, True])
def test_no_usage_is_unknown_with_a_null_cost(
    server: FakeChatServer, runner: OpenAIChatRunner, streamed: bool
) -> None:
    server.push_reply("x" * 40, prompt_tokens=None)
    result = run(runner, streamed=streamed, prompt="y" * 80)
    assert (result.tokens_in, result.tokens_out, result.cost) == (None, None, None)


@pytest.mark.parametrize(
    ("usage", "tokens"),
    [
        ({"prompt_tokens": None, "completion_tokens": 5}, (None, 5)),
        ({"prompt_tokens": 7, "completion_tokens": None}, (7, None)),
        ({"prompt_tokens": 0, "completion_tokens": 0}, (0, 0)),
    ],
)
def test_a_null_count_is_unknown_never_read_as_zero(
    server: FakeChatServer,
    runner: OpenAIChatRunner,
    usage: dict[str, Any],
    tokens: tuple[int | None, int | None],
) -> None:
    body = completion_body("x" * 40, prompt_tokens=None)
    body["usage"] = usage
    server.push(200, body)
    result = run(runner, streamed=False, prompt="y" * 80)
    assert (result.tokens_in, result.tokens_out) == tokens
    # A reported zero is a count (free), an estimate is not priced.
    assert result.cost == (0.0 if tokens == (0, 0) else None)
