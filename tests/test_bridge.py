"""The bridge (issue 35 item 1): a per-attempt loopback endpoint that relays an agent CLI's
model calls upstream as they stream, behind a secret path, keeping counts and never
credentials. Bridge-level tests use a real HTTP client and a real loopback upstream; the
real Claude Code and Codex CLIs are driven through it to the fake backend
(tests/agent_backends.py)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agent_backends import USAGE_IN, USAGE_OUT, Backend, Step, start_backend
from tests.agent_fakes.bins import git_repo
from tests.conftest import run_wf, spawn_wf, wait_for
from tests.helpers_http import LoopbackHTTPServer, isolate_loopback_env
from tests.test_agents_real import KEYS, real_workflow, work
from wf_magic import Engine
from wf_magic.bridge.server import MAX_REQUEST_BYTES, Bridge, CallRecord
from wf_magic.bridge.usage import CallUsage, dialect_of

# -- a loopback upstream whose SSE answer is paced by the test ------------------------------


class Upstream:
    """A fake provider: records requests; streams two SSE events, the second only once
    ``release`` is set (or at once when ``paced`` is false)."""

    def __init__(self, *, paced: bool = False) -> None:
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        self.last_sent = threading.Event()
        self.paced = paced
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                upstream.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": raw,
                    }
                )
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                start = {
                    "type": "message_start",
                    "message": {"model": "claude-x", "usage": {"input_tokens": 7}},
                }
                self.wfile.write(f"event: message_start\ndata: {json.dumps(start)}\n\n".encode())
                self.wfile.flush()
                if upstream.paced:
                    upstream.release.wait(10)
                end = {"type": "message_delta", "usage": {"output_tokens": 3}}
                self.wfile.write(f"event: message_delta\ndata: {json.dumps(end)}\n\n".encode())
                self.wfile.flush()
                upstream.last_sent.set()
                self.close_connection = True

        self.server = LoopbackHTTPServer(Handler, name="bridge-upstream")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[Upstream]:
    isolate_loopback_env(monkeypatch)
    served = Upstream()
    yield served
    served.release.set()
    served.server.stop()


@pytest.fixture
def bridge(upstream: Upstream) -> Iterator[tuple[Bridge, list[CallRecord]]]:
    seen: list[CallRecord] = []
    opened = Bridge.open(upstream=upstream.url, on_call=seen.append)
    yield opened, seen
    opened.close()


def _post(url: str, **kw: Any) -> httpx.Response:
    return httpx.post(url, content=b'{"model": "claude-x"}', timeout=10, trust_env=False, **kw)


def test_the_first_sse_chunk_reaches_the_client_before_the_upstream_sends_the_last(
    upstream: Upstream, bridge: tuple[Bridge, list[CallRecord]]
) -> None:
    upstream.paced = True
    opened, seen = bridge
    with httpx.Client(trust_env=False, timeout=10) as client:
        with client.stream("POST", opened.url + "/v1/messages", content=b"{}") as response:
            chunks = response.iter_bytes()
            first = next(chunks)
            assert b"message_start" in first
            assert not upstream.last_sent.is_set()  # the rest is still held upstream
            upstream.release.set()
            rest = b"".join(chunks)
    assert b"message_delta" in rest
    wait_for(lambda: len(seen) == 1, timeout=5, what="the call record")
    [record] = seen
    assert (record.model, record.status, record.tokens_in, record.tokens_out) == (
        "claude-x",
        "ok",
        7,
        3,
    )


BAD_PATHS = [
    "/v1/messages",
    "/",
    "/{secret}x/v1/messages",
    "/{short}/v1/messages",
    "/x{secret}/v1/messages",
    "//{secret}/v1/messages",
    "/{upper}/v1/messages",
    "/..%2F{secret}/v1/messages",
]


@pytest.mark.parametrize("shape", BAD_PATHS)
def test_a_request_without_the_attempts_secret_is_refused_and_never_forwarded(
    upstream: Upstream, bridge: tuple[Bridge, list[CallRecord]], shape: str
) -> None:
    opened, seen = bridge
    path = shape.format(
        secret=opened.secret, short=opened.secret[:-1], upper=opened.secret.swapcase()
    )
    response = _post(f"http://127.0.0.1:{opened.port}{path}")
    assert response.status_code == 404
    assert upstream.requests == [] and seen == []


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=60))
def test_no_guessed_path_passes_the_secret(
    upstream: Upstream, bridge: tuple[Bridge, list[CallRecord]], guess: str
) -> None:
    opened, _ = bridge
    with socket.create_connection(("127.0.0.1", opened.port), timeout=5) as sock:
        sock.sendall(f"POST /{guess} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n".encode())
        head = sock.recv(64)
    assert head.startswith((b"HTTP/1.1 404", b"HTTP/1.1 431")) or head == b""
    assert upstream.requests == []


def test_credentials_reach_the_upstream_and_no_call_record_keeps_them(
    upstream: Upstream, bridge: tuple[Bridge, list[CallRecord]]
) -> None:
    canary = "sk-ant-CANARY-35-b7f1"
    opened, seen = bridge
    response = _post(
        opened.url + "/v1/messages?beta=true",
        headers={"x-api-key": canary, "authorization": f"Bearer {canary}"},
    )
    assert response.status_code == 200
    [request] = upstream.requests
    assert request["path"] == "/v1/messages?beta=true"
    assert request["headers"]["x-api-key"] == canary
    assert request["headers"]["authorization"] == f"Bearer {canary}"
    wait_for(lambda: len(seen) == 1, timeout=5, what="the call record")
    assert canary not in repr(seen)


def test_the_port_is_closed_when_the_bridge_closes(upstream: Upstream) -> None:
    opened = Bridge.open(upstream=upstream.url, on_call=lambda record: None)
    assert _post(opened.url + "/v1/messages").status_code == 200
    opened.close()
    with pytest.raises(httpx.ConnectError):
        _post(opened.url + "/v1/messages")


def test_a_request_body_over_the_bound_is_refused_413_unread(
    upstream: Upstream, bridge: tuple[Bridge, list[CallRecord]]
) -> None:
    opened, _ = bridge
    with socket.create_connection(("127.0.0.1", opened.port), timeout=5) as sock:
        head = (
            f"POST /{opened.secret}/v1/messages HTTP/1.1\r\nhost: x\r\n"
            f"content-length: {MAX_REQUEST_BYTES + 1}\r\n\r\n"
        )
        sock.sendall(head.encode())
        assert sock.recv(64).startswith(b"HTTP/1.1 413")
    assert upstream.requests == []


def test_an_unreachable_upstream_is_a_502_and_an_error_call() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{free.getsockname()[1]}"
    seen: list[CallRecord] = []
    opened = Bridge.open(upstream=dead, on_call=seen.append)
    try:
        assert _post(opened.url + "/v1/messages").status_code == 502
        wait_for(lambda: len(seen) == 1, timeout=5, what="the call record")
    finally:
        opened.close()
    assert (seen[0].status, seen[0].http_status, seen[0].error) == (
        "error",
        None,
        "upstream unreachable (ConnectError)",
    )


# -- usage read from each wire dialect -------------------------------------------------------


def _sse(*objects: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(o)}\n\n".encode() for o in objects)


USAGE_CASES = [
    (  # Anthropic: the cached input beside input_tokens; the delta's output count wins
        "/v1/messages?beta=true",
        _sse(
            {
                "type": "message_start",
                "message": {
                    "model": "claude-sonnet-4-5",
                    "usage": {
                        "input_tokens": 10,
                        "cache_read_input_tokens": 100,
                        "cache_creation_input_tokens": 5,
                        "output_tokens": 1,
                    },
                },
            },
            {"type": "message_delta", "usage": {"output_tokens": 42}},
        ),
        ("claude-sonnet-4-5", 115, 42, 100, 5),
    ),
    (
        "/v1/responses",
        _sse(
            {"type": "response.created", "response": {"model": "gpt-5.5"}},
            {
                "type": "response.completed",
                "response": {
                    "model": "gpt-5.5",
                    "usage": {
                        "input_tokens": 50,
                        "input_tokens_details": {"cached_tokens": 20},
                        "output_tokens": 9,
                    },
                },
            },
        ),
        ("gpt-5.5", 50, 9, 20, 0),
    ),
    (
        "/v1/chat/completions",
        _sse(
            {"model": "m", "choices": []},
            {
                "model": "m",
                "choices": [],
                "usage": {
                    "prompt_tokens": 30,
                    "completion_tokens": 4,
                    "prompt_tokens_details": {"cached_tokens": 3},
                },
            },
        ),
        ("m", 30, 4, 3, 0),
    ),
    (
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        _sse(
            {
                "modelVersion": "gemini-2.5-flash",
                "usageMetadata": {
                    "promptTokenCount": 12,
                    "candidatesTokenCount": 6,
                    "thoughtsTokenCount": 2,
                    "cachedContentTokenCount": 4,
                },
            }
        ),
        ("gemini-2.5-flash", 12, 8, 4, 0),
    ),
]


@pytest.mark.parametrize(("path", "body", "expected"), USAGE_CASES)
@pytest.mark.parametrize("split", [1, 7, 10_000])
def test_usage_is_read_from_each_dialect_however_the_stream_is_cut(
    path: str, body: bytes, expected: tuple[Any, ...], split: int
) -> None:
    usage = CallUsage(dialect=dialect_of(path))
    for start in range(0, len(body), split):
        usage.feed(body[start : start + split])
    usage.finish()
    got = (usage.model, usage.tokens_in, usage.output, usage.cache_read, usage.cache_write)
    assert got == expected


def test_a_plain_json_answer_is_read_whole() -> None:
    usage = CallUsage(dialect="anthropic")
    usage.finish(
        json.dumps({"model": "claude-x", "usage": {"input_tokens": 3, "output_tokens": 2}}).encode()
    )
    assert (usage.model, usage.tokens_in, usage.output) == ("claude-x", 3, 2)


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).filter(
            lambda f: not (math.isfinite(f) and f >= 0 and f == int(f))
        ),
        st.integers(max_value=-1),
        st.booleans(),
        st.text(max_size=5),
        st.none(),
        st.lists(st.integers(), max_size=2),
    )
)
def test_a_usage_number_that_is_no_count_is_ignored(bad: Any) -> None:
    usage = CallUsage(dialect="responses")
    usage.fold({"usage": {"input_tokens": 5, "output_tokens": 2}})
    usage.fold({"usage": {"input_tokens": bad, "output_tokens": bad}})
    assert (usage.tokens_in, usage.output) == (5, 2)


# -- the real CLIs through the bridge --------------------------------------------------------


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """The loopback fake provider the real CLIs' calls reach through the bridge."""
    isolate_loopback_env(monkeypatch)
    served = start_backend()
    yield served
    served.stop()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_repo(tmp_path / "repo")


