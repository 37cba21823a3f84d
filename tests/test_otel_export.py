"""OpenTelemetry export (issue 36): runs as GenAI traces at a real OTLP/HTTP receiver.

The receiver (tests/otlp_receiver.py) is a loopback HTTP server that decodes the protobuf
body with ``opentelemetry-proto``, exactly what a collector reads; like a trace backend it
keeps one span per (trace id, span id) and also counts every span it was sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.agent_fakes.bins import git_repo, make_bins
from tests.helpers_flow import use_runner
from tests.helpers_http import isolate_loopback_env
from tests.otlp_receiver import OtlpReceiver, Received
from wf_magic import Engine, RunnerError, UnitRequest, UnitResult, register_runner
from wf_magic.errors import UsageError
from wf_magic.otel.endpoint import parse_headers, traces_url
from wf_magic.otel.journal import read_run
from wf_magic.otel.records import SEMCONV_VERSION, trace_id_of
from wf_magic.otel.spans import build_spans
from wf_magic.runners.base import BaseRunner

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (wf_magic[otel]) is not installed")

CANARY = "cnry7Kq2Xw9Lm4Tz"
"""16 characters of no known credential shape: only the secret param's door can mask it."""

FLOW = """
name: traced
runner: mix
params:
  api_token: {type: string}
steps:
  - id: m
    map: "{{ range(3) | list }}"
    prompt: "item {{ item }} with {{ params.api_token }}"
  - id: g
    prompt: Write.
    gate: {judge: expr, check: "output | length >= 6", criteria: [long enough], max_loops: 3}
  - id: f
    prompt: flaky
    retry: {max_attempts: 3, backoff_s: 0}
  - id: x
    exec: [python, -c, "print('tool ran')"]
AGENT"""

