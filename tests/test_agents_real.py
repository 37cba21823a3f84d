"""Agent steps (issue 21), real tier: the four pinned agent CLIs against loopback fake backends.

``scripts/ci_agents.sh`` installs the CLIs into a cache (``.ci/run`` calls it); each is found
through ``WF_AGENT_<NAME>_BIN`` or that cache, and its tests skip with the reason when it is
absent. The backends (tests/agent_backends.py) speak streamed Anthropic Messages and OpenAI
Responses, Chat Completions (opencode) and generateContent (Gemini) on 127.0.0.1; no real
API is reached.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_backends import (
    USAGE_IN,
    USAGE_OUT,
    Backend,
    Step,
    opencode_config,
    start_backend,
)
from tests.agent_fakes.bins import git_repo
from tests.conftest import run_wf, spawn_wf, wait_for
from tests.helpers_http import isolate_loopback_env
from wf_magic import Engine
from wf_magic.agents.sidecars import preset_session_id
from wf_magic.store.records import AttemptRow

PINS = {"claude": "2.1.197", "codex": "0.171.0", "opencode": "1.18.33", "gemini": "0.61.0"}
KEYS = {"claude": "sk-ant-fake-key-0123456789", "codex": "sk-fake-key-0123456789"}


def cli_path(name: str) -> Path | None:
    """The pinned CLI ``name``: ``$WF_AGENT_<NAME>_BIN``, else the ci_agents.sh cache."""
    given = os.environ.get(f"WF_AGENT_{name.upper()}_BIN")
    if given:
        return Path(given) if Path(given).is_file() else None
    cache = Path(os.environ.get("WF_AGENTS_CACHE") or Path.home() / ".cache" / "wf_magic-agents")
    path = cache / f"{name}-{PINS[name]}" / "node_modules" / ".bin" / name
    return path if path.exists() else None


def _require(name: str) -> Path:
    path = cli_path(name)
    if path is None:
        pytest.skip(
            f"the {name} CLI {PINS[name]} is not installed (run scripts/ci_agents.sh, "
            f"or set WF_AGENT_{name.upper()}_BIN)"
        )
    return path


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    isolate_loopback_env(monkeypatch)
    served = start_backend()
    yield served
    served.stop()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_repo(tmp_path / "repo")


def _codex_home(folder: Path, backend: Backend) -> Path:
    """A CODEX_HOME whose provider is the fake backend (passed to the agent via pass_env)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(
        'model = "gpt-5.5"\nmodel_provider = "fake"\ncheck_for_update_on_startup = false\n'
        '[analytics]\nenabled = false\n[feedback]\nenabled = false\n[otel]\nexporter = "none"\n'
        f'[model_providers.fake]\nname = "fake loopback"\nbase_url = "{backend.url}/v1"\n'
        'env_key = "FAKE_OPENAI_KEY"\nwire_api = "responses"\nrequest_max_retries = 0\n'
        "stream_max_retries = 0\n"
    )
    return folder


def real_workflow(
    name: str,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    prompt: str,
    extra: str = "",
    top: str = "",
) -> Path:
    """An agent workflow for the real CLI ``name`` against ``backend``."""
    cli = _require(name)
    if name == "claude":
        monkeypatch.setenv("ANTHROPIC_BASE_URL", backend.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEYS[name])
        passed = "[ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY]"
        model = "    model: claude-sonnet-4-5\n"
    else:
        monkeypatch.setenv("CODEX_HOME", str(_codex_home(tmp_path / "codex-home", backend)))
        monkeypatch.setenv("FAKE_OPENAI_KEY", KEYS[name])
        passed = "[CODEX_HOME, FAKE_OPENAI_KEY]"
        model = ""
    body = "".join(f"    {line}\n" for line in extra.strip().splitlines())
    path = repo / f"real-{name}.yaml"
    path.write_text(
        f"name: real{name}\n{top}steps:\n  - id: fix\n    agent: {name}\n    prompt: {json.dumps(prompt)}\n"
        f"{model}    pass_env: {passed}\n{body}runners:\n  {name}: {{bin: {cli}}}\n"
    )
    return path


def work(engine: Engine, run_id: str) -> list[AttemptRow]:
    return [a for a in engine.store.attempts_of(run_id) if a.phase == "work"]


GATE = "gate: {judge: expr, check: \"'FIXED' in output\", criteria: [say FIXED], max_loops: 3}"
CLIS = ["claude", "codex"]
AUTH_MESSAGES = {"claude": "Invalid API key", "codex": "401 Unauthorized"}


