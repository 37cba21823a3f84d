"""Rate limits are the limiter's business (drive/limiter.py, drive/endpoints.py).

A call the provider refuses (429, 529) waits for the endpoint's pause and goes out again
inside the same attempt: no attempt row is added, no unit is charged, nothing fails; each
wait is one ``throttled`` event. One limiter per endpoint is shared by every drive of the
process: it cuts concurrency on a refusal, honours one ``Retry-After`` for every call in
flight, regrows additively, and paces known ``rpm`` limits so the provider never refuses.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic import Engine, UnitRequest, UnitResult, register_runner
from wf_magic.drive.limiter import LIMITERS, Limiter, Pacing, summary
from wf_magic.errors import RunnerError
from wf_magic.runners.base import BaseRunner


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the limiter alone ---------------------------------------------------------------------


def test_a_storm_of_refusals_cuts_the_limit_once_and_pauses_every_call_until_one_moment() -> None:
    clock = FakeClock()
    limiter = Limiter("e", max_limit=32, clock=clock)
    assert all(limiter.try_acquire() == 0.0 for _ in range(32))
    assert limiter.try_acquire() > 0  # the 33rd waits for a slot
    waits = [limiter.throttle(1.0) for _ in range(20)]  # 20 calls in flight come back 429
    for _ in range(20):
        limiter.release(ok=False)
    state = limiter.state()
    assert state.limit == 16  # one multiplicative cut for the whole storm
    assert state.throttles == 20
    assert waits == [1.0] * 20  # one Retry-After, honoured by every call in flight
    assert state.waited_s == 1.0
    assert limiter.try_acquire() == pytest.approx(1.0)  # paused: nobody goes out
    clock.now += 1.0
    assert limiter.try_acquire() == 0.0  # the pause is over


def test_a_refusal_after_the_cool_down_cuts_again_down_to_one_and_successes_regrow_it() -> None:
    clock = FakeClock()
    limiter = Limiter("e", max_limit=8, clock=clock)
    for _ in range(8):
        assert limiter.try_acquire() == 0.0
    for expected in (4, 2, 1, 1):
        limiter.throttle(0.0)
        assert limiter.state().limit == expected
        clock.now += 1.0
    for _ in range(8):
        limiter.release(ok=True)
    limiter_state = limiter.state()
    assert limiter_state.in_flight == 0
    grown = []
    for _ in range(40):
        assert limiter.try_acquire() == 0.0
        limiter.release(ok=True)
        grown.append(limiter.state().limit)
    assert grown == sorted(grown)  # additive: never a jump down without a refusal
    assert grown[-1] == 8  # back to the ceiling, and not past it


def test_rpm_pacing_spaces_calls_so_a_known_limit_is_never_reached() -> None:
    clock = FakeClock()
    limiter = Limiter("e", max_limit=100, pacing=Pacing(rpm=600), clock=clock)
    started = []
    for _ in range(50):
        wait = limiter.try_acquire()
        if wait > 0:
            clock.now += wait
            assert limiter.try_acquire() == 0.0
        started.append(clock.now)
        limiter.release(ok=True)
    gaps = [b - a for a, b in zip(started, started[1:], strict=False)]
    assert min(gaps) == pytest.approx(0.1)  # 600 a minute: one every 100 ms


def test_a_cancelled_slot_is_given_back_uncounted() -> None:
    limiter = Limiter("e", max_limit=1)
    assert limiter.try_acquire() == 0.0
    limiter.cancel()
    assert (limiter.state().in_flight, limiter.state().calls) == (0, 0)
    assert limiter.try_acquire() == 0.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.just(("acquire", None)),
            st.just(("ok", None)),
            st.just(("refused", None)),
            st.tuples(st.just("throttle"), st.one_of(st.none(), st.floats(-5, 1e9))),
            st.tuples(st.just("tick"), st.floats(0, 5)),
        ),
        max_size=80,
    ),
    st.integers(1, 64),
)
def test_whatever_happens_the_limit_stays_between_one_and_the_ceiling_and_pauses_are_bounded(
    ops: list[tuple[str, float | None]], ceiling: int
) -> None:
    clock = FakeClock()
    limiter = Limiter("e", max_limit=ceiling, clock=clock)
    held = 0
    for op, value in ops:
        if op == "acquire" and limiter.try_acquire() == 0.0:
            held += 1
        elif op in ("ok", "refused") and held:
            held -= 1
            limiter.release(ok=op == "ok")
        elif op == "throttle":
            wait = limiter.throttle(value)
            assert 0.0 <= wait <= 300.0
        elif op == "tick":
            clock.now += value or 0.0
        state = limiter.state()
        assert 1 <= state.limit <= ceiling
        assert state.in_flight == held <= max(ceiling, held)


def test_the_live_summary_line_names_in_flight_throttles_and_the_wait() -> None:
    clock = FakeClock()
    limiter = Limiter("e", max_limit=32, clock=clock)
    for _ in range(24):
        limiter.try_acquire()
    limiter.throttle(0.8)
    limiter.throttle(0.8)
    limiter.throttle(0.8)
    assert summary([limiter.state()]) == "in flight 24/12 · throttled 3 · waiting 0.8 s"


# -- a drive against a loopback server that rate-limits ------------------------------------


@dataclass
class Bucket:
    """A token bucket: ``rate`` requests a second, ``burst`` at once; 429 + Retry-After past it."""

    rate: float
    burst: float
    retry_after: str = "1"
    latency_s: float = 0.02
    tokens: float = 0.0
    at: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    trace: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, in flight when the request arrived, status) per request."""

    def take(self) -> bool:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            return False


