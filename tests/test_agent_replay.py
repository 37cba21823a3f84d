"""Record and replay of an agent's model calls (issue 35 item 5): the bridge keeps what each
call sent and got back (redacted, capped), ``wf export-cassette`` writes it, and an agent step
with ``runners: {claude: {replay: tape}}`` is answered from it offline, in order, at no
cost. The fast tier drives a fake Claude Code that makes real HTTP calls
(tests/agent_fakes/api_agent.py) against the loopback fake backend (tests/agent_backends.py);
the real tier drives the real Claude Code and Codex CLIs the same way."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.agent_backends import USAGE_IN, USAGE_OUT, Backend, start_backend
from tests.agent_fakes.bins import git_repo
from tests.conftest import run_wf
from tests.helpers_http import isolate_loopback_env
from tests.test_agents_real import real_workflow, work
from wf_magic import Engine
from wf_magic.bridge.tape import (
    HOME_MARK,
    RECORD_CAP,
    WORKDIR_MARK,
    Capture,
    mark_folders,
    tool_names,
    unmark_folders,
)
from wf_magic.errors import DefinitionError, RunnerError
from wf_magic.runners.cassette_calls import load_calls
from wf_magic.runners.replay import export_cassette, load_cassette

CANARY = "sk-ant-CANARY-replay-35-9f3e1d"
API_AGENT = Path(__file__).with_name("agent_fakes") / "api_agent.py"


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    isolate_loopback_env(monkeypatch)
    served = start_backend()
    yield served
    served.stop()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_repo(tmp_path / "repo")


@pytest.fixture
def claude_bin(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "claude"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(API_AGENT)!r}, run_name='__main__')\n"
    )
    path.chmod(0o755)
    return path


def _workflow(
    repo: Path,
    claude_bin: Path,
    *,
    prompt: str = "Make [[write hello.txt]]",
    model: str = "claude-sonnet-4-5",
    replay: Path | None = None,
    name: str = "rec",
) -> Path:
    option = f"replay: {json.dumps(str(replay))}, " if replay is not None else ""
    path = repo / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nsteps:\n  - id: fix\n    agent: claude\n    prompt: {json.dumps(prompt)}\n"
        f"    model: {model}\n    pass_env: [ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY]\n"
        f"runners:\n  claude: {{{option}bin: {claude_bin}}}\n"
    )
    return path


def _record(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> tuple[Any, Path]:
    """Record the two-call session (a Write tool call, then the answer): the run, the cassette."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", upstream.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    run = engine.run(str(_workflow(repo, claude_bin)))
    assert run.status == "completed", run.reason
    assert (repo / "hello.txt").read_text() == "written by the agent\n"
    tape = tmp_path / "tape.jsonl"
    tape.write_text("".join(line + "\n" for line in export_cassette(engine.store, run.run_id)))
    return run, tape


