"""Read-only queries for recorded succeeded attempts: what the replay runner and cassettes use."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from .records import from_row

_COLUMNS = (
    "a.input_hash, a.step_id, a.unit_id, a.phase, a.runner, a.model, a.tokens_in, a.tokens_out,"
    " (SELECT CASE WHEN json_valid(i.input_json) THEN json_extract(i.input_json,"
    " '$.content_hash') END FROM inputs i WHERE i.input_hash = a.input_hash) AS content_hash"
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
    content_hash: str | None = None
    """The input's hash without the runner's settings (None: the runner had none that
    change an answer, so ``input_hash`` is that hash)."""


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
    return _latest_by_content(conn, phase=phase, content_hash=input_hash, workflow=workflow)


def _latest_by_content(
    conn: sqlite3.Connection, *, phase: str, content_hash: str, workflow: str
) -> RecordingRow | None:
    """The newest succeeded attempt whose input, without its runner's settings, hashes to
    ``content_hash`` (recorded by a runner with answer-changing options). A scan of
    ``inputs``, paid only when no recording has that very input hash."""
    row = conn.execute(
        f"SELECT {_COLUMNS}, a.output_json FROM inputs i JOIN attempts a"
        " ON a.input_hash = i.input_hash"
        " WHERE json_valid(i.input_json) AND json_extract(i.input_json, '$.content_hash') = ?"
        " AND a.status = 'succeeded' AND a.phase = ?"
        " ORDER BY a.workflow = ? DESC, a.attempt_pk DESC LIMIT 1",
        (content_hash, phase, workflow),
    ).fetchone()
    return from_row(RecordingRow, row) if row is not None else None


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
