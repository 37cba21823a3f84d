"""The openai and replay runners driven by the engine against a real loopback chat server.

Unit-level runner behaviour lives in test_openai_runner.py and test_replay_runner.py; these
tests check what a user sees end to end: the journal, budgets, cost, record/replay through
``wf export-cassette``, secrets, and llm gates judged over HTTP. No test reaches the internet.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sqlite3
import subprocess
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, db_rows, run_wf, wf_cmd
from tests.openai_server import (
    FakeChatServer,
    RecordedRequest,
    ScriptedResponse,
    completion_body,
    isolate_openai_env,
)
from wf_magic import DefinitionError, Engine, load_workflow
from wf_magic.cli import main as wf_main
from wf_magic.runners.openai_chat import OpenAIChatRunner
from wf_magic.store.records import AttemptRow

KEY_ENV = "WF_TEST_KEY"
CANARY = "cnry-7f3a9c1e5b2d4f6a8c0e-d00d"
"""Shaped like no known credential, so only literal masking of the key can hide it."""
SECTIONS_SCHEMA = (
    "{type: object, properties: {sections: {type: array, items: {type: string}}},"
    " required: [sections]}"
)
VERDICT_OK = '{"complete": true, "feedback": "", "missing": []}'


# -- fixtures and helpers ---------------------------------------------------------------------
@pytest.fixture(autouse=True)
def openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The canary key in the environment; no proxy or base-URL setting leaks in."""
    isolate_openai_env(monkeypatch, KEY_ENV, CANARY)


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as running:
        yield running


@pytest.fixture
def engine(state_dir: Path, openai_env: None) -> Iterator[Engine]:
    """An engine built after the canary is in the environment (its redactor reads it)."""
    eng = Engine(state_dir)
    yield eng
    eng.close()


def openai_workflow(
    url: str, steps: str, *, name: str = "digest", head: str = "", options: str = ""
) -> str:
    """A workflow on the ``openai`` runner pointed at ``url`` (``steps`` is indented YAML)."""
    return (
        f"name: {name}\n"
        "runner: openai\n"
        "runners:\n"
        f"  openai: {{base_url: '{url}', api_key_env: {KEY_ENV}, model: m1{options}}}\n"
        f"{textwrap.dedent(head)}"
        "steps:\n"
        f"{textwrap.indent(textwrap.dedent(steps).strip(), '  ')}\n"
    )


def replay_workflow(steps: str, *, name: str = "digest", options: str = "") -> str:
    """The same steps on the ``replay`` runner."""
    return (
        f"name: {name}\n"
        "runner: replay\n"
        f"runners: {{replay: {{{options}}}}}\n"
        "steps:\n"
        f"{textwrap.indent(textwrap.dedent(steps).strip(), '  ')}\n"
    )


def work(engine: Engine, run_id: str) -> list[AttemptRow]:
    """The run's work attempts (gate rows left out), in journal order."""
    return [a for a in engine.attempts(run_id) if a.phase == "work"]


def outputs(engine: Engine, run_id: str) -> dict[str, Any]:
    """Step id → stored output of every step of the run."""
    return {s.step_id: json.loads(s.output_json or "null") for s in engine.steps(run_id)}


def fixed_usage(
    prompt_tokens: int,
    completion_tokens: int,
    content: Callable[[RecordedRequest], str] = lambda r: "ok",
) -> Callable[[RecordedRequest], ScriptedResponse]:
    """A responder answering every request with the same usage."""

    def respond(request: RecordedRequest) -> ScriptedResponse:
        return ScriptedResponse(
            200,
            completion_body(
                content(request),
                model=str(request.body["model"]),
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            ),
        )

    return respond