CLIS = ["claude", "codex"]


def _model_requests(served: Backend) -> list[dict[str, Any]]:
    return [
        r for r in served.requests if r["path"].split("?")[0].endswith(("/messages", "/responses"))
    ]


@pytest.mark.parametrize("name", CLIS)
def test_real_every_call_is_journaled_and_the_attempt_is_their_sum(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    path = real_workflow(
        name, repo, backend, monkeypatch, tmp_path, "Make [[write hello.txt]]", extra="timeout: 120"
    )
    run = engine.run(str(path))
    assert run.status == "completed", run.reason
    [attempt] = work(engine, run.run_id)
    calls = engine.calls(run.run_id)
    served = _model_requests(backend)
    assert len(served) == 2  # the tool call, then the answer
    assert list(calls["call"]) == [1, 2]
    assert list(calls["model"]) == [r["body"]["model"] for r in served]
    assert list(calls["status"]) == ["ok", "ok"]
    assert list(calls["tokens_in"]) == [USAGE_IN, USAGE_IN]
    assert list(calls["tokens_out"]) == [USAGE_OUT, USAGE_OUT]
    assert set(calls["dispatch_id"]) == {attempt.dispatch_id}
    assert (attempt.tokens_in, attempt.tokens_out) == (2 * USAGE_IN, 2 * USAGE_OUT)
    assert attempt.cost == pytest.approx(float(calls["cost"].sum()))
    assert all(s.startswith("genai-prices ") for s in calls["price_source"])
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None
    assert facts["bridge"]["calls"] == 2
    report = facts["bridge"]["cli_report"]
    assert (report["tokens_in"], report["tokens_out"]) == (2 * USAGE_IN, 2 * USAGE_OUT)
    assert (repo / "hello.txt").read_text() == "written by the agent\n"
    shown = run_wf(engine.state_dir, "show", run.run_id, "fix")
    assert "calls      2 through the bridge: 240 in / 16 out" in shown.stdout
    assert "DISAGREE" not in shown.stdout


@pytest.mark.parametrize("name", CLIS)
def test_real_credentials_never_reach_the_journal_events_or_logs(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    canary = f"{KEYS[name]}-CANARY-35"
    path = real_workflow(name, repo, backend, monkeypatch, tmp_path, "Fix.", extra="timeout: 120")
    key = "ANTHROPIC_API_KEY" if name == "claude" else "FAKE_OPENAI_KEY"
    monkeypatch.setenv(key, canary)
    backend.script.append(Step(status=401))  # the error text goes through the journal too
    run = engine.run(str(path))
    assert run.status == "failed"
    served = _model_requests(backend)
    sent = served[0]["headers"].get("x-api-key") or served[0]["headers"].get("authorization")
    assert canary in sent  # the user's key went upstream, through the bridge
    calls = engine.calls(run.run_id)
    assert list(calls["status"]) == ["error"]
    assert str(calls["error"][0]).startswith("HTTP 401")
    engine.close()
    leaked = [
        p for p in engine.state_dir.rglob("*") if p.is_file() and canary.encode() in p.read_bytes()
    ]
    assert leaked == []


def test_real_bridge_false_in_runners_leaves_the_cli_unbridged(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    path = real_workflow(
        "claude", repo, backend, monkeypatch, tmp_path, "Fix.", extra="timeout: 120"
    )
    path.write_text(path.read_text().replace("{bin: ", "{bridge: false, bin: "))
    run = engine.run(str(path))
    assert run.status == "completed", run.reason
    [attempt] = work(engine, run.run_id)
    assert engine.calls(run.run_id).empty
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None and "bridge" not in facts
    assert facts["cost_source"] == "estimate: Claude Code's own price table"
    assert attempt.cost == json.loads(facts["final_json"])["total_cost_usd"]


@pytest.mark.parametrize("name", CLIS)
def test_real_killed_driver_keeps_its_calls_and_a_resume_continues_the_numbering(
    state_dir: Path,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    path = real_workflow(
        name, repo, backend, monkeypatch, tmp_path, "Make [[write hello.txt]]", extra="timeout: 120"
    )
    backend.script.extend([Step(), Step(delay_s=60)])  # the second call hangs upstream
    driver = spawn_wf(state_dir, "run", str(path))
    engine = Engine(state_dir)
    try:
        wait_for(lambda: len(_model_requests(backend)) >= 2, timeout=90, what="the second call")
        runs = engine.store.runs_frame()
        run_id = str(runs["run"].iloc[0]) if "run" in runs else str(runs["run_id"].iloc[0])
        wait_for(lambda: len(engine.calls(run_id)) == 1, timeout=10, what="the first call row")
    finally:
        if driver.poll() is None:
            os.kill(driver.pid, signal.SIGKILL)
        driver.communicate(timeout=10)
    before = engine.calls(run_id)
    assert list(before["call"]) == [1] and list(before["tokens_in"]) == [USAGE_IN]
    backend.script.clear()
    done = run_wf(state_dir, "resume", run_id, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    after = engine.calls(run_id)
    [attempt] = work(engine, run_id)
    mine = after[after["dispatch_id"] == attempt.dispatch_id]
    assert list(mine["call"]) == list(range(1, len(mine) + 1))
    assert len(mine) >= 2 and mine["call"].iloc[0] == 1
    assert (attempt.tokens_in, attempt.tokens_out) == (
        int(mine["tokens_in"].sum()),
        int(mine["tokens_out"].sum()),
    )
    engine.close()
    time.sleep(0.1)


# -- budgets bind mid-agent (issue 35 item 3) ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ceiling"),
    # Claude also gets --max-budget-usd (the second line of defence), which stops it on its
    # own before the bridge must refuse a max_cost call: its max_tokens case shows the bridge.
    [("claude", "max_tokens: 100"), ("codex", "max_tokens: 100"), ("codex", "max_cost: 0.0004")],
)
def test_real_a_budget_stops_the_agent_at_the_call_that_would_pass_it(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    ceiling: str,
) -> None:
    path = real_workflow(
        name,
        repo,
        backend,
        monkeypatch,
        tmp_path,
        "Make [[write hello.txt]]",
        extra="timeout: 120",
        top=f"budget: {{{ceiling}}}\n",
    )
    run = engine.run(str(path))
    calls = engine.calls(run.run_id)
    assert len(_model_requests(backend)) == 1  # call 2 never went upstream
    assert list(calls["status"]) == ["ok", "refused"]
    [attempt] = work(engine, run.run_id)
    key = ceiling.split(":")[0]
    assert run.status == "failed"
    said = f"step fix: Budget exceeded in run {run.run_id}: {key} used "
    assert run.reason is not None and run.reason.startswith(said)
    assert "call 2 of unit fix was refused by the bridge and the agent stopped" in run.reason
    assert attempt.failure == run.reason.removeprefix("step fix: ") and not attempt.transient
    assert (attempt.tokens_in, attempt.tokens_out) == (USAGE_IN, USAGE_OUT)  # charged once
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None and facts["error_class"] == "budget"


ALLOWANCE_CASES = [
    # (max_tokens, max_cost, charged tokens, charged cost, attempt tokens, attempt cost, refused)
    (100, None, 0, 0.0, 0, 0.0, None),
    (100, None, 0, 0.0, 99, 0.0, None),
    (100, None, 0, 0.0, 100, 0.0, "max_tokens"),
    (100, None, 60, 0.0, 40, 0.0, "max_tokens"),  # what other attempts were charged counts
    (None, 1.0, 0, 0.5, 0, 0.49, None),
    (None, 1.0, 0, 0.5, 0, 0.5, "max_cost"),
    (1000, 1.0, 0, 0.0, 2000, 0.0, "max_tokens"),
]


@pytest.mark.parametrize(
    ("tokens", "cost", "used_t", "used_c", "spent_t", "spent_c", "hit"), ALLOWANCE_CASES
)
def test_the_call_allowance_refuses_once_the_spend_reaches_a_ceiling(
    tokens: int | None,
    cost: float | None,
    used_t: int,
    used_c: float,
    spent_t: int,
    spent_c: float,
    hit: str | None,
) -> None:
    from wf_magic.drive.agentunits import CallAllowance
    from wf_magic.drive.budget import Budget
    from wf_magic.spec.models import BudgetSpec

    budget = Budget(
        root_run_id="r-1",
        spec=BudgetSpec(max_tokens=tokens, max_cost=cost),
        tokens=used_t,
        cost=used_c,
    )
    said = CallAllowance(budget).refusal(
        run_id="r-1", unit_id="u", tokens=spent_t, cost=spent_c, call=3
    )
    if hit is None:
        assert said is None
    else:
        assert said is not None and said.startswith(f"Budget exceeded in run r-1: {hit} used ")
        assert "call 3 of unit u was refused by the bridge" in said


# -- shared limits (issue 35 item 4) ---------------------------------------------------------


@pytest.mark.parametrize("name", CLIS)
def test_real_a_429_storm_is_absorbed_by_the_bridge_and_the_cli_sees_none(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    backend.script.extend([Step(status=429)] * 3)
    path = real_workflow(
        name, repo, backend, monkeypatch, tmp_path, "Make [[write hello.txt]]", extra="timeout: 120"
    )
    run = engine.run(str(path))
    assert run.status == "completed", run.reason  # its own retries are off: it saw no 429
    [attempt] = work(engine, run.run_id)
    assert attempt.attempt == 1
    assert len(_model_requests(backend)) == 3 + 2  # three refusals, then the two calls
    calls = engine.calls(run.run_id)
    assert list(calls["status"]) == ["ok", "ok"]
    throttled = [
        json.loads(e.data_json or "{}")
        for e in engine.store.events_after(run.run_id)
        if e.kind == "throttled"
    ]
    assert len(throttled) == 3
    # Claude's upstream is a pass_env value, masked like every one; Codex's is in its config.
    upstream = "***" if name == "claude" else f"{backend.url}/v1"
    assert [t["cause"] for t in throttled] == [
        f"HTTP 429 from {upstream} (refusal {n})" for n in (1, 2, 3)
    ]
    assert {t["endpoint"] for t in throttled} == {f"bridge {name} {upstream}"}


# -- bridge: on the step and per harness (fast: the fake CLIs) -------------------------------

BRIDGE_SETTINGS = [
    # (runners: bridge, step bridge:, bridged)
    (None, None, True),
    (False, None, False),
    (True, False, False),
    (False, True, True),
    (None, False, False),
]


@pytest.mark.parametrize(("in_runners", "on_step", "bridged"), BRIDGE_SETTINGS)
def test_the_steps_bridge_wins_over_the_harness_setting(
    engine: Engine,
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    in_runners: bool | None,
    on_step: bool | None,
    bridged: bool,
) -> None:
    from tests.agent_fakes.bins import make_bins

    bins = make_bins(tmp_path / "bin")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/user-given")
    runner = f"bridge: {str(in_runners).lower()}, " if in_runners is not None else ""
    step = f"    bridge: {str(on_step).lower()}\n" if on_step is not None else ""
    path = repo / "wf.yaml"
    path.write_text(
        "name: bridged\nsteps:\n  - id: fix\n    agent: claude\n"
        '    prompt: "[[echo-env ANTHROPIC_BASE_URL]]"\n    pass_env: [ANTHROPIC_BASE_URL]\n'
        f"{step}runners:\n  claude: {{{runner}bin: {bins['claude']}}}\n"
    )
    run = engine.run(str(path))
    assert run.status == "completed", run.reason
    said = str(run.result)
    if bridged:  # the CLI was given the bridge, never the user's URL
        assert re.search(r"http://127\.0\.0\.1:\d+/[A-Za-z0-9_-]{32}", said), said
        assert "user-given" not in said
    else:
        assert "user-given" in said or "***" in said  # its own (a pass_env value is masked)


def _options_refusal(engine: Engine, repo: Path, tmp_path: Path, option: str) -> str:
    """The one-line refusal of a claude step whose ``runners:`` entry holds ``option``."""
    from tests.agent_fakes.bins import make_bins
    from wf_magic.errors import DefinitionError

    bins = make_bins(tmp_path / "bin")
    path = repo / "wf.yaml"
    path.write_text(
        "name: bridged\nsteps:\n  - id: fix\n    agent: claude\n    prompt: hi\n"
        f"runners:\n  claude: {{{option}, bin: {bins['claude']}}}\n"
    )
    with pytest.raises(DefinitionError) as caught:
        engine.run(str(path))
    return str(caught.value)


@pytest.mark.parametrize("bad", ["yes", "1", "[true]", "{a: 1}", "null-ish"])
def test_a_bridge_option_that_is_no_boolean_is_one_line_naming_it(
    engine: Engine, repo: Path, tmp_path: Path, bad: str
) -> None:
    said = _options_refusal(engine, repo, tmp_path, f"bridge: {bad}")
    assert said.startswith("runners.claude: runner options rejected: bridge: expected true or")
    assert len(said.splitlines()) == 1 and "wf.yaml, line 7" in said


def test_a_harness_that_cannot_be_bridged_runs_with_one_warning_naming_it(
    engine: Engine, repo: Path, tmp_path: Path
) -> None:
    from tests.agent_fakes.bins import make_bins

    bins = make_bins(tmp_path / "bin")
    path = repo / "wf.yaml"
    path.write_text(
        "name: unbridged\nsteps:\n  - id: fix\n    agent: opencode\n    prompt: hi\n"
        f"    map: '{{{{ [1, 2, 3] }}}}'\nrunners:\n  opencode: {{bin: {bins['opencode']}}}\n"
    )
    run = engine.run(str(path))
    assert run.status == "completed", run.reason
    warned = [
        json.loads(e.data_json or "{}")
        for e in engine.store.events_after(run.run_id)
        if e.kind == "warning"
    ]
    assert [w["reason"] for w in warned] == ["bridge"]
    assert warned[0]["message"].startswith("opencode: not bridged (")


# -- limits: per harness, as a model runner's (fast) -------------------------------------------


def test_a_harness_limits_set_its_bridged_endpoints_ceiling_and_pacing() -> None:
    from wf_magic.drive.agentunits import BridgeLimits
    from wf_magic.drive.limiter import LIMITERS

    endpoint = "bridge claude http://127.0.0.1:9/limits-test"
    options = {"limits": {"m1": {"concurrency": 2, "rpm": 120}, "*": {"tpm": 9000}}}
    try:
        BridgeLimits(None).limits(endpoint, {}, options=options, model="m1")  # type: ignore[arg-type]
        [state] = [s for s in LIMITERS.states() if s.endpoint == endpoint]
        assert (state.max_limit, state.rpm, state.tpm) == (2, 120.0, None)
        other = endpoint + "/other"
        BridgeLimits(None).limits(other, {}, options=options, model="m2")  # type: ignore[arg-type]
        [state] = [s for s in LIMITERS.states() if s.endpoint == other]
        assert (state.max_limit, state.rpm, state.tpm) == (1024, None, 9000.0)
    finally:
        LIMITERS.clear()


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ("[1]", "claude.limits: expected a mapping of model → limits (got [1])"),
        ("{m: 3}", "claude.limits.m: expected a mapping of rpm, tpm, concurrency (got 3)"),
        ("{m: {rps: 3}}", "claude.limits.m: unknown key(s) rps; expected some of rpm, tpm"),
        ("{m: {rpm: -1}}", "claude.limits.m.rpm: expected a positive number (got -1)"),
        ("{'*': {concurrency: 1.5}}", "claude.limits.*.concurrency: expected a positive whole"),
    ],
)
def test_a_harness_limits_option_that_is_wrong_is_one_line_naming_it(
    engine: Engine, repo: Path, tmp_path: Path, limits: str, said: str
) -> None:
    text = _options_refusal(engine, repo, tmp_path, f"limits: {limits}")
    assert text.startswith(f"runners.claude: runner options rejected: {said}"), text
    assert len(text.splitlines()) == 1
