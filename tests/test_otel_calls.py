"""An agent attempt's model calls (the bridge's ``calls`` rows) as child ``chat`` spans of its
``invoke_agent`` span (issue 36 item 1), by ``wf export-otel`` and by live export, at the
loopback OTLP receiver of tests/test_otel_export.py: their GenAI attributes, their times,
ids from the call numbers, no answer body, and a call journaled after its attempt was sent
going exactly once."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.agent_backends import Backend, start_backend
from tests.agent_fakes.bins import git_repo, make_bins
from tests.helpers_http import isolate_loopback_env
from tests.otlp_receiver import OtlpReceiver, Received
from tests.test_agents_real import real_workflow, work
from wf_magic import Engine
from wf_magic.otel.calls import call_error
from wf_magic.otel.journal import read_run
from wf_magic.otel.records import attempt_span_id, call_span_id, trace_id_of
from wf_magic.otel.spans import build_spans
from wf_magic.store.calls import CallRow
from wf_magic.store.records import AttemptRow

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (wf_magic[otel]) is not installed")

CANARY = "cnry7Kq2Xw9Lm4Tz"
"""Quoted by an upstream's error body: a body never reaches a span."""


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


def _agent_flow(tmp_path: Path) -> str:
    bins = make_bins(tmp_path / "bin")
    path = git_repo(tmp_path / "repo") / "agented.yaml"  # the agent works in the file's folder
    path.write_text(
        "name: agented\nsteps:\n  - id: fix\n    agent: claude\n    prompt: Fix the test.\n"
        f"runners:\n  claude: {{bin: {bins['claude']}}}\n"
    )
    return str(path)


def _agent_attempt(engine: Engine, run_id: str) -> AttemptRow:
    [attempt] = [a for a in engine.store.attempts_of(run_id) if a.phase == "work"]
    return attempt


def _call(attempt: AttemptRow, at: float, **kw: Any) -> CallRow:
    fields: dict[str, Any] = {
        "run_id": attempt.run_id,
        "step_id": attempt.step_id,
        "unit_id": attempt.unit_id,
        "dispatch_id": attempt.dispatch_id,
        "attempt": attempt.attempt,
        "model": "claude-sonnet-4-5",
        "status": "ok",
        "tokens_in": 1200,
        "tokens_out": 80,
        "cache_read": 1000,
        "cache_write": 100,
        "cost": 0.0042,
        "price_source": "genai-prices 0.2.3",
        "latency_s": 1.5,
        "started_at": at,
        "error": None,
    }
    fields.update(kw)
    return CallRow(**fields)


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


BUDGET_LINE = "Budget exceeded in run r-x: max_tokens 100 reached (used 1360)"


