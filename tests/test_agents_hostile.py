"""Agent CLIs that print or do anything (issue 31, items 5, 10-13, 16, 17), fast tier.

The fake harness (tests/agent_fakes) prints hostile lines and numbers through the real
stream reader and runner: an option-like or secret prompt goes on stdin (never argv), a
100 MiB line or a 100 000-deep JSON line is skipped in one line with the driver's peak
memory measured from outside, a reported NaN/negative cost is never journaled or charged,
the stream log is capped, what the agent left in its group ends with the attempt, and the
``--version`` probe runs with the launch's HOME and minimal environment.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agent_fakes.bins import git_repo, make_bins
from tests.conftest import ROOT, run_wf, spawn_wf, wait_for, wf_cmd
from wf_magic import Engine
from wf_magic.agents import sidecars
from wf_magic.agents.claude import ClaudeHarness
from wf_magic.agents.harness import Watch
from wf_magic.agents.stream import MAX_DEPTH, StreamReader
from wf_magic.drive.budget import Budget, SharedBudget
from wf_magic.redact import Redactor
from wf_magic.spec.models import BudgetSpec
from wf_magic.store.records import AttemptRow

MIB = 1 << 20


@pytest.fixture
def bins(tmp_path: Path) -> dict[str, Path]:
    return make_bins(tmp_path / "bin")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_repo(tmp_path / "repo")


def workflow(
    folder: Path,
    bins: dict[str, Path],
    harness: str,
    prompt: str,
    *,
    extra: str = "",
    options: str = "",
    top: str = "",
) -> Path:
    body = "".join(f"    {line}\n" for line in extra.strip().splitlines())
    path = folder / f"{harness}.yaml"
    path.write_text(
        f"name: hostile\n{top}steps:\n  - id: fix\n    agent: {harness}\n"
        f"    prompt: {json.dumps(prompt)}\n{body}"
        f"runners:\n  {harness}: {{bin: {bins[harness]}{options}}}\n"
    )
    return path


def work(engine: Engine, run_id: str) -> list[AttemptRow]:
    return [a for a in engine.store.attempts_of(run_id) if a.phase == "work"]


def warnings_of(engine: Engine, run_id: str) -> list[str]:
    return [
        json.loads(e.data_json or "{}")["message"]
        for e in engine.store.events_after(run_id)
        if e.kind == "warning" and json.loads(e.data_json or "{}").get("reason") != "bridge"
    ]


def _cmdlines() -> list[bytes]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((entry / "cmdline").read_bytes())
            except OSError:
                pass
    return out


# -- items 5 and 10: the prompt is text on stdin, never an option, never in argv ----------


@pytest.mark.parametrize("harness", ["claude", "codex", "opencode", "gemini"])
@pytest.mark.parametrize("prompt", ["--version", "--dangerously-skip-permissions", "-p", "-"])
def test_an_option_like_prompt_reaches_the_agent_as_its_text(
    engine: Engine, repo: Path, bins: dict[str, Path], harness: str, prompt: str
) -> None:
    run = engine.run(str(workflow(repo, bins, harness, prompt)))
    assert run.status == "completed", run.reason
    assert run.result == f"TRIED turn=1 prompt_chars={len(prompt)} history=0"
    home = sidecars.isolated_home(engine.state_dir, run.run_id)
    [session] = list((home / ".fake-agent" / "sessions").glob("*.json"))
    assert json.loads(session.read_text())["prompts"] == [prompt]


@pytest.mark.parametrize("harness", ["claude", "codex", "opencode", "gemini"])
def test_a_secret_in_the_prompt_never_appears_in_any_process_argv(
    engine: Engine,
    repo: Path,
    bins: dict[str, Path],
    harness: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    canary = "CANARY-9f3b2e71d0"
    prompt = f"Use the key {canary} [[sleep 1.5]]"
    path = workflow(repo, bins, harness, prompt)
    seen: list[bytes] = []
    done = threading.Event()

    def scan() -> None:
        while not done.is_set():
            seen.extend(c for c in _cmdlines() if canary.encode() in c)
            time.sleep(0.02)

    scanner = threading.Thread(target=scan)
    scanner.start()
    try:
        run = engine.run(str(path))
    finally:
        done.set()
        scanner.join()
    assert run.status == "completed", run.reason
    assert run.result.startswith("TRIED turn=1")  # the prompt did reach it
    assert seen == []


# -- item 11: the stream reader stays bounded and alive -----------------------------------


def _read_through(bins: dict[str, Path], tmp: Path, hostile: bytes, *, cap: int) -> StreamReader:
    """The fake claude prints ``hostile`` after its first line; the real reader reads it."""
    payload = tmp / "hostile.bin"
    payload.write_bytes(hostile)
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [str(bins["claude"]), "-p", "--output-format", "stream-json", "--verbose"],
        cwd=tmp,
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(f"hi [[print-file {payload}]]".encode())
    proc.stdin.close()
    reader = StreamReader(
        proc,
        adapter=ClaudeHarness(),
        watch=Watch(),
        redactor=Redactor(),
        output_cap=cap,
        log_path=tmp / "stream.log",
        on_session=lambda _: None,
        on_text=None,
    )
    assert reader.wait(time.monotonic() + 30) == 0
    return reader


def _nested(depth: int) -> bytes:
    return b'{"type": "x", "v": ' + b"[" * depth + b"]" * depth + b"}"


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1", '"12"', "true"]).map(
        lambda raw: ("raw", raw)
    )
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _dump(value: Any) -> str:
    if isinstance(value, tuple):
        return value[1]
    if isinstance(value, list):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_dump(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


HOSTILE_LINES = st.one_of(
    st.integers(MAX_DEPTH + 1, 120_000).map(_nested),
    st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")),
    st.binary(max_size=60).map(lambda b: b"{" + b.replace(b"\n", b"") + b"}"),
    st.integers(5_000, 40_000).map(lambda n: b'{"type": "assistant", "pad": "' + b"y" * n + b'"}'),
    st.tuples(
        st.sampled_from(["assistant", "system", "user", "result_", "stream_event"]),
        _JSON,
    ).map(
        lambda t: (
            json.dumps({"type": t[0]}).encode()[:-1]
            + b', "message": '
            + _dump(t[1]).encode()
            + b"}"
        )
    ),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(lines=st.lists(HOSTILE_LINES, min_size=1, max_size=6))
def test_hostile_lines_are_skipped_and_the_result_after_them_is_read(
    bins: dict[str, Path], tmp_path: Path, lines: list[bytes]
) -> None:
    cap = 4096
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # one folder per example
    reader = _read_through(bins, tmp_path, b"".join(line + b"\n" for line in lines), cap=cap)
    assert not reader.thread.is_alive()
    prompt = f"hi [[print-file {tmp_path / 'hostile.bin'}]]"
    results = [e["result"] for e in reader.events if e.get("type") == "result"]
    assert results == [f"TRIED turn=1 prompt_chars={len(prompt)} history=0"]
    assert reader.watch.session_id is not None  # the first line was read before them
    kept = sum(len(json.dumps(e)) for e in reader.events)
    assert kept <= 2 * cap + 200  # events held: within the cap (the last one may be whole)
    for line in lines:
        if len(line) + 1 > cap:
            assert any("over the line cap of 4,096 bytes" in n for n in reader.notes)
    assert (tmp_path / "stream.log").stat().st_size <= cap + 400


def test_a_line_nested_100000_deep_is_skipped_in_one_note_and_the_attempt_succeeds(
    engine: Engine, repo: Path, bins: dict[str, Path], tmp_path: Path
) -> None:
    payload = tmp_path / "deep.jsonl"
    payload.write_bytes(_nested(100_000) + b"\n" + b"\xff\xfe\xc3(invalid utf-8\n")
    run = engine.run(str(workflow(repo, bins, "claude", f"go [[print-file {payload}]]")))
    assert run.status == "completed", run.reason
    [attempt] = work(engine, run.run_id)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None
    assert facts["stream_notes"] == [f"line 2 skipped: JSON nested deeper than {MAX_DEPTH} levels"]


def _wf_run_peak(state_dir: Path, path: Path) -> tuple[int, int, str]:
    """Run ``wf run path`` in a child; (exit status, its peak RSS in bytes, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        wf_cmd(state_dir, "run", str(path)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stderr is not None
    with proc.stderr:
        err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024, err


def test_a_100_mib_line_without_newline_fails_the_attempt_in_one_line_with_memory_bounded(
    repo: Path, bins: dict[str, Path], tmp_path: Path
) -> None:
    """The driver's peak RSS (wait4, measured from outside) stays within 64 MiB of a plain
    run's: the 8 MiB output cap, never the 100 MiB line."""
    plain_code, plain_peak, _ = _wf_run_peak(
        tmp_path / "s1", workflow(repo, bins, "claude", "plain")
    )
    assert plain_code == 0
    path = workflow(repo, bins, "claude", "go [[long-line 100]]")
    code, peak, err = _wf_run_peak(tmp_path / "s2", path)
    assert code != 0
    assert peak - plain_peak < 64 * MIB, (peak, plain_peak)
    assert "Traceback" not in err and "Exception in thread" not in err
    engine = Engine(tmp_path / "s2")
    try:
        [run] = engine.store.list_runs()
        [attempt] = work(engine, run.run_id)
    finally:
        engine.close()
    size = len(b'{"type": "pad", "text": "') + 100 * MIB
    assert attempt.failure is not None
    assert attempt.failure.endswith(
        f"(line 2 skipped: {size:,} bytes, over the line cap of {8 * MIB:,} bytes "
        "(and no newline before the end))"
    )
    assert "\n" not in attempt.failure


# -- item 12: reported numbers that are no numbers ----------------------------------------

BAD_COSTS = ["NaN", "Infinity", "-Infinity", "-1", "-0.0001", "1e400", '"12"', "true", "{}"]


@pytest.mark.parametrize("raw", BAD_COSTS)
@pytest.mark.parametrize("harness", ["claude", "opencode"])
def test_a_bad_reported_cost_is_journaled_null_with_a_warning_naming_it(
    engine: Engine, repo: Path, bins: dict[str, Path], harness: str, raw: str
) -> None:
    run = engine.run(str(workflow(repo, bins, harness, f"go [[raw-cost {raw}]]")))
    assert run.status == "completed", run.reason
    [attempt] = work(engine, run.run_id)
    assert attempt.cost is None
    shown = repr(json.loads(raw, parse_constant=float))
    name = "total_cost_usd" if harness == "claude" else "part.cost"
    assert warnings_of(engine, run.run_id) == [
        f"{harness}: the CLI reported {name} = {shown}, expected a finite number of dollars "
        "from 0; the attempt's cost is journaled as null"
    ]


@pytest.mark.parametrize("raw", ["NaN", "-1", "1e400", "2.5", '"12"', "true", "-Infinity"])
@pytest.mark.parametrize("harness", ["claude", "codex", "opencode", "gemini"])
def test_a_bad_reported_token_count_is_journaled_as_unknown_with_a_warning(
    engine: Engine, repo: Path, bins: dict[str, Path], harness: str, raw: str
) -> None:
    run = engine.run(str(workflow(repo, bins, harness, f"go [[raw-tokens {raw}]]")))
    assert run.status == "completed", run.reason
    [attempt] = work(engine, run.run_id)
    # the output count was refused: unknown (NULL), never 0; the input count stands
    assert (attempt.tokens_in, attempt.tokens_out) == (120, None)
    if harness in ("claude", "opencode"):  # the CLI's own cost report stands
        assert attempt.cost == pytest.approx(0.00048)
    else:  # no price is put on an unknown count
        assert attempt.cost is None
    name = {
        "claude": "usage.output_tokens",
        "codex": "usage.output_tokens",
        "opencode": "tokens.output",
        "gemini": "tokens.candidates",
    }[harness]
    shown = repr(json.loads(raw, parse_constant=float))
    assert warnings_of(engine, run.run_id) == [
        f"{harness}: the CLI reported {name} = {shown}, expected a whole number from 0; "
        "that count is journaled as unknown (null)"
    ]


@pytest.mark.parametrize("raw", ["NaN", "-5", "-Infinity", "1e400"])
def test_a_bad_cost_on_the_failure_path_is_null_and_gives_no_headroom(
    engine: Engine, repo: Path, bins: dict[str, Path], raw: str
) -> None:
    path = workflow(
        repo,
        bins,
        "claude",
        f"go [[max-turns]] [[raw-cost {raw}]]",
        top="budget: {max_cost: 1.0}\n",
    )
    run = engine.run(str(path))
    assert run.status == "failed"
    [attempt] = work(engine, run.run_id)
    assert attempt.status == "failed" and attempt.cost is None
    reported = [w for w in warnings_of(engine, run.run_id) if "the CLI reported" in w]
    assert reported == [
        f"claude: the CLI reported total_cost_usd = {json.loads(raw, parse_constant=float)!r}, "
        "expected a finite number of dollars from 0; the attempt's cost is journaled as null"
    ]
    assert engine.store.budget_usage(run.run_id)[2] == 0.0


@given(
    costs=st.lists(
        st.floats(allow_nan=True, allow_infinity=True) | st.none(), min_size=1, max_size=8
    ),
    tokens=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=8),
)
def test_no_report_ever_lowers_a_budget(costs: list[float | None], tokens: list[int]) -> None:
    budget = Budget(root_run_id="r", spec=BudgetSpec(max_cost=1.0))
    shared = SharedBudget(max_cost=1.0)
    for target in (budget, shared):
        before_cost, before_tokens = target.cost, target.tokens
        for cost, count in zip(costs, tokens, strict=False):
            target.charge_usage(count, cost)
            assert target.cost >= before_cost and target.tokens >= before_tokens
            assert math.isfinite(target.cost)
            before_cost, before_tokens = target.cost, target.tokens


# -- item 13: the stream log is capped and says where --------------------------------------


def test_the_stream_log_is_capped_like_the_output_and_says_where_it_was_cut(
    engine: Engine, repo: Path, bins: dict[str, Path], tmp_path: Path
) -> None:
    payload = tmp_path / "many.jsonl"
    line = b'{"type": "noise", "n": "' + b"z" * 90 + b'"}\n'
    payload.write_bytes(line * 200)
    path = workflow(
        repo, bins, "claude", f"go [[print-file {payload}]]", options=", output_cap: 4000"
    )
    run = engine.run(str(path))
    [attempt] = work(engine, run.run_id)
    log = sidecars.log_path(engine.state_dir, run.run_id, attempt.dispatch_id).read_text()
    kept, cut, after = log.partition("[wf_magic: log cut here at ")
    assert cut and len(kept.encode()) <= 4000
    assert after.startswith(f"{len(kept.encode()):,} bytes, the output cap of 4,000 bytes; ")
    assert log.endswith(" after the cut were not logged]\n")
    assert len(log.encode()) < 4000 + 300


# -- item 16: what the agent leaves in its group ends with the attempt ---------------------


@pytest.mark.parametrize("harness", ["claude", "codex"])
def test_a_child_left_in_the_group_after_a_normal_exit_is_ended_with_the_attempt(
    engine: Engine, repo: Path, bins: dict[str, Path], harness: str
) -> None:
    run = engine.run(str(workflow(repo, bins, harness, "go [[spawn-sleep]]")))
    assert run.status == "completed", run.reason
    home = sidecars.isolated_home(engine.state_dir, run.run_id)
    agent, child = (int(p) for p in (home / ".fake-agent" / "pids").read_text().split())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)
    [attempt] = work(engine, run.run_id)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None
    assert facts["leftover_group"] == "processes left in its group were ended (SIGTERM)"


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2] not in ("Z", "X")