def cli(*args: str) -> tuple[int, str, str]:
    """``wf ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = wf_main(list(args))
    return code, out.getvalue(), err.getvalue()


def forbid_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """From now on any socket connection fails; returns the addresses that were attempted."""
    attempted: list[object] = []

    def refuse(self: socket.socket, address: object) -> None:
        attempted.append(address)
        raise OSError(f"network disabled in this test (connect to {address!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempted


# -- the request and the journal --------------------------------------------------------------
def test_prompt_model_and_dispatch_id_arrive_as_sent_and_usage_becomes_tokens(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push_reply(
        "Hello, Ada.", prompt_tokens=11, completion_tokens=4, completion_id="chatcmpl-1"
    )
    server.push_reply(
        '```json\n{"sections": ["tides", "moons"]}\n```', prompt_tokens=23, completion_tokens=9
    )
    src = openai_workflow(
        server.url,
        f"""
        - id: greet
          prompt: Say hello to {{{{ params.who }}}}.
        - id: outline
          model: m2
          prompt: Outline {{{{ steps.greet.output }}}}
          output: {SECTIONS_SCHEMA}
        """,
        head="params: {who: {type: string}}\n",
    )

    run = engine.run(src, params={"who": "Ada"})

    assert (run.status, run.reason) == ("completed", None)
    greet, outline = server.requests
    attempts = work(engine, run.run_id)
    assert [a.unit_id for a in attempts] == ["greet", "outline"]
    assert greet.path == "/v1/chat/completions"
    assert greet.body["messages"] == [{"role": "user", "content": "Say hello to Ada."}]
    assert greet.body["model"] == "m1"
    assert "response_format" not in greet.body
    assert greet.headers["authorization"] == f"Bearer {CANARY}"
    for request, attempt in zip(server.requests, attempts, strict=True):
        assert request.headers["idempotency-key"] == attempt.dispatch_id
        assert request.headers["x-request-id"] == attempt.dispatch_id
    assert outline.body["model"] == "m2"
    assert outline.body["response_format"] == {"type": "json_object"}
    assert outline.prompt.startswith("Outline Hello, Ada.\n\n")
    assert '"required": ["sections"]' in outline.prompt  # the schema travels with the prompt
    assert [(a.model, a.tokens_in, a.tokens_out, a.status) for a in attempts] == [
        ("m1", 11, 4, "succeeded"),
        ("m2", 23, 9, "succeeded"),
    ]
    assert attempts[0].session_id == "chatcmpl-1"
    assert outputs(engine, run.run_id) == {
        "greet": "Hello, Ada.",
        "outline": {"sections": ["tides", "moons"]},
    }
    frame = engine.journal(run.run_id)
    assert frame[["unit", "runner", "tokens_in", "tokens_out"]].values.tolist() == [
        ["greet", "openai", 11, 4],
        ["outline", "openai", 23, 9],
    ]
    assert run.budget_use().tokens == 47


def test_schema_mismatch_is_fed_back_to_the_model_through_the_gate_loop(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push_reply('{"headings": ["tides"]}')
    server.push_reply('{"sections": ["tides"]}')
    src = openai_workflow(
        server.url,
        f"""
        - id: outline
          prompt: Outline tides.
          output: {SECTIONS_SCHEMA}
          gate: {{judge: expr, check: "true", max_loops: 2}}
        """,
    )

    run = engine.run(src)

    assert run.status == "completed"
    assert run.output("outline") == {"sections": ["tides"]}
    first, second = server.requests
    assert "Gate feedback" not in first.prompt
    assert (
        "Gate feedback" in second.prompt and "sections" in second.prompt.split("Gate feedback")[1]
    )
    assert [(a.unit_id, a.loop, a.status) for a in work(engine, run.run_id)] == [
        ("outline", 1, "succeeded"),
        ("outline", 2, "succeeded"),
    ]


# -- transient and permanent errors -----------------------------------------------------------
def test_429_then_200_is_sent_again_in_the_same_attempt_with_the_same_idempotency_key(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push(
        429, {"error": {"message": "Rate limit reached for m1"}}, headers={"Retry-After": "0"}
    )
    server.push_reply("fine", prompt_tokens=5, completion_tokens=1)
    src = openai_workflow(
        server.url,
        """
        - id: ask
          prompt: Are you there?
          retry: {max_attempts: 1}
        """,
    )

    run = engine.run(src)

    assert run.status == "completed"
    assert run.output("ask") == "fine"
    attempts = work(engine, run.run_id)
    assert [(a.attempt, a.status, a.transient) for a in attempts] == [(1, "succeeded", None)]
    throttled = engine.events(run.run_id).query("kind == 'throttled'")
    assert len(throttled) == 1
    assert "HTTP 429" in throttled.iloc[0]["data_json"]
    assert "Rate limit reached for m1" in throttled.iloc[0]["data_json"]
    assert [r.headers["idempotency-key"] for r in server.requests] == [attempts[0].dispatch_id] * 2


def test_400_fails_the_run_at_once_with_the_servers_message(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push(
        400,
        {"error": {"message": "model 'm1' is not served here", "type": "invalid_request_error"}},
    )
    src = openai_workflow(
        server.url,
        """
        - id: ask
          prompt: Are you there?
          retry: {max_attempts: 3, backoff_s: 0}
        - id: never
          prompt: Not reached.
        """,
    )

    run = engine.run(src)

    assert run.status == "failed"
    assert "model 'm1' is not served here" in (run.reason or "")
    assert "HTTP 400" in (run.reason or "")
    assert [(a.unit_id, a.attempt, a.status, a.transient) for a in work(engine, run.run_id)] == [
        ("ask", 1, "failed", 0)
    ]
    assert len(server.requests) == 1


def test_server_errors_exhaust_the_retry_policy_then_fail_the_run(
    engine: Engine, server: FakeChatServer
) -> None:
    for _ in range(2):
        server.push(503, {"error": {"message": "overloaded"}})
    src = openai_workflow(
        server.url,
        """
        - id: ask
          prompt: Are you there?
          retry: {max_attempts: 2, backoff_s: 0}
        """,
    )

    run = engine.run(src)

    assert run.status == "failed"
    assert "overloaded" in (run.reason or "")
    assert [(a.attempt, a.status, a.transient) for a in work(engine, run.run_id)] == [
        (1, "failed", 1),
        (2, "failed", 1),
    ]
    assert len(server.requests) == 2


def test_step_timeout_reaches_the_client_and_a_timeout_is_retried(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push(200, completion_body("too late"), delay_s=5)
    server.push_reply("in time")
    src = openai_workflow(
        server.url,
        """
        - id: ask
          prompt: Quick!
          timeout: 0.3
          retry: {max_attempts: 2, backoff_s: 0}
        """,
    )

    run = engine.run(src)

    assert run.status == "completed"
    assert run.output("ask") == "in time"
    attempts = work(engine, run.run_id)
    assert [(a.status, a.transient) for a in attempts] == [("failed", 1), ("succeeded", None)]
    assert "timed out after 0.3s" in (attempts[0].failure or "")


def test_drives_of_one_endpoint_share_one_client_a_new_endpoint_gets_its_own(
    engine: Engine, server: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sweep cells and runs on the model loop reuse one client (and its open connections)
    per endpoint, timeout and key; a drive's end, even a failed one, leaves it open."""
    made: list[object] = []
    new_client = OpenAIChatRunner._new_client

    def counting_new_client(self: OpenAIChatRunner) -> Any:
        client = new_client(self)
        made.append(client)
        return client

    monkeypatch.setattr(OpenAIChatRunner, "_new_client", counting_new_client)
    steps = """
        - id: fan
          map: "{{ ['a', 'b', 'c'] }}"
          prompt: Say {{ item }}.
        """
    head = "execution: {max_concurrency: 3}\n"
    src = openai_workflow(server.url, steps, head=head, options=", timeout_s: 41")

    assert engine.run(src).status == "completed"
    server.push(400, {"error": {"message": "no"}})
    assert engine.run(src.replace("Say", "Shout"), new=True).status == "failed"
    assert engine.run(src.replace("Say", "Sing"), new=True).status == "completed"
    assert len(made) == 1
    assert not made[0].is_closed()  # type: ignore[attr-defined]

    other = openai_workflow(server.url, steps, head=head, options=", timeout_s: 42")
    assert engine.run(other.replace("Say", "Hum"), new=True).status == "completed"
    assert len(made) == 2


