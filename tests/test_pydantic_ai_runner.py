"""The ``pydantic-ai`` runner through the real SDKs against loopback fakes of Anthropic's Messages
API and Google's Gemini API (issue 22, item 1)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from typing import Any

import genai_prices
import pytest

from tests.helpers_http import isolate_loopback_env
from tests.provider_servers import (
    FakeAnthropic,
    FakeGemini,
    Reply,
    anthropic_error,
    gemini_error,
)
from wf_magic import Engine
from wf_magic.bus import Event
from wf_magic.store.records import AttemptRow

KEY_ENV = "WF_TEST_PROVIDER_KEY"
KEY = "provider-test-key-1234"
GENAI = f"genai-prices {genai_prices.__version__}"
SCHEMA = {
    "type": "object",
    "properties": {"sections": {"type": "array", "items": {"type": "string"}}},
    "required": ["sections"],
}
PROVIDER_ENV = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_CLOUD_PROJECT",
)


@pytest.fixture(autouse=True)
def provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROVIDER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(KEY_ENV, KEY)
    isolate_loopback_env(monkeypatch)


@pytest.fixture
def anthropic() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        yield fake  # type: ignore[misc]


@pytest.fixture
def gemini() -> Iterator[FakeGemini]:
    with FakeGemini() as fake:
        yield fake  # type: ignore[misc]


def workflow(url: str, model: str, *, step: str = "", head: str = "") -> str:
    return (
        "name: native\nrunner: pydantic-ai\n"
        f"runners:\n  pydantic-ai: {{model: '{model}', base_url: '{url}', api_key_env: {KEY_ENV}}}\n"
        f"{head}"
        "steps:\n  - id: a\n    prompt: Outline tides.\n"
        f"{textwrap.indent(textwrap.dedent(step), '    ')}"
    )


def attempts(engine: Engine, run_id: str) -> list[AttemptRow]:
    return [a for a in engine.attempts(run_id) if a.phase == "work"]


def price(model: str, provider: str, tokens_in: int, tokens_out: int, **cache: int) -> float:
    usage = genai_prices.Usage(input_tokens=tokens_in, output_tokens=tokens_out, **cache)
    return float(genai_prices.calc_price(usage, model, provider_id=provider).total_price)


# -- Anthropic ----------------------------------------------------------------------------------
def test_anthropic_text_with_exact_tokens_cache_and_cost(
    engine: Engine, anthropic: FakeAnthropic
) -> None:
    anthropic.push(
        Reply(text="Moon and sun.", tokens_in=1000, tokens_out=100, cache_read=200, cache_write=50)
    )
    run = engine.run(workflow(anthropic.url, "anthropic:claude-sonnet-4-5"))
    assert run.status == "completed", run.reason
    (a,) = attempts(engine, run.run_id)
    assert (json.loads(a.output_json or ""), a.tokens_in, a.tokens_out) == (
        "Moon and sun.",
        1000,
        100,
    )
    expected = price(
        "claude-sonnet-4-5", "anthropic", 1000, 100, cache_read_tokens=200, cache_write_tokens=50
    )
    assert expected == pytest.approx((750 * 3 + 200 * 0.3 + 50 * 3.75 + 100 * 15) / 1e6)
    assert (a.model, a.cost) == ("anthropic:claude-sonnet-4-5", pytest.approx(expected))
    assert run.attempt("a").price_source == GENAI
    sent = anthropic.requests[0]
    assert sent.path == "/v1/messages"
    # The key from api_key_env, as this SDK version sends it (x-api-key or a bearer token).
    assert KEY in sent.headers.get("x-api-key", "") + sent.headers.get("authorization", "")
    assert sent.body["model"] == "claude-sonnet-4-5"
    assert sent.body["messages"][-1]["content"][0]["text"] == "Outline tides."


def test_anthropic_schema_output_natively(engine: Engine, anthropic: FakeAnthropic) -> None:
    anthropic.push(Reply(text='{"sections": ["moon", "sun"]}'))
    run = engine.run(
        workflow(
            anthropic.url, "anthropic:claude-sonnet-4-5", step=f"output: {json.dumps(SCHEMA)}\n"
        )
    )
    assert run.status == "completed", run.reason
    assert run.result == {"sections": ["moon", "sun"]}
    body = anthropic.requests[0].body
    # Claude 4.5 takes a JSON-schema response format: no prompt instruction, no tool.
    assert "tools" not in body
    assert json.dumps(body).count('"sections"') >= 1


def test_anthropic_schema_output_by_a_forced_tool_on_older_models(
    engine: Engine, anthropic: FakeAnthropic
) -> None:
    anthropic.push(Reply(tool={"sections": ["a", "b"]}))
    run = engine.run(
        workflow(
            anthropic.url,
            "anthropic:claude-3-5-haiku-latest",
            step=f"output: {json.dumps(SCHEMA)}\n",
        )
    )
    assert run.status == "completed", run.reason
    assert run.result == {"sections": ["a", "b"]}
    body = anthropic.requests[0].body
    assert [t["input_schema"]["required"] for t in body["tools"]] == [["sections"]]


def test_anthropic_529_is_a_throttle_sent_again_in_the_same_attempt(
    engine: Engine, anthropic: FakeAnthropic
) -> None:
    anthropic.push(anthropic_error(529, "overloaded_error", "Overloaded"))
    anthropic.push(Reply(text="second time lucky"))
    run = engine.run(
        workflow(
            anthropic.url,
            "anthropic:claude-sonnet-4-5",
            step="retry: {max_attempts: 1}\n",  # no retry: the throttle is not one
        )
    )
    assert run.status == "completed", run.reason
    (only,) = attempts(engine, run.run_id)
    assert (only.attempt, only.status) == (1, "succeeded")
    throttled = engine.events(run.run_id).query("kind == 'throttled'")
    assert len(throttled) == 1
    assert "HTTP 529: Overloaded" in throttled.iloc[0]["data_json"]
    assert len(anthropic.requests) == 2  # the SDK's own retries are off


def test_anthropic_401_is_permanent_with_the_providers_message(
    engine: Engine, anthropic: FakeAnthropic
) -> None:
    anthropic.push(anthropic_error(401, "authentication_error", "invalid x-api-key"))
    run = engine.run(
        workflow(
            anthropic.url,
            "anthropic:claude-sonnet-4-5",
            step="retry: {max_attempts: 3, backoff_s: 0}\n",
        )
    )
    assert run.status == "failed"
    (a,) = attempts(engine, run.run_id)
    assert (a.status, a.transient) == ("failed", 0)
    assert "HTTP 401: invalid x-api-key" in (a.failure or "")
    assert KEY not in (a.failure or "")


def test_a_retry_after_is_honoured(engine: Engine, anthropic: FakeAnthropic) -> None:
    failure = anthropic_error(429, "rate_limit_error", "slow down")
    anthropic.push(type(failure)(failure.status, failure.body, {"retry-after-ms": "600"}))
    run = engine.run(
        workflow(
            anthropic.url,
            "anthropic:claude-sonnet-4-5",
            step="retry: {max_attempts: 1}\n",
        )
    )
    assert run.status == "completed", run.reason
    (only,) = attempts(engine, run.run_id)  # refused, waited for, sent again: one attempt
    assert (only.finished_at or 0) - only.started_at >= 0.55
    throttled = engine.events(run.run_id).query("kind == 'throttled'")
    assert json.loads(throttled.iloc[0]["data_json"])["wait_s"] == 0.6


def test_a_watched_anthropic_unit_streams_its_text(
    engine: Engine, anthropic: FakeAnthropic
) -> None:
    words = " ".join(f"w{i}" for i in range(12))
    anthropic.chunk_delay_s = 0.03
    anthropic.push(Reply(text=words, tokens_in=40, tokens_out=12))
    run = engine.start(workflow(anthropic.url, "anthropic:claude-sonnet-4-5"))
    events: list[Event] = []
    unsubscribe = engine.subscribe(events.append)
    try:
        engine.drive(run.run_id)
    finally:
        unsubscribe()
    texts = [e.data["text"] for e in events if e.kind == "unit_text"]
    assert len(texts) >= 2 and texts[-1] == words
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert anthropic.requests[0].body["stream"] is True
    (a,) = attempts(engine, run.run_id)
    assert (a.tokens_in, a.tokens_out, json.loads(a.output_json or "")) == (40, 12, words)


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (Reply(text="", stop="refusal"), "stopped by the provider's content filter"),
        (
            anthropic_error(400, "invalid_request_error", "prompt is too long: 300000 tokens"),
            "HTTP 400: prompt is too long: 300000 tokens",
        ),
        (
            anthropic_error(404, "not_found_error", "model: claude-nope"),
            "HTTP 404: model: claude-nope",
        ),
    ],
)
def test_refusals_are_permanent(
    engine: Engine, anthropic: FakeAnthropic, answer: Any, said: str
) -> None:
    anthropic.push(answer)
    run = engine.run(
        workflow(
            anthropic.url,
            "anthropic:claude-sonnet-4-5",
            step="retry: {max_attempts: 3, backoff_s: 0}\n",
        )
    )
    assert run.status == "failed"
    (a,) = attempts(engine, run.run_id)
    assert a.transient == 0 and said in (a.failure or "")


def test_a_gate_judge_answers_its_verdict_natively(
    engine: Engine, anthropic: FakeAnthropic
) -> None:
    anthropic.push(Reply(text="draft"))
    anthropic.push(Reply(text='{"complete": true, "feedback": "fine", "missing": []}'))
    run = engine.run(
        workflow(
            anthropic.url,
            "anthropic:claude-sonnet-4-5",
            step="gate: {judge: llm, criteria: [short]}\n",
        )
    )
    assert run.status == "completed", run.reason
    verdict = [a for a in engine.attempts(run.run_id) if a.phase == "gate"]
    assert [json.loads(v.output_json or "")["complete"] for v in verdict] == [True]
    assert "required" in json.dumps(anthropic.requests[1].body)


# -- Gemini -------------------------------------------------------------------------------------
def test_gemini_text_with_exact_tokens_and_cost(engine: Engine, gemini: FakeGemini) -> None:
    gemini.push(Reply(text="Tides follow the moon.", tokens_in=2000, tokens_out=300))
    run = engine.run(workflow(gemini.url, "google:gemini-2.5-flash"))
    assert run.status == "completed", run.reason
    (a,) = attempts(engine, run.run_id)
    assert (a.tokens_in, a.tokens_out) == (2000, 300)
    assert a.cost == pytest.approx(price("gemini-2.5-flash", "google", 2000, 300))
    assert a.cost == pytest.approx((2000 * 0.3 + 300 * 2.5) / 1e6)
    sent = gemini.requests[0]
    assert sent.path.startswith("/v1beta/models/gemini-2.5-flash:generateContent")
    assert sent.headers["x-goog-api-key"] == KEY


def test_gemini_schema_output_natively(engine: Engine, gemini: FakeGemini) -> None:
    gemini.push(Reply(tool={"sections": ["x"]}))
    run = engine.run(
        workflow(gemini.url, "google:gemini-2.5-flash", step=f"output: {json.dumps(SCHEMA)}\n")
    )
    assert run.status == "completed", run.reason
    assert run.result == {"sections": ["x"]}
    config = gemini.requests[0].body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert "sections" in json.dumps(config)


def test_gemini_503_is_retried_and_401_is_permanent(engine: Engine, gemini: FakeGemini) -> None:
    gemini.push(gemini_error(503, "UNAVAILABLE", "The model is overloaded."))
    gemini.push(Reply(text="ok"))
    gemini.push(gemini_error(401, "UNAUTHENTICATED", "API key not valid."))
    step = "retry: {max_attempts: 2, backoff_s: 0}\n"
    run = engine.run(workflow(gemini.url, "google:gemini-2.5-flash", step=step))
    assert run.status == "completed", run.reason
    first, second = attempts(engine, run.run_id)
    assert (first.transient, second.status) == (1, "succeeded")
    assert "HTTP 503: The model is overloaded." in (first.failure or "")
    refused = engine.run(
        workflow(gemini.url, "google:gemini-2.5-flash", step=step), new=True, no_cache=True
    )
    assert refused.status == "failed"
    (a,) = attempts(engine, refused.run_id)
    assert a.transient == 0 and "HTTP 401: API key not valid." in (a.failure or "")


def test_a_watched_gemini_unit_streams_with_running_usage(
    engine: Engine, gemini: FakeGemini
) -> None:
    words = " ".join(f"g{i}" for i in range(10))
    gemini.chunk_delay_s = 0.03
    gemini.push(Reply(text=words, tokens_in=30, tokens_out=10))
    run = engine.start(workflow(gemini.url, "google:gemini-2.5-flash"))
    events: list[Event] = []
    unsubscribe = engine.subscribe(events.append)
    try:
        engine.drive(run.run_id)
    finally:
        unsubscribe()
    texts = [e.data["text"] for e in events if e.kind == "unit_text"]
    assert len(texts) >= 2 and texts[-1] == words
    assert ":streamGenerateContent" in gemini.requests[0].path
    (a,) = attempts(engine, run.run_id)
    assert (a.tokens_in, a.tokens_out) == (30, 10)  # the running totals are not summed


# -- setup errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("{model: 'anthropic:x', api_key: 'k'}", "api_key: looks like a secret value"),
        ("{model: 'anthropic:x', temprature: 1}", "unknown option(s) temprature"),
        ("{model: 3}", "runners.pydantic-ai.model: expected a string"),
        ("{timeout_s: 0}", "runners.pydantic-ai.timeout_s: expected a positive number"),
        ("{settings: [1]}", "runners.pydantic-ai.settings: expected a mapping"),
    ],
)
def test_bad_options_are_refused_when_frozen(options: str, message: str) -> None:
    from wf_magic import load_workflow
    from wf_magic.errors import WorkflowError

    source = f"name: bad\nrunner: pydantic-ai\nrunners: {{pydantic-ai: {options}}}\nsteps:\n  - id: a\n    prompt: hi\n"
    with pytest.raises(WorkflowError) as caught:
        load_workflow(source)
    assert message in str(caught.value)


def test_a_model_without_a_provider_prefix_is_a_permanent_error(engine: Engine) -> None:
    run = engine.run(
        "name: bare\nrunner: pydantic-ai\nsteps:\n  - id: a\n    model: claude\n    prompt: hi\n"
    )
    assert run.status == "failed"
    assert "needs a model named provider:model (got 'claude')" in (run.reason or "")


def test_the_claude_example_runs_on_the_sdks_own_environment_variables(
    engine: Engine, anthropic: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    anthropic.push(Reply(text='{"sections": ["moon", "sun", "shore"]}', tokens_in=50))
    for section in ("moon", "sun", "shore"):
        anthropic.push(Reply(text=f"About the {section}. Two sentences.", tokens_in=40))
    anthropic.push(Reply(text='{"complete": true, "feedback": "", "missing": []}'))
    example = Path(__file__).resolve().parent.parent / "examples" / "pydantic_ai_claude.yaml"
    run = engine.run(example)
    assert run.status == "completed", run.reason
    assert run.result == [f"About the {s}. Two sentences." for s in ("moon", "sun", "shore")]
    bodies = [r.body for r in anthropic.requests]
    assert {b["model"] for b in bodies} == {"claude-sonnet-4-5"}
    assert all(b["temperature"] == 0.3 for b in bodies)
    assert "You write short, plain English." in json.dumps(bodies[0].get("system"))
    work = attempts(engine, run.run_id)
    assert all(a.cost is not None and a.cost > 0 for a in work)


def test_a_used_runner_pickles_for_dask_and_the_copy_runs(anthropic: FakeAnthropic) -> None:
    cloudpickle = pytest.importorskip("cloudpickle")
    from wf_magic.runners.base import UnitRequest
    from wf_magic.runners.pydanticai import PydanticAIRunner

    options = {
        "model": "anthropic:claude-sonnet-4-5",
        "base_url": anthropic.url,
        "api_key_env": KEY_ENV,
    }
    runner = PydanticAIRunner(options)
    request = UnitRequest(
        run_id="r",
        step_id="a",
        unit_id="a",
        dispatch_id="d",
        attempt=1,
        kind="prompt",
        prompt="one",
    )
    copy = None
    try:
        assert runner.run(request).output == "echo: one"
        copy = cloudpickle.loads(cloudpickle.dumps(runner))
        assert copy.run(request).output == "echo: one"
    finally:
        runner.close()
        if copy is not None:
            copy.close()


@pytest.mark.parametrize(
    ("change", "dispatched"),
    [
        ("system_prompt: 'Be terse.'", True),
        ("temperature: 0.1", True),
        ("timeout_s: 30", False),
        ("prices: {'anthropic:claude-sonnet-4-5': 0}", False),
    ],
)
def test_a_settings_change_re_dispatches_only_when_it_can_change_the_answer(
    engine: Engine, anthropic: FakeAnthropic, change: str, dispatched: bool
) -> None:
    base = workflow(anthropic.url, "anthropic:claude-sonnet-4-5")
    engine.run(base)
    changed = base.replace(f"api_key_env: {KEY_ENV}}}", f"api_key_env: {KEY_ENV}, {change}}}")
    assert changed != base
    again = engine.run(changed, new=True)
    assert again.status == "completed", again.reason
    assert [a.status for a in attempts(engine, again.run_id)] == [
        "succeeded" if dispatched else "reused"
    ]
    assert len(anthropic.requests) == (2 if dispatched else 1)
