"""Budgets (DESIGN.md §3.7, §9): per-run ceilings seeded from the journal; gates, reuse free."""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.helpers_flow import children_of, journal_counts, step_statuses, work_attempts
from wf_magic import Engine, UnitRequest, UnitResult, register_runner
from wf_magic.runners.base import BaseRunner

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

REPO = Path(__file__).resolve().parent.parent

# Five sleeping units of 7 + 3 tokens each, one at a time: a ceiling stops the map part-way.
SLEEPY_MAP = """
name: budget-CEILING
budget: {CEILING: LIMIT}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "^Say", reply: said, tokens_in: 7, tokens_out: 3, sleep_s: 0.1}
steps:
  - id: say
    map: "{{ ['a', 'b', 'c', 'd', 'e'] }}"
    prompt: "Say {{ item }}"
"""


def sleepy_map(ceiling: str, limit: int) -> str:
    return SLEEPY_MAP.replace("CEILING", ceiling).replace("LIMIT", str(limit))


def budget_used(engine: Engine, run_id: str) -> dict[str, float]:
    frame = engine.budget(run_id)
    return dict(zip(frame["ceiling"], frame["used"], strict=True))


def charged_units(engine: Engine, run_id: str) -> list[tuple[str, int, str, int]]:
    """(unit, attempt, status, tokens) of the run's charged attempts, in journal order."""
    return [
        (a.unit_id, a.attempt, a.status, a.tokens_in + a.tokens_out)
        for a in engine.attempts(run_id)
        if a.charged
    ]


def reason_without_run_id(engine: Engine, run_id: str) -> str:
    reason = engine.status(run_id).reason
    assert reason is not None
    return reason.replace(run_id, "<run>")


