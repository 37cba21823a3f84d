"""Sampling settings on the ``openai`` runner (issue 34, item 6): runner options and a step's
``options:`` reach a real loopback server as the Chat Completions API names them, join the
input hash, and bad values are refused at freeze in one line."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.openai_server import FakeChatServer, chat_runner, isolate_openai_env, unit_request
from wf_magic import DefinitionError, Engine, load_workflow
from wf_magic.errors import RunnerError
from wf_magic.runners.sampling import SAMPLING_OPTIONS, check_sampling, check_step_options

KEY_ENV = "WF_TEST_SAMPLING_KEY"
SETTINGS = "temperature: 0.2, top_p: 0.9, seed: 7, stop: ['END'], max_tokens: 64"


@pytest.fixture(autouse=True)
def openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_openai_env(monkeypatch, KEY_ENV, "sampling-test-key")


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as running:
        yield running


@pytest.fixture
def engine(state_dir: Path) -> Iterator[Engine]:
    eng = Engine(state_dir)
    yield eng
    eng.close()


def workflow(url: str, steps: str, *, options: str = "", head: str = "") -> str:
    runner = f"{{base_url: '{url}', api_key_env: {KEY_ENV}, model: m1{options}}}"
    return (
        f"name: sampling\nrunner: openai\nrunners:\n  openai: {runner}\n{head}steps:\n"
        f"{textwrap.indent(textwrap.dedent(steps).strip(), '  ')}\n"
    )


def sent(request: Any) -> dict[str, Any]:
    """The sampling part of a recorded request body."""
    keys = ("temperature", "top_p", "seed", "stop", "max_tokens", "max_completion_tokens")
    return {k: request.body[k] for k in keys if k in request.body}


# -- what the server sees ------------------------------------------------------------------------
def test_runner_options_reach_the_server_as_the_api_names_them(
    engine: Engine, server: FakeChatServer
) -> None:
    src = workflow(
        server.url,
        "- {id: a, prompt: Say hi.}",
        options=f", {SETTINGS}, system_prompt: 'You are terse.'",
    )
    run = engine.run(src)
    assert run.status == "completed", run.reason
    (request,) = server.requests
    assert sent(request) == {
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["END"],
        "max_tokens": 64,
    }
    assert request.body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi."},
    ]


def test_no_settings_send_no_sampling_parameters(engine: Engine, server: FakeChatServer) -> None:
    run = engine.run(workflow(server.url, "- {id: a, prompt: Say hi.}"))
    assert run.status == "completed", run.reason
    assert sent(server.requests[0]) == {}
    assert server.requests[0].body["messages"] == [{"role": "user", "content": "Say hi."}]


def test_a_step_overrides_the_runner_settings_key_by_key(
    engine: Engine, server: FakeChatServer
) -> None:
    src = workflow(
        server.url,
        """
        - id: a
          prompt: First.
          options: {temperature: 1.5, stop: "STOP", system_prompt: "Be loud."}
        - id: b
          prompt: Second.
        """,
        options=f", {SETTINGS}, system_prompt: 'Be quiet.'",
    )
    run = engine.run(src)
    assert run.status == "completed", run.reason
    first, second = server.requests
    assert sent(first) == {
        "temperature": 1.5,
        "top_p": 0.9,
        "seed": 7,
        "stop": "STOP",
        "max_tokens": 64,
    }
    assert first.body["messages"][0] == {"role": "system", "content": "Be loud."}
    assert sent(second)["temperature"] == 0.2
    assert second.body["messages"][0] == {"role": "system", "content": "Be quiet."}


@pytest.mark.parametrize(
    ("setting", "offer", "param", "expected"),
    [
        (64, None, "max_tokens", {"max_tokens": 64}),
        (64, 20, "max_tokens", {"max_tokens": 20}),
        (10, 20, "max_tokens", {"max_tokens": 10}),
        (None, 20, "max_tokens", {"max_tokens": 20}),
        (None, None, "max_tokens", {}),
        (64, 20, "max_completion_tokens", {"max_completion_tokens": 20}),
        (10, None, "max_completion_tokens", {"max_completion_tokens": 10}),
    ],
)
def test_max_tokens_is_the_lower_of_the_setting_and_the_budget_offer(
    server: FakeChatServer,
    tmp_path: Path,
    setting: int | None,
    offer: int | None,
    param: str,
    expected: dict[str, int],
) -> None:
    options: dict[str, Any] = {"base_url": server.url, "api_key_env": KEY_ENV, "model": "m1"}
    options["max_tokens_param"] = param
    if setting is not None:
        options["max_tokens"] = setting
    runner = chat_runner(options, tmp_path)
    try:
        runner.run(
            unit_request(step_id="a", unit_id="a", dispatch_id="d-1", prompt="x", max_tokens=offer)
        )
    finally:
        runner.close()
    assert sent(server.requests[0]) == expected


def test_a_step_max_tokens_meets_the_run_budget_offer(
    engine: Engine, server: FakeChatServer
) -> None:
    src = workflow(
        server.url,
        """
        - {id: a, prompt: One., options: {max_tokens: 5}}
        - {id: b, prompt: Two., options: {max_tokens: 5000}}
        """,
        head="budget: {max_tokens: 1000}\n",
    )
    run = engine.run(src)
    assert run.status == "completed", run.reason
    first, second = server.requests
    assert first.body["max_tokens"] == 5
    assert second.body["max_tokens"] < 1000  # the budget's offer, lower than the setting


# -- the input hash ------------------------------------------------------------------------------
def test_a_changed_setting_changes_the_hash_and_is_not_reused(
    engine: Engine, server: FakeChatServer
) -> None:
    def run_with(step_options: str, runner_options: str = "") -> Any:
        steps = f"- {{id: a, prompt: Same prompt.{step_options}}}"
        run = engine.run(workflow(server.url, steps, options=runner_options), new=True)
        assert run.status == "completed", run.reason
        (attempt,) = [a for a in engine.attempts(run.run_id) if a.phase == "work"]
        return attempt

    plain = run_with("")
    again = run_with("")
    assert again.reused_from is not None and len(server.requests) == 1  # reuse works here
    step_temp = run_with(", options: {temperature: 0.7}")
    assert step_temp.reused_from is None and len(server.requests) == 2
    assert step_temp.input_hash != plain.input_hash
    same_step_temp = run_with(", options: {temperature: 0.7}")
    assert same_step_temp.reused_from is not None and len(server.requests) == 2
    other_temp = run_with(", options: {temperature: 0.8}")
    assert other_temp.reused_from is None and len(server.requests) == 3
    runner_seed = run_with("", ", seed: 3")
    assert runner_seed.reused_from is None and len(server.requests) == 4
    assert len({plain.input_hash, step_temp.input_hash, other_temp.input_hash}) == 3
    assert runner_seed.input_hash not in {plain.input_hash, step_temp.input_hash}
    assert server.requests[3].body["seed"] == 3


def test_a_plan_without_options_keeps_its_json_and_hash() -> None:
    plan = load_workflow("name: p\nrunner: openai\nsteps:\n  - {id: a, prompt: x}\n").plan
    assert '"options"' not in plan.to_json()
    with_options = load_workflow(
        "name: p\nrunner: openai\nsteps:\n  - {id: a, prompt: x, options: {seed: 1}}\n"
    ).plan
    assert with_options.steps[0].options == {"seed": 1}
    assert '"options":{"seed":1}' in with_options.to_json()


# -- bad values are refused at freeze ------------------------------------------------------------
def refusal(src: str) -> str:
    with pytest.raises(DefinitionError) as caught:
        load_workflow(src)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def step_source(options: str, runner: str = "openai") -> str:
    return (
        f"name: sampling\nrunner: {runner}\n"
        "runners: {openai: {model: m1, base_url: 'http://127.0.0.1:9/v1'}}\n"
        f"steps:\n  - id: answer\n    prompt: x\n    options: {options}\n"
    )


def test_an_unknown_step_option_names_the_step_and_key() -> None:
    message = refusal(step_source("{temprature: 0.2}"))
    assert "step 'answer'" in message and "options.temprature" in message
    assert "expected some of max_tokens, seed, stop, system_prompt, temperature, top_p" in message


def test_a_runner_without_settings_takes_no_options() -> None:
    src = (
        "name: sampling\nsteps:\n"
        "  - {id: lint, exec: [python, -c, 'print(1)'], options: {temperature: 0.2}}\n"
    )
    message = refusal(src)
    assert "step 'lint'" in message and "options.temperature" in message
    assert "the exec runner takes no options" in message


BAD_VALUES: dict[str, Any] = {
    "temperature": st.one_of(
        st.floats(max_value=-1e-9) | st.floats(min_value=2.0000001),
        st.just(math.nan),
        st.just(math.inf),
        st.text(max_size=3),
        st.booleans(),
        st.none(),
    ),
    "top_p": st.one_of(
        st.floats(max_value=-1e-9) | st.floats(min_value=1.0000001),
        st.just(math.nan),
        st.text(max_size=3),
        st.booleans(),
    ),
    "max_tokens": st.one_of(
        st.integers(max_value=0), st.floats(allow_nan=True), st.text(max_size=3), st.booleans()
    ),
    "seed": st.one_of(
        st.floats(allow_nan=True),
        st.integers(min_value=2**63),
        st.integers(max_value=-(2**63) - 1),
        st.text(max_size=3),
        st.booleans(),
    ),
    "stop": st.one_of(
        st.just(""),
        st.lists(st.text(min_size=1, max_size=3), min_size=5, max_size=8),
        st.just([]),
        st.lists(st.integers(), min_size=1, max_size=3),
        st.integers(),
        st.lists(st.just(""), min_size=1, max_size=2),
    ),
    "system_prompt": st.one_of(st.integers(), st.floats(), st.lists(st.text(), max_size=2)),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bad_values_are_refused_in_one_line_naming_the_key(data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(SAMPLING_OPTIONS))
    value = data.draw(BAD_VALUES[key])
    with pytest.raises(RunnerError) as caught:
        check_step_options({key: value}, kind="openai", where="step 'answer'")
    assert str(caught.value).startswith(f"step 'answer' options.{key}: expected ")
    with pytest.raises(RunnerError) as at_runner:
        check_sampling({key: value}, where="runners.openai")
    assert str(at_runner.value).startswith(f"runners.openai.{key}: expected ")


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ("{temperature: .nan}", "temperature"),
        ("{temperature: 2.5}", "temperature"),
        ("{top_p: -0.1}", "top_p"),
        ("{max_tokens: 0}", "max_tokens"),
        ("{max_tokens: 1.5}", "max_tokens"),
        ("{seed: 'x'}", "seed"),
        ("{seed: true}", "seed"),
        ("{stop: [a, b, c, d, e]}", "stop"),
        ("{stop: ''}", "stop"),
        ("{system_prompt: 3}", "system_prompt"),
    ],
)
def test_bad_step_values_are_refused_at_freeze(options: str, key: str) -> None:
    message = refusal(step_source(options))
    assert f"steps[0].options.{key}" in message and "line 7" in message
    if "nan" not in options:  # the YAML reader refuses .nan anywhere first, by path
        assert f"step 'answer' options.{key}: expected" in message


def test_bad_runner_values_are_refused_at_freeze() -> None:
    src = (
        "name: sampling\nrunner: openai\n"
        "runners: {openai: {model: m1, temperature: 3}}\nsteps:\n  - {id: a, prompt: x}\n"
    )
    message = refusal(src)
    assert "runners.openai.temperature: expected a finite number from 0 to 2 (got 3)" in message
    assert "line 3" in message


@settings(max_examples=60, deadline=None)
@given(
    temperature=st.floats(min_value=0, max_value=2),
    top_p=st.floats(min_value=0, max_value=1),
    seed=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    stop=st.one_of(
        st.text(min_size=1, max_size=5),
        st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4),
    ),
    max_tokens=st.integers(min_value=1, max_value=10**9),
)
def test_good_values_pass(
    temperature: float, top_p: float, seed: int, stop: Any, max_tokens: int
) -> None:
    options = {
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "stop": stop,
        "max_tokens": max_tokens,
        "system_prompt": "",
    }
    check_step_options(options, kind="openai", where="step 'answer'")
    check_step_options(options, kind="pydantic-ai", where="step 'answer'")


# -- pydantic-ai takes the same options ----------------------------------------------------------
def test_pydantic_ai_step_options_reach_the_server(
    engine: Engine, server: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "pai-key")
    src = (
        "name: native\nrunner: pydantic-ai\n"
        f"runners:\n  pydantic-ai: {{model: 'openai-chat:m1', base_url: '{server.url}',"
        " temperature: 0.3, system_prompt: 'Be brief.'}\n"
        "steps:\n  - id: a\n    prompt: Hi.\n"
        "    options: {temperature: 0.6, stop: [END], max_tokens: 9, seed: 4}\n"
    )
    run = engine.run(src)
    assert run.status == "completed", run.reason
    (request,) = server.requests
    # pydantic-ai's OpenAI chat model names the cap max_completion_tokens.
    assert sent(request) == {
        "temperature": 0.6,
        "seed": 4,
        "stop": ["END"],
        "max_completion_tokens": 9,
    }
    assert request.body["messages"][0] == {"role": "system", "content": "Be brief."}