@pytest.fixture
def limited_server() -> Iterator[tuple[str, Bucket]]:
    bucket = Bucket(rate=40, burst=4)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            with bucket.lock:
                bucket.in_flight += 1
                arrived, at = bucket.in_flight, time.monotonic()
            try:
                ok = bucket.take()
                time.sleep(bucket.latency_s)
                status = 200 if ok else 429
                with bucket.lock:
                    bucket.trace.append((at, arrived, status))
                if self.path.endswith("/chat/completions"):
                    reply = json.dumps(_completion(body) if ok else _refusal())
                else:
                    reply = json.dumps({"answer": f"ok {body.get('n')}"} if ok else {"error": "x"})
                self.send_response(status)
                if not ok:
                    self.send_header("Retry-After", bucket.retry_after)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply.encode())
            finally:
                with bucket.lock:
                    bucket.in_flight -= 1

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            return

    class Server(ThreadingHTTPServer):
        # socketserver's listen backlog of 5 resets connections when 16 calls (each on a
        # connection of its own: HTTP/1.0) arrive at once; a provider's does not.
        request_queue_size = 1024

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    LIMITERS.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", bucket
    finally:
        server.shutdown()
        server.server_close()
        LIMITERS.clear()


def _completion(body: dict[str, object]) -> dict[str, object]:
    messages = body.get("messages") or [{}]
    prompt = str(messages[-1].get("content", "")) if isinstance(messages, list) else ""
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"re: {prompt}"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def _refusal() -> dict[str, object]:
    return {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}}