AGENT = """  - id: fix
    agent: claude
    prompt: "Fix the test."
runners:
  claude: {bin: BIN}
"""


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_loopback_env(monkeypatch)
    for name in ("WF_MAGIC_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    rc = OtlpReceiver().start()
    yield rc
    rc.stop()


def _mix(state: dict[str, int] | None = None) -> None:
    grow = state if state is not None else {"n": 0}

    def body(r: UnitRequest) -> object:
        if r.prompt == "flaky" and r.attempt == 1:
            raise RunnerError("TimeoutError: hiccup", transient=True)
        if r.prompt and r.prompt.startswith("Write"):
            grow["n"] += 1
            return "x" * (3 * grow["n"])
        return f"out {r.prompt}"

    use_runner("mix", body)


def _flow(tmp_path: Path, *, agent: bool) -> str:
    if not agent:
        return FLOW.replace("AGENT", "")
    bins = make_bins(tmp_path / "bin")
    path = git_repo(tmp_path / "repo") / "traced.yaml"  # the agent works in the file's folder
    path.write_text(FLOW.replace("AGENT", AGENT.replace("BIN", str(bins["claude"]))))
    return str(path)


def _by_name(spans: list[Received]) -> dict[str, list[Received]]:
    out: dict[str, list[Received]] = {}
    for s in sorted(spans, key=lambda s: (s.start_ns, s.name)):
        out.setdefault(s.name, []).append(s)
    return out


# -- one run, one trace ---------------------------------------------------------------------------
def test_a_run_arrives_as_one_trace_parented_root_step_attempt_with_genai_attributes(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    _mix()
    with Engine(tmp_path / "state") as engine:
        run = engine.run(_flow(tmp_path, agent=True), params={"api_token": CANARY})
        assert run.status == "completed"
        report = engine.export_otel(run.run_id, endpoint=receiver.endpoint)

    trace = f"{trace_id_of(run.run_id):032x}"
    assert report.trace_id == trace
    spans = receiver.of_trace(trace)
    assert report.sent == report.spans == len(spans) == len(receiver.received)
    names = _by_name(spans)
    root = names["invoke_workflow traced"][0]
    assert root.parent_id is None
    assert root.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert root.attributes["gen_ai.workflow.name"] == "traced"
    assert root.attributes["wf_magic.run.id"] == run.run_id
    assert root.attributes["wf_magic.run.status"] == "completed"
    assert root.attributes["wf_magic.param.api_token"] == "***"
    assert root.resource["service.name"] == "wf_magic" and root.scope == "wf_magic"

    steps = {s.attributes["wf_magic.step.id"]: s for s in spans if s.name.startswith("step ")}
    assert sorted(steps) == ["f", "fix", "g", "m", "x"]
    assert {s.parent_id for s in steps.values()} == {root.span_id}

    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    map_chats = [c for c in chats if c.attributes["wf_magic.step.id"] == "m"]
    assert sorted(c.attributes["wf_magic.item.index"] for c in map_chats) == [0, 1, 2]
    for chat in map_chats:
        assert chat.parent_id == steps["m"].span_id
        assert chat.name == "chat scripted-1" and chat.kind == 3  # SPAN_KIND_CLIENT
        assert chat.attributes["gen_ai.provider.name"] == "mix"
        assert chat.attributes["gen_ai.request.model"] == "scripted-1"
        assert chat.attributes["gen_ai.usage.input_tokens"] == 4
        assert chat.attributes["gen_ai.usage.output_tokens"] == 5
        assert "gen_ai.input.messages" not in chat.attributes  # content is opt-in

    # the gate loop: two work attempts and a verdict span per loop, under the step
    gates = names["gate g"]
    assert [
        (v.attributes["wf_magic.gate.loop"], v.attributes["wf_magic.gate.verdict"]) for v in gates
    ] == [
        (1, "reject"),
        (2, "pass"),
    ]
    assert {v.parent_id for v in gates} == {steps["g"].span_id}
    assert gates[0].attributes["wf_magic.gate.missing"] == ("long enough",)
    g_work = [c for c in chats if c.attributes["wf_magic.step.id"] == "g"]
    assert [c.attributes["wf_magic.loop"] for c in g_work] == [1, 2]

    # the retry: a failed attempt with error.type, and the retry as an event of the next
    f_work = sorted(
        (c for c in chats if c.attributes["wf_magic.step.id"] == "f"),
        key=lambda c: c.attributes["wf_magic.attempt"],
    )
    assert [c.attributes["wf_magic.attempt.status"] for c in f_work] == ["failed", "succeeded"]
    assert f_work[0].attributes["error.type"] == "TimeoutError"
    assert f_work[0].status_code == 2 and f_work[0].status_message == "TimeoutError: hiccup"
    assert [name for name, _ in f_work[1].events] == ["wf_magic.retry"]
    assert (
        f_work[1].events[0][1]["wf_magic.retry_of"] == f_work[0].attributes["wf_magic.dispatch.id"]
    )

    tool = names["execute_tool x"][0]
    assert tool.parent_id == steps["x"].span_id
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "x"

    agent = names["invoke_agent claude"][0]
    assert agent.parent_id == steps["fix"].span_id
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.name"] == "fix"
    assert agent.attributes["gen_ai.provider.name"] == "claude"
    assert agent.attributes["wf_magic.agent.harness"] == "claude"
    assert agent.attributes["gen_ai.conversation.id"]

    # span timings are the journal's
    for attempt in engine_attempts(tmp_path, run.run_id):
        span = next(s for s in spans if s.attributes.get("wf_magic.dispatch.id") == attempt[0])
        assert (span.start_ns, span.end_ns) == attempt[1:]


def engine_attempts(tmp_path: Path, run_id: str) -> list[tuple[str, int, int]]:
    with Engine(tmp_path / "state") as engine:
        return [
            (a.dispatch_id, int(round(a.started_at * 1e9)), int(round((a.finished_at or 0) * 1e9)))
            for a in engine.attempts(run_id)
        ]


def test_reuse_and_budget_stop_arrive_as_span_events(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    _mix()
    source = _flow(tmp_path, agent=False)
    with Engine(tmp_path / "state") as engine:
        first = engine.run(source, params={"api_token": CANARY})
        _mix()
        again = engine.run(source, params={"api_token": CANARY}, new=True)
        stopped = engine.run(
            source.replace("runner: mix\n", "runner: mix\nbudget: {max_units: 2}\n"),
            params={"api_token": CANARY},
            new=True,
            no_cache=True,
        )
        assert (first.status, again.status, stopped.status) == ("completed", "completed", "failed")
        for run in (again, stopped):
            engine.export_otel(run.run_id, endpoint=receiver.endpoint)

    reused = [
        s
        for s in receiver.of_trace(f"{trace_id_of(again.run_id):032x}")
        if s.attributes.get("wf_magic.attempt.status") == "reused"
    ]
    assert len(reused) == 8  # every unit but the exec step's (exec is not cached)
    for span in reused:
        assert [name for name, _ in span.events] == ["wf_magic.reuse"]
        assert span.events[0][1]["wf_magic.reused_from"] == span.attributes["wf_magic.reused_from"]

    spans = receiver.of_trace(f"{trace_id_of(stopped.run_id):032x}")
    root = next(s for s in spans if s.parent_id is None)
    step = next(s for s in spans if s.name == "step m")
    assert root.attributes["wf_magic.run.status"] == "failed" and root.status_code == 2
    for span in (root, step):
        assert [name for name, _ in span.events] == ["wf_magic.budget_stop"]
        assert span.events[0][1]["wf_magic.reason"].startswith("Budget exceeded in run")
    assert not any(s.name == "step g" for s in spans)  # never reached: no span


# -- idempotence and secrets ----------------------------------------------------------------------
def test_exporting_twice_adds_no_span(tmp_path: Path, receiver: OtlpReceiver) -> None:
    _mix()
    with Engine(tmp_path / "state") as engine:
        run = engine.run(_flow(tmp_path, agent=False), params={"api_token": CANARY})
        first = engine.export_otel(run.run_id, endpoint=receiver.endpoint)
        count = len(receiver.spans)
        second = engine.export_otel(run.run_id, endpoint=receiver.endpoint, content=True)
    assert first.sent == second.sent == count == 15
    assert len(receiver.received) == 2 * count  # sent again, every span under the same id
    assert len(receiver.spans) == count


@pytest.mark.parametrize("content", [False, True])
def test_a_secret_canary_never_arrives(
    tmp_path: Path, receiver: OtlpReceiver, content: bool
) -> None:
    _mix()
    with Engine(tmp_path / "state") as engine:
        run = engine.run(_flow(tmp_path, agent=False), params={"api_token": CANARY})
        engine.export_otel(run.run_id, endpoint=receiver.endpoint, content=content)
    # and from another process, which never saw the secret
    _wf(
        "export-otel",
        run.run_id,
        "--endpoint",
        receiver.endpoint,
        *(["--content"] * content),
        state=tmp_path / "state",
    )
    wire = receiver.wire()
    assert len(receiver.bodies) == 2 and len(receiver.spans) == 15
    assert CANARY.encode() not in wire
    chat = next(
        s for s in receiver.spans.values() if s.attributes.get("wf_magic.unit.id") == "m[0]"
    )
    if content:
        sent = json.loads(chat.attributes["gen_ai.input.messages"])
        assert sent == [{"role": "user", "parts": [{"type": "text", "content": "item 0 with ***"}]}]
        out = json.loads(chat.attributes["gen_ai.output.messages"])
        assert out[0]["parts"][0]["content"] == "out item 0 with ***"
        tool = next(s for s in receiver.spans.values() if s.name == "execute_tool x")
        assert tool.attributes["gen_ai.tool.call.result"] == "tool ran\n"
    else:
        assert not any(
            k.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.tool.call"))
            for s in receiver.spans.values()
            for k in s.attributes
        )


# -- the wf verb ----------------------------------------------------------------------------------
def _wf(
    *args: str, state: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wf_magic", "--db", str(state), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_wf_export_otel_sends_each_run_with_the_headers_given(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    runs = []
    with Engine(tmp_path / "state") as engine:
        for _ in range(2):
            _mix()
            source = _flow(tmp_path, agent=False)
            runs.append(engine.run(source, params={"api_token": CANARY}, new=True, no_cache=True))
    done = _wf(
        "export-otel",
        *(r.run_id for r in runs),
        "--endpoint",
        receiver.endpoint + "/v1/traces",
        "--headers",
        "Authorization=Basic dXNlcjpwdw==",
        "--headers",
        "x-tenant=team a",
        state=tmp_path / "state",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [f"{r.run_id}: 15 spans sent, trace {trace_id_of(r.run_id):032x}" for r in runs]
    assert {h["authorization"] for h in receiver.headers} == {"Basic dXNlcjpwdw=="}
    assert {h["x-tenant"] for h in receiver.headers} == {"team a"}
    assert {s.trace_id for s in receiver.spans.values()} == {
        f"{trace_id_of(r.run_id):032x}" for r in runs
    }


def test_wf_export_otel_to_nobody_fails_in_one_line_naming_the_endpoint(tmp_path: Path) -> None:
    _mix()
    with Engine(tmp_path / "state") as engine:
        run = engine.run(_flow(tmp_path, agent=False), params={"api_token": CANARY})
    dead = OtlpReceiver().start()
    dead.stop()
    started = time.monotonic()
    done = _wf(
        "export-otel",
        run.run_id,
        "--endpoint",
        dead.endpoint + "?api_key=" + CANARY,
        "--timeout",
        "0.5",
        state=tmp_path / "state",
    )
    assert time.monotonic() - started < 8
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"error: OpenTelemetry export of run {run.run_id} to http://127.0.0.1:{dead.port}/v1/traces?api_key=*** failed (15 spans not sent)"
    )
    assert CANARY not in done.stderr
    assert ".." not in lines[0] and lines[0].endswith("listens there, then export again.")


BAD_ENDPOINTS = ["", "127.0.0.1:4318", "ftp://h/x", "http://", "http:///v1/traces", "http://h x/"]


@pytest.mark.parametrize("endpoint", BAD_ENDPOINTS)
def test_a_bad_endpoint_is_a_usage_error_before_anything_is_read(endpoint: str) -> None:
    with pytest.raises(UsageError, match=r"^OTLP endpoint: expected an http\(s\) URL"):
        traces_url(endpoint)


@given(st.text(max_size=30).filter(lambda t: "=" not in t))
@settings(max_examples=60, deadline=None)
def test_a_header_without_equals_is_refused_and_never_echoed(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_headers([text])
    if text.strip():
        assert text.strip() not in str(caught.value) or len(text.strip()) < 3


@given(
    st.text(min_size=1, max_size=12).filter(
        lambda n: not n.strip() or any(c in n for c in ' ():;,"\x00\n')
    ),
    st.text(max_size=20),
)
@settings(max_examples=60, deadline=None)
def test_a_header_with_a_bad_name_is_refused_without_its_value(name: str, value: str) -> None:
    secret = "VALUE-" + CANARY
    with pytest.raises(UsageError, match="^--headers: expected NAME=VALUE") as caught:
        parse_headers({name: secret + value})
    assert CANARY not in str(caught.value)


@given(st.sampled_from("\x00\r\n\x1b\x7f"), st.text(max_size=10))
@settings(max_examples=40, deadline=None)
def test_a_header_value_with_control_characters_is_refused(bad: str, rest: str) -> None:
    with pytest.raises(UsageError, match="^--headers auth: expected a one-line text value"):
        parse_headers([f"auth={CANARY}{bad}{rest}"])


def test_the_endpoint_gets_v1_traces_once() -> None:
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("https://h/api/public/otel/") == "https://h/api/public/otel/v1/traces"
    assert traces_url(" http://h:6006/v1/traces ") == "http://h:6006/v1/traces"


# -- live export ----------------------------------------------------------------------------------
LIVE = """
name: live
runner: slow
steps:
  - id: m
    map: "{{ range(8) | list }}"
    prompt: "item {{ item }}"
  - id: g
    prompt: last
    gate: {judge: expr, check: "output | length >= 2", criteria: [long], max_loops: 2}
"""


def test_live_export_survives_a_receiver_stopped_half_way_and_every_span_arrives_once(
    tmp_path: Path, receiver: OtlpReceiver, capfd: pytest.CaptureFixture[str]
) -> None:
    done: list[int] = []

    def body(r: UnitRequest) -> object:
        time.sleep(0.15)
        done.append(1)
        if len(done) == 3:
            receiver.stop()  # the collector goes away mid-run
        return f"out {r.prompt}"

    use_runner("slow", body)
    with Engine(tmp_path / "state", otlp_endpoint=receiver.endpoint) as engine:
        assert engine.otlp is not None
        engine.otlp.timeout_s = 0.3  # each try gives up quickly: the retries are ours
        run = engine.run(LIVE)
        assert run.status == "completed"
        assert 0 < len(receiver.spans) < 13
        deadline = time.monotonic() + 10
        while engine.otlp.failures < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.otlp.failures >= 2
        receiver.start()  # back on the same port
        engine.otlp.poke(run.run_id)
        assert engine.otlp.wait_idle(30)
        expected = build_spans(read_run(engine.store, run.run_id), redactor=engine.redactor)
    trace = f"{trace_id_of(run.run_id):032x}"
    assert sorted(s.span_id for s in receiver.of_trace(trace)) == sorted(
        s.span_hex for s in expected
    )
    assert len(receiver.received) == len(set(receiver.received)) == len(expected) == 13
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith("wf_magic: warning: OpenTelemetry export")


def test_a_slow_collector_never_slows_a_drive(tmp_path: Path, receiver: OtlpReceiver) -> None:
    use_runner("slow", lambda r: f"out {r.prompt}")
    receiver.delay_s = 1.0
    with Engine(tmp_path / "state", otlp_endpoint=receiver.endpoint) as engine:
        started = time.monotonic()
        run = engine.run(LIVE)
        took = time.monotonic() - started
        assert run.status == "completed"
        assert took < 0.8, took
        assert engine.otlp is not None and engine.otlp.wait_idle(30)
    assert len(receiver.spans) == 13


EXEC_FLOW = """
name: tools
steps:
  - id: a
    exec: [python, -c, "print('a')"]
  - id: b
    exec: [python, -c, "print('b')"]
"""


@pytest.mark.parametrize("delay_s", [0.0, 0.6])
def test_wf_run_with_live_export_sends_every_span_before_it_exits(
    tmp_path: Path, receiver: OtlpReceiver, delay_s: float
) -> None:
    # The run's root span settles last: the verb must give the exporter its last seconds.
    receiver.delay_s = delay_s
    source = tmp_path / "tools.yaml"
    source.write_text(EXEC_FLOW)
    done = _wf(
        "run",
        str(source),
        "--quiet",
        state=tmp_path / "state",
        env={"WF_MAGIC_OTLP_ENDPOINT": receiver.endpoint},
    )
    assert done.returncode == 0, done.stderr
    names = sorted(s.name for s in receiver.spans.values())
    assert names == [
        "execute_tool a",
        "execute_tool b",
        "invoke_workflow tools",
        "step a",
        "step b",
    ], names
    assert done.stderr == ""


def test_wf_run_to_a_dead_collector_says_one_warning_line_and_succeeds(tmp_path: Path) -> None:
    dead = OtlpReceiver().start()
    dead.stop()
    source = tmp_path / "tools.yaml"
    source.write_text(EXEC_FLOW)
    done = _wf(
        "run",
        str(source),
        "--quiet",
        state=tmp_path / "state",
        env={"WF_MAGIC_OTLP_ENDPOINT": dead.endpoint + "?api_key=" + CANARY},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("wf_magic: warning: OpenTelemetry export of run "), lines[0]
    assert "?api_key=***" in lines[0]
    assert CANARY not in done.stderr


def test_spans_a_dead_collector_missed_go_with_the_next_drive(
    tmp_path: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_runner("slow", lambda r: f"out {r.prompt}")
    dead = OtlpReceiver().start()
    dead.stop()
    with Engine(tmp_path / "state", otlp_endpoint=dead.endpoint) as engine:
        assert engine.otlp is not None
        engine.otlp.timeout_s = 0.5
        run = engine.run(LIVE)
    assert receiver.spans == {}
    monkeypatch.setenv("WF_MAGIC_OTLP_ENDPOINT", receiver.endpoint)
    with Engine(tmp_path / "state") as engine:  # the environment names the endpoint
        assert engine.drive(run.run_id).status == "completed"
        assert engine.otlp is not None and engine.otlp.wait_idle(30)
    assert len(receiver.spans) == len(receiver.received) == 13


def test_a_killed_driver_loses_no_span(tmp_path: Path, receiver: OtlpReceiver) -> None:
    source = tmp_path / "live.yaml"
    source.write_text(
        LIVE.replace(
            "runner: slow",
            "runner: scripted\nexecution: {max_concurrency: 1}\nrunners:\n  scripted:\n"
            "    rules:\n      - {match: '.', reply: 'out {{ prompt }}', sleep_s: 0.2}",
        )
    )
    state = tmp_path / "state"
    log = tmp_path / "wf-run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "wf_magic", "--db", str(state), "run", str(source)],
            env={**os.environ, "WF_MAGIC_OTLP_ENDPOINT": receiver.endpoint},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while len(receiver.spans) < 3 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            proc.kill()  # SIGKILL: no close, no flush, no goodbye
            proc.wait()
    arrived = len(receiver.spans)
    assert 3 <= arrived < 13, (arrived, log.read_text())  # the run was cut mid-map
    with Engine(state, otlp_endpoint=receiver.endpoint) as engine:
        run_id = engine.list_runs()[0].run_id
        assert engine.drive(run_id).status == "completed"
        assert engine.otlp is not None and engine.otlp.wait_idle(30)
        expected = build_spans(read_run(engine.store, run_id), redactor=engine.redactor)
    # every span of the finished journal arrived (a receiver keeps one per id)
    assert sorted(receiver.spans) == sorted((f"{s.trace_id:032x}", s.span_hex) for s in expected)
    assert len(expected) == 13


# -- import costs ---------------------------------------------------------------------------------
def test_the_sdk_is_imported_only_when_something_is_sent(tmp_path: Path) -> None:
    code = (
        "import sys, wf_magic, wf_magic.cli\n"
        "from wf_magic import Engine\n"
        f"e = Engine({str(tmp_path / 's')!r}, otlp_endpoint='http://127.0.0.1:9')\n"
        "e.close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_semconv_version_is_pinned_in_the_docs() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "otel.md").read_text()
    assert f"v{SEMCONV_VERSION}" in docs


# -- the export cursor, on both backends ----------------------------------------------------------
@pytest.mark.backends
def test_live_export_keeps_its_cursor_in_the_state_and_gc_drops_it(
    state_dir: Path, receiver: OtlpReceiver
) -> None:
    use_runner("slow", lambda r: f"out {r.prompt}")
    with Engine(state_dir, otlp_endpoint=receiver.endpoint) as engine:
        run = engine.run(LIVE)
        assert engine.otlp is not None and engine.otlp.wait_idle(30)
        expected = build_spans(read_run(engine.store, run.run_id), redactor=engine.redactor)
        sent = engine.store.otel_sent(run.run_id, engine.otlp.url)
        assert sent == {s.span_hex: s.fingerprint() for s in expected}
        assert len(receiver.received) == 13
        engine.drive(run.run_id)  # nothing changed: nothing is sent again
        assert engine.otlp.wait_idle(30)
        assert len(receiver.received) == 13
        assert engine.gc(older_than_s=0) == [run.run_id]
        assert engine.store.otel_sent(run.run_id, engine.otlp.url) == {}


class _RefusingOnce(BaseRunner):
    """A model endpoint that refuses each prompt's first call (HTTP 429, Retry-After 0.05)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def limit_key(self, model: str | None) -> str:
        return f"otel-test refusing {id(self)} {model}"

    def run(self, request: UnitRequest) -> UnitResult:
        if request.prompt not in self.seen:
            self.seen.add(request.prompt or "")
            raise RunnerError("HTTP 429 rate limited", throttled=True, retry_after_s=0.05)
        return UnitResult(output=f"out {request.prompt}", tokens_in=2, tokens_out=1)


def test_a_throttle_arrives_as_an_event_of_its_attempt(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    register_runner("refusing", lambda ctx: _RefusingOnce(), replace=True)
    with Engine(tmp_path / "state") as engine:
        run = engine.run("name: thr\nrunner: refusing\nsteps:\n  - id: a\n    prompt: hello\n")
        assert run.status == "completed"
        engine.export_otel(run.run_id, endpoint=receiver.endpoint)
    chat = next(s for s in receiver.spans.values() if s.name.startswith("chat "))
    assert chat.attributes["wf_magic.attempt"] == 1  # the refusal added no attempt
    assert [name for name, _ in chat.events] == ["wf_magic.throttled"]
    data = chat.events[0][1]
    assert data["wf_magic.wait_s"] == 0.05
    assert data["wf_magic.cause"] == "HTTP 429 rate limited"


@pytest.mark.parametrize("content", [False, True])
def test_score_units_arrive_as_spans_with_their_value(
    tmp_path: Path, receiver: OtlpReceiver, content: bool
) -> None:
    with Engine(tmp_path / "state") as engine:
        run = engine.run(
            "name: sc\nrunner: scripted\nrunners:\n  scripted:\n    rules:\n"
            "      - {match: '.', reply: 'out {{ prompt }}'}\n"
            "steps:\n  - id: a\n    map: '{{ [1, 2] }}'\n    prompt: 'hi {{ item }}'\n"
            "    score:\n      - {name: exact, equals: 'out hi 1'}\n"
        )
        engine.export_otel(run.run_id, endpoint=receiver.endpoint, content=content)
    scores = sorted(
        (s for s in receiver.spans.values() if s.name == "score exact"),
        key=lambda s: s.attributes["wf_magic.item.index"],
    )
    step = next(s for s in receiver.spans.values() if s.name == "step a")
    assert [s.attributes["gen_ai.evaluation.score.value"] for s in scores] == [1.0, 0.0]
    assert {s.attributes["gen_ai.evaluation.name"] for s in scores} == {"exact"}
    assert {s.parent_id for s in scores} == {step.span_id}
    explained = [s.attributes.get("gen_ai.evaluation.explanation") for s in scores]
    assert explained == (
        ["equal", "expected 'out hi 1' (got 'out hi 2')"] if content else [None, None]
    )


def test_config_workflow_magics_otlp_endpoint_exports_a_cells_run_live(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    from tests.helpers_notebook import cell, ipython_shell, magics_in

    use_runner("slow", lambda r: f"out {r.prompt}")
    shells = ipython_shell()
    shell = next(shells)
    try:
        with magics_in(shell, tmp_path / "state", widgets="off") as magics:
            assert magics.engine.otlp is None  # off unless configured
            shell.run_line_magic("config", f"WorkflowMagics.otlp_endpoint = {receiver.endpoint!r}")
            try:
                engine = magics.engine
                assert engine.otlp is not None
                assert (engine.otlp.url, engine.otlp.content) == (
                    receiver.endpoint + "/v1/traces",
                    False,
                )
                run = cell(shell, "", LIVE)
                assert run.status == "completed"
                assert engine.otlp.wait_idle(30)
            finally:
                shell.run_line_magic("config", "WorkflowMagics.otlp_endpoint = ''")
    finally:
        next(shells, None)
    assert {s.trace_id for s in receiver.spans.values()} == {f"{trace_id_of(run.run_id):032x}"}
    assert len(receiver.spans) == len(receiver.received) == 13


def test_wf_run_to_a_collector_that_never_answers_says_one_warning_line_and_exits(
    tmp_path: Path,
) -> None:
    """A collector that takes the connection and never answers fails no try before the verb
    closes: the spans still owed are said in one line (naming the endpoint, masked), and the
    verb exits within the close's few seconds."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections are queued and taken by the kernel, never answered
    port = silent.getsockname()[1]
    source = tmp_path / "tools.yaml"
    source.write_text(EXEC_FLOW)
    try:
        started = time.monotonic()
        done = _wf(
            "run",
            str(source),
            "--quiet",
            state=tmp_path / "state",
            env={"WF_MAGIC_OTLP_ENDPOINT": f"http://127.0.0.1:{port}?api_key={CANARY}"},
        )
        took = time.monotonic() - started
    finally:
        silent.close()
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.strip().splitlines()
    url = f"http://127.0.0.1:{port}/v1/traces?api_key=***"
    # The first try times out about when the close gives up: whichever comes first is said.
    assert line.startswith(
        (
            f"wf_magic: warning: OpenTelemetry export to {url} did not finish within 5 s "
            "(1 run(s) owed spans, first r-",
            "wf_magic: warning: OpenTelemetry export of run r-",
        )
    ), line
    assert f" to {url} " in line and "Spans are kept in the journal and sent " in line
    assert CANARY not in done.stderr
    assert took < 20, took


def test_closing_while_a_try_hangs_says_the_owed_spans_once(tmp_path: Path) -> None:
    """The close gives up on a try that is still waiting for the collector (its own deadline
    is later): the spans still owed are said in one line, never silently left."""
    import socket

    from wf_magic.otel.live import LiveExporter

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    said: list[str] = []
    try:
        with Engine(tmp_path / "state") as engine:
            run = engine.run(EXEC_FLOW)
            live = LiveExporter(
                engine.store,
                url=traces_url(f"http://127.0.0.1:{silent.getsockname()[1]}"),
                headers={},
                redactor_of=engine.store.scrubber.redactor,
                timeout_s=30.0,
                warn=said.append,
            )
            live.poke(run.run_id)
            started = time.monotonic()
            live.close(wait_s=0.5)
            assert time.monotonic() - started < 3
    finally:
        silent.close()
    assert said == [
        f"wf_magic: warning: OpenTelemetry export to {live.url} did not finish within 0.5 s "
        f"(1 run(s) owed spans, first {run.run_id}). Spans are kept in the journal and sent "
        "by the next drive or `wf export-otel RUN`."
    ]
