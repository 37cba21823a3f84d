"""The unit events and the ``units`` projection as views over the attempt rows (m016), the same
SQL on SQLite (store/migrations.py) and PostgreSQL (store/pgschema.py).

A reserved attempt is its unit's ``unit_started`` event at ``started_seq``; a finished one is
also its ``unit_finished`` event at ``finished_seq``, with the data its finish wrote
(``finish_data``); every other event is a row of ``event_log``. Both kinds of ids come from
``journal_seq`` (store/journal.py ``NEXT_SEQ``), so they are one cursor.
"""

from __future__ import annotations

UNIT_EVENTS_VIEW = """
CREATE VIEW events (event_id, run_id, at, kind, step_id, unit_id, dispatch_id, data_json) AS
    SELECT event_id, run_id, at, kind, step_id, unit_id, dispatch_id, data_json FROM event_log
    UNION ALL
    SELECT started_seq, run_id, started_at, 'unit_started', step_id, unit_id, dispatch_id,
        '{"attempt": ' || attempt || ', "loop": ' || loop || ', "phase": "' || phase || '"}'
    FROM attempts WHERE started_seq IS NOT NULL
    UNION ALL
    SELECT finished_seq, run_id, finished_at, 'unit_finished', step_id, unit_id, dispatch_id,
        finish_data
    FROM attempts WHERE finished_seq IS NOT NULL;
CREATE INDEX attempts_started_seq ON attempts(run_id, started_seq)
    WHERE started_seq IS NOT NULL;
CREATE INDEX attempts_finished_seq ON attempts(run_id, finished_seq)
    WHERE finished_seq IS NOT NULL;
CREATE VIEW units (run_id, unit_id, step_id, phase, item_index, loop, status, input_hash,
        attempts, updated_at) AS
    SELECT a.run_id, a.unit_id, a.step_id, a.phase, a.item_index, a.loop, a.status,
        a.input_hash, a.attempt, COALESCE(a.finished_at, a.started_at)
    FROM attempts a
    WHERE NOT EXISTS (SELECT 1 FROM attempts b WHERE b.run_id = a.run_id
        AND b.unit_id = a.unit_id AND b.attempt > a.attempt);
"""
"""The unit events and the ``units`` projection, derived from the attempt rows (m016), and the
two indexes that let a cursor read a run's new events without scanning its attempts (an
``INSERT INTO events`` still appends, with the next id, to ``event_log``): an
attempt that was reserved is its ``unit_started`` event at ``started_seq`` and, once finished,
its ``unit_finished`` event at ``finished_seq`` with the data its finish wrote
(``finish_data``); every other event is a row of ``event_log``. Event ids of both kinds come
from ``journal_seq``, one counter, so they are one cursor (``wf events --after``)."""

EVENTS_INSERT_BODY = """
            INSERT INTO event_log (event_id, run_id, at, kind, step_id, unit_id, dispatch_id,
                data_json)
            VALUES ((SELECT n + 1 FROM journal_seq), NEW.run_id, NEW.at, NEW.kind, NEW.step_id,
                NEW.unit_id, NEW.dispatch_id, NEW.data_json);
            UPDATE journal_seq SET n = n + 1;"""
"""What an ``INSERT INTO events`` does instead (the body of the INSTEAD OF trigger on the
view, both backends): append the row to ``event_log`` with the next id of ``journal_seq``."""

BUDGET_TOKENS = (
    "COALESCE(a.tokens_in + a.tokens_out,"
    " CAST(json_extract(a.finish_data, '$.charged_tokens') AS BIGINT), 0)"
)
"""What attempt ``a`` charged its run budget: its tokens, or, when a count is unknown (NULL),
what the budget charged for it (``Finish.charged_tokens``); read only for such rows."""