# -- item 17: the --version probe runs like the agent -------------------------------------


def test_the_version_probe_sees_the_isolated_home_and_the_minimal_environment(
    engine: Engine,
    repo: Path,
    bins: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from wf_magic.agents import stream

    monkeypatch.setattr(stream, "_VERSIONS", {})  # asked afresh for this binary
    monkeypatch.setenv("WF_TEST_DRIVER_ONLY_SECRET", "s3cr3t-value-123")
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    run = engine.run(str(workflow(repo, bins, "claude", "go")))
    assert run.status == "completed", run.reason
    [probe] = [
        json.loads(x)
        for x in (bins["claude"].parent / "version-probes.jsonl").read_text().splitlines()
    ]
    assert probe["home"] == str(sidecars.isolated_home(engine.state_dir, run.run_id))
    assert probe["cwd"] == str(repo)
    assert "WF_TEST_DRIVER_ONLY_SECRET" not in probe["env"]
    assert {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER"} <= set(probe["env"])
    [attempt] = work(engine, run.run_id)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None and facts["version"] == "2.1.197 (Claude Code)"


def test_after_kill_9_gc_of_the_abandoned_run_ends_what_the_agent_left(
    repo: Path, bins: dict[str, Path], state_dir: Path
) -> None:
    """A driver killed mid-agent never resumes: ``wf gc`` of the abandoned run ends the
    agent's group (the agent and the child it started) from the unit's recorded group."""
    path = workflow(repo, bins, "claude", "go [[spawn-sleep]] [[sleep 60]]")
    proc = spawn_wf(state_dir, "run", str(path))
    pids_file: list[Path] = []

    def started() -> bool:
        pids_file[:] = list((state_dir / "agents").glob("*/home/.fake-agent/pids"))
        return bool(pids_file) and len(pids_file[0].read_text().split()) == 2

    wait_for(started, what="the agent and its child to start")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    pids = [int(p) for p in pids_file[0].read_text().split()]
    try:
        assert all(_alive(p) for p in pids)  # they outlived the driver
        run_id = pids_file[0].parents[2].name
        abandoned = run_wf(state_dir, "abandon", run_id)
        assert abandoned.returncode == 0, abandoned.stderr
        gone = run_wf(state_dir, "gc", "--older-than", "0s")
        assert gone.returncode == 0, gone.stderr
        wait_for(lambda: not any(_alive(p) for p in pids), timeout=10, what="the group to go")
        assert not any((state_dir / "procs").glob("*.json"))
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# -- any event shape: adapters fold and read it without raising ---------------------------

_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(["error_max_turns", "success", "agent_message", "command_execution"])
)
_VALUE = st.recursive(
    _LEAF,
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "text",
                    "content",
                    "input_tokens",
                    "output_tokens",
                    "tokens",
                    "input",
                    "output",
                    "cache",
                    "read",
                    "prompt",
                    "candidates",
                    "models",
                    "tool_input",
                    "tool_name",
                    "data",
                    "statusCode",
                    "message",
                    "code",
                    "name",
                    "command",
                ]
            ),
            c,
            max_size=4,
        )
    ),  # fmt: skip
    max_leaves=20,
)
_TYPES = ["result", "assistant", "system", "turn.completed", "item.completed", "item.started",
          "thread.started", "turn.failed", "step_finish", "step_start", "text", "tool_use",
          "error"]  # fmt: skip