def _offline(upstream: Backend, repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The upstream is down, the key is gone and the agent's file is removed."""
    upstream.stop()
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    (repo / "hello.txt").unlink()


def _lines(tape: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in tape.read_text().splitlines() if line.strip()]


def _warnings(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    return [
        json.loads(e.data_json or "{}")
        for e in engine.store.events_after(run_id)
        if e.kind == "warning"
    ]


def test_a_cassette_recorded_in_one_folder_replays_into_another(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The recording's folder is kept as a mark (the cassette names no local path), and the
    replaying agent's ``Write`` lands in its own folder: a classroom's checkout, not the
    recorder's."""
    recorded, tape = _record(engine, repo, claude_bin, upstream, monkeypatch, tmp_path)
    text = tape.read_text()
    assert str(repo) not in text and str(repo.resolve()) not in text
    assert WORKDIR_MARK in text
    stored = engine.store.recorded_calls(recorded.run_id)
    assert len(stored) == 2
    assert all(str(repo) not in f"{c.body.request}{c.body.response}" for c in stored)
    _offline(upstream, repo, monkeypatch)

    elsewhere = git_repo(tmp_path / "classroom" / "checkout")
    replay = engine.run(str(_workflow(elsewhere, claude_bin, replay=tape, name="moved")))
    assert replay.status == "completed", replay.reason
    assert (elsewhere / "hello.txt").read_text() == "written by the agent\n"
    assert not (repo / "hello.txt").exists()  # nothing written where it was recorded
    [attempt] = work(engine, replay.run_id)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None and "replay_warnings" not in facts


_PATH_PART = st.text(alphabet="abcXYZ019_-. ", min_size=1, max_size=8).filter(
    lambda p: p not in (".", "..")
)


@given(
    recorded=st.lists(_PATH_PART, min_size=1, max_size=4),
    replayed=st.lists(_PATH_PART, min_size=1, max_size=4),
    name=_PATH_PART,
    before=st.sampled_from(['"', " ", "'", "(", "path: ", "\n", "<path>"]),
    after=st.sampled_from(['"', "/", " ", ".", ",", ")", "", "\n"]),
)
def test_the_agents_folder_is_kept_as_a_mark_and_written_back_as_the_replays(
    recorded: list[str], replayed: list[str], name: str, before: str, after: str
) -> None:
    old = "/" + "/".join(recorded)
    new = "/srv/" + "/".join(replayed)
    body = json.dumps({"file_path": f"{old}/{name}", "note": f"{before}{old}{after}"})
    kept = mark_folders(body, {WORKDIR_MARK: old})
    assert json.loads(kept)["file_path"] == f"{WORKDIR_MARK}/{name}"
    back = json.loads(unmark_folders(kept, {WORKDIR_MARK: new}, json_text=True))
    assert back["file_path"] == f"{new}/{name}"
    assert back["note"] == f"{before}{new}{after}"
    # A sibling that only starts like the folder is not the folder.
    sibling = json.dumps({"p": f"{old}x/{name}"})
    assert mark_folders(sibling, {WORKDIR_MARK: old}) == sibling
    # A folder inside another keeps its own mark (the longer path is marked first).
    nested = json.dumps({"home": f"{old}/home/.claude", "cwd": old})
    marks = {WORKDIR_MARK: old, HOME_MARK: f"{old}/home"}
    assert json.loads(mark_folders(nested, marks)) == {
        "home": f"{HOME_MARK}/.claude",
        "cwd": WORKDIR_MARK,
    }


@pytest.mark.backends
def test_a_recorded_session_replays_offline_with_the_same_files_answer_and_no_cost(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    recorded, tape = _record(engine, repo, claude_bin, upstream, monkeypatch, tmp_path)
    calls = [line for line in _lines(tape) if line.get("kind") == "agent_call"]
    assert [(c["step"], c["unit"], c["attempt"], c["call"]) for c in calls] == [
        ("fix", "fix", 1, 1),
        ("fix", "fix", 1, 2),
    ]
    assert [c["http_status"] for c in calls] == [200, 200]
    assert all(c["content_type"] == "text/event-stream" for c in calls)
    assert [c["tools"] for c in calls] == [["Write", "Bash"], ["Write", "Bash"]]
    assert "tool_use" in calls[0]["response"] and "TRIED" in calls[1]["response"]
    assert json.loads(calls[0]["request"])["model"] == "claude-sonnet-4-5"
    assert not any(c["request_truncated"] or c["response_truncated"] for c in calls)
    served = len(upstream.requests)
    _offline(upstream, repo, monkeypatch)

    replay = engine.run(str(_workflow(repo, claude_bin, replay=tape, name="replayed")))
    assert replay.status == "completed", replay.reason
    assert replay.result == recorded.result == "TRIED"
    assert (repo / "hello.txt").read_text() == "written by the agent\n"
    assert len(upstream.requests) == served  # nothing went upstream
    rows = engine.calls(replay.run_id)
    assert rows.equals(replay.calls())  # the Run handle's frame is the engine's
    assert replay.calls(unit="other").empty
    assert list(rows["call"]) == [1, 2]
    assert list(rows["status"]) == ["ok", "ok"]
    assert list(rows["price_source"]) == ["replay", "replay"]
    assert (rows["cost"].sum(), rows["tokens_in"].sum(), rows["tokens_out"].sum()) == (0, 0, 0)
    assert list(rows["model"]) == ["claude-sonnet-4-5", "claude-sonnet-4-5"]
    [attempt] = work(engine, replay.run_id)
    assert (attempt.tokens_in, attempt.tokens_out, attempt.cost) == (0, 0, 0.0)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None
    assert facts["replay"]["recorded"] == 2 and facts["replay"]["served"] == 2
    assert "replay_warnings" not in facts
    assert _warnings(engine, replay.run_id) == []
    # What the recording paid stays on its own run.
    paid = engine.calls(recorded.run_id)
    assert list(paid["tokens_in"]) == [USAGE_IN, USAGE_IN]
    assert list(paid["tokens_out"]) == [USAGE_OUT, USAGE_OUT]


def test_wf_show_names_a_replayed_attempt_as_a_replay_and_not_a_disagreement(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The replayed calls cost nothing while the CLI reports the recording's usage: that is
    the replay, so ``wf show`` says so instead of flagging the two as disagreeing."""
    _, tape = _record(engine, repo, claude_bin, upstream, monkeypatch, tmp_path)
    _offline(upstream, repo, monkeypatch)
    replay = engine.run(str(_workflow(repo, claude_bin, replay=tape, name="replayed")))
    assert replay.status == "completed", replay.reason
    shown = run_wf(engine.state_dir, "show", replay.run_id, "fix")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "calls      2 through the bridge: 0 in / 0 out, $0.000000" in lines
    assert any(line.startswith(f"cli report {2 * USAGE_IN} in / ") for line in lines)
    assert [line for line in lines if line.startswith("DISAGREE")] == []
    assert [line for line in lines if line.startswith("replayed")] == [
        f"replayed   2 of 2 recorded call(s) from cassette {tape} (unit fix, attempt 1): "
        "nothing was paid; the CLI's report is the recording's"
    ]


def test_no_credential_reaches_the_cassette_or_the_state(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _, tape = _record(engine, repo, claude_bin, upstream, monkeypatch, tmp_path)
    # The key went upstream in the header and in the request body's metadata.
    assert upstream.requests[0]["headers"]["x-api-key"] == CANARY
    assert upstream.requests[0]["body"]["metadata"]["user_id"] == CANARY
    text = tape.read_text()
    assert CANARY not in text and CANARY[:12] not in text
    calls = [line for line in _lines(tape) if line.get("kind") == "agent_call"]
    assert json.loads(calls[0]["request"])["metadata"]["user_id"].endswith("***")
    engine.close()
    leaked = [
        p for p in engine.state_dir.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()
    ]
    assert leaked == []


def test_a_request_that_differs_from_the_recording_is_answered_and_named_in_a_warning(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _, tape = _record(engine, repo, claude_bin, upstream, monkeypatch, tmp_path)
    _offline(upstream, repo, monkeypatch)
    path = _workflow(
        repo,
        claude_bin,
        prompt="Make [[write hello.txt]] [[tools Write,Grep]]",
        model="claude-opus-4-1",
        replay=tape,
        name="diverged",
    )
    run = engine.run(str(path))
    assert run.status == "completed", run.reason
    assert (repo / "hello.txt").read_text() == "written by the agent\n"
    said = [w["message"] for w in _warnings(engine, run.run_id) if w["reason"] == "replay"]
    assert said == [
        f"replay: call {n} differs from the recording (model claude-opus-4-1, recorded "
        "claude-sonnet-4-5; tools +Grep, -Bash); answered with the recorded answer"
        for n in (1, 2)
    ]


def test_a_call_past_the_recording_fails_the_attempt_in_one_line(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _, tape = _record(engine, repo, claude_bin, upstream, monkeypatch, tmp_path)
    _offline(upstream, repo, monkeypatch)
    lines = tape.read_text().splitlines()
    tape.write_text("\n".join(line for line in lines if '"call":2,' not in line) + "\n")
    run = engine.run(str(_workflow(repo, claude_bin, replay=tape, name="short")))
    assert run.status == "failed"
    assert run.reason is not None and len(run.reason.splitlines()) == 1
    assert run.reason == (
        "step fix: unit fix failed: claude failed (replay): replay exhausted after 1 calls: "
        f"the CLI made call 2 and cassette {tape} (unit fix, attempt 1) has no more"
    )
    [attempt] = work(engine, run.run_id)
    assert not attempt.transient
    rows = engine.calls(run.run_id)
    assert list(rows["status"]) == ["ok", "error"]
    assert rows["cost"].sum() == 0


def test_a_truncated_answer_is_not_replayed(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _, tape = _record(engine, repo, claude_bin, upstream, monkeypatch, tmp_path)
    _offline(upstream, repo, monkeypatch)
    lines = _lines(tape)
    for line in lines:
        if line.get("kind") == "agent_call" and line["call"] == 1:
            line["response_truncated"] = True
    tape.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = engine.run(str(_workflow(repo, claude_bin, replay=tape, name="cut")))
    assert run.status == "failed"
    assert run.reason is not None and run.reason.endswith(
        f"call 1 of cassette {tape} (unit fix, attempt 1) cannot be replayed: its answer was "
        f"cut at the recording cap of {RECORD_CAP:,} bytes"
    )
    assert not (repo / "hello.txt").exists()


def test_a_unit_the_cassette_never_recorded_fails_before_the_cli_starts(
    engine: Engine, repo: Path, claude_bin: Path, tmp_path: Path
) -> None:
    tape = tmp_path / "empty.jsonl"
    tape.write_text('{"input_hash": "abc", "output": "x"}\n')
    run = engine.run(str(_workflow(repo, claude_bin, replay=tape, name="unrecorded")))
    assert run.status == "failed"
    assert run.reason == (
        f"step fix: unit fix failed: claude: replay cassette {tape} has no recorded model calls "
        "of step fix unit fix; export it with `wf export-cassette RUN` from a run whose agent "
        "calls went through the bridge"
    )


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("replay: 3", "replay: expected a cassette path (got 3)"),
        ("replay: ''", "replay: expected a cassette path (got '')"),
        ("replay: t.jsonl, bridge: false", "replay: answers through the bridge; remove bridge"),
    ],
)
def test_a_bad_replay_option_is_one_line_naming_it(
    engine: Engine, repo: Path, claude_bin: Path, option: str, said: str
) -> None:
    path = repo / "bad.yaml"
    path.write_text(
        "name: bad\nsteps:\n  - id: fix\n    agent: claude\n    prompt: hi\n"
        f"runners:\n  claude: {{{option}, bin: {claude_bin}}}\n"
    )
    with pytest.raises(DefinitionError) as caught:
        engine.run(str(path))
    text = str(caught.value)
    assert text.startswith(f"runners.claude: runner options rejected: {said}"), text
    assert len(text.splitlines()) == 1


def test_the_replay_runner_skips_agent_call_lines_and_old_cassettes_still_load(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _, tape = _record(engine, repo, claude_bin, upstream, monkeypatch, tmp_path)
    old = '{"input_hash":"h1","output":"a","phase":"work","step":"s","unit":"s"}\n'
    tape.write_text(old + tape.read_text())
    prompt_lines = [line for line in _lines(tape) if "kind" not in line]
    assert len(prompt_lines) == 2  # the old line and the agent unit's own answer
    loaded = load_cassette(tape)
    hashes = {line.get(k) for line in prompt_lines for k in ("input_hash", "content_hash")}
    assert ("work", "h1") in loaded and {h for _, h in loaded} <= hashes
    only_old = tmp_path / "old.jsonl"
    only_old.write_text(old)
    assert list(load_cassette(only_old)) == [("work", "h1")]


def test_wf_export_cassette_prints_the_agent_calls(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    run, tape = _record(engine, repo, claude_bin, upstream, monkeypatch, tmp_path)
    printed = run_wf(engine.state_dir, "export-cassette", run.run_id)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == tape.read_text()
    assert CANARY not in printed.stdout


def test_wf_run_replay_answers_every_step_of_a_whole_run_from_the_cassette(
    engine: Engine,
    repo: Path,
    claude_bin: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", upstream.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    path = repo / "whole.yaml"
    path.write_text(
        "name: whole\nsteps:\n  - id: plan\n    prompt: Plan the fix.\n"
        "  - id: fix\n    agent: claude\n    prompt: 'Make [[write hello.txt]]'\n"
        "    model: claude-sonnet-4-5\n    pass_env: [ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY]\n"
        f"runners:\n  claude: {{bin: {claude_bin}}}\n"
    )
    recorded = engine.run(str(path))
    assert recorded.status == "completed", recorded.reason
    tape = tmp_path / "tape.jsonl"
    tape.write_text("".join(f"{line}\n" for line in export_cassette(engine.store, recorded.run_id)))
    _offline(upstream, repo, monkeypatch)
    done = run_wf(engine.state_dir, "run", "--replay", str(tape), str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.split()[1]
    assert engine.status(run_id).result == recorded.result == "TRIED"
    assert (repo / "hello.txt").read_text() == "written by the agent\n"
    rows = engine.calls(run_id)
    assert list(rows["price_source"]) == ["replay", "replay"]
    attempts = {a.step_id: a for a in engine.store.attempts_of(run_id)}
    assert attempts["plan"].output_json == engine.store.attempts_of(recorded.run_id)[0].output_json
    spent = {k: (a.tokens_in, a.tokens_out, a.cost or 0.0) for k, a in attempts.items()}
    assert spent == {"plan": (0, 0, 0.0), "fix": (0, 0, 0.0)}
    plan = json.loads(engine.get_run(run_id).plan_json)
    assert plan["runners"]["scripted"] == {"type": "replay", "cassette": str(tape.resolve())}
    assert plan["runners"]["claude"] == {"bin": str(claude_bin), "replay": str(tape.resolve())}


def test_wf_run_replay_of_a_missing_cassette_is_one_line(
    engine: Engine, repo: Path, claude_bin: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.jsonl"
    done = run_wf(
        engine.state_dir, "run", "--replay", str(missing), str(_workflow(repo, claude_bin))
    )
    assert done.returncode != 0
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"--replay {missing}: no such cassette file; write one with `wf export-cassette RUN > "
            f"{missing}` after a run against the real runners."
        )
    )


GOOD_CALL = {
    "kind": "agent_call",
    "step": "fix",
    "unit": "fix",
    "attempt": 1,
    "call": 1,
    "path": "/v1/messages",
    "response": "{}",
    "http_status": 200,
}
BAD_VALUES = st.one_of(
    st.floats(allow_nan=True),
    st.booleans(),
    st.lists(st.integers(), min_size=1, max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.integers(max_value=-1),
)


@given(
    field=st.sampled_from(
        ["step", "unit", "attempt", "call", "path", "response", "http_status", "tools", "model"]
    ),
    bad=BAD_VALUES,
)
def test_a_malformed_agent_call_line_is_one_line_naming_the_line_and_field(
    tmp_path_factory: pytest.TempPathFactory, field: str, bad: Any
) -> None:
    tape = tmp_path_factory.mktemp("tape") / "tape.jsonl"
    line = {**GOOD_CALL, field: bad}
    tape.write_text(json.dumps(GOOD_CALL) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(RunnerError) as caught:
        load_calls(tape)
    said = str(caught.value)
    assert said.startswith(f"replay cassette {tape} line 2: {field} must be ")
    assert len(said.splitlines()) == 1


def test_agent_call_lines_load_by_step_unit_and_attempt_in_call_order(tmp_path: Path) -> None:
    tape = tmp_path / "tape.jsonl"
    lines = [{**GOOD_CALL, "call": 2}, GOOD_CALL, {**GOOD_CALL, "attempt": 2}]
    tape.write_text("".join(json.dumps(line) + "\n" for line in lines))
    loaded = load_calls(tape)
    assert {k: [c.call for c in v] for k, v in loaded.items()} == {
        ("fix", "fix", 1): [1, 2],
        ("fix", "fix", 2): [1],
    }


# -- the capture and the request reading ---------------------------------------------------


def test_an_answer_past_the_cap_is_kept_clipped_and_marked_truncated() -> None:
    capture = Capture(method="POST", path="/v1/messages", request=b"{}")
    capture.status = 200
    capture.keep(b"x" * (RECORD_CAP - 1))
    assert not capture.cut
    capture.keep(b"yz")
    body = capture.body(lambda text: text)
    assert body.response_truncated and body.response is not None
    assert len(body.response) == RECORD_CAP and body.response.endswith("y")
    big = Capture(method="POST", path="/v1/messages", request=b"{" + b" " * RECORD_CAP + b"}")
    assert big.body(lambda text: text).request_truncated


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"tools": [{"name": "Write"}, {"name": "Bash"}]}, ["Write", "Bash"]),  # Anthropic
        ({"tools": [{"type": "function", "name": "exec_command"}]}, ["exec_command"]),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, ["f"]),  # Chat
        ({"tools": [{"functionDeclarations": [{"name": "g"}, {"name": "h"}]}]}, ["g", "h"]),
        ({"tools": [{"type": "web_search"}]}, ["web_search"]),
        ({"model": "m"}, []),
        ({"tools": "nope"}, []),
    ],
)
def test_the_tools_a_request_offers_are_read_in_each_dialect(
    body: dict[str, Any], names: list[str]
) -> None:
    assert tool_names(json.dumps(body).encode()) == names


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b"{", b"\xff\xfe"])
def test_a_request_that_is_no_json_object_offers_no_known_tools(raw: bytes) -> None:
    assert tool_names(raw) is None


# -- the real CLIs ---------------------------------------------------------------------------


def _record_real(
    engine: Engine,
    repo: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> tuple[Path, Any, Path]:
    """Record the real CLI ``name`` writing hello.txt, export the cassette, then go offline:
    the upstream stopped, every key gone, the agent's file removed. (workflow, run, tape)"""
    path = real_workflow(
        name,
        repo,
        upstream,
        monkeypatch,
        tmp_path,
        "Make [[write hello.txt]]",
        extra="timeout: 120",
    )
    recorded = engine.run(str(path))
    assert recorded.status == "completed", recorded.reason
    tape = tmp_path / "tape.jsonl"
    tape.write_text("".join(f"{line}\n" for line in export_cassette(engine.store, recorded.run_id)))
    upstream.stop()
    (repo / "hello.txt").unlink()
    for key in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "FAKE_OPENAI_KEY"):  # no key at all
        monkeypatch.delenv(key, raising=False)
    return path, recorded, tape


def _replaying(text: str, name: str, tape: Path, renamed: str) -> str:
    """The recorded workflow's text, renamed, its harness answering from ``tape``."""
    return text.replace(f"name: real{name}", f"name: {renamed}{name}").replace(
        "{bin: ", f"{{replay: {json.dumps(str(tape))}, bin: "
    )


@pytest.mark.parametrize("name", ["claude", "codex"])
def test_real_a_recorded_session_replays_offline_with_the_same_cli(
    engine: Engine,
    repo: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    path, recorded, tape = _record_real(engine, repo, upstream, monkeypatch, tmp_path, name)
    calls = [line for line in _lines(tape) if line.get("kind") == "agent_call"]
    assert len(calls) == 2
    served = len(upstream.requests)
    path.write_text(_replaying(path.read_text(), name, tape, "replay"))
    replay = engine.run(str(path))
    assert replay.status == "completed", replay.reason
    assert replay.result == recorded.result
    assert (repo / "hello.txt").read_text() == "written by the agent\n"
    assert len(upstream.requests) == served
    rows = engine.calls(replay.run_id)
    assert len(rows) == 2 and list(rows["price_source"]) == ["replay", "replay"]
    assert rows["cost"].sum() == 0 and rows["tokens_in"].sum() == 0
    [attempt] = work(engine, replay.run_id)
    assert (attempt.tokens_in, attempt.tokens_out, attempt.cost) == (0, 0, 0.0)


@pytest.mark.parametrize("name", ["claude", "codex"])
def test_real_a_cassette_replays_into_another_checkout(
    engine: Engine,
    repo: Path,
    upstream: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    """Recorded in one checkout, replayed by the same CLI in another (a classroom's): the
    agent's file lands in the replaying checkout; the cassette names neither folder."""
    path, recorded, tape = _record_real(engine, repo, upstream, monkeypatch, tmp_path, name)
    text = tape.read_text()
    assert str(repo) not in text, re.findall(".{120}" + re.escape(str(repo)) + ".{60}", text)
    elsewhere = git_repo(tmp_path / "classroom")
    moved = elsewhere / path.name
    moved.write_text(_replaying(path.read_text(), name, tape, "moved"))
    replay = engine.run(str(moved))
    assert replay.status == "completed", replay.reason
    assert replay.result == recorded.result
    assert (elsewhere / "hello.txt").read_text() == "written by the agent\n"
    assert not (repo / "hello.txt").exists()
