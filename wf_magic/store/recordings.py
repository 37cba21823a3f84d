"""Read-only queries for recorded succeeded attempts: what the replay runner and cassettes use."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from .records import from_row

_COLUMNS = (
    "a.input_hash, a.step_id, a.unit_id, a.phase, a.runner, a.model, a.tokens_in, a.tokens_out"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordingRow:
    """A succeeded (or reused) attempt as a recording: its key, provenance and raw output."""

    input_hash: str
    step_id: str
    unit_id: str
    phase: str
    """``work`` or ``gate``."""
    runner: str
    model: str | None
    tokens_in: int
    tokens_out: int
    output_json: str | None
    """The recorded output as stored (None when the attempt kept none)."""


def latest_recording(
    conn: sqlite3.Connection, *, phase: str, input_hash: str, workflow: str
) -> RecordingRow | None:
    """The newest succeeded attempt of ``phase`` with ``input_hash``, ``workflow``'s first.

    Args:
        conn: An open connection to the state database.
        phase: ``work`` or ``gate``.
        input_hash: The unit's input hash (the lookup key).
        workflow: The workflow whose recordings win; any other workflow's answer on a miss.

    Returns:
        The recording, or None when no workflow recorded that input.
    """
    # The workflow's own recordings first: that query rides the attempts_reuse index; a
    # full scan for any workflow's is paid only on a miss.
    for where, args in (("a.workflow = ? AND ", (workflow,)), ("", ())):
        row = conn.execute(
            f"SELECT {_COLUMNS}, a.output_json FROM attempts a"
            f" WHERE {where}a.input_hash = ? AND a.status = 'succeeded' AND a.phase = ?"
            " ORDER BY a.attempt_pk DESC LIMIT 1",
            (*args, input_hash, phase),
        ).fetchone()
        if row is not None:
            return from_row(RecordingRow, row)
    return None


def run_recordings(conn: sqlite3.Connection, run_id: str) -> list[RecordingRow]:
    """The succeeded and reused attempts of ``run_id`` and the runs below it, in journal order.

    Args:
        conn: An open connection to the state database.
        run_id: The run (child runs of its tree are included).

    Returns:
        The recordings, oldest first; empty for an unknown run.
    """
    # A reused attempt may carry no output of its own: take its source's (the newest
    # succeeded attempt of the workflow with that input).
    rows = conn.execute(
        f"SELECT {_COLUMNS}, COALESCE(a.output_json, ("
        "   SELECT s.output_json FROM attempts s WHERE s.workflow = a.workflow"
        "   AND s.input_hash = a.input_hash AND s.phase = a.phase AND s.status = 'succeeded'"
        "   ORDER BY s.attempt_pk DESC LIMIT 1)) AS output_json"
        " FROM attempts a"
        " WHERE a.run_id IN (SELECT run_id FROM runs WHERE run_id = ? OR root_run_id = ?)"
        " AND a.status IN ('succeeded', 'reused')"
        " ORDER BY a.attempt_pk",
        (run_id, run_id),
    )
    return [from_row(RecordingRow, row) for row in rows]