# -- the crash harness ------------------------------------------------------------------------
def spawn_wf_run(state_dir: Path, workflow_file: Path) -> subprocess.Popen[bytes]:
    """``wf run FILE`` in a real process (the repo on PYTHONPATH, whatever the cwd)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-m", "wf_magic.cli", "--db", str(state_dir), "run", str(workflow_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=str(REPO),
    )


def first_cell(db: Path, sql: str) -> Any:
    if not db.exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute(sql).fetchone()
    except sqlite3.OperationalError:  # not migrated yet
        return None
    finally:
        conn.close()
    return row[0] if row else None


def kill_when(proc: subprocess.Popen[bytes], db: Path, sql: str, *, timeout_s: float = 30) -> Any:
    """SIGKILL ``proc`` as soon as ``sql`` yields a truthy cell; that cell."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            cell = first_cell(db, sql)
            if cell:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
                assert proc.returncode == -signal.SIGKILL
                return cell
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"wf exited ({proc.returncode}) before {sql!r}:\n{out!r}\n{err!r}")
            time.sleep(0.01)
        pytest.fail(f"timed out waiting for {sql!r}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


# -- ceilings hit at the same unit, driven in one go or killed and resumed --------------------
@pytest.mark.parametrize(
    ("ceiling", "limit", "refused", "used"),
    [
        ("max_units", 4, "say[4]", {"units": 4.0, "tokens": 40.0, "cost": 0.0}),
        # Tokens are known only after a unit ran: say[2] starts at 20 < 25 and ends at 30.
        ("max_tokens", 25, "say[3]", {"units": 3.0, "tokens": 30.0, "cost": 0.0}),
    ],
)
def test_ceiling_is_hit_at_the_same_unit_whether_driven_in_one_go_or_killed_and_resumed(
    tmp_path: Path, ceiling: str, limit: int, refused: str, used: dict[str, float]
) -> None:
    source = tmp_path / "budget.yaml"
    source.write_text(sleepy_map(ceiling, limit), encoding="utf-8")
    crashed_dir = tmp_path / "crashed"
    proc = spawn_wf_run(crashed_dir, source)  # starting up while the reference run drives

    with Engine(tmp_path / "one-go") as engine:
        straight = engine.run(source)
        assert straight.status == "failed"
        expected_reason = reason_without_run_id(engine, straight.run_id)
        expected_used = budget_used(engine, straight.run_id)
        expected_charged = charged_units(engine, straight.run_id)

    # Kill mid-way, while a unit after the first is in flight: its attempt is reserved (so
    # charged) but has no tokens yet.
    in_flight = kill_when(
        proc,
        crashed_dir / "state.db",
        "SELECT unit_id || ' ' || dispatch_id FROM attempts"
        " WHERE status = 'running' AND unit_id != 'say[0]'",
    )
    unit_id, dispatch_id = in_flight.split()
    with Engine(crashed_dir) as engine:
        (run_row,) = engine.list_runs()
        assert run_row.status == "active"
        resumed = engine.drive(run_row.run_id)
        assert resumed.status == "failed"
        assert reason_without_run_id(engine, resumed.run_id) == expected_reason
        assert budget_used(engine, resumed.run_id) == expected_used
        assert charged_units(engine, resumed.run_id) == expected_charged
        # The unit in flight at the kill was reclaimed in place, not dispatched again.
        reclaimed = [a for a in engine.attempts(resumed.run_id) if a.unit_id == unit_id]
        assert [(a.attempt, a.dispatch_id, a.status) for a in reclaimed] == [
            (1, dispatch_id, "succeeded")
        ]

    name = ceiling.removeprefix("max_")
    assert expected_used == used
    assert expected_reason == (
        f"step say: Budget exceeded in run <run>: {ceiling} used {int(used[name])} of {limit}; "
        f"unit {refused} was not dispatched. Raise budget.{ceiling} and start a new run (--new), "
        "or fork this one."
    )
    assert [unit for unit, *_ in expected_charged] == [
        f"say[{i}]" for i in range(int(used["units"]))
    ]


def test_retries_charge_the_same_units_when_the_driver_is_killed_during_a_backoff(
    tmp_path: Path,
) -> None:
    source = tmp_path / "flaky.yaml"
    source.write_text(
        """
name: flaky
budget: {max_units: 10}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "^Call", error: transient}
steps:
  - id: call
    prompt: "Call the flaky service"
    retry: {max_attempts: 3, backoff_s: 0.4}
""",
        encoding="utf-8",
    )
    crashed_dir = tmp_path / "crashed"
    proc = spawn_wf_run(crashed_dir, source)
    with Engine(tmp_path / "one-go") as engine:
        straight = engine.run(source)
        expected = [(a.attempt, a.status) for a in engine.attempts(straight.run_id)]
        expected_used = budget_used(engine, straight.run_id)
    assert expected == [(1, "failed"), (2, "failed"), (3, "failed")]

    kill_when(
        proc, crashed_dir / "state.db", "SELECT COUNT(*) FROM attempts WHERE status = 'failed'"
    )
    with Engine(crashed_dir) as engine:
        (run_row,) = engine.list_runs()
        resumed = engine.drive(run_row.run_id)
        assert resumed.status == "failed"
        assert [(a.attempt, a.status) for a in engine.attempts(resumed.run_id)] == expected
        assert budget_used(engine, resumed.run_id) == expected_used


def test_a_budget_stopped_run_re_stops_at_once_without_dispatching(tmp_path: Path) -> None:
    from wf_magic.cli import main

    state_dir = tmp_path / "state"
    with Engine(state_dir) as engine:
        run = engine.run(sleepy_map("max_units", 2).replace("0.1}", "0}"))
        assert run.status == "failed"
        reason = run.reason
        before = [(a.dispatch_id, a.status) for a in engine.attempts(run.run_id)]
        again = engine.drive(run.run_id)
        assert (again.status, again.reason) == ("failed", reason)
        assert again.stats is not None and again.stats.dispatched == 0
        assert [(a.dispatch_id, a.status) for a in engine.attempts(run.run_id)] == before
    assert main(["--db", str(state_dir), "resume", run.run_id]) == 1
    with Engine(state_dir) as engine:
        assert [(a.dispatch_id, a.status) for a in engine.attempts(run.run_id)] == before


def test_budget_stop_is_a_hard_stop_under_on_error_continue(engine: Engine) -> None:
    run = engine.run("""
name: lenient
budget: {max_units: 2}
runner: scripted
steps:
  - id: say
    map: "{{ ['a', 'b', 'c'] }}"
    prompt: "Say {{ item }}"
    on_error: continue
  - id: after
    prompt: "Summarise"
    on_error: continue
""")
    assert run.status == "failed"
    assert run.reason is not None and "max_units used 2 of 2; unit say[2] was not" in run.reason
    assert [a.unit_id for a in engine.attempts(run.run_id)] == ["say[0]", "say[1]"]


def test_budget_stop_inside_a_gate_loop_fails_the_run_and_the_gate_row_is_free(
    engine: Engine,
) -> None:
    run = engine.run("""
name: looped
budget: {max_units: 1}
runner: scripted
runners:
  scripted:
    rules:
      - {match: '"v1"', kind: judge, reply: {complete: false, feedback: "deeper", missing: []}}
      - {match: "^Write", reply: v1, tokens_in: 5, tokens_out: 1}
steps:
  - id: essay
    prompt: "Write an essay"
    gate: {judge: llm, criteria: [deep], max_loops: 3}
""")
    assert run.status == "failed"
    assert run.reason is not None and (
        "max_units used 1 of 1; unit essay was not dispatched" in run.reason
    )
    journal = [
        (a.unit_id, a.phase, a.loop, a.status, bool(a.charged)) for a in engine.attempts(run.run_id)
    ]
    assert journal == [
        ("essay", "work", 1, "succeeded", True),
        ("essay.gate:l1", "gate", 1, "succeeded", False),
    ]


# -- what is charged --------------------------------------------------------------------------
JUDGED_MAP = """
name: judged-map
budget: {max_units: UNITS, max_tokens: 100}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "Judge", kind: judge, reply: {complete: true, feedback: "", missing: []},
         tokens_in: 400, tokens_out: 40}
      - {match: "^Draft", reply: drafted, tokens_in: 8, tokens_out: 2}
      - {match: "^Title", reply: titled, tokens_in: 6, tokens_out: 1}
steps:
  - id: draft
    map: "{{ ['a', 'b', 'c'] }}"
    prompt: "Draft {{ item }}"
    gate: {judge: llm, criteria: [complete]}
EXTRA
"""
TITLE_STEP = """
  - id: title
    prompt: "Title the drafts"
"""


def test_gate_rows_and_reused_attempts_are_not_charged_and_saved_tokens_are_reported(
    engine: Engine,
) -> None:
    # Three 10-token units fill max_units 3; the judge's 440 tokens would blow max_tokens 100.
    first = engine.run(JUDGED_MAP.replace("UNITS", "3").replace("EXTRA", ""))
    assert first.status == "completed"
    rows = [
        (a.unit_id, a.status, bool(a.charged), a.tokens_in + a.tokens_out, a.saved_tokens)
        for a in engine.attempts(first.run_id)
    ]
    assert rows == [
        ("draft[0]", "succeeded", True, 10, 0),
        ("draft[1]", "succeeded", True, 10, 0),
        ("draft[2]", "succeeded", True, 10, 0),
        ("draft.gate:l1", "succeeded", False, 440, 0),
    ]
    assert budget_used(engine, first.run_id) == {"units": 3.0, "tokens": 30.0, "cost": 0.0}

    # An edited workflow with a one-unit budget: three reused drafts, a free judge, one title.
    second = engine.run(JUDGED_MAP.replace("UNITS", "1").replace("EXTRA", TITLE_STEP))
    assert second.run_id != first.run_id
    assert second.status == "completed"
    rows = [
        (a.unit_id, a.status, bool(a.charged), a.tokens_in + a.tokens_out, a.saved_tokens)
        for a in engine.attempts(second.run_id)
    ]
    assert rows == [
        ("draft[0]", "reused", False, 0, 10),
        ("draft[1]", "reused", False, 0, 10),
        ("draft[2]", "reused", False, 0, 10),
        ("draft.gate:l1", "reused", False, 0, 440),  # same judge input: the verdict is reused
        ("title", "succeeded", True, 7, 0),
    ]
    assert second.stats is not None
    assert (second.stats.dispatched, second.stats.reused, second.stats.saved_tokens) == (1, 4, 470)
    expected = pd.DataFrame(
        {
            "ceiling": pd.array(["units", "tokens", "cost"], dtype="string"),
            "used": [1.0, 7.0, 0.0],
            "limit": [1.0, 100.0, math.nan],
            "remaining": [0.0, 93.0, math.nan],
            "used_fraction": [1.0, 0.07, math.nan],
            "saved": [3.0, 470.0, 0.0],
            "judge": [0.0, 0.0, 0.0],
        }
    )
    pd.testing.assert_frame_equal(engine.budget(second.run_id), expected)
    use = second.budget_use()
    assert (use.units, use.tokens, use.max_units, use.max_tokens) == (1, 7, 1, 100)


@pytest.mark.parametrize(
    "on_error",
    [
        "fail",
        pytest.param(
            "continue",
        ),
    ],
)
def test_child_workflow_units_are_charged_to_the_parent_budget(
    state_dir: Path, on_error: str
) -> None:
    child = """
name: child
runner: scripted
steps:
  - id: part
    map: "{{ ['x', 'y', 'z'] }}"
    prompt: "Part {{ item }}"
"""
    parent = """
name: parent
budget: {max_units: MAX}
runner: scripted
steps:
  - id: intro
    prompt: "Introduce"
  - id: sub
    workflow: child
    on_error: ON_ERROR
  - id: outro
    prompt: "Conclude"
""".replace("ON_ERROR", on_error)
    with Engine(state_dir, library={"child": child}) as engine:
        roomy = engine.run(parent.replace("MAX", "5"))
        assert roomy.status == "completed"
        # intro, three child units, outro; the workflow step's own unit is free.
        assert budget_used(engine, roomy.run_id)["units"] == 5.0
        assert [a.unit_id for a in engine.attempts(roomy.run_id) if a.charged] == ["intro", "outro"]

        tight = engine.run(parent.replace("MAX", "3"), no_cache=True)
        assert tight.status == "failed"
        assert tight.reason is not None and "max_units used 3 of 3" in tight.reason
        assert "unit part[2] was not dispatched" in tight.reason
        (child_run,) = [
            r for r in engine.list_runs(include_children=True) if r.parent_run_id == tight.run_id
        ]
        assert child_run.status == "failed"
        assert [a.unit_id for a in engine.attempts(child_run.run_id)] == ["part[0]", "part[1]"]
        assert [a.unit_id for a in engine.attempts(tight.run_id)] == ["intro", "sub"]
        charged = [
            a for r in (tight.run_id, child_run.run_id) for a in engine.attempts(r) if a.charged
        ]
        assert budget_used(engine, tight.run_id) == {
            "units": 3.0,
            "tokens": float(sum(a.tokens_in + a.tokens_out for a in charged)),
            "cost": 0.0,
        }
        # A child run reports the budget it is charged to: its root's.
        pd.testing.assert_frame_equal(engine.budget(child_run.run_id), engine.budget(tight.run_id))
        assert engine.status(child_run.run_id).budget_use() == tight.budget_use()


def test_a_runner_is_told_the_remaining_token_allowance(engine: Engine) -> None:
    seen: list[int | None] = []

    class Counting(BaseRunner):
        def run(self, request: UnitRequest) -> UnitResult:
            seen.append(request.max_tokens)
            return UnitResult(output="ok", tokens_in=6, tokens_out=4)

    register_runner("budget_counting", lambda ctx: Counting(), replace=True)
    run = engine.run("""
name: allowance
budget: {max_tokens: 25}
runner: budget_counting
steps:
  - id: say
    map: "{{ [1, 2, 3, 4] }}"
    prompt: "Say {{ item }}"
""")
    assert seen == [25, 15, 5]
    assert run.status == "failed"
    assert run.reason is not None and "max_tokens used 30 of 25; unit say[3]" in run.reason


def test_max_cost_counts_the_cost_runners_report(engine: Engine) -> None:
    class Priced(BaseRunner):
        def run(self, request: UnitRequest) -> UnitResult:
            return UnitResult(output="ok", tokens_in=1, tokens_out=1, cost=0.5)

    register_runner("budget_priced", lambda ctx: Priced(), replace=True)
    run = engine.run("""
name: priced
budget: {max_cost: 1.2}
runner: budget_priced
steps:
  - id: say
    map: "{{ [1, 2, 3, 4, 5] }}"
    prompt: "Say {{ item }}"
""")
    assert run.status == "failed"
    assert run.reason is not None and "max_cost used 1.5000 of 1.2000; unit say[3]" in run.reason
    assert budget_used(engine, run.run_id) == {"units": 3.0, "tokens": 6.0, "cost": 1.5}


def test_the_budget_demo_example_behaves_as_its_header_says(engine: Engine) -> None:
    demo = REPO / "examples" / "budget_demo.yaml"
    first = engine.run(demo)
    assert (first.status, first.result) == ("completed", "On durable execution")
    assert budget_used(engine, first.run_id) == {"units": 5.0, "tokens": 240.0, "cost": 0.0}
    judge = [a for a in engine.attempts(first.run_id) if a.phase == "gate"]
    assert [(a.tokens_in + a.tokens_out, bool(a.charged)) for a in judge] == [(220, False)]

    reused = engine.run(demo, new=True)
    assert reused.status == "completed"
    assert reused.stats is not None and (reused.stats.dispatched, reused.stats.saved_tokens) == (
        0,
        460,  # 240 of work + the judge's 220
    )
    assert budget_used(engine, reused.run_id) == {"units": 0.0, "tokens": 0.0, "cost": 0.0}

    wider = engine.run(demo, params={"sections": 5}, no_cache=True)
    assert wider.status == "failed"
    assert reason_without_run_id(engine, wider.run_id) == (
        "step title: Budget exceeded in run <run>: max_units used 6 of 6; unit title was not "
        "dispatched. Raise budget.max_units and start a new run (--new), or fork this one."
    )


CHILD_GATE_BUDGET = """
name: child-gate-budget
budget: {max_units: 4}
steps:
  - id: pre
    prompt: "Pre."
  - id: sub
    workflow: kid
  - id: post
    prompt: "Post."
---
name: kid
runners:
  scripted:
    rules:
      - {kind: judge, match: ".", reply: {complete: false, feedback: "again", missing: []}}
steps:
  - id: w
    prompt: "Kid work."
    gate: {max_loops: 5}
"""


def test_budget_exhausted_inside_a_childs_gate_loop_fails_the_parent_and_re_stops(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(CHILD_GATE_BUDGET)
    assert run.status == "failed"
    assert "max_units used 4 of 4; unit w was not dispatched" in (run.reason or "")
    [child] = children_of(engine, run.run_id)
    assert [a.charged for a in work_attempts(engine, child)] == [1, 1, 1]
    assert [a.unit_id for a in engine.attempts(child)][-1] == "w.gate:l3"
    assert step_statuses(engine, run.run_id)["post"] == "pending"
    before = [(a.dispatch_id, a.status) for a in engine.attempts(child)]

    again = engine.drive(run.run_id)

    assert (again.status, again.reason) == ("failed", run.reason)
    assert children_of(engine, run.run_id) == [child]
    assert [(a.dispatch_id, a.status) for a in engine.attempts(child)] == before
    assert again.budget_use().units == 4


def test_redriving_a_parent_stopped_by_its_childs_budget_writes_nothing(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(CHILD_GATE_BUDGET)
    assert run.status == "failed"
    [child] = children_of(engine, run.run_id)
    before = (journal_counts(engine, run.run_id), journal_counts(engine, child))

    assert engine.drive(run.run_id).status == "failed"

    assert (journal_counts(engine, run.run_id), journal_counts(engine, child)) == before
    assert [a.attempt for a in engine.attempts(run.run_id) if a.unit_id == "sub"] == [1]


def test_child_approved_and_driven_directly_still_obeys_the_root_budget(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: direct-child
budget: {max_units: 2}
steps:
  - id: pre
    prompt: "Pre."
  - id: sub
    workflow: kid
---
name: kid
steps:
  - id: k1
    prompt: "one"
    gate: {judge: human}
  - id: k2
    prompt: "two"
""")
    assert run.status == "blocked"
    [child] = children_of(engine, run.run_id)
    engine.approve(child, "k1")

    direct = engine.drive(child)

    assert direct.status == "failed"
    assert "max_units used 2 of 2; unit k2 was not dispatched" in (direct.reason or "")
    assert [a.unit_id for a in work_attempts(engine, child)] == ["k1"]
    assert engine.drive(run.run_id).status == "failed"
