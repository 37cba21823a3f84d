"""A run's trace in Arize Phoenix, a trace backend teams watch (issue 36).

Phoenix's server is started by this module from its own virtualenv, which ``.ci/run``
installs at ``~/.cache/wf_magic-phoenix`` (``$WF_MAGIC_TEST_PHOENIX`` names another
``phoenix`` executable). It has about 70 packages of its own, so it stays out of the project's
venv, and the module skips when it is absent. The fast, exact checks of every attribute are in
tests/test_otel_export.py, against a protobuf-decoding receiver. This module checks that a
real backend takes the same trace: every span under its derived id, parented as sent, two
exports stored once, and no secret anywhere.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers_http import PROXY_ENV, isolate_loopback_env
from tests.test_otel_calls import _call
from tests.test_otel_export import CANARY, _flow, _mix
from wf_magic import Engine
from wf_magic.otel.journal import read_run
from wf_magic.otel.records import trace_id_of
from wf_magic.otel.spans import build_spans

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (wf_magic[otel]) is not installed")

PHOENIX = Path(
    os.environ.get("WF_MAGIC_TEST_PHOENIX")
    or Path.home() / ".cache" / "wf_magic-phoenix" / "bin" / "phoenix"
)
START_S = 180.0
"""Phoenix migrates its database and builds its app at start: ~17 s on a busy 2-core box."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not PHOENIX.exists():
        pytest.skip(f"Arize Phoenix is not installed at {PHOENIX} (.ci/run installs it)")
    work = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in PROXY_ENV}
    env.update(
        PHOENIX_WORKING_DIR=str(work),
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(_free_port()),
        PHOENIX_TELEMETRY_ENABLED="false",
        NO_PROXY="127.0.0.1,localhost",
    )
    log = work / "phoenix.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(PHOENIX), "serve"], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"phoenix serve exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                    url + "/healthz", timeout=2
                ).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"phoenix serve not up in {START_S} s:\n{log.read_text()[-3000:]}")
                time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _spans_of(url: str, trace_id: str, *, expected: int) -> list[dict[str, Any]]:
    """The trace's spans as Phoenix serves them, once it has stored ``expected`` of them."""
    deadline = time.monotonic() + 30
    while True:
        spans = _get(url + "/v1/projects/default/spans?limit=1000")["data"]
        mine = [s for s in spans if s["context"]["trace_id"] == trace_id]
        if len(mine) >= expected or time.monotonic() > deadline:
            return mine
        time.sleep(0.25)


def test_phoenix_stores_the_trace_once_parented_as_sent_without_the_secret(
    tmp_path: Path, phoenix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_loopback_env(monkeypatch)
    _mix()
    with Engine(tmp_path / "state") as engine:
        run = engine.run(_flow(tmp_path, agent=True), params={"api_token": CANARY})
        assert run.status == "completed"
        a = next(a for a in engine.store.attempts_of(run.run_id) if a.step_id == "fix")
        engine.store.record_call(_call(a, a.started_at + 0.1))  # the agent bridge's calls
        body = f'HTTP 529: {{"message": "overloaded {CANARY}"}}'
        engine.store.record_call(_call(a, a.started_at + 2, status="error", error=body))
        first = engine.export_otel(run.run_id, endpoint=phoenix)
        second = engine.export_otel(run.run_id, endpoint=phoenix, content=True)
        sent = build_spans(read_run(engine.store, run.run_id), redactor=engine.redactor)
    assert first.sent == second.sent == len(sent)

    trace = f"{trace_id_of(run.run_id):032x}"
    stored = _spans_of(phoenix, trace, expected=len(sent))
    time.sleep(1.0)  # a second copy, had Phoenix kept one, would be in by now
    stored = _spans_of(phoenix, trace, expected=len(sent))
    assert len(stored) == len(sent)  # two exports, every span once
    parents = {s.span_hex: (f"{s.parent_id:016x}" if s.parent_id else None) for s in sent}
    assert {s["context"]["span_id"]: s["parent_id"] for s in stored} == parents
    assert sorted(s["name"] for s in stored) == sorted(s.name for s in sent)

    by_name = {s["name"]: s for s in stored}
    root = by_name["invoke_workflow traced"]
    assert root["attributes"]["gen_ai.workflow.name"] == "traced"
    assert root["attributes"]["wf_magic.param.api_token"] == "***"
    agent = by_name["invoke_agent claude"]
    assert agent["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    calls = sorted(
        (s for s in stored if s["parent_id"] == agent["context"]["span_id"]),
        key=lambda s: s["attributes"]["wf_magic.call"],
    )
    assert [c["name"] for c in calls] == ["chat claude-sonnet-4-5"] * 2
    assert calls[0]["attributes"]["gen_ai.usage.cache_read.input_tokens"] == 1000
    assert calls[0]["attributes"]["gen_ai.provider.name"] == "anthropic"
    assert [c["status_code"] for c in calls] == ["UNSET", "ERROR"]
    assert calls[1]["attributes"]["error.type"] == "529"
    chats = [
        s
        for s in stored
        if s["attributes"].get("gen_ai.operation.name") == "chat" and s not in calls
    ]
    worked = [c for c in chats if c["status_code"] != "ERROR"]
    assert {c["attributes"]["gen_ai.request.model"] for c in worked} == {"scripted-1"}
    failed = [c for c in chats if c["status_code"] == "ERROR"]
    assert [c["attributes"]["error.type"] for c in failed] == ["TimeoutError"]
    assert CANARY not in json.dumps(stored)


def test_phoenix_keeps_reuse_and_budget_stop_events(
    tmp_path: Path, phoenix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_loopback_env(monkeypatch)
    _mix()
    source = _flow(tmp_path, agent=False)
    with Engine(tmp_path / "state") as engine:
        engine.run(source, params={"api_token": CANARY})
        _mix()
        again = engine.run(source, params={"api_token": CANARY}, new=True)
        stopped = engine.run(
            source.replace("runner: mix\n", "runner: mix\nbudget: {max_units: 2}\n"),
            params={"api_token": CANARY},
            new=True,
            no_cache=True,
        )
        assert (again.status, stopped.status) == ("completed", "failed")
        counts = {}
        for run in (again, stopped):
            counts[run.run_id] = engine.export_otel(run.run_id, endpoint=phoenix).sent

    reused = [
        s
        for s in _spans_of(
            phoenix, f"{trace_id_of(again.run_id):032x}", expected=counts[again.run_id]
        )
        if s["attributes"].get("wf_magic.attempt.status") == "reused"
    ]
    assert len(reused) == 8  # every unit but the exec step's (exec is not cached)
    assert all([e["name"] for e in s["events"]] == ["wf_magic.reuse"] for s in reused)
    spans = _spans_of(
        phoenix, f"{trace_id_of(stopped.run_id):032x}", expected=counts[stopped.run_id]
    )
    root = next(s for s in spans if s["parent_id"] is None)
    assert root["status_code"] == "ERROR"
    assert [e["name"] for e in root["events"]] == ["wf_magic.budget_stop"]
    assert root["events"][0]["attributes"]["wf_magic.reason"].startswith("Budget exceeded in run")
    assert CANARY not in json.dumps(spans)
