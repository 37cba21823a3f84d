"""Verbs on runs in every state (issue 20, class 3): exit code, message, and rows after.

Each verb (approve, reject, abandon, stop, resume, fork, gc) meets a run in each status
(active, blocked, completed, failed, abandoned), twice: the second invocation must do what
the first should have (a refusal refuses again and writes nothing, a done verb says so).
Decisions are compare-and-set against a *blocked* run; everything else a wrong state refuses
writes nothing.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers_flow import journal_counts, run_cli
from wf_magic import Engine, register_function

FAIL = {"on": False}


def _step_a() -> str:
    if FAIL["on"]:
        raise ValueError("a broke")
    return "A"


register_function("verb_state_a", _step_a)

SOURCE = """
name: verbs
steps:
  - id: a
    python: verb_state_a
  - id: b
    prompt: Draft from {{ steps.a.output }}
    gate: {judge: human, criteria: [clear]}
"""
STATES = ("active", "blocked", "completed", "failed", "abandoned")


def _make(state_dir: Path, status: str) -> str:
    """A run of SOURCE left in ``status``."""
    FAIL["on"] = status == "failed"
    with Engine(state_dir) as engine:
        if status == "active":
            return engine.start(SOURCE).run_id  # started, never driven
        run = engine.run(SOURCE)
        if status == "completed":
            engine.approve(run.run_id, "b")
            engine.drive(run.run_id)
        elif status == "abandoned":
            engine.abandon(run.run_id)
        assert engine.get_run(run.run_id).status == status
        return run.run_id


@dataclass(frozen=True)
class Case:
    """What one verb does to a run in one status: the first and the second invocation."""

    code: int
    words: str
    after: str
    """The run's status afterwards (``deleted``: gc removed it, leaving a receipt)."""
    writes: bool
    """Whether the first invocation writes the run's rows (or a new run: a fork); refusals
    never do."""
    again_code: int
    again_words: str


VERBS: dict[str, Callable[[str], list[str]]] = {
    "approve": lambda r: ["approve", r, "b"],
    "reject": lambda r: ["reject", r, "b", "--feedback", "shorter"],
    "abandon": lambda r: ["abandon", r],
    "stop": lambda r: ["stop", r],
    "resume": lambda r: ["resume", r],
    "fork": lambda r: ["fork", r, "--from", "a"],
    "gc": lambda r: ["gc", "--older-than", "0s"],
}

_NOT_WAITING = "step b is not waiting for a decision (status {s})"
_DECIDE = {
    "active": "the run is active, not blocked on a gate",
    "completed": "the run completed; there is nothing left to decide",
    "failed": "the run failed (step a: unit a failed: verb_state_a raised ValueError: a broke)",
    "abandoned": "the run was abandoned (abandoned by user); `wf fork",
}


def _decision(verb: str, done: str) -> dict[str, Case]:
    cases = {
        s: Case(2, f"{_NOT_WAITING.format(s=s)}: {w}", s, False, 2, _NOT_WAITING.format(s=s))
        for s, w in _DECIDE.items()
    }
    cases["blocked"] = Case(0, f"{done} ", "blocked", True, 2, "was already decided")
    return cases


TABLE: dict[str, dict[str, Case]] = {
    "approve": _decision("approve", "approved"),
    "reject": _decision("reject", "rejected"),
    "abandon": {
        "active": Case(0, "abandoned", "abandoned", True, 1, "is already abandoned"),
        "blocked": Case(0, "abandoned", "abandoned", True, 1, "is already abandoned"),
        "completed": Case(2, "completed; there is nothing to abandon", "completed", False, 2,
                          "nothing to abandon"),
        "failed": Case(0, "abandoned", "abandoned", True, 1, "is already abandoned"),
        "abandoned": Case(1, "is already abandoned (reason: abandoned by user); nothing was "
                          "changed", "abandoned", False, 1, "is already abandoned"),
    },
    "stop": {
        "active": Case(0, "is not being driven now: nothing stops", "active", True, 0,
                      "nothing stops"),
        "blocked": Case(0, "is not being driven now: nothing stops", "blocked", True, 0,
                      "nothing stops"),
        "completed": Case(0, "is completed; there is nothing to stop (nothing was changed)",
                          "completed", False, 0, "nothing to stop"),
        "failed": Case(0, "is not being driven now: nothing stops", "failed", True, 0,
                      "nothing stops"),
        "abandoned": Case(0, "is abandoned; there is nothing to stop (nothing was changed)",
                          "abandoned", False, 0, "nothing to stop"),
    },
    "resume": {
        "active": Case(3, "waiting for a human verdict on loop 1", "blocked", True, 3,
                       "waiting for a human verdict"),
        "blocked": Case(3, "waiting for a human verdict on loop 1", "blocked", False, 3,
                        "waiting for a human verdict"),
        "completed": Case(0, "[completed]", "completed", False, 0, "[completed]"),
        "failed": Case(1, "verb_state_a raised ValueError: a broke", "failed", True, 1,
                       "a broke"),
        "abandoned": Case(1, "was abandoned (reason: abandoned by user) and cannot be resumed",
                          "abandoned", False, 1, "cannot be resumed"),
    },
    "fork": {
        "active": Case(3, "(fork of", "abandoned", True, 3, "(fork of"),
        "blocked": Case(3, "(fork of", "abandoned", True, 3, "(fork of"),
        "completed": Case(3, "(fork of", "completed", True, 3, "(fork of"),
        # A failed run keeps its status and reason when a fork supersedes it (issue 23).
        "failed": Case(1, "(fork of", "failed", True, 1, "(fork of"),
        "abandoned": Case(3, "(fork of", "abandoned", True, 3, "(fork of"),
    },
    "gc": {
        "active": Case(0, "deleted 0 finished run(s)", "active", False, 0, "deleted 0"),
        "blocked": Case(0, "deleted 0 finished run(s)", "blocked", False, 0, "deleted 0"),
        "completed": Case(0, "deleted 1 finished run(s)", "deleted", True, 0, "deleted 0"),
        "failed": Case(0, "deleted 1 finished run(s)", "deleted", True, 0, "deleted 0"),
        "abandoned": Case(0, "deleted 1 finished run(s)", "deleted", True, 0, "deleted 0"),
    },
}  # fmt: skip