# -- wf export-otel -------------------------------------------------------------------------------
def test_each_journaled_call_is_a_chat_span_under_its_agent_attempt_with_genai_attributes(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    with Engine(tmp_path / "state") as engine:
        run = engine.run(_agent_flow(tmp_path))
        assert run.status == "completed"
        a = _agent_attempt(engine, run.run_id)
        t0 = a.started_at
        engine.store.record_call(_call(a, t0 + 0.1))
        engine.store.record_call(
            _call(
                a,
                t0 + 2.0,
                status="error",
                tokens_in=0,
                tokens_out=0,
                cache_read=0,
                cache_write=0,
                cost=0.0,
                latency_s=0.25,
                error=f'HTTP 529: {{"type": "error", "message": "overloaded {CANARY}"}}',
            )
        )
        engine.store.record_call(
            _call(
                a,
                t0 + 3.0,
                model=None,
                status="refused",
                tokens_in=0,
                tokens_out=0,
                cache_read=0,
                cache_write=0,
                cost=None,
                price_source=None,
                latency_s=0.0,
                error=BUDGET_LINE,
            )
        )
        report = engine.export_otel(run.run_id, endpoint=receiver.endpoint, content=True)

    spans = receiver.of_trace(f"{trace_id_of(run.run_id):032x}")
    assert report.sent == report.spans == len(spans) == 6  # root, step, agent, 3 calls
    agent = next(s for s in spans if s.name == "invoke_agent claude")
    assert agent.span_id == f"{attempt_span_id(a.dispatch_id):016x}"
    calls = sorted((s for s in spans if s.parent_id == agent.span_id), key=lambda s: s.start_ns)
    assert [s.span_id for s in calls] == [
        f"{call_span_id(a.dispatch_id, n):016x}" for n in (1, 2, 3)
    ]
    fallback = a.model or a.runner  # a refused call names no model: the attempt's
    assert [s.name for s in calls] == ["chat claude-sonnet-4-5"] * 2 + [f"chat {fallback}"]
    assert {s.kind for s in calls} == {3}  # SPAN_KIND_CLIENT
    ids = {
        "wf_magic.run.id": run.run_id,
        "wf_magic.step.id": "fix",
        "wf_magic.unit.id": "fix",
        "wf_magic.dispatch.id": a.dispatch_id,
        "wf_magic.attempt": 1,
    }
    assert calls[0].attributes == {
        **ids,
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5",
        "gen_ai.response.model": "claude-sonnet-4-5",
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 80,
        "gen_ai.usage.cache_read.input_tokens": 1000,
        "gen_ai.usage.cache_creation.input_tokens": 100,
        "wf_magic.call": 1,
        "wf_magic.call.status": "ok",
        "wf_magic.cost.usd": 0.0042,
    }
    assert (calls[0].start_ns, calls[0].end_ns) == (_ns(t0 + 0.1), _ns(t0 + 0.1 + 1.5))
    assert calls[0].status_code == 0  # UNSET
    assert calls[1].attributes == {
        **ids,
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5",
        "gen_ai.usage.input_tokens": 0,
        "gen_ai.usage.output_tokens": 0,
        "wf_magic.call": 2,
        "wf_magic.call.status": "error",
        "wf_magic.cost.usd": 0.0,
        "error.type": "529",
    }
    assert (calls[1].status_code, calls[1].status_message) == (2, "HTTP 529")
    assert (calls[1].start_ns, calls[1].end_ns) == (_ns(t0 + 2.0), _ns(t0 + 2.25))
    assert calls[2].attributes["error.type"] == "budget_exceeded"
    assert "gen_ai.response.model" not in calls[2].attributes  # nothing answered
    assert "wf_magic.cost.usd" not in calls[2].attributes  # unpriced, not 0
    assert (calls[2].status_code, calls[2].status_message) == (2, BUDGET_LINE)
    assert calls[2].start_ns == calls[2].end_ns == _ns(t0 + 3.0)
    # no body, no content attribute on a call (even with content on), no credential
    assert CANARY.encode() not in receiver.wire()
    assert not any(
        k.startswith(("gen_ai.input", "gen_ai.output")) for s in calls for k in s.attributes
    )


def test_a_run_without_agent_steps_reads_no_calls_and_sends_no_call_span(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    with Engine(tmp_path / "state") as engine:
        run = engine.run(
            "name: plain\nrunner: scripted\nsteps:\n  - id: a\n    prompt: hi\n"
            "runners:\n  scripted:\n    rules:\n      - {match: '.', reply: 'out'}\n"
        )
        assert read_run(engine.store, run.run_id).calls == {}
        report = engine.export_otel(run.run_id, endpoint=receiver.endpoint)
    assert report.sent == 3  # root, step, chat


# -- live export: the cursor ----------------------------------------------------------------------
def _received(receiver: OtlpReceiver) -> list[str]:
    return [span_id for _, span_id in receiver.received]


@pytest.mark.backends
def test_live_export_sends_a_call_journaled_after_its_attempt_was_sent_once(
    tmp_path: Path, state_dir: Path, receiver: OtlpReceiver
) -> None:
    with Engine(state_dir, otlp_endpoint=receiver.endpoint) as engine:
        assert engine.otlp is not None
        run = engine.run(_agent_flow(tmp_path))
        assert run.status == "completed"
        assert engine.otlp.wait_idle(30)
        assert len(receiver.received) == 3  # root, step, invoke_agent: no call yet
        a = _agent_attempt(engine, run.run_id)

        # a call journaled after the attempt span went (a call in flight when its bridge closed)
        engine.store.record_call(_call(a, a.started_at + 0.5))
        engine.otlp.poke(run.run_id)
        assert engine.otlp.wait_idle(30)
        assert _received(receiver)[3:] == [f"{call_span_id(a.dispatch_id, 1):016x}"]

        # a later-journaled call that started earlier (an earlier launch's) takes the next
        # number: the first call's span keeps its id and is not sent again
        engine.store.record_call(_call(a, a.started_at + 0.1, latency_s=0.2))
        engine.otlp.poke(run.run_id)
        assert engine.otlp.wait_idle(30)
        assert _received(receiver)[4:] == [f"{call_span_id(a.dispatch_id, 2):016x}"]

        engine.drive(run.run_id)  # nothing new: nothing is sent again
        assert engine.otlp.wait_idle(30)
        assert len(receiver.received) == 5 == len(set(receiver.received))
        expected = build_spans(read_run(engine.store, run.run_id), redactor=engine.redactor)
        sent = engine.store.otel_sent(run.run_id, engine.otlp.url)
        assert sent == {s.span_hex: s.fingerprint() for s in expected}
    agent = f"{attempt_span_id(a.dispatch_id):016x}"
    children = [s for s in receiver.spans.values() if s.parent_id == agent]
    assert sorted(s.attributes["wf_magic.call"] for s in children) == [1, 2]


# -- a failed call's text: the answer's body never goes ---------------------------------------------
def test_no_error_body_of_a_failed_call_reaches_its_span(tmp_path: Path) -> None:
    with Engine(tmp_path / "state") as engine:
        run = engine.run(_agent_flow(tmp_path))
        journal = read_run(engine.store, run.run_id)
        a = _agent_attempt(engine, run.run_id)
        redactor = engine.redactor

    kinds = {
        "HTTP 400: ": "400",
        "HTTP 529: ": "529",
        "upstream unreachable (ConnectError)": "_OTHER",
    }

    @given(
        head=st.sampled_from([*kinds, "HTTP 5: ", "upstream stream cut (ReadError) ", ""]),
        body=st.text(max_size=60),
    )
    @settings(max_examples=100, deadline=None)
    def check(head: str, body: str) -> None:
        call = _call(a, a.started_at, status="error", error=f"{head}{{{CANARY}{body}", call=1)
        spans = build_spans(
            dataclasses.replace(journal, calls={a.dispatch_id: [call]}), redactor=redactor
        )
        [span] = [s for s in spans if s.attributes.get("wf_magic.call") == 1]
        assert CANARY not in json.dumps([span.error, span.attributes], ensure_ascii=False)
        assert span.attributes["error.type"] == kinds.get(head, "_OTHER")
        assert span.error == (
            f"HTTP {kinds[head]}"
            if head.startswith("HTTP 4") or head.startswith("HTTP 529")
            else "error"
        )

    check()
    for own, kind in [
        ("upstream unreachable (ConnectError)", "ConnectError"),
        ("upstream stream cut (RemoteProtocolError)", "RemoteProtocolError"),
        ("answer over the output bound of 67,108,864 bytes; cut", "_OTHER"),
    ]:
        call = _call(a, a.started_at, status="error", error=own, call=1)
        assert call_error(call, redactor) == (kind, own)  # the bridge's own line, whole


# -- the real CLIs, through the bridge --------------------------------------------------------------
@pytest.fixture
def provider() -> Iterator[Backend]:
    """The loopback fake provider the real CLIs' calls reach through the bridge."""
    served = start_backend()
    yield served
    served.stop()


@pytest.mark.parametrize("name", ["claude", "codex"])
def test_real_the_calls_an_agent_made_through_the_bridge_arrive_as_its_chat_spans(
    tmp_path: Path,
    provider: Backend,
    receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    repo = git_repo(tmp_path / "repo")
    path = real_workflow(
        name, repo, provider, monkeypatch, tmp_path, "Make [[write hello.txt]]", "timeout: 120"
    )
    with Engine(tmp_path / "state") as engine:
        run = engine.run(str(path))
        assert run.status == "completed", run.reason
        [attempt] = work(engine, run.run_id)
        rows = engine.store.calls_of(run.run_id)
        engine.export_otel(run.run_id, endpoint=receiver.endpoint)
    assert len(rows) == 2  # the tool call, then the answer
    agent = f"{attempt_span_id(attempt.dispatch_id):016x}"
    children: list[Received] = sorted(
        (s for s in receiver.spans.values() if s.parent_id == agent),
        key=lambda s: s.attributes["wf_magic.call"],
    )
    assert [
        (
            s.name,
            s.attributes["gen_ai.provider.name"],
            s.attributes["gen_ai.request.model"],
            s.attributes["gen_ai.usage.input_tokens"],
            s.attributes["gen_ai.usage.output_tokens"],
            s.start_ns,
            s.end_ns,
        )
        for s in children
    ] == [
        (
            f"chat {r.model}",
            {"claude": "anthropic", "codex": "openai"}[name],
            r.model,
            r.tokens_in,
            r.tokens_out,
            _ns(r.started_at),
            _ns(r.started_at + r.latency_s),
        )
        for r in rows
    ]
    assert not any(s.status_code == 2 for s in children)
    wire = receiver.wire()
    assert b"sk-" not in wire and b"fake-key" not in wire  # the CLI's key never leaves
