"""Read-only tallies of one run's journal for its text and HTML views, counted inside SQLite.

``wf status`` of a 10 000-unit run needs a few numbers per step, not 10 000 attempt rows
turned into Python objects: the counting happens in SQL, and only the gate verdicts (a few
rows) come back whole.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from .dialect import pick
from .records import AttemptRow, from_row

_ATTEMPT_COLS = ", ".join(AttemptRow.__dataclass_fields__)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTally:
    """One step's units and tokens, as a run view shows them."""

    done: int = 0
    """Units whose latest work attempt is in the step's current loop and succeeded or reused."""
    seen: int = 0
    """Units whose latest work attempt is in the step's current loop."""
    tokens: int = 0
    """Paid tokens: in + out of the step's charged attempts (what the budget counts)."""
    saved_tokens: int = 0
    """Tokens its reused attempts saved (what they first cost)."""
    judge_tokens: int = 0
    """Tokens its gate's judge spent outside the budget (uncharged gate attempts)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTally:
    """Everything a run view counts from the journal."""

    steps: dict[str, StepTally]
    """Step id → its tally (a step without attempts is absent)."""
    gate_attempts: list[AttemptRow]
    """The gate verdict attempts, in journal order."""
    reused: int
    """Attempts answered from an earlier run."""
    reused_saved_tokens: int


def run_tally(conn: sqlite3.Connection, run_id: str) -> RunTally:
    """The tallies of ``run_id``'s journal (see :class:`RunTally`)."""
    units: dict[str, tuple[int, int]] = {}
    latest = pick(
        conn,
        sqlite="SELECT step_id, loop, status, max(attempt_pk) FROM attempts"
        "  WHERE run_id = ? AND phase = 'work' GROUP BY step_id, unit_id",
        postgresql="SELECT DISTINCT ON (step_id, unit_id) step_id, loop, status FROM attempts"
        "  WHERE run_id = ? AND phase = 'work' ORDER BY step_id, unit_id, attempt_pk DESC",
    )
    for step_id, done, seen in conn.execute(
        "SELECT latest.step_id,"
        " sum(CASE WHEN latest.status IN ('succeeded', 'reused') THEN 1 ELSE 0 END), count(*)"
        f" FROM ({latest}) AS latest"
        " JOIN steps ON steps.run_id = ? AND steps.step_id = latest.step_id"
        "  AND steps.loop = latest.loop"
        " GROUP BY latest.step_id",
        (run_id, run_id),
    ):
        units[str(step_id)] = (int(done), int(seen))
    steps: dict[str, StepTally] = {}
    reused = saved = 0
    for step_id, tokens, step_saved, step_reused, judge in conn.execute(
        "SELECT step_id, sum(CASE WHEN charged <> 0 THEN tokens_in + tokens_out ELSE 0 END),"
        " sum(CASE WHEN status = 'reused' THEN saved_tokens ELSE 0 END),"
        " sum(CASE WHEN status = 'reused' THEN 1 ELSE 0 END),"
        " sum(CASE WHEN phase IN ('gate', 'score') AND charged = 0"
        " THEN tokens_in + tokens_out ELSE 0 END)"
        " FROM attempts WHERE run_id = ? GROUP BY step_id",
        (run_id,),
    ):
        done, seen = units.get(str(step_id), (0, 0))
        steps[str(step_id)] = StepTally(
            done=done,
            seen=seen,
            tokens=int(tokens or 0),
            saved_tokens=int(step_saved or 0),
            judge_tokens=int(judge or 0),
        )
        reused += int(step_reused or 0)
        saved += int(step_saved or 0)
    gates = conn.execute(
        f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE run_id = ? AND phase = 'gate'"
        " ORDER BY attempt_pk",
        (run_id,),
    )
    return RunTally(
        steps=steps,
        gate_attempts=[from_row(AttemptRow, r) for r in gates],
        reused=reused,
        reused_saved_tokens=saved,
    )