# -- budget and cost --------------------------------------------------------------------------
def test_max_tokens_sent_never_exceeds_the_remaining_token_budget(
    engine: Engine, server: FakeChatServer
) -> None:
    server.default = fixed_usage(10, 20)
    src = openai_workflow(
        server.url,
        """
        - id: fan
          map: "{{ ['a', 'b', 'c'] }}"
          prompt: Say {{ item }}.
        - id: last
          prompt: Sum up.
        - id: over
          prompt: One too many.
        """,
        head="budget: {max_tokens: 100}\n",
    )

    run = engine.run(src)

    sent = [r.body.get("max_tokens") for r in server.requests]
    assert sent == [100, 70, 40, 10]
    used_before = 0
    for request, attempt in zip(server.requests, work(engine, run.run_id), strict=True):
        assert request.body["max_tokens"] <= 100 - used_before
        used_before += attempt.tokens_in + attempt.tokens_out
    assert run.status == "failed"
    assert "max_tokens used 120 of 100" in (run.reason or "")
    assert "unit over was not dispatched" in (run.reason or "")


def test_no_max_tokens_is_sent_without_a_token_budget(
    engine: Engine, server: FakeChatServer
) -> None:
    src = openai_workflow(server.url, "- id: ask\n  prompt: Hi.\n")

    assert engine.run(src).status == "completed"
    assert "max_tokens" not in server.requests[0].body