@pytest.mark.parametrize("name", CLIS)
def test_real_gate_loop_passes_at_loop_2_and_usage_cost_session_are_journaled_exactly(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    path = real_workflow(
        name,
        repo,
        backend,
        monkeypatch,
        tmp_path,
        "Fix the test.",
        extra=f"timeout: 120\n{GATE}",
        top="budget: {max_cost: 5.0}\n",
    )
    run = engine.run(str(path))
    assert (run.status, run.result) == ("completed", "FIXED")
    first, second = work(engine, run.run_id)
    assert [json.loads(a.output_json or "null") for a in (first, second)] == ["TRIED", "FIXED"]
    for attempt in (first, second):
        assert (attempt.tokens_in, attempt.tokens_out) == (USAGE_IN, USAGE_OUT)
        facts = engine.store.agent_facts(attempt.dispatch_id)
        assert facts is not None and PINS[name] in facts["version"]
        final = json.loads(facts["final_json"])
        if name == "claude":  # its own estimate, journaled as it reported it
            assert attempt.cost == final["total_cost_usd"] and attempt.cost > 0
            assert facts["cost_source"] == "estimate: Claude Code's own price table"
            assert attempt.session_id == preset_session_id(attempt.dispatch_id, 1)
        else:
            # Codex reports no cost; the bridge prices its calls (issue 35)
            assert facts["cost_source"] is None and attempt.cost == facts["bridge"]["cost"] > 0
    sessions = {
        r["headers"].get("x-claude-code-session-id") or r["body"].get("prompt_cache_key")
        for r in backend.requests
    }
    assert sessions == {first.session_id, second.session_id}  # what the CLI told the backend


@pytest.mark.parametrize("prompt", ["--version", "--dangerously-skip-permissions", "-"])
@pytest.mark.parametrize("name", CLIS)
def test_real_option_like_prompt_reaches_the_model_as_text_and_never_argv(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    prompt: str,
) -> None:
    """Issue 31 items 5 and 10: the prompt goes on stdin; a map item that reads like an
    option is the user's text at the model, not a flag of the CLI."""
    canary = "CANARY-31-5d9e0c7a"
    path = real_workflow(
        name,
        repo,
        backend,
        monkeypatch,
        tmp_path,
        "{{ item }} {{ params.api_token }}",
        extra=f"timeout: 120\nmap: '{{{{ {json.dumps([prompt])} }}}}'",
        top="params:\n  api_token: {type: string}\n",
    )
    seen: list[bytes] = []
    done = threading.Event()

    def scan() -> None:
        while not done.is_set():
            for entry in Path("/proc").iterdir():
                try:
                    if entry.name.isdigit() and canary.encode() in (entry / "cmdline").read_bytes():
                        seen.append((entry / "cmdline").read_bytes())
                except OSError:
                    pass
            time.sleep(0.02)

    scanner = threading.Thread(target=scan)
    scanner.start()
    try:
        run = engine.run(str(path), params={"api_token": canary})
    finally:
        done.set()
        scanner.join()
    assert run.status == "completed", run.reason
    [attempt] = work(engine, run.run_id)
    assert json.loads(attempt.output_json or "null") == "TRIED"  # the model answered, no flag
    asked = [json.dumps(r["body"]) for r in backend.requests]
    assert any(f"{prompt} {canary}" in a for a in asked)
    assert seen == []


@pytest.mark.parametrize("name", CLIS)
def test_real_worktree_attempt_writes_only_in_its_worktree(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    path = real_workflow(
        name,
        repo,
        backend,
        monkeypatch,
        tmp_path,
        "Make [[write hello.txt]]",
        extra="isolation: worktree\ntimeout: 120",
    )
    run = engine.run(str(path))
    assert run.status == "completed", work(engine, run.run_id)
    [attempt] = work(engine, run.run_id)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None
    tree = Path(facts["worktree"]["path"])
    assert (tree / "hello.txt").read_text() == "written by the agent\n"
    assert not (repo / "hello.txt").exists()
    assert facts["worktree"]["changed_files"] == ["hello.txt"] and facts["worktree"]["kept"]


@pytest.mark.parametrize("name", CLIS)
def test_real_401_fails_permanently_with_the_clis_message(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    backend.script.extend([Step(status=401)] * 3)
    path = real_workflow(
        name,
        repo,
        backend,
        monkeypatch,
        tmp_path,
        "Fix.",
        extra="timeout: 120\nretry: {max_attempts: 3}",
    )
    run = engine.run(str(path))
    assert run.status == "failed"
    [attempt] = work(engine, run.run_id)
    assert not attempt.transient and attempt.failure is not None
    assert attempt.failure.startswith(f"{name} failed (auth): ")
    assert AUTH_MESSAGES[name] in attempt.failure  # the CLI's own words
    assert len(backend.requests) == 1  # the CLI's own retries are off; wf's do not apply


@pytest.mark.parametrize("name", CLIS)
def test_real_529_fails_transiently_and_is_retried(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    backend.script.append(Step(status=529))
    path = real_workflow(
        name,
        repo,
        backend,
        monkeypatch,
        tmp_path,
        "Fix.",
        # Unbridged: the bridge would wait the 529 out (tests/test_bridge.py); this is the
        # CLI's own error path.
        extra="timeout: 120\nretry: {max_attempts: 2}\nbridge: false",
    )
    run = engine.run(str(path))
    assert run.status == "completed"
    first, second = work(engine, run.run_id)
    assert first.status == "failed" and first.transient and second.status == "succeeded"


def _agent_processes(dispatch_id: str) -> list[int]:
    """Live processes whose environment carries ``WF_DISPATCH_ID=dispatch_id``."""
    marker = f"WF_DISPATCH_ID={dispatch_id}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat[stat.rfind(")") + 2] not in ("Z", "X"):
                    out.append(int(entry.name))
        except OSError:
            continue
    return out


@pytest.mark.parametrize("name", CLIS)
def test_real_slow_backend_trips_the_step_timeout_and_leaves_no_process(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    backend.script.append(Step(delay_s=8))
    path = real_workflow(name, repo, backend, monkeypatch, tmp_path, "Fix.", extra="timeout: 4")
    run = engine.run(str(path))
    [attempt] = work(engine, run.run_id)
    assert attempt.status == "failed" and attempt.transient
    assert attempt.failure == f"{name} timed out after 4s and its process group was killed"
    assert _agent_processes(attempt.dispatch_id) == []


@pytest.mark.parametrize("name", CLIS)
def test_real_kill_9_mid_agent_then_resume_continues_dispatch_worktree_and_session(
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    state_dir: Path,
    name: str,
) -> None:
    backend.script.append(Step(delay_s=15))
    path = real_workflow(
        name,
        repo,
        backend,
        monkeypatch,
        tmp_path,
        "Fix the test.",
        extra="isolation: worktree\nsession: continue\ntimeout: 120",
    )
    driver = spawn_wf(state_dir, "run", str(path))
    try:
        wait_for(lambda: len(backend.requests) >= 1, timeout=60, what="the agent's request")
        [sidecar] = (state_dir / "agents").glob("*/*.json")
        wait_for(
            lambda: bool(json.loads(sidecar.read_text()).get("session_id")),
            timeout=30,
            what="the session id",
        )
    finally:
        if driver.poll() is None:
            os.kill(driver.pid, signal.SIGKILL)
        driver.communicate(timeout=10)
    before = json.loads(sidecar.read_text())
    run_id, dispatch_id = sidecar.parent.name, sidecar.stem
    assert _agent_processes(dispatch_id) != []  # the CLI outlived its driver
    done = run_wf(state_dir, "resume", run_id, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    engine = Engine(state_dir)
    try:
        [attempt] = work(engine, run_id)
        assert (attempt.dispatch_id, attempt.status) == (dispatch_id, "succeeded")
        assert attempt.session_id == before["session_id"]
        facts = engine.store.agent_facts(dispatch_id)
        assert facts is not None and facts["reclaimed"] is True
        assert facts["resumed_session"] == before["session_id"]
        assert facts["worktree"]["path"] == before["worktree"]
    finally:
        engine.close()
    time.sleep(0.1)
    assert _agent_processes(dispatch_id) == []


def _opencode_workflow(
    repo: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, extra: str
) -> Path:
    """An opencode agent workflow whose provider is the fake chat-completions backend."""
    cli = _require("opencode")
    config = tmp_path / "opencode.json"
    config.write_text(
        json.dumps(opencode_config(base_url=f"{backend.url}/v1", api_key="sk-fake-key-0123456789"))
    )
    monkeypatch.setenv("OPENCODE_CONFIG", str(config))
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", "http://127.0.0.1:9/")  # it looks plugins up
    body = "".join(f"    {line}\n" for line in extra.strip().splitlines())
    path = repo / "real-opencode.yaml"
    path.write_text(
        "name: realopencode\nsteps:\n  - id: fix\n    agent: opencode\n    prompt: Fix it.\n"
        "    model: fake/fake-model\n    pass_env: [OPENCODE_CONFIG, NPM_CONFIG_REGISTRY]\n"
        # bridged: the calls are priced from the runner's table, the model's configured cost
        f"{body}runners:\n  opencode: {{bin: {cli}, "
        "prices: {fake-model: {input_per_mtok: 3, output_per_mtok: 15}}}\n"
    )
    return path


def test_real_opencode_gate_loop_continues_its_session_with_usage_and_cost(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    path = _opencode_workflow(
        repo, backend, monkeypatch, tmp_path, f"session: continue\ntimeout: 180\n{GATE}"
    )
    run = engine.run(str(path))
    assert (run.status, run.result) == ("completed", "FIXED")
    first, second = work(engine, run.run_id)
    assert first.session_id and first.session_id.startswith("ses_")
    assert second.session_id == first.session_id
    # one bridged call each, priced 120 * 3 + 8 * 15 per million tokens; opencode's own sum
    # (from the provider model's configured cost) agrees beside it
    for attempt in (first, second):
        assert (attempt.tokens_in, attempt.tokens_out) == (USAGE_IN, USAGE_OUT)
        assert attempt.cost == pytest.approx(0.00048)
        facts = engine.store.agent_facts(attempt.dispatch_id)
        assert facts is not None and facts["bridge"]["calls"] == 1
        assert facts["bridge"]["cli_report"]["cost"] == pytest.approx(0.00048)


def test_real_opencode_401_fails_permanently(
    engine: Engine,
    repo: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    backend.script.extend([Step(status=401)] * 3)
    path = _opencode_workflow(
        repo, backend, monkeypatch, tmp_path, "timeout: 180\nretry: {max_attempts: 3}"
    )
    run = engine.run(str(path))
    assert run.status == "failed"
    [attempt] = work(engine, run.run_id)
    assert not attempt.transient
    assert attempt.failure is not None and attempt.failure.startswith("opencode failed (auth): ")


def _gemini_workflow(
    repo: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch, extra: str
) -> Path:
    """A gemini agent workflow against the fake generateContent backend (no router call)."""
    cli = _require("gemini")
    monkeypatch.setenv("GEMINI_API_KEY", "fake-gemini-key-0123456789")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", backend.url)
    body = "".join(f"    {line}\n" for line in extra.strip().splitlines())
    path = repo / "real-gemini.yaml"
    path.write_text(
        "name: realgemini\nsteps:\n  - id: fix\n    agent: gemini\n    prompt: Fix it.\n"
        "    model: gemini-2.5-flash\n    pass_env: [GEMINI_API_KEY, GOOGLE_GEMINI_BASE_URL]\n"
        f"{body}runners:\n  gemini: {{bin: {cli}}}\n"
    )
    return path


def test_real_gemini_gate_loop_continues_its_preset_session(
    engine: Engine, repo: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _gemini_workflow(repo, backend, monkeypatch, f"session: continue\ntimeout: 180\n{GATE}")
    run = engine.run(str(path))
    assert (run.status, run.result) == ("completed", "FIXED")
    first, second = work(engine, run.run_id)
    assert first.session_id == preset_session_id(first.dispatch_id, 1)
    assert second.session_id == first.session_id
    for attempt in (first, second):
        assert (attempt.tokens_in, attempt.tokens_out) == (USAGE_IN, USAGE_OUT)
        # Gemini CLI reports no cost: the attempt is priced from genai-prices (issue 22).
        record = engine.handle(run.run_id).attempt(attempt.unit_id, attempt.attempt)
        assert (attempt.cost or 0) > 0
        assert (record.price_source or "").startswith("bridge: sum of 1 call(s) (priced by genai")


def test_real_gemini_401_fails_permanently(
    engine: Engine, repo: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.script.extend([Step(status=401)] * 5)
    path = _gemini_workflow(repo, backend, monkeypatch, "timeout: 180\nretry: {max_attempts: 3}")
    run = engine.run(str(path))
    assert run.status == "failed"
    [attempt] = work(engine, run.run_id)
    assert not attempt.transient
    assert attempt.failure is not None and attempt.failure.startswith("gemini failed (auth): ")