_FIELDS = ["subtype", "session_id", "usage", "result", "total_cost_usd", "num_turns",
           "permission_denials", "is_error", "api_error_status", "errors", "structured_output",
           "message", "item", "thread_id", "error", "part", "sessionID", "response", "stats"]  # fmt: skip
EVENTS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(_TYPES)}, optional=dict.fromkeys(_FIELDS, _VALUE)
    ),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(events=EVENTS, code=st.sampled_from([0, 1, 145]))
def test_every_adapter_reads_any_event_shape_into_checked_numbers(
    events: list[dict[str, Any]], code: int
) -> None:
    from wf_magic.agents.facts import attempt_facts
    from wf_magic.agents.harness import AgentCall
    from wf_magic.agents.registry import harness

    call = AgentCall(
        prompt="p", model=None, permission="edits", max_turns=None, cwd="/", home="/",
        scratch="/",
    )  # fmt: skip
    stderr = "\n".join(json.dumps(e) for e in events)
    for name in ("claude", "codex", "opencode", "gemini"):
        adapter, seen = harness(name), Watch()
        assert adapter is not None
        for event in events:
            adapter.watch(event, seen)
        out = adapter.outcome(events, "", stderr, code, call)
        assert type(out.tokens_in) is int and type(out.tokens_out) is int
        assert out.tokens_in >= 0 and out.tokens_out >= 0
        assert out.cost is None or (math.isfinite(out.cost) and out.cost >= 0)
        facts = attempt_facts(
            harness=name, version=None, call=call, outcome=out, watch=seen, exit_code=code,
            error_class=None, worktree=None, reclaimed=False, redactor=Redactor(),
        )  # fmt: skip
        json.dumps(facts, default=str)


