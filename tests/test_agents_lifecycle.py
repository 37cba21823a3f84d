"""Agent steps (issue 21), fast tier: timeouts, a driver killed mid-agent, secrets, HOME, gc.

The crash cases run ``wf run`` in a real process and SIGKILL it while the fake agent sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.agent_fakes.bins import git_repo, make_bins
from tests.conftest import run_wf, spawn_wf, wait_for
from tests.test_agents import work, workflow
from wf_magic import Engine
from wf_magic.agents import sidecars


@pytest.fixture
def bins(tmp_path: Path) -> dict[str, Path]:
    return make_bins(tmp_path / "bin")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_repo(tmp_path / "repo")


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2] not in ("Z", "X")


def _pids(state_dir: Path, run_id: str) -> list[int]:
    path = sidecars.isolated_home(state_dir, run_id) / ".fake-agent" / "pids"
    return [int(p) for p in path.read_text().split()]


def test_the_step_timeout_kills_the_agents_process_group_and_leaves_no_process(
    engine: Engine, repo: Path, bins: dict[str, Path], state_dir: Path
) -> None:
    path = workflow(repo, bins, "claude", "[[spawn-sleep]] [[sleep 60]]", extra="timeout: 1s")
    started = time.monotonic()
    run = engine.run(str(path))
    assert time.monotonic() - started < 20
    [attempt] = work(engine, run.run_id)
    assert attempt.status == "failed" and attempt.transient
    assert attempt.failure == "claude timed out after 1s and its process group was killed"
    pids = _pids(state_dir, run.run_id)
    assert len(pids) == 2  # the agent and the child it started
    wait_for(lambda: not any(_alive(p) for p in pids), timeout=10, what="the group to go")
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None and facts["error_class"] == "timeout"
    assert facts["session_id"] == attempt.session_id is not None  # preset before it started


def test_agent_steps_default_to_a_30_minute_timeout(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    wf = engine.load(str(workflow(repo, bins, "claude", "x")))
    assert wf.plan.steps[0].timeout_s == 1800.0


@pytest.mark.parametrize("harness", ["claude", "codex"])
def test_kill_9_mid_agent_then_resume_continues_the_same_dispatch_worktree_and_session(
    tmp_path: Path, repo: Path, bins: dict[str, Path], state_dir: Path, harness: str
) -> None:
    path = workflow(
        repo,
        bins,
        harness,
        "Fix. [[sleep-once 60]]",
        extra="isolation: worktree\nsession: continue",
    )
    driver = spawn_wf(state_dir, "run", str(path))
    agents = state_dir / "agents"

    def session_journaled() -> bool:
        for sidecar in agents.glob("*/*.json"):
            if json.loads(sidecar.read_text()).get("session_id"):
                return (sidecar.parent / "home" / ".fake-agent" / "slept-once").exists()
        return False

    try:
        wait_for(session_journaled, timeout=60, what="the agent to start its session")
    finally:
        if driver.poll() is None:
            os.kill(driver.pid, signal.SIGKILL)
        driver.communicate(timeout=10)
    [sidecar_file] = agents.glob("*/*.json")
    run_id, dispatch_id = sidecar_file.parent.name, sidecar_file.stem
    before = json.loads(sidecar_file.read_text())
    sleeper = int((sidecar_file.parent / "home" / ".fake-agent" / "slept-once").read_text())
    assert _alive(sleeper)  # the orphan outlived its driver

    done = run_wf(state_dir, "resume", run_id, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not _alive(sleeper)  # reaped before the attempt was dispatched again
    engine = Engine(state_dir)
    try:
        [attempt] = work(engine, run_id)
        assert (attempt.dispatch_id, attempt.status) == (dispatch_id, "succeeded")
        assert attempt.session_id == before["session_id"]
        facts = engine.store.agent_facts(dispatch_id)
        assert facts is not None
        assert facts["reclaimed"] is True and facts["resumed_session"] == before["session_id"]
        assert facts["worktree"]["path"] == before["worktree"]
        assert facts["worktree"]["path"] == str(state_dir / "worktrees" / run_id / dispatch_id)
        # the session's second turn: the killed launch's prompt is in its history
        output = json.loads(attempt.output_json or "null")
        assert output.startswith("TRIED turn=2") and "history=1" in output
    finally:
        engine.close()


def test_a_secret_passed_through_pass_env_is_in_no_row_event_input_output_or_log(
    engine: Engine,
    repo: Path,
    bins: dict[str, Path],
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "s3cr3t-value-Zq81xw"
    monkeypatch.setenv("PLAIN_NAMED_VALUE", secret)  # a name that does not look secret
    path = workflow(
        repo,
        bins,
        "claude",
        "Use it: [[echo-env PLAIN_NAMED_VALUE]] [[write note.txt done]] [[fail-once 529]]",
        extra="pass_env: [PLAIN_NAMED_VALUE]\nisolation: worktree\nretry: {max_attempts: 2}",
    )
    run = engine.run(str(path))
    assert run.status == "completed"
    assert "PLAIN_NAMED_VALUE=***" in run.result  # it reached the agent, and was masked
    engine.close()
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        tables = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        ]
        for table in tables:
            for row in conn.execute(f"SELECT * FROM {table}"):  # noqa: S608
                assert secret not in repr(row), table
    finally:
        conn.close()
    for file in state_dir.rglob("*"):
        if file.is_file() and ".git" not in file.parts and file.name != "state.db":
            assert secret.encode() not in file.read_bytes(), file


def test_pass_env_reaches_the_agent_and_wins_over_the_kinds_defaults(
    engine: Engine,
    repo: Path,
    bins: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    state_dir: Path,
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "7")
    monkeypatch.setenv("NOT_PASSED_VALUE", "nope")
    path = workflow(
        repo,
        bins,
        "claude",
        "[[echo-env CLAUDE_CODE_MAX_RETRIES]] [[echo-env DISABLE_TELEMETRY]] "
        "[[echo-env NOT_PASSED_VALUE]] [[echo-env HOME]]",
        extra="pass_env: [CLAUDE_CODE_MAX_RETRIES]",
    )
    run = engine.run(str(path))
    home = state_dir / "agents" / run.run_id / "home"
    assert run.result.endswith(
        f" CLAUDE_CODE_MAX_RETRIES=7 DISABLE_TELEMETRY=1 NOT_PASSED_VALUE= HOME={home}"
    )
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_home_user_keeps_the_users_home(
    engine: Engine,
    repo: Path,
    bins: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user_home = tmp_path / "user-home"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))
    path = workflow(repo, bins, "claude", "[[echo-env HOME]]")
    path.write_text(
        path.read_text().replace(
            f"{{bin: {bins['claude']}}}", f"{{bin: {bins['claude']}, home: user}}"
        )
    )
    run = engine.run(str(path))
    assert run.result.endswith(f" HOME={user_home}")


def test_gc_removes_the_worktrees_and_agent_homes_of_the_runs_it_deletes(
    engine: Engine, repo: Path, bins: dict[str, Path], state_dir: Path
) -> None:
    path = workflow(repo, bins, "claude", "[[write kept.txt x]]", extra="isolation: worktree")
    run = engine.run(str(path))
    [attempt] = work(engine, run.run_id)
    tree = state_dir / "worktrees" / run.run_id / attempt.dispatch_id
    assert (tree / "kept.txt").exists()
    assert engine.gc(older_than_s=0) == [run.run_id]
    assert not tree.exists() and not (state_dir / "agents" / run.run_id).exists()
    listed = subprocess.run(
        ["git", "worktree", "list"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    assert len(listed.strip().splitlines()) == 1


def test_a_stop_request_ends_the_agents_process_group_and_a_resume_runs_it_again(
    engine: Engine, repo: Path, bins: dict[str, Path], state_dir: Path
) -> None:
    import threading

    path = workflow(repo, bins, "claude", "Fix. [[spawn-sleep]] [[sleep-once 60]]")
    run = engine.start(str(path))
    driven: list[str] = []
    thread = threading.Thread(target=lambda: driven.append(engine.drive(run.run_id).status))
    started = time.monotonic()
    thread.start()
    home = state_dir / "agents" / run.run_id / "home" / ".fake-agent"
    wait_for(lambda: (home / "slept-once").exists(), what="the agent to start sleeping")
    engine.stop(run.run_id)
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - started < 30
    pids = _pids(state_dir, run.run_id)
    wait_for(lambda: not any(_alive(p) for p in pids), timeout=10, what="the group to go")
    [attempt] = work(engine, run.run_id)
    assert attempt.status == "failed" and attempt.transient
    assert attempt.failure == (
        "claude was stopped (the drive was stopped or interrupted) and its process group was "
        "killed; a later drive runs the unit again"
    )
    resumed = engine.drive(run.run_id)
    assert resumed.status == "completed"
    assert [a.status for a in work(engine, run.run_id)] == ["failed", "succeeded"]


def test_a_descendant_holding_stdout_after_the_cli_exited_is_killed_after_a_grace(
    engine: Engine, repo: Path, bins: dict[str, Path], state_dir: Path
) -> None:
    started = time.monotonic()
    run = engine.run(str(workflow(repo, bins, "claude", "Fix. [[hold-stdout]]")))
    assert run.status == "completed" and run.result.startswith("TRIED")
    assert time.monotonic() - started < 60  # not the holder's 120 s
    pids = _pids(state_dir, run.run_id)
    wait_for(lambda: not any(_alive(p) for p in pids), timeout=10, what="the holder to go")


def test_agent_cost_is_charged_and_the_remaining_allowance_is_passed_as_claudes_spend_cap(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    gate = "gate: {judge: expr, check: \"'FIXED' in output\", criteria: [say FIXED], max_loops: 3}"
    path = workflow(repo, bins, "claude", "Fix.", extra=gate, top="budget: {max_cost: 1.0}\n")
    run = engine.run(str(path))
    assert run.status == "completed"
    first, second = (json.loads(a.output_json or "null") for a in work(engine, run.run_id))
    assert first.endswith(" budget=1.000000") and second.endswith(" budget=0.999520")
    assert run.budget_use().cost == pytest.approx(0.00096)


def test_an_agent_unit_is_not_started_once_the_cost_ceiling_is_reached(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    gate = "gate: {judge: expr, check: \"'FIXED' in output\", criteria: [say FIXED], max_loops: 3}"
    path = workflow(repo, bins, "claude", "Fix.", extra=gate, top="budget: {max_cost: 0.0004}\n")
    run = engine.run(str(path))
    assert run.status == "failed"
    assert [a.loop for a in work(engine, run.run_id)] == [1]


@pytest.mark.parametrize(
    ("prompt", "error_class"), [("[[max-turns]]", "max_turns"), ("[[deny]]", "permission_denied")]
)
def test_a_failed_claude_attempt_journals_the_cost_it_reported(
    engine: Engine, repo: Path, bins: dict[str, Path], prompt: str, error_class: str
) -> None:
    run = engine.run(str(workflow(repo, bins, "claude", f"[[write a.txt x]] {prompt}")))
    [attempt] = work(engine, run.run_id)
    assert attempt.status == "failed"
    assert attempt.failure is not None and attempt.failure.startswith(
        f"claude failed ({error_class}): "
    )
    # the fake's result line says total_cost_usd 0.00048 for 120 + 8 tokens, failed or not
    assert (attempt.tokens_in, attempt.tokens_out, attempt.cost) == (120, 8, 0.00048)
    assert engine.store.price_source_of(run.run_id, attempt.dispatch_id) == "runner"
    assert run.budget_use().cost == pytest.approx(0.00048)


def test_a_failed_agent_attempts_cost_counts_against_max_cost(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    path = repo / "two.yaml"
    path.write_text(
        "name: twoagents\n"
        "budget: {max_cost: 0.0004}\n"
        "steps:\n"
        "  - {id: first, agent: claude, prompt: '[[max-turns]]', on_error: continue}\n"
        "  - {id: second, agent: claude, prompt: 'Fix.'}\n"
        f"runners:\n  claude: {{bin: '{bins['claude']}'}}\n"
    )
    run = engine.run(str(path))
    # the failed first attempt spent 0.00048 of 0.0004: the second step is never started
    assert run.status == "failed"
    assert run.reason is not None and "max_cost used 0.0005 of 0.0004; unit second" in run.reason
    assert [(a.step_id, a.status, a.cost) for a in work(engine, run.run_id)] == [
        ("first", "failed", 0.00048)
    ]
    assert run.budget_use().cost == pytest.approx(0.00048)
