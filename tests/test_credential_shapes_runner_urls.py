"""Credentialed URLs in runner errors (issue 31, item 4): a base URL holding a key (userinfo,
``?key=``, ``&sig=``, ``?api_key=``) never reaches the CLI's output or any file under the
state dir in clear when the server cannot be reached; and the words a model library says
about a URL pass through :func:`mask_url`'s rule in every runner's messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers_secrets import files_holding, wf
from wf_magic import Engine
from wf_magic.runners import bounded_http, llm_models, openai_chat, pydanticai

CANARY = st.from_regex(r"Qk[A-Za-z0-9]{2,14}", fullmatch=True)
"""A credential's value, short ones too (``Qk`` marks it: nothing else in a run holds it)."""


@st.composite
def credentialed_urls(draw: st.DrawFn) -> tuple[str, str]:
    """A base URL to a closed loopback port holding ``canary`` as a credential."""
    canary = draw(CANARY)
    where = draw(st.sampled_from(["userinfo", "query", "later query", "fragment"]))
    name = draw(st.sampled_from(["key", "sig", "api_key", "access_token", "X-Amz-Signature"]))
    if where == "userinfo":
        return f"http://user:{canary}@127.0.0.1:1/v1", canary
    if where == "query":
        return f"http://127.0.0.1:1/v1?{name}={canary}", canary
    if where == "later query":
        return f"http://127.0.0.1:1/v1?a=1&{name}={canary}&sig=x", canary
    return f"http://127.0.0.1:1/v1#{name}={canary}", canary


FLOW = """\
name: o
runner: openai
steps:
  - id: a
    prompt: hello
    model: m
    retry: {max_attempts: 1}
"""


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=credentialed_urls())
def test_a_credentialed_base_url_is_masked_in_the_cli_output_and_the_state_dir(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, str]
) -> None:
    url, canary = case
    root = tmp_path_factory.mktemp("url")
    flow = root / "o.yaml"
    flow.write_text(FLOW, encoding="utf-8")
    state = root / "state"
    before = os.environ.get("WF_MAGIC_OPENAI_BASE_URL")
    os.environ["WF_MAGIC_OPENAI_BASE_URL"] = url
    try:
        code, shown = wf(state, "run", str(flow))
    finally:
        if before is None:
            del os.environ["WF_MAGIC_OPENAI_BASE_URL"]
        else:
            os.environ["WF_MAGIC_OPENAI_BASE_URL"] = before
    assert code != 0 and "could not connect" in shown, shown
    assert canary not in shown, shown
    with Engine(state) as engine:
        run_id = engine.list_runs()[0].run_id
    for verb in (("status", run_id), ("journal", run_id), ("events", run_id)):
        assert canary not in wf(state, *verb)[1]
    assert files_holding(state, canary) == []


@pytest.mark.parametrize("clip", [openai_chat._clip, pydanticai._clip, llm_models._clip])
@given(case=credentialed_urls())
def test_what_a_library_says_about_a_url_is_masked_in_every_runners_message(
    clip: object, case: tuple[str, str]
) -> None:
    url, canary = case
    said = f"Client error '404 Not Found' for url '{url}/chat/completions'"
    assert callable(clip)
    shown = clip(said)
    assert canary not in shown and "127.0.0.1:1" in shown


def test_a_cut_connections_words_are_masked() -> None:
    inner = ConnectionResetError(f"reset talking to http://127.0.0.1:1/v1?key=Qk{'a' * 6}")
    outer = RuntimeError("stream broke")
    outer.__cause__ = inner
    assert "Qkaaaaaa" not in bounded_http.cut_words(outer)


def test_the_openai_runners_provider_and_endpoint_hold_no_credential(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WF_MAGIC_OPENAI_BASE_URL", "http://u:QkPass1@127.0.0.1:1/v1?key=QkKey1")
    runner = openai_chat.OpenAIChatRunner(openai_chat.OpenAIChatOptions.parse({}, name="openai"))
    assert "Qk" not in runner.endpoint
    assert "Qk" not in runner.limit_key("m")
