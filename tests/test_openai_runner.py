"""The openai runner against a real HTTP server on loopback."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.openai_server import (
    FakeChatServer,
    RecordedRequest,
    ScriptedResponse,
    chat_runner,
    completion_body,
    isolate_openai_env,
    unit_request,
)
from wf_magic.errors import RunnerError
from wf_magic.runners.base import UnitRequest
from wf_magic.runners.openai_chat import OpenAIChatRunner
from wf_magic.runners.registry import runner_factory

CANARY = "sk-canary-7f3a9c1e5b2d4f6a8c0e"
KEY_ENV = "WF_TEST_OPENAI_KEY"
SCHEMA = {"type": "object", "properties": {"sections": {"type": "array"}}, "required": ["sections"]}

MakeRunner = Callable[..., OpenAIChatRunner]


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as running:
        yield running


@pytest.fixture
def make_runner(
    server: FakeChatServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> Iterator[MakeRunner]:
    isolate_openai_env(monkeypatch, KEY_ENV, CANARY)
    made: list[OpenAIChatRunner] = []

    def make(**options: Any) -> OpenAIChatRunner:
        merged = {"base_url": server.url, "api_key_env": KEY_ENV, "model": "default-model"}
        merged.update(options)
        runner = chat_runner(merged, tmp_path)
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()


OUTLINE: dict[str, Any] = {
    "step_id": "outline",
    "unit_id": "outline",
    "dispatch_id": "d-123",
    "input_hash": "h" * 64,
    "prompt": "Outline a digest of tides.",
}


def unit(**overrides: Any) -> UnitRequest:
    return unit_request(**{**OUTLINE, **overrides})


def failure_of(runner: OpenAIChatRunner, request: UnitRequest) -> RunnerError:
    with pytest.raises(RunnerError) as caught:
        runner.run(request)
    return caught.value


def test_prompt_model_and_idempotency_key_arrive_as_sent(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push_reply("An outline.")
    result = make_runner().run(unit(model="gpt-test"))

    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "gpt-test"
    assert sent.body["messages"] == [{"role": "user", "content": "Outline a digest of tides."}]
    assert sent.headers["idempotency-key"] == "d-123"
    assert sent.headers["x-request-id"] == "d-123"
    assert sent.headers["authorization"] == f"Bearer {CANARY}"
    assert "response_format" not in sent.body
    assert "max_tokens" not in sent.body
    assert result.output == "An outline."
    assert result.model == "gpt-test"
    assert result.session_id == "chatcmpl-fake"


def test_default_model_comes_from_the_options(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    make_runner(model="plan-model").run(unit())
    assert server.requests[0].body["model"] == "plan-model"


def test_environment_supplies_base_url_and_model_when_options_do_not(
    server: FakeChatServer, make_runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WF_MAGIC_OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("WF_MAGIC_OPENAI_MODEL", "env-model")
    result = make_runner(base_url=None, model=None).run(unit())
    assert server.requests[0].body["model"] == "env-model"
    assert result.output == "echo: Outline a digest of tides."


def test_usage_becomes_tokens_and_the_price_table_gives_the_cost(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push_reply("ok", prompt_tokens=1200, completion_tokens=300)
    prices = {"default-model": {"input_per_mtok": 2.5, "output_per_mtok": 10.0}}
    result = make_runner(prices=prices).run(unit())
    assert (result.tokens_in, result.tokens_out) == (1200, 300)
    assert result.cost == pytest.approx((1200 * 2.5 + 300 * 10.0) / 1e6)


def test_a_model_missing_from_the_price_table_has_no_cost(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    prices = {"other-model": {"input_per_mtok": 1, "output_per_mtok": 1}}
    assert make_runner(prices=prices).run(unit()).cost is None


def test_a_reply_without_usage_has_unknown_tokens(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push_reply("x" * 40, prompt_tokens=None)
    result = make_runner().run(unit(prompt="y" * 80))
    assert (result.tokens_in, result.tokens_out, result.cost) == (None, None, None)


def test_an_output_schema_asks_for_json_and_the_reply_is_parsed(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push_reply('{"sections": ["a", "b"]}')
    result = make_runner().run(unit(output_schema=SCHEMA))

    sent = server.requests[0].body
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["messages"][0]["content"].startswith("Outline a digest of tides.\n\n")
    assert '"required": ["sections"]' in sent["messages"][0]["content"]
    assert result.output == {"sections": ["a", "b"]}


def test_a_fenced_json_reply_is_parsed(server: FakeChatServer, make_runner: MakeRunner) -> None:
    server.push_reply('```json\n{"sections": []}\n```')
    assert make_runner().run(unit(output_schema=SCHEMA)).output == {"sections": []}


def test_an_unparsable_json_reply_is_returned_as_raw_text(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push_reply("Sure! Here are the sections: a, b")
    result = make_runner().run(unit(output_schema=SCHEMA))
    assert result.output == "Sure! Here are the sections: a, b"


def test_a_judge_unit_is_asked_for_json(server: FakeChatServer, make_runner: MakeRunner) -> None:
    server.push_reply('{"complete": true, "feedback": "", "missing": []}')
    result = make_runner().run(unit(kind="judge", unit_id="outline.gate:l1"))
    assert server.requests[0].body["response_format"] == {"type": "json_object"}
    assert result.output == {"complete": True, "feedback": "", "missing": []}


def test_json_mode_off_sends_the_instruction_only(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push_reply('{"sections": []}')
    make_runner(json_mode=False).run(unit(output_schema=SCHEMA))
    sent = server.requests[0].body
    assert "response_format" not in sent
    assert "JSON Schema" in sent["messages"][0]["content"]


def test_a_server_rejecting_response_format_is_asked_once_more_without_it(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push(400, {"error": {"message": "response_format is not supported"}})
    server.push_reply('{"sections": ["a"]}')
    server.push_reply('{"sections": ["b"]}')
    runner = make_runner()

    first = runner.run(unit(output_schema=SCHEMA))
    second = runner.run(unit(output_schema=SCHEMA, dispatch_id="d-456"))

    assert [("response_format" in r.body) for r in server.requests] == [True, False, False]
    assert server.requests[1].headers["idempotency-key"] == "d-123-nojson"
    assert "JSON Schema" in server.requests[1].body["messages"][0]["content"]
    assert (first.output, second.output) == ({"sections": ["a"]}, {"sections": ["b"]})


def test_a_second_400_is_reported_and_json_mode_is_not_given_up(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push(400, {"error": {"message": "response_format is not supported"}})
    server.push(400, {"error": {"message": "context length exceeded"}})
    runner = make_runner()
    err = failure_of(runner, unit(output_schema=SCHEMA))
    assert not err.transient
    assert "context length exceeded" in str(err)
    runner.run(unit(output_schema=SCHEMA))
    assert "response_format" in server.requests[2].body


@pytest.mark.parametrize(
    ("status", "transient"),
    [
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (408, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (422, False),
    ],
)
def test_status_codes_map_to_transient_or_permanent(
    server: FakeChatServer, make_runner: MakeRunner, status: int, transient: bool
) -> None:
    server.push(status, {"error": {"message": f"status {status} from the server"}})
    err = failure_of(make_runner(), unit())
    assert err.transient is transient
    assert f"HTTP {status}: status {status} from the server" in str(err)
    assert err.__cause__ is not None
    assert len(server.requests) == 1  # the client's own retries are off


def test_a_400_is_permanent_and_carries_the_server_message(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push(
        400, {"error": {"message": "Invalid model 'nope'", "type": "invalid_request_error"}}
    )
    err = failure_of(make_runner(), unit(model="nope"))
    assert err.transient is False
    assert str(err) == (
        f"openai runner: unit outline (model nope at {server.url}) got HTTP 400: "
        "Invalid model 'nope'"
    )


def test_a_429_is_transient_and_says_when_to_retry(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push(429, {"error": {"message": "Rate limit reached"}}, headers={"Retry-After": "7"})
    err = failure_of(make_runner(), unit())
    assert err.transient is True
    assert str(err).endswith("got HTTP 429: Rate limit reached (retry after 7s)")


def test_a_plain_text_error_body_is_the_message(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    server.push(500, "upstream exploded")
    err = failure_of(make_runner(), unit())
    assert err.transient is True
    assert str(err).endswith("got HTTP 500: upstream exploded")


def test_a_timeout_is_transient(server: FakeChatServer, make_runner: MakeRunner) -> None:
    server.push(200, completion_body("late"), delay_s=5.0)
    err = failure_of(make_runner(), unit(timeout_s=0.2))
    assert err.transient is True
    assert "timed out after 0.2s" in str(err)


def test_a_refused_connection_is_transient(make_runner: MakeRunner) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    err = failure_of(make_runner(base_url=f"http://127.0.0.1:{port}/v1"), unit())
    assert err.transient is True
    assert "could not connect" in str(err)


def test_max_tokens_sent_never_exceeds_the_request(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    runner = make_runner()
    runner.run(unit(max_tokens=17))
    make_runner(max_tokens_param="max_completion_tokens").run(unit(max_tokens=5))
    assert server.requests[0].body["max_tokens"] == 17
    assert server.requests[1].body["max_completion_tokens"] == 5
    assert "max_tokens" not in server.requests[1].body


def test_an_exhausted_token_budget_sends_nothing(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    err = failure_of(make_runner(), unit(max_tokens=0))
    assert err.transient is False
    assert "no tokens left" in str(err)
    assert server.requests == []


def test_close_closes_the_client(server: FakeChatServer, make_runner: MakeRunner) -> None:
    runner = make_runner()
    runner.run(unit())
    [client] = runner._clients.all()
    assert not client.is_closed()
    runner.close()
    runner.close()
    assert client.is_closed()
    assert runner._clients.all() == []


def test_the_client_is_created_once_per_runner(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    runner = make_runner()
    runner.run(unit())
    [client] = runner._clients.all()
    runner.run(unit(dispatch_id="d-2"))
    assert runner._clients.all() == [client]


def test_the_api_key_never_appears_in_an_error_message(
    server: FakeChatServer, make_runner: MakeRunner
) -> None:
    def leak(request: RecordedRequest) -> ScriptedResponse:
        auth = request.headers["authorization"]
        return ScriptedResponse(int(request.body["model"]), {"error": {"message": f"bad {auth}"}})

    server.default = leak
    runner = make_runner()
    messages = [str(failure_of(runner, unit(model=str(status)))) for status in (400, 401, 429, 500)]
    messages.append(str(failure_of(make_runner(base_url="http://127.0.0.1:1/v1"), unit())))
    assert all("bad Bearer" in m for m in messages[:4])
    assert not [m for m in messages if CANARY in m or CANARY[3:] in m]


def test_an_api_key_option_is_refused_without_echoing_it(make_runner: MakeRunner) -> None:
    with pytest.raises(RunnerError) as caught:
        make_runner(api_key=CANARY)
    assert "api_key_env" in str(caught.value)
    assert CANARY not in str(caught.value)


def test_a_missing_key_for_the_default_endpoint_is_permanent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("OPENAI_BASE_URL", "WF_MAGIC_OPENAI_BASE_URL", "WF_TEST_MISSING_KEY"):
        monkeypatch.delenv(name, raising=False)
    runner = chat_runner({"api_key_env": "WF_TEST_MISSING_KEY", "model": "m"}, tmp_path)
    err = failure_of(runner, unit())
    runner.close()
    assert err.transient is False
    assert "WF_TEST_MISSING_KEY is not set" in str(err)


def test_a_missing_openai_package_names_the_extra(
    make_runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    err = failure_of(make_runner(), unit())
    assert err.transient is False
    assert "pip install 'wf_magic[openai]'" in str(err)


def test_exec_units_are_refused(make_runner: MakeRunner) -> None:
    err = failure_of(make_runner(), unit(kind="exec", prompt=None, argv=("true",)))
    assert err.transient is False
    assert "only runs prompts" in str(err)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"timeout_s": 0}, "timeout_s: expected a positive number of seconds (got 0)"),
        ({"max_tokens_param": "tokens"}, "max_tokens_param: expected max_tokens or"),
        ({"prices": {"m": {"input_per_mtok": 1}}}, "prices.m: expected"),
        ({"json_mode": "no"}, "json_mode: expected true or false (got 'no')"),
        ({"temprature": 0}, "unknown option(s) temprature"),
        ({"temperature": 3}, "temperature: expected a finite number from 0 to 2 (got 3)"),
    ],
)
def test_invalid_options_are_refused(
    make_runner: MakeRunner, options: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(RunnerError, match="runners.openai") as caught:
        make_runner(**options)
    assert fragment in str(caught.value)


def test_openai_and_replay_are_registered_like_plugins() -> None:
    assert runner_factory("openai") is not None
    assert runner_factory("replay") is not None


def test_worker_threads_share_one_runner(server: FakeChatServer, make_runner: MakeRunner) -> None:
    runner = make_runner()
    requests = [unit(dispatch_id=f"d-{i}", prompt=f"item {i}") for i in range(16)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        outputs = list(pool.map(runner.run, requests))
    assert [r.output for r in outputs] == [f"echo: item {i}" for i in range(16)]
    assert sorted(r.headers["idempotency-key"] for r in server.requests) == sorted(
        f"d-{i}" for i in range(16)
    )