def _rows(state_dir: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _snapshot(state_dir: Path, run_id: str) -> tuple[object, ...]:
    """Everything a verb could write about the run: its row, journal, events and steps."""
    with Engine(state_dir) as engine:
        counts = journal_counts(engine, run_id)
    row = _rows(
        state_dir,
        "SELECT status, status_reason, stop_requested, updated_at FROM runs WHERE run_id = ?",
        run_id,
    )
    return (*counts, tuple(row), len(_rows(state_dir, "SELECT 1 FROM runs")))


@pytest.mark.parametrize("status", STATES)
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_each_verb_on_each_run_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, status: str
) -> None:
    case = TABLE[verb][status]
    state_dir = tmp_path / "state"
    run_id = _make(state_dir, status)
    capsys.readouterr()
    before = _snapshot(state_dir, run_id)
    human_sql = "SELECT COUNT(*) FROM attempts WHERE runner = 'human'"
    [(humans_before,)] = _rows(state_dir, human_sql)

    code = run_cli(state_dir, *VERBS[verb](run_id))
    said = capsys.readouterr()
    text = said.out + said.err

    assert code == case.code, text
    assert case.words in text, text
    if case.code == 2:  # a refusal: one line on stderr, naming the run
        assert said.err.startswith(f"error: Run {run_id} ") and said.err.count("\n") == 1
    after = _rows(state_dir, "SELECT status FROM runs WHERE run_id = ?", run_id)
    if case.after == "deleted":
        assert after == []
        assert _rows(state_dir, "SELECT status FROM run_receipts") == [(status,)]
    else:
        assert after == [(case.after,)]
        assert (_snapshot(state_dir, run_id) != before) is case.writes
    decided = verb in ("approve", "reject") and status == "blocked"
    if case.after != "deleted":  # a decision is journaled only on a blocked run
        assert _rows(state_dir, human_sql) == [(humans_before + decided,)]

    settled = _snapshot(state_dir, run_id) if case.after != "deleted" else None
    again = run_cli(state_dir, *VERBS[verb](run_id))
    said = capsys.readouterr()
    assert again == case.again_code, said.out + said.err
    assert case.again_words in said.out + said.err
    # The second invocation finds the work done (or refuses again) and writes nothing; only
    # a fork (another new run) and a failed run's resume (another dispatch) act again.
    acts_again = verb == "fork" or (verb, status) == ("resume", "failed")
    if settled is not None:
        assert (_snapshot(state_dir, run_id) != settled) is acts_again
    else:
        assert _rows(state_dir, "SELECT COUNT(*) FROM runs") == [(0,)]


def test_a_decision_raced_by_an_abandon_is_refused_inside_the_same_transaction(
    tmp_path: Path,
) -> None:
    """The blocked check is the decision's own compare-and-set, not a read before it."""
    from wf_magic.errors import GateDecisionRefused
    from wf_magic.gates.human import record_human_verdict
    from wf_magic.gates.verdict import Verdict

    run_id = _make(tmp_path, "blocked")
    with Engine(tmp_path) as engine:
        handle = engine.handle(run_id)  # read while blocked
        engine.store.set_run_status(run_id, "abandoned", reason="abandoned meanwhile")
        with pytest.raises(GateDecisionRefused, match=re.escape("(status abandoned)")):
            record_human_verdict(
                engine.store,
                run_id,
                "b",
                workflow=handle.workflow,
                verdict=Verdict(complete=True, feedback="", judge="human"),
                loop=None,
            )
        assert [a for a in engine.attempts(run_id) if a.runner == "human"] == []