class HttpRunner(BaseRunner):
    """A runner that calls the loopback server and reports its refusals as throttles."""

    def __init__(self, url: str) -> None:
        self.url = url

    def limit_key(self, model: str | None) -> str:
        return f"http {self.url} {model}"

    def run(self, request: UnitRequest) -> UnitResult:
        data = json.dumps({"n": request.item}).encode()
        req = urllib.request.Request(self.url, data=data, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as response:  # noqa: S310 - loopback
                return UnitResult(output=json.loads(response.read())["answer"], tokens_in=1)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 429:
                after = exc.headers.get("Retry-After")
                raise RunnerError(
                    "HTTP 429", throttled=True, retry_after_s=float(after) if after else None
                ) from exc
            raise


def _use(url: str) -> None:
    register_runner("rate_limited", lambda ctx: HttpRunner(url), replace=True)


def _map_workflow(n: int, *, concurrency: int = 16, extra: str = "") -> str:
    return (
        f"name: limited\nrunner: rate_limited\nexecution: {{max_concurrency: {concurrency}}}\n"
        f"{extra}steps:\n  - id: ask\n    map: '{{{{ range({n}) | list }}}}'\n"
        "    prompt: 'n {{ item }}'\n"
    )


def test_at_default_settings_a_rate_limited_map_fails_nothing_and_adds_no_attempt(
    tmp_path: Path, limited_server: tuple[str, Bucket]
) -> None:
    url, bucket = limited_server
    _use(url)
    with Engine(tmp_path / "s") as engine:
        # Exactly one unit each: a refused call charged as a unit would stop the run.
        run = engine.run(_map_workflow(60, extra="budget: {max_units: 60}\n"))
        attempts = engine.attempts(run.run_id)
        events = engine.events(run.run_id)
    assert run.status == "completed"
    assert sorted(run.result) == sorted(f"ok {n}" for n in range(60))
    assert len(attempts) == 60  # one attempt row per unit, however often it was refused
    assert {a.attempt for a in attempts} == {1}
    assert {a.status for a in attempts} == {"succeeded"}
    refused = [t for t in bucket.trace if t[2] == 429]
    assert refused, "the server must have refused some calls for this test to mean anything"
    throttled = events[events["kind"] == "throttled"]
    assert len(throttled) == len(refused)  # each wait journaled once
    data = json.loads(throttled.iloc[0]["data_json"])
    assert set(data) == {"endpoint", "wait_s", "cause"}
    assert data["endpoint"] == f"http {url} None"
    assert 0 < data["wait_s"] <= 1.0


def test_every_call_in_flight_honours_one_retry_after_and_in_flight_drops_after_a_storm(
    tmp_path: Path, limited_server: tuple[str, Bucket]
) -> None:
    url, bucket = limited_server
    bucket.retry_after, bucket.burst, bucket.tokens, bucket.latency_s = "0.5", 30, 30, 0.05
    _use(url)
    with Engine(tmp_path / "s") as engine:
        run = engine.run(_map_workflow(80, concurrency=16))
    assert run.status == "completed"
    first_refusal = min(t for t, _, status in bucket.trace if status == 429)
    # Nobody is sent during the pause the first refusal imposed (a few already on the wire
    # when it was answered may still arrive within a few ms).
    during = [t for t, _, _ in bucket.trace if first_refusal + 0.1 < t < first_refusal + 0.45]
    assert during == []
    before = max(n for t, n, _ in bucket.trace if t <= first_refusal)
    # Right after the pause: the limit was halved and nothing succeeded meanwhile to regrow it.
    after = [n for t, n, _ in bucket.trace if first_refusal + 0.5 < t < first_refusal + 0.7]
    assert before >= 8
    assert max(after) < before  # the limiter cut concurrency after the storm


def test_known_rpm_keeps_refusals_at_zero(
    tmp_path: Path, limited_server: tuple[str, Bucket]
) -> None:
    url, bucket = limited_server
    bucket.tokens = bucket.burst  # a full bucket: only pacing keeps the calls under its rate
    _use(url)
    extra = "runners:\n  rate_limited:\n    limits: {'*': {rpm: 1800}}\n"
    with Engine(tmp_path / "s") as engine:
        run = engine.run(_map_workflow(30, extra=extra))
        failures = [a.failure for a in engine.attempts(run.run_id) if a.failure]
    assert run.status == "completed", failures
    assert [t for t in bucket.trace if t[2] == 429] == []


def test_a_unit_throttled_longer_than_its_timeout_fails_as_a_timeout(
    tmp_path: Path, limited_server: tuple[str, Bucket]
) -> None:
    url, bucket = limited_server
    bucket.rate, bucket.burst, bucket.tokens, bucket.retry_after = 0.0001, 1, 0.0, "0.4"
    _use(url)
    with Engine(tmp_path / "s") as engine:
        run = engine.run(
            "name: slow\nrunner: rate_limited\nsteps:\n  - id: ask\n    prompt: x\n"
            "    timeout: 1s\n    retry: {max_attempts: 1}\n"
        )
        attempts = engine.attempts(run.run_id)
    assert run.status == "failed"
    assert [a.status for a in attempts] == ["failed"]
    assert "throttled by the provider for longer than the step's timeout" in (
        attempts[0].failure or ""
    )


def test_a_runner_without_an_endpoint_is_not_limited(tmp_path: Path) -> None:
    calls = {"n": 0}

    class Flaky(BaseRunner):
        def run(self, request: UnitRequest) -> UnitResult:
            calls["n"] += 1
            raise RunnerError("refused", throttled=True, retry_after_s=0)

    register_runner("no_endpoint", lambda ctx: Flaky(), replace=True)
    with Engine(tmp_path / "s") as engine:
        run = engine.run(
            "name: f\nrunner: no_endpoint\nsteps:\n  - id: a\n    prompt: x\n"
            "    retry: {max_attempts: 2}\n"
        )
    # Without an endpoint there is no limiter to wait on: the step's retry: decides.
    assert run.status == "failed"
    assert calls["n"] == 2


def test_limits_in_runner_options_are_checked_at_freeze(tmp_path: Path) -> None:
    from wf_magic.runners.base import check_limits

    with pytest.raises(RunnerError, match=r"x\.limits\.m\.rpm: expected a positive number"):
        check_limits({"m": {"rpm": float("nan")}}, "x")
    with pytest.raises(RunnerError, match=r"unknown key\(s\) rps"):
        check_limits({"m": {"rps": 3}}, "x")
    with pytest.raises(RunnerError, match="positive whole number"):
        check_limits({"m": {"concurrency": 2.5}}, "x")
    check_limits({"*": {"rpm": 60, "tpm": 1000, "concurrency": 4}}, "x")


def test_engine_limits_is_a_frame_of_the_endpoints_called(
    tmp_path: Path, limited_server: tuple[str, Bucket]
) -> None:
    url, bucket = limited_server
    _use(url)
    with Engine(tmp_path / "s") as engine:
        assert engine.limits().empty
        run = engine.run(_map_workflow(30))
        frame = engine.limits()
    assert run.status == "completed"
    refused = len([t for t in bucket.trace if t[2] == 429])
    assert list(frame.columns) == [
        "endpoint",
        "limit",
        "max_limit",
        "in_flight",
        "calls",
        "throttles",
        "waited_s",
        "waiting_s",
        "rpm",
        "tpm",
    ]
    [row] = frame.to_dict("records")
    assert row["endpoint"] == f"http {url} None"
    assert (row["in_flight"], row["calls"], row["throttles"]) == (0, 30 + refused, refused)
    assert 1 <= row["limit"] <= row["max_limit"] == 1024


def test_a_gate_judge_refused_by_the_provider_waits_and_asks_again_in_its_attempt(
    tmp_path: Path,
) -> None:
    calls: list[str] = []

    class Judge(BaseRunner):
        def limit_key(self, model: str | None) -> str:
            return "judge-endpoint"

        def run(self, request: UnitRequest) -> UnitResult:
            calls.append(request.kind)
            if request.kind == "judge" and calls.count("judge") <= 2:
                raise RunnerError("HTTP 429", throttled=True, retry_after_s=0.05)
            if request.kind == "judge":
                return UnitResult(output={"complete": True, "feedback": "", "missing": []})
            return UnitResult(output="draft")

    register_runner("judge_limited", lambda ctx: Judge(), replace=True)
    LIMITERS.clear()
    with Engine(tmp_path / "s") as engine:
        run = engine.run(
            "name: g\nrunner: judge_limited\nsteps:\n  - id: a\n    prompt: write\n"
            "    gate: {criteria: [good]}\n"
        )
        attempts = engine.attempts(run.run_id)
        events = engine.events(run.run_id)
    assert run.status == "completed"
    assert calls == ["prompt", "judge", "judge", "judge"]
    judges = [a for a in attempts if a.phase == "gate"]
    assert [(a.attempt, a.status) for a in judges] == [(1, "succeeded")]
    assert list(events[events["kind"] == "throttled"]["unit"]) == [judges[0].unit_id] * 2


def test_the_openai_runner_rides_a_rate_limit_at_default_settings(
    tmp_path: Path, limited_server: tuple[str, Bucket], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, bucket = limited_server
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-for-the-loopback-server")
    source = (
        f"name: oa\nrunner: openai\nruntime: {{}}\n"
        f"runners:\n  openai: {{base_url: '{url}v1', model: m}}\n"
        "execution: {max_concurrency: 16}\nbudget: {max_units: 50}\n"
        "steps:\n  - id: ask\n    map: '{{ range(50) | list }}'\n    prompt: 'n {{ item }}'\n"
    ).replace("runtime: {}\n", "")
    with Engine(tmp_path / "s") as engine:
        run = engine.run(source)
        attempts = engine.attempts(run.run_id)
        events = engine.events(run.run_id)
        limits = engine.limits()
    assert run.status == "completed", [a.failure for a in attempts if a.failure][:3]
    assert sorted(run.result) == sorted(f"re: n {n}" for n in range(50))
    assert [(a.attempt, a.status) for a in attempts] == [(1, "succeeded")] * 50
    refused = [t for t in bucket.trace if t[2] == 429]
    assert refused
    assert (events["kind"] == "throttled").sum() == len(refused)
    [row] = limits.to_dict("records")
    assert row["endpoint"].startswith(f"openai {url}v1 m key:")
    assert "sk-test" not in row["endpoint"]
    assert row["throttles"] == len(refused)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"retry-after": "1"}, 1.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"x-ratelimit-reset-requests": "6m0s"}, 300.0),  # past the bound: the bound
        ({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "20ms"}, 1.0),
        ({"x-ratelimit-reset-tokens": "1m30s"}, 90.0),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "-3"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "1e999"}, None),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "86400"}, 300.0),
        ({"anthropic-ratelimit-requests-reset": "2015-10-21T07:28:00Z"}, 0.0),
        ({"anthropic-ratelimit-requests-reset": "not a time"}, None),
    ],
)
def test_how_long_a_refusal_asks_to_wait(headers: dict[str, str], expected: float | None) -> None:
    from wf_magic.runners.ratelimits import wait_of

    assert wait_of(headers) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "retry-after",
                "retry-after-ms",
                "x-ratelimit-reset-requests",
                "x-ratelimit-reset-tokens",
                "anthropic-ratelimit-tokens-reset",
            ]
        ),
        st.one_of(
            st.text(max_size=30),
            st.floats(allow_nan=True, allow_infinity=True).map(str),
            st.integers(-(10**30), 10**30).map(str),
        ),
    )
)
def test_whatever_a_server_sends_the_wait_is_none_or_between_zero_and_the_bound(
    headers: dict[str, str],
) -> None:
    from wf_magic.runners.ratelimits import MAX_WAIT_S, wait_of

    wait = wait_of(headers)
    assert wait is None or 0.0 <= wait <= MAX_WAIT_S


def test_a_rate_limited_sweep_fails_no_cell_and_sweep_status_tells_its_throttles(
    tmp_path: Path, limited_server: tuple[str, Bucket]
) -> None:
    import subprocess
    import sys

    url, bucket = limited_server
    _use(url)
    source = (
        "name: sw\nrunner: rate_limited\nparams:\n  n: {type: integer}\n"
        "steps:\n  - id: ask\n    prompt: 'n {{ params.n }}'\n"
    )
    with Engine(tmp_path / "s") as engine:
        sweep = engine.sweep(
            source, rows=[{"n": i} for i in range(40)], max_concurrency=16, budget={"max_units": 40}
        )
        assert sweep.status == "completed"
        assert sorted(sweep.frame()["status"]) == ["completed"] * 40
        assert sweep.totals()["units"] == 40  # a refused call is no unit
        flow = sweep.flow()
    refused = len([t for t in bucket.trace if t[2] == 429])
    assert refused
    assert flow.startswith(f"in flight 0 · throttled {refused} · waiting ")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "wf_magic",
            "--db",
            str(tmp_path / "s"),
            "sweep-status",
            sweep.sweep_id,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert f"  calls: in flight 0 · throttled {refused} · waiting " in out.stdout
