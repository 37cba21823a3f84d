"""Agent steps (issue 21), fast tier: each CLI's shape played by a fake harness executable.

The fakes (tests/agent_fakes/fake_agent.py) print each real CLI's JSON/JSONL, errors and exit
codes, write files in their cwd and honour preset and resumed sessions, so these tests drive
the whole path: spec → units → dispatch → the agent runner's subprocess → journal.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.agent_fakes.bins import SHAPES, git_repo, make_bins
from wf_magic import Engine
from wf_magic.agents.sidecars import preset_session_id
from wf_magic.drive.units import Feedback, feedback_block
from wf_magic.store.records import AttemptRow


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
    top: str = "",
) -> Path:
    """A one-step agent workflow in ``folder`` (the step's keys: ``extra`` lines)."""
    body = "".join(f"    {line}\n" for line in extra.strip().splitlines())
    path = folder / f"{harness}.yaml"
    path.write_text(
        f"name: agentfix\n{top}steps:\n  - id: fix\n    agent: {harness}\n"
        f"    prompt: {json.dumps(prompt)}\n{body}"
        f"runners:\n  {harness}: {{bin: {bins[harness]}}}\n"
    )
    return path


def work(engine: Engine, run_id: str) -> list[AttemptRow]:
    return [a for a in engine.store.attempts_of(run_id) if a.phase == "work"]


GATE = "gate: {judge: expr, check: \"'FIXED' in output\", criteria: [say FIXED], max_loops: 3}"


@pytest.mark.parametrize("harness", SHAPES)
def test_a_gate_loop_passes_at_loop_2_because_the_feedback_reached_the_agent(
    engine: Engine, repo: Path, bins: dict[str, Path], harness: str
) -> None:
    run = engine.run(str(workflow(repo, bins, harness, "Fix the test.", extra=GATE)))
    assert run.status == "completed"
    assert run.result.startswith("FIXED turn=1")  # session: fresh: a new session per loop
    attempts = work(engine, run.run_id)
    assert [(a.loop, a.status) for a in attempts] == [(1, "succeeded"), (2, "succeeded")]
    assert attempts[0].session_id != attempts[1].session_id
    outputs = [json.loads(a.output_json or "null") for a in attempts]
    assert outputs[0].startswith("TRIED") and outputs[1].startswith("FIXED")


@pytest.mark.parametrize("harness", SHAPES)
def test_session_continue_resumes_the_previous_loops_session_with_only_the_feedback(
    engine: Engine, repo: Path, bins: dict[str, Path], harness: str
) -> None:
    path = workflow(repo, bins, harness, "Fix the test.", extra=f"session: continue\n{GATE}")
    run = engine.run(str(path))
    assert run.status == "completed"
    block = feedback_block(Feedback(loop=1, feedback="say FIXED", missing=("say FIXED",)))
    first, second = work(engine, run.run_id)
    assert first.session_id and second.session_id == first.session_id
    # turn 2 of the same session, one earlier prompt, and the new prompt was the block alone
    assert run.result == f"FIXED turn=2 prompt_chars={len(block.strip())} history=1"
    facts = engine.store.agent_facts(second.dispatch_id)
    assert facts is not None and facts["resumed_session"] == first.session_id


def test_claude_tokens_cost_and_preset_session_id_are_journaled_exactly(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    run = engine.run(str(workflow(repo, bins, "claude", "Say hello.")))
    [attempt] = work(engine, run.run_id)
    assert (attempt.tokens_in, attempt.tokens_out, attempt.cost) == (120, 8, 0.00048)
    assert attempt.session_id == preset_session_id(attempt.dispatch_id, 1)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None
    assert facts["cost_source"] == "estimate: Claude Code's own price table"
    assert (facts["harness"], facts["version"]) == ("claude", "2.1.197 (Claude Code)")
    assert (facts["exit_code"], facts["error_class"], facts["turns"]) == (0, None, 1)
    assert json.loads(facts["final_json"])["session_id"] == attempt.session_id
    frame = engine.journal(run.run_id)
    assert list(frame.loc[frame["phase"] == "work", "session_id"]) == [attempt.session_id]


def test_codex_cumulative_usage_on_a_resumed_thread_is_journaled_as_the_delta(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    path = workflow(repo, bins, "codex", "Fix.", extra=f"session: continue\n{GATE}")
    run = engine.run(str(path))
    first, second = work(engine, run.run_id)
    assert second.session_id == first.session_id  # the thread id of its first line
    # the fake reports 240/16 for the thread on its second turn: the journal keeps 120/8
    assert [(a.tokens_in, a.tokens_out, a.cost) for a in (first, second)] == [
        (120, 8, None),
        (120, 8, None),
    ]
    facts = engine.store.agent_facts(second.dispatch_id)
    assert facts is not None and facts["usage_total"] == [240, 16]


@pytest.mark.parametrize(
    ("harness", "tokens", "cost"),
    [("opencode", (120, 8), 0.00048), ("gemini", (120, 8), None)],
)
def test_opencode_and_gemini_usage_and_cost(
    engine: Engine,
    repo: Path,
    bins: dict[str, Path],
    harness: str,
    tokens: tuple[int, int],
    cost: float | None,
) -> None:
    run = engine.run(str(workflow(repo, bins, harness, "Say hello.")))
    [attempt] = work(engine, run.run_id)
    assert (attempt.tokens_in, attempt.tokens_out) == tokens
    assert attempt.cost == cost
    assert attempt.session_id


@pytest.mark.parametrize("harness", SHAPES)
def test_a_worktree_attempt_edits_only_its_worktree_and_the_dirty_one_is_kept_and_named(
    engine: Engine, repo: Path, bins: dict[str, Path], harness: str, state_dir: Path
) -> None:
    path = workflow(repo, bins, harness, "[[write hello.txt hi]]", extra="isolation: worktree")
    subprocess.run(["git", "add", path.name], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "wf"],
        cwd=repo,
        check=True,
    )
    run = engine.run(str(path))
    assert run.status == "completed", run.steps
    [attempt] = work(engine, run.run_id)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None
    tree = Path(facts["worktree"]["path"])
    assert tree == state_dir / "worktrees" / run.run_id / attempt.dispatch_id
    assert (tree / "hello.txt").read_text() == "hi\n"
    assert not (repo / "hello.txt").exists()
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    assert status == ""
    assert facts["worktree"]["kept"] is True
    assert facts["worktree"]["changed_files"] == ["hello.txt"]
    assert "1 file changed" in facts["worktree"]["diff_stat"]
    assert facts["workdir"] == str(tree)


def test_a_clean_worktree_is_removed_after_the_attempt(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    run = engine.run(str(workflow(repo, bins, "claude", "Only look.", extra="isolation: worktree")))
    [attempt] = work(engine, run.run_id)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None and facts["worktree"]["kept"] is False
    assert not Path(facts["worktree"]["path"]).exists()
    listed = subprocess.run(
        ["git", "worktree", "list"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    assert len(listed.strip().splitlines()) == 1


def test_isolation_worktree_outside_a_git_repository_is_refused_in_one_line(
    engine: Engine, tmp_path: Path, bins: dict[str, Path]
) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    run = engine.run(str(workflow(folder, bins, "claude", "Fix.", extra="isolation: worktree")))
    assert run.status == "failed"
    [attempt] = work(engine, run.run_id)
    assert attempt.failure == (
        f"step fix: isolation: worktree needs a git repository, but {folder.resolve()} is not "
        "inside one; run `git init` there or use isolation: none"
    )


@pytest.mark.parametrize(
    ("harness", "message"),
    [
        (
            "claude",
            "claude failed (auth): Failed to authenticate. API Error: 401 invalid x-api-key",
        ),
        (
            "codex",
            "codex failed (auth): unexpected status 401 Unauthorized: fake backend: injected HTTP 401",
        ),
        ("opencode", "opencode failed (auth): injected HTTP 401"),
        (
            "gemini",
            'gemini failed (auth): {"type": "error", "error": {"message": "injected HTTP 401"}}',
        ),
    ],
)
def test_a_401_fails_permanently_with_the_clis_message_and_is_not_retried(
    engine: Engine, repo: Path, bins: dict[str, Path], harness: str, message: str
) -> None:
    extra = "retry: {max_attempts: 3}"
    run = engine.run(str(workflow(repo, bins, harness, "Fix. [[fail 401]]", extra=extra)))
    assert run.status == "failed"
    [attempt] = work(engine, run.run_id)
    assert (attempt.status, attempt.transient, attempt.failure) == ("failed", False, message)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None and facts["error_class"] == "auth"


@pytest.mark.parametrize("harness", SHAPES)
def test_a_529_fails_transiently_and_is_retried(
    engine: Engine, repo: Path, bins: dict[str, Path], harness: str
) -> None:
    extra = "retry: {max_attempts: 2}"
    run = engine.run(str(workflow(repo, bins, harness, "Fix. [[fail-once 529]]", extra=extra)))
    assert run.status == "completed"
    first, second = work(engine, run.run_id)
    assert (first.status, first.transient) == ("failed", True)
    assert first.dispatch_id != second.dispatch_id and second.status == "succeeded"
    facts = engine.store.agent_facts(first.dispatch_id)
    assert facts is not None
    assert facts["error_class"] in ("overloaded", "server_error")


def test_claude_exit_0_with_permission_denials_when_edits_were_asked_is_a_failure(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    run = engine.run(str(workflow(repo, bins, "claude", "[[write a.txt x]] [[deny]]")))
    [attempt] = work(engine, run.run_id)
    assert attempt.status == "failed" and not attempt.transient
    assert attempt.failure == (
        "claude failed (permission_denied): exited 0 but denied 1 tool call(s) (Write) although "
        "permission: edits was asked for"
    )
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None
    assert facts["permission_denials"] == [{"tool_name": "Write", "target": "a.txt"}]


def test_permission_read_reports_denials_without_failing(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    path = workflow(repo, bins, "claude", "[[write a.txt x]]", extra="permission: read")
    run = engine.run(str(path))
    assert run.status == "completed"
    assert not (repo / "a.txt").exists()


def test_claude_error_max_turns_is_a_failure_of_its_own_name(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    path = workflow(repo, bins, "claude", "[[max-turns]]", extra="max_turns: 1")
    run = engine.run(str(path))
    [attempt] = work(engine, run.run_id)
    assert attempt.failure == "claude failed (max_turns): Reached maximum number of turns (1)"
    assert not attempt.transient


def test_an_agents_streamed_turns_and_tool_uses_reach_the_bus_and_the_progress_line(
    engine: Engine, repo: Path, bins: dict[str, Path]
) -> None:
    import io

    from wf_magic.bus import Event
    from wf_magic.progress import ProgressPrinter

    seen: list[Event] = []
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=True)
    engine.subscribe(seen.append)
    engine.subscribe(printer)
    run = engine.run(str(workflow(repo, bins, "claude", "[[sleep 0.3]] [[write a.txt x]]")))
    assert run.status == "completed"
    texts = [e.data["text"] for e in seen if e.kind == "unit_text"]
    assert texts and texts[0] == "starting"
    assert any("1 tool use · Write" in t for t in texts)
    assert {(e.step_id, e.unit_id) for e in seen if e.kind == "unit_text"} == {("fix", "fix")}
    # drawn at most 10 times a second: the tool use comes 0.3 s after the start
    assert "  … fix: 0 done, 1 running, 0 failed · turn 1 · 1 tool use · Write" in out.getvalue()


def test_wf_show_and_the_unit_drill_down_show_the_agent_facts(
    engine: Engine, repo: Path, bins: dict[str, Path], state_dir: Path
) -> None:
    from tests.conftest import run_wf
    from wf_magic.inspection import attempt_record
    from wf_magic.notebook.detail import unit_loops_html

    path = workflow(repo, bins, "claude", "[[write hello.txt hi]]", extra="isolation: worktree")
    run = engine.run(str(path))
    [attempt] = work(engine, run.run_id)
    shown = run_wf(state_dir, "show", run.run_id, "fix")
    assert shown.returncode == 0, shown.stderr
    tree = state_dir / "worktrees" / run.run_id / attempt.dispatch_id
    for line in (
        "── agent ──",
        "harness    claude (2.1.197 (Claude Code))",
        f"session    {attempt.session_id}",
        "outcome    exit 0",
        "turns      1, 1 tool use(s), permission edits",
        "cost       $0.000480 (estimate: Claude Code's own price table)",
        f"worktree   {tree} — kept",
        "changed    hello.txt",
    ):
        assert line in shown.stdout.splitlines(), line
    record = attempt_record(engine.store, run.run_id, "fix")
    assert record.session_id == attempt.session_id
    page = unit_loops_html([record], {})
    assert "class='wf-agent'" in page and "hello.txt" in page
    journal = run_wf(state_dir, "journal", run.run_id, "--format", "csv")
    assert "session_id" in journal.stdout.splitlines()[0]
    assert attempt.session_id in journal.stdout


@pytest.mark.parametrize(
    ("harness", "prompt", "expected"),
    [
        ("claude", "Report.", {"status": "TRIED", "turn": 1}),  # native: structured_output
        ("codex", "Report. [[json]]", {"status": "TRIED", "turn": 1}),  # parsed from the text
        ("gemini", "Report. [[json]]", {"status": "TRIED", "turn": 1}),
    ],
)
def test_an_output_schema_is_answered_natively_or_parsed_from_the_final_text(
    engine: Engine,
    repo: Path,
    bins: dict[str, Path],
    harness: str,
    prompt: str,
    expected: dict[str, Any],
) -> None:
    schema = "output: {type: object, properties: {status: {type: string}}, required: [status]}"
    run = engine.run(str(workflow(repo, bins, harness, prompt, extra=schema)))
    assert run.status == "completed"
    assert run.result == expected


def test_a_reclaimed_fresh_session_attempt_gets_a_new_preset_session_id(
    engine: Engine, repo: Path, bins: dict[str, Path], state_dir: Path
) -> None:
    from wf_magic.agents import sidecars

    run = engine.start(str(workflow(repo, bins, "claude", "Fix.")))
    # a launch of a dead driver left its sidecar (launch 1) for the dispatch id to reclaim
    [attempt] = engine.store.reserve_attempts([(_key(engine, run.run_id), True)])
    sidecars.save(
        state_dir,
        run.run_id,
        attempt.dispatch_id,
        sidecars.Sidecar(launches=1, session_id=preset_session_id(attempt.dispatch_id, 1)),
    )
    finished = engine.drive(run.run_id)
    assert finished.status == "completed"
    [row] = work(engine, run.run_id)
    assert row.dispatch_id == attempt.dispatch_id
    assert row.session_id == preset_session_id(attempt.dispatch_id, 2)


def _key(engine: Engine, run_id: str) -> Any:
    from wf_magic.drive.units import build_units
    from wf_magic.spec.plan import Plan
    from wf_magic.store.journal import UnitKey

    run = engine.store.get_run(run_id)
    assert run is not None
    plan = Plan.model_validate_json(run.plan_json)
    [unit] = build_units(plan, plan.steps[0], params={}, outputs={}, loop=1, feedback=None)
    return UnitKey(
        run_id=run_id,
        workflow=plan.name,
        step_id="fix",
        unit_id="fix",
        phase="work",
        loop=1,
        item_index=None,
        runner="claude",
        model=None,
        input_hash=unit.input_hash,
        input_json=unit.rendered.input_json,
    )