def test_prices_give_each_attempt_a_cost_and_max_cost_stops_the_run(
    engine: Engine, server: FakeChatServer
) -> None:
    server.default = fixed_usage(1000, 500)
    prices = ", prices: {m1: {input_per_mtok: 2.0, output_per_mtok: 8.0}}"
    src = openai_workflow(
        server.url,
        """
        - id: fan
          map: "{{ ['a', 'b', 'c'] }}"
          prompt: Say {{ item }}.
        """,
        head="budget: {max_cost: 0.01}\n",
        options=prices,
    )

    run = engine.run(src)

    attempts = work(engine, run.run_id)
    assert [a.cost for a in attempts] == [pytest.approx(0.006)] * 2
    assert engine.journal(run.run_id)["cost"].tolist() == [pytest.approx(0.006)] * 2
    assert len(server.requests) == 2
    assert run.status == "failed"
    assert "max_cost" in (run.reason or "")
    assert "unit fan[2] was not dispatched" in (run.reason or "")
    assert run.budget_use().cost == pytest.approx(0.012)


def test_a_model_without_a_price_records_no_cost(engine: Engine, server: FakeChatServer) -> None:
    prices = ", prices: {other: {input_per_mtok: 2.0, output_per_mtok: 8.0}}"
    src = openai_workflow(server.url, "- id: ask\n  prompt: Hi.\n", options=prices)

    run = engine.run(src)

    assert run.status == "completed"
    assert [a.cost for a in work(engine, run.run_id)] == [None]


# -- record and replay ------------------------------------------------------------------------
DIGEST_STEPS = f"""
- id: outline
  prompt: Outline a digest of {{{{ params.topic }}}}.
  output: {SECTIONS_SCHEMA}
- id: draft
  map: "{{{{ steps.outline.output.sections }}}}"
  prompt: Write the section '{{{{ item }}}}'.
- id: polish
  prompt: "Polish: {{{{ steps.draft.output | join(' / ') }}}}"
"""
DIGEST_PARAMS = "params: {topic: {type: string, default: tides}}\n"


def record_digest(engine: Engine, server: FakeChatServer) -> str:
    """Run the digest against the server; returns the run id."""

    def answer(request: RecordedRequest) -> str:
        if request.prompt.startswith("Outline"):
            return '{"sections": ["moon", "sun"]}'
        return f"[{request.prompt.split(chr(10))[0]}]"

    server.default = fixed_usage(12, 6, answer)
    run = engine.run(openai_workflow(server.url, DIGEST_STEPS, head=DIGEST_PARAMS))
    assert run.status == "completed", run.reason
    return run.run_id


def replay_source(options: str = "") -> str:
    return replay_workflow(DIGEST_STEPS, options=options).replace(
        "steps:\n", DIGEST_PARAMS + "steps:\n", 1
    )