@pytest.mark.parametrize("cost", [-1.0, -1e-9, math.nan, math.inf, -math.inf])
def test_any_runner_reporting_a_negative_or_non_finite_cost_is_never_charged(cost: float) -> None:
    """Beyond the agent runner: a result's such cost fails its attempt in one line, and a
    failure's is journaled null (drive/outcomes.py)."""
    from wf_magic.drive.outcomes import checked_result, unit_failure
    from wf_magic.errors import RunnerError
    from wf_magic.runners.base import UnitResult

    with pytest.raises(RunnerError) as raised:
        checked_result(UnitResult(output="x", cost=cost))
    assert str(raised.value) == f"cost is {cost!r}, expected a finite number from 0 or None"
    failure = unit_failure(RunnerError("boom", cost=cost), redact=lambda s: s)
    assert (str(failure), failure.cost) == ("boom", None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + '}\n{"b": 1}', [{"b": 1}]),
        ('{"a": ' + "[" * 200 + "]" * 200 + '}\n{"b": 2}', [{"b": 2}]),
        ('{\n  "response": "ok",\n  "n": NaN\n}', [{"response": "ok", "n": math.nan}]),
        ("\udcff{not json\n{}", [{}]),
    ],
)
def test_the_whole_output_fallback_skips_what_is_too_deep(
    text: str, expected: list[dict[str, Any]]
) -> None:
    from wf_magic.agents.harness import parse_lines

    assert json.dumps(parse_lines(text)) == json.dumps(expected)
