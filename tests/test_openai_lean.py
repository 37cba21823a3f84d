"""The ``openai`` runner's read-whole path (``runners/openai_reply.py``) skips the SDK's
object layer; for every reply a server can give it must end exactly as the SDK's own
``create`` would: the same kept reply, or the same error line and transience."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.openai_server import FakeChatServer, chat_runner, isolate_openai_env, unit_request
from wf_magic.errors import RunnerError
from wf_magic.runners import openai_reply
from wf_magic.runners.base import UnitResult

KEY_ENV = "WF_TEST_OPENAI_KEY"
KEY = "sk-lean-5e1f0c2a9b8d7e6f"

_texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_counts = st.one_of(st.none(), st.integers(0, 10_000))
_usage = st.one_of(
    st.none(),
    st.fixed_dictionaries({}, optional={"prompt_tokens": _counts, "completion_tokens": _counts}),
)
_message = st.fixed_dictionaries(
    {"role": st.just("assistant")},
    optional={"content": st.one_of(st.none(), _texts), "refusal": st.one_of(st.none(), _texts)},
)
_choices = st.one_of(
    st.none(),
    st.just([]),
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"index": st.just(0), "message": _message}),
            st.fixed_dictionaries({"index": st.just(0), "message": _message}),
            st.fixed_dictionaries({"index": st.just(0), "finish_reason": st.just("stop")}),
        ),
        min_size=1,
        max_size=3,
    ),
)
_completion = st.fixed_dictionaries(
    {"object": st.just("chat.completion"), "choices": _choices},
    optional={
        "id": st.one_of(st.none(), _texts),
        "model": st.one_of(st.none(), _texts),
        "usage": _usage,
    },
) | st.fixed_dictionaries({}, optional={"id": _texts, "usage": _usage})
_error_body = st.one_of(
    st.fixed_dictionaries({"error": st.fixed_dictionaries({}, optional={"message": _texts})}),
    st.fixed_dictionaries({}, optional={"message": _texts, "detail": _texts}),
    _texts,  # plain text, or nothing at all
)
_failure = st.tuples(
    st.sampled_from([400, 401, 403, 404, 408, 409, 418, 422, 425, 500, 502, 503]), _error_body
)
_answers = st.one_of(
    st.tuples(st.just(200), _completion), st.tuples(st.just(200), _completion), _failure
)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as running:
        yield running


def outcome(server: FakeChatServer, tmp_path: Any, status: int, body: Any, lean: bool) -> Any:
    """What one unit ends as, with the read-whole path on or off."""
    runner = chat_runner(
        {"base_url": server.url, "api_key_env": KEY_ENV, "model": "m", "json_mode": False},
        tmp_path,
    )
    server.push(status, body)
    saved = openai_reply._lean_of
    if not lean:
        openai_reply._lean_of = lambda client: None  # type: ignore[assignment]
    try:
        result: UnitResult = runner.run(
            unit_request(
                step_id="u", unit_id="u", dispatch_id="d-1", input_hash="h" * 64, prompt="p"
            )
        )
    except RunnerError as exc:
        return ("error", str(exc), exc.transient, exc.throttled)
    finally:
        openai_reply._lean_of = saved
        runner.close()
    return ("ok", result.output, result.tokens_in, result.tokens_out, result.session_id)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(answer=_answers)
def test_the_lean_path_ends_as_the_sdk_does(
    server: FakeChatServer,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    answer: tuple[int, Any],
) -> None:
    isolate_openai_env(monkeypatch, KEY_ENV, KEY)
    status, body = answer
    sdk = outcome(server, tmp_path, status, body, lean=False)
    lean = outcome(server, tmp_path, status, body, lean=True)
    assert lean == sdk, (status, body)


def test_the_lean_path_sends_what_the_sdk_sends(
    server: FakeChatServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_openai_env(monkeypatch, KEY_ENV, KEY)
    server.requests.clear()
    outcome(server, tmp_path, 200, {"choices": [{"message": {"content": "a"}}]}, lean=False)
    outcome(server, tmp_path, 200, {"choices": [{"message": {"content": "a"}}]}, lean=True)
    sdk, lean = server.requests[-2:]
    assert lean.body == sdk.body == {"model": "m", "messages": [{"role": "user", "content": "p"}]}
    for name in ("authorization", "idempotency-key", "x-request-id", "content-type", "accept"):
        assert lean.headers[name] == sdk.headers[name], name
    assert lean.headers["authorization"] == f"Bearer {KEY}"
    assert lean.headers["accept-encoding"] == "identity"  # the byte bound's hook ran


def test_a_non_json_success_body_is_a_permanent_failure_on_both_paths(
    server: FakeChatServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_openai_env(monkeypatch, KEY_ENV, KEY)
    sdk = outcome(server, tmp_path, 200, [1, 2], lean=False)
    lean = outcome(server, tmp_path, 200, [1, 2], lean=True)
    assert sdk[0] == lean[0] == "error"
    assert sdk[2] is lean[2] is False
    assert "no chat completion (a JSON list)" in lean[1]
    assert json.dumps([1, 2]) not in lean[1]