def test_replay_from_an_exported_cassette_in_a_new_state_dir_is_offline_and_free(
    engine: Engine, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeChatServer() as server:
        recorded_id = record_digest(engine, server)
    code, cassette_text, err = cli("--db", str(state_dir), "export-cassette", recorded_id)
    assert (code, err) == (0, "")
    assert len(server.requests) == 4
    lines = [json.loads(line) for line in cassette_text.splitlines()]
    assert sorted(line["unit"] for line in lines) == ["draft[0]", "draft[1]", "outline", "polish"]
    assert CANARY not in cassette_text
    cassette = tmp_path / "digest.jsonl"
    cassette.write_text(cassette_text, encoding="utf-8")
    attempted = forbid_network(monkeypatch)

    with Engine(tmp_path / "elsewhere") as fresh:
        run = fresh.run(replay_source(f"cassette: '{cassette}', journal: false"))
        assert run.status == "completed", run.reason
        assert outputs(fresh, run.run_id) == outputs(engine, recorded_id)
        attempts = work(fresh, run.run_id)
        assert len(attempts) == 4
        assert {(a.runner, a.status) for a in attempts} == {("replay", "succeeded")}
        assert sum(a.tokens_in + a.tokens_out for a in attempts) == 0
        assert run.budget_use().tokens == 0
        assert fresh.journal(run.run_id)[["tokens_in", "tokens_out"]].sum().tolist() == [0, 0]
    assert attempted == []
    assert len(server.requests) == 4


def test_replay_from_the_journal_of_the_same_state_dir(
    engine: Engine, server: FakeChatServer
) -> None:
    recorded_id = record_digest(engine, server)
    server.stop()
    calls = len(server.requests)

    run = engine.run(replay_source())

    assert run.status == "completed", run.reason
    assert run.run_id != recorded_id
    assert outputs(engine, run.run_id) == outputs(engine, recorded_id)
    assert {
        (a.runner, a.status, a.tokens_in, a.tokens_out, a.reused_from)
        for a in work(engine, run.run_id)
    } == {("replay", "succeeded", 0, 0, None)}
    assert len(server.requests) == calls


def test_a_replay_miss_is_a_permanent_error_naming_the_unit_and_hash(
    engine: Engine, server: FakeChatServer
) -> None:
    record_digest(engine, server)
    server.stop()
    calls = len(server.requests)
    src = replay_source().replace(
        "  prompt: Outline a digest",
        "  retry: {max_attempts: 3, backoff_s: 0}\n    prompt: Outline a short digest",
    )

    run = engine.run(src)

    assert run.status == "failed"
    [attempt] = work(engine, run.run_id)
    assert (attempt.unit_id, attempt.status, attempt.transient) == ("outline", "failed", 0)
    assert "no recorded answer for unit outline" in (run.reason or "")
    assert attempt.input_hash[:12] in (run.reason or "")
    assert len(server.requests) == calls


def test_export_cassette_via_the_cli_subprocess_round_trips(
    engine: Engine, server: FakeChatServer, state_dir: Path, tmp_path: Path
) -> None:
    recorded_id = record_digest(engine, server)
    engine.close()

    done = run_wf(state_dir, "export-cassette", recorded_id)

    assert (done.returncode, done.stderr) == (0, "")
    cassette = tmp_path / "tape.jsonl"
    cassette.write_text(done.stdout, encoding="utf-8")
    server.stop()
    with Engine(tmp_path / "replayed") as fresh:
        run = fresh.run(replay_source(f"cassette: '{cassette}'"))
        assert run.status == "completed", run.reason
        assert run.result == engine.status(recorded_id).result


def test_replay_answers_an_llm_gate_from_its_recorded_verdict(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push_reply("An essay on tides.")
    server.push_reply(VERDICT_OK)
    steps = """
        - id: essay
          prompt: Write an essay on tides.
          gate: {criteria: [mentions the moon], max_loops: 2}
        """
    recorded = engine.run(openai_workflow(server.url, steps))
    assert recorded.status == "completed"
    server.stop()

    run = engine.run(replay_workflow(steps))

    assert (run.status, run.reason) == ("completed", None)
    assert run.output("essay") == "An essay on tides."


# -- secrets ----------------------------------------------------------------------------------
def leaky() -> Callable[[RecordedRequest], ScriptedResponse]:
    """A server that echoes the caller's credentials back: in errors and in replies.

    ``Fail…`` prompts get a 401 quoting the key; ``Flaky…`` prompts a 500 quoting it on their
    first request; ``Json…`` prompts a JSON reply carrying it; others a text reply with it.
    """
    seen: set[str] = set()
    lock = threading.Lock()

    def respond(request: RecordedRequest) -> ScriptedResponse:
        auth = request.headers.get("authorization", "")
        bare = auth.removeprefix("Bearer ")
        prompt = request.prompt
        with lock:
            first = prompt not in seen
            seen.add(prompt)
        if prompt.startswith("Fail"):
            return ScriptedResponse(401, {"error": {"message": f"bad key {bare} ({auth})"}})
        if prompt.startswith("Flaky") and first:
            return ScriptedResponse(500, {"error": {"message": f"oops for {bare}"}})
        content = (
            f'{{"echo": "{bare}", "authorization": "{auth}", "note": "key={bare}"}}'
            if prompt.startswith("Json")
            else f"You sent {auth}; i.e. {bare}."
        )
        return ScriptedResponse(200, completion_body(content, prompt_tokens=3, completion_tokens=3))

    return respond


def scan_db(state_dir: Path, needle: str) -> list[str]:
    """Every table.column of state.db whose text contains ``needle``; and raw file hits."""
    hits: list[str] = []
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        # The tables, and the views read from them (`units`, `events`: DESIGN §7).
        tables = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        ]
        assert {"runs", "steps", "units", "attempts", "events", "event_log"} <= set(tables)
        for table in tables:
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info('{table}')")]
            for column in columns:
                found = conn.execute(
                    f'SELECT COUNT(*) FROM "{table}" WHERE CAST("{column}" AS TEXT) LIKE ?',
                    (f"%{needle}%",),
                ).fetchone()[0]
                if found:
                    hits.append(f"{table}.{column}")
    finally:
        conn.close()
    for path in state_dir.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            hits.append(f"file {path.name}")
    return hits


def test_a_canary_key_never_reaches_the_state_db_or_printed_output(
    server: FakeChatServer, state_dir: Path, tmp_path: Path
) -> None:
    server.default = leaky()
    wf_file = tmp_path / "leaky.yaml"
    wf_file.write_text(
        openai_workflow(
            server.url,
            """
        - id: plain
          prompt: Plain, please.
        - id: structured
          prompt: Json, please.
          output: {type: object}
        - id: flaky
          map: "{{ range(4) | list }}"
          prompt: Flaky {{ item }}.
          retry: {max_attempts: 3, backoff_s: 0}
          on_error: continue
        - id: broken
          prompt: Fail, please.
        """,
            name="leaky",
        ),
        encoding="utf-8",
    )

    done = run_wf(state_dir, "run", str(wf_file))
    [(run_id,)] = db_rows(state_dir, "SELECT run_id FROM runs")

    assert done.returncode == 1, done.stderr
    printed = [done.stdout, done.stderr]
    for args in (
        ("status", run_id),
        ("journal", run_id, "--format", "json"),
        ("events", run_id, "--format", "json"),
        ("export-cassette", run_id),
    ):
        _, out, err = cli("--db", str(state_dir), *map(str, args))
        printed += [out, err]
    assert "bad key" in "".join(printed)  # the server's message is shown, masked
    assert [i for i, text in enumerate(printed) if CANARY in text] == []
    assert scan_db(state_dir, CANARY) == []
    assert len(server.requests) >= 5
    assert all(r.headers["authorization"] == f"Bearer {CANARY}" for r in server.requests)


def test_a_key_in_a_variable_whose_name_looks_harmless_is_still_masked(
    server: FakeChatServer, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_ACCESS", CANARY)  # no KEY/TOKEN/SECRET in the name
    server.default = leaky()
    src = openai_workflow(
        server.url,
        """
        - id: plain
          prompt: Plain, please.
        - id: structured
          prompt: Json, please.
          output: {type: object}
        - id: broken
          prompt: Fail, please.
        """,
    ).replace(f"api_key_env: {KEY_ENV}", "api_key_env: LLM_ACCESS")
    monkeypatch.delenv(KEY_ENV)

    with Engine(state_dir) as eng:
        run = eng.run(src)
        assert run.status == "failed"
        assert CANARY not in (run.reason or "")
        assert "***" in run.output("plain")
    assert scan_db(state_dir, CANARY) == []


# -- llm gates judged over HTTP ---------------------------------------------------------------
def test_an_llm_gate_judged_by_openai_is_journaled_with_its_tokens_and_not_charged(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push_reply("Tides follow the sun.", prompt_tokens=8, completion_tokens=5)
    server.push_reply(
        '{"complete": false, "feedback": "mention the moon", "missing": ["moon"]}',
        prompt_tokens=40,
        completion_tokens=12,
    )
    server.push_reply("Tides follow the moon.", prompt_tokens=9, completion_tokens=5)
    server.push_reply(VERDICT_OK, prompt_tokens=41, completion_tokens=11)
    src = openai_workflow(
        server.url,
        """
        - id: essay
          prompt: Write about tides.
          gate:
            criteria: [mentions the moon]
            runner: openai
            model: judge-m
            max_loops: 2
        """,
        head="budget: {max_tokens: 40}\n",
    )

    run = engine.run(src)

    assert (run.status, run.reason) == ("completed", None)
    assert run.output("essay") == "Tides follow the moon."
    rows = [
        (
            a.unit_id,
            a.phase,
            a.loop,
            a.runner,
            a.model,
            a.status,
            a.tokens_in,
            a.tokens_out,
            a.charged,
        )
        for a in engine.attempts(run.run_id)
    ]
    assert rows == [
        ("essay", "work", 1, "openai", "m1", "succeeded", 8, 5, 1),
        ("essay.gate:l1", "gate", 1, "openai", "judge-m", "succeeded", 40, 12, 0),
        ("essay", "work", 2, "openai", "m1", "succeeded", 9, 5, 1),
        ("essay.gate:l2", "gate", 2, "openai", "judge-m", "succeeded", 41, 11, 0),
    ]
    judge_1 = server.requests[1]
    assert judge_1.body["model"] == "judge-m"
    assert judge_1.body["response_format"] == {"type": "json_object"}
    assert "mentions the moon" in judge_1.prompt and "Tides follow the sun." in judge_1.prompt
    assert "max_tokens" not in judge_1.body
    assert "mention the moon" in server.requests[2].prompt  # the feedback reached the model
    gate_attempts = [a for a in engine.attempts(run.run_id) if a.phase == "gate"]
    assert [r.headers["idempotency-key"] for r in server.requests[1::2]] == [
        a.dispatch_id for a in gate_attempts
    ]
    assert json.loads(gate_attempts[1].output_json or "") == {
        **json.loads(VERDICT_OK),
        "judge": "llm",
    }
    assert run.budget_use().tokens == 27
    assert engine.journal(run.run_id)["charged"].tolist() == [True, False, True, False]


def test_an_unparsable_verdict_blocks_the_step_without_consuming_a_loop(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push_reply("Tides.")
    server.push_reply("I think it is fine.")
    src = openai_workflow(
        server.url,
        """
        - id: essay
          prompt: Write about tides.
          gate: {criteria: [short], max_loops: 2}
        """,
    )

    run = engine.run(src)

    assert run.status == "blocked"
    assert "judge failed on loop 1" in (run.reason or "")
    server.push_reply(VERDICT_OK)
    again = engine.drive(run.run_id)
    assert again.status == "completed"
    assert [(a.unit_id, a.status) for a in engine.attempts(run.run_id)] == [
        ("essay", "succeeded"),
        ("essay.gate:l1", "failed"),
        ("essay.gate:l1", "succeeded"),
    ]
    assert len(server.requests) == 3  # the work was not re-dispatched


def test_named_instances_of_the_openai_runner_keep_their_own_options(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push_reply("draft")
    server.push_reply(VERDICT_OK)
    src = f"""
name: two-endpoints
runner: local
runners:
  local: {{type: openai, base_url: '{server.url}', model: small}}
  judge: {{type: openai, base_url: '{server.url}', api_key_env: {KEY_ENV}, model: large}}
steps:
  - id: draft
    prompt: Draft it.
    gate: {{runner: judge, criteria: [clear]}}
"""

    run = engine.run(src)

    assert run.status == "completed", run.reason
    assert [(r.body["model"], r.headers["authorization"]) for r in server.requests] == [
        ("small", "Bearer unused"),
        ("large", f"Bearer {CANARY}"),
    ]
    assert [(a.runner, a.model) for a in engine.attempts(run.run_id)] == [
        ("local", "small"),
        ("judge", "large"),
    ]


def test_a_literal_api_key_in_the_workflow_is_refused_before_anything_is_stored(
    engine: Engine, state_dir: Path, server: FakeChatServer
) -> None:
    src = openai_workflow(server.url, "- id: ask\n  prompt: Hi.\n").replace(
        f"api_key_env: {KEY_ENV}", "api_key: 'gsk_0a1b2c3d4e5f6a7b8c9d'"
    )

    with pytest.raises(DefinitionError, match="api_key"):
        engine.run(src)
    engine.close()

    assert not (state_dir / "state.db").exists() or scan_db(state_dir, "0a1b2c3d4e5f") == []
    assert server.requests == []


# -- plugins ----------------------------------------------------------------------------------
def plugin_snippet() -> str:
    """The runner plugin example of docs/runners.md."""
    text = (ROOT / "docs" / "runners.md").read_text(encoding="utf-8")
    section = text.split("## Writing a runner plugin", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_plugin_registers_and_runs(engine: Engine) -> None:
    code = plugin_snippet().replace(
        'register_runner("shout", shout_factory)',
        'register_runner("shout", shout_factory, replace=True)',
    )
    exec(compile(code, "docs/runners.md", "exec"), {"__name__": "shout_doc"})

    run = engine.run(
        'name: loud\nrunner: shout\nrunners: {shout: {suffix: "!"}}\n'
        "steps:\n  - id: a\n    prompt: hello there\n"
    )

    assert run.status == "completed", run.reason
    assert run.output("a") == "HELLO THERE!"
    assert [(a.model, a.tokens_in, a.tokens_out) for a in work(engine, run.run_id)] == [
        ("shout-1", 2, 2)
    ]


def test_a_plugin_declared_as_an_entry_point_is_found_without_an_import(
    tmp_path: Path, state_dir: Path
) -> None:
    site = tmp_path / "site"
    (site / "shout_runner-0.1.dist-info").mkdir(parents=True)
    (site / "shout_runner-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: shout-runner\nVersion: 0.1\n", encoding="utf-8"
    )
    (site / "shout_runner-0.1.dist-info" / "entry_points.txt").write_text(
        "[wf_magic.runners]\nshout = shout_runner:shout_factory\n", encoding="utf-8"
    )
    module = plugin_snippet().replace('wf_magic.register_runner("shout", shout_factory)', "")
    (site / "shout_runner.py").write_text(module, encoding="utf-8")
    wf_file = tmp_path / "loud.yaml"
    wf_file.write_text(
        "name: loud\nrunner: shout\nsteps:\n  - id: a\n    prompt: hi you\n", encoding="utf-8"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}

    done = subprocess.run(
        wf_cmd(state_dir, "run", str(wf_file)),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert db_rows(state_dir, "SELECT output_json FROM steps") == [('"HI YOU"',)]


# -- examples ---------------------------------------------------------------------------------
def test_the_local_example_runs_against_an_openai_compatible_server(
    engine: Engine, server: FakeChatServer
) -> None:
    source = (ROOT / "examples" / "openai_local.yaml").read_text(encoding="utf-8")
    assert "http://localhost:11434/v1" in source
    server.default = fixed_usage(
        10,
        10,
        lambda r: (
            '{"sections": ["one", "two", "three"]}' if r.prompt.startswith("Outline") else "text"
        ),
    )

    run = engine.run(source.replace("http://localhost:11434/v1", server.url))

    assert run.status == "completed", run.reason
    assert {r.body["model"] for r in server.requests} == {"llama3.2"}


def test_the_cloud_example_names_its_key_variable_and_prices(
    engine: Engine, server: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = ROOT / "examples" / "openai_cloud.yaml"
    wf = load_workflow(path)
    options = wf.plan.runners["openai"]
    assert options["api_key_env"] == "OPENAI_API_KEY"
    assert "gpt-4o-mini" in options["prices"]
    assert "base_url" not in options
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    monkeypatch.setenv("WF_MAGIC_OPENAI_BASE_URL", server.url)
    server.default = fixed_usage(
        100,
        50,
        lambda r: (
            '{"sections": ["one", "two", "three"]}'
            if r.prompt.startswith("Outline")
            else VERDICT_OK
            if r.prompt.startswith("Judge")
            else "text"
        ),
    )

    run = engine.run(path)

    assert run.status == "completed", run.reason
    assert {r.headers["authorization"] for r in server.requests} == {f"Bearer {CANARY}"}
    assert all(a.cost and a.cost > 0 for a in engine.attempts(run.run_id) if a.runner == "openai")
    assert {r.body["model"] for r in server.requests} == {"gpt-4o-mini", "gpt-4o"}
