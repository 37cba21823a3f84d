"""Schema migrations m016 onwards: derived unit events, shared plans, lease fences, the score
phase, OpenTelemetry marks, agent calls and their bodies (registered in order by
``store/migrations.py``; a shipped migration is never edited: add the next one here)."""

from __future__ import annotations

import sqlite3

from .derived import EVENTS_INSERT_BODY, UNIT_EVENTS_VIEW
from .migration_steps import _script


def m016_derived_unit_events(conn: sqlite3.Connection) -> None:
    # The attempt row is the single source of truth (DESIGN §3): a unit's start and finish
    # events and the `units` projection were two more rows written per attempt and two more
    # rewritten per finish; now they are read from the attempt row. Existing unit events move
    # onto their attempts (same ids, same data), the rest stay in `event_log`, and the one
    # counter `journal_seq` continues after the highest event id ever given.
    _script(
        conn,
        """
        ALTER TABLE attempts ADD COLUMN started_seq INTEGER;
        ALTER TABLE attempts ADD COLUMN finished_seq INTEGER;
        ALTER TABLE attempts ADD COLUMN finish_data TEXT;
        CREATE TABLE journal_seq (n INTEGER NOT NULL);
        INSERT INTO journal_seq (n) SELECT MAX(x) FROM (
            SELECT 0 AS x
            UNION ALL SELECT COALESCE(MAX(event_id), 0) FROM events
            UNION ALL SELECT seq FROM sqlite_sequence WHERE name = 'events');
        CREATE INDEX m016_events_dispatch ON events(dispatch_id, kind, event_id);
        DROP TRIGGER attempts_terminal_immutable;
        UPDATE attempts SET started_seq = (SELECT MIN(e.event_id) FROM events e
            WHERE e.dispatch_id = attempts.dispatch_id AND e.kind = 'unit_started');
        UPDATE attempts SET
            finished_seq = (SELECT MAX(e.event_id) FROM events e
                WHERE e.dispatch_id = attempts.dispatch_id AND e.kind = 'unit_finished'),
            finish_data = (SELECT e.data_json FROM events e
                WHERE e.dispatch_id = attempts.dispatch_id AND e.kind = 'unit_finished'
                ORDER BY e.event_id DESC LIMIT 1)
            WHERE started_seq IS NOT NULL;
        CREATE TRIGGER attempts_terminal_immutable BEFORE UPDATE ON attempts
        WHEN OLD.status != 'running'
        BEGIN SELECT RAISE(ABORT, 'attempts are append-only: a terminal attempt is never updated'); END;
        CREATE TABLE event_log (
            event_id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            step_id TEXT,
            unit_id TEXT,
            dispatch_id TEXT,
            data_json TEXT
        );
        INSERT INTO event_log SELECT e.event_id, e.run_id, e.at, e.kind, e.step_id, e.unit_id,
            e.dispatch_id, e.data_json FROM events e
            WHERE NOT (e.kind IN ('unit_started', 'unit_finished') AND EXISTS (
                SELECT 1 FROM attempts a WHERE a.dispatch_id = e.dispatch_id
                AND a.started_seq IS NOT NULL))
            ORDER BY e.event_id;
        DROP TABLE events;
        CREATE INDEX event_log_run ON event_log(run_id, event_id);
        DROP TABLE units;
        """
        + UNIT_EVENTS_VIEW
        + """
        CREATE TRIGGER events_insert INSTEAD OF INSERT ON events
        BEGIN"""
        + EVENTS_INSERT_BODY
        + """
        END;
        """,
    )


def m017_shared_plans(conn: sqlite3.Connection) -> None:
    # A sweep's cells are runs of one plan (or a few: one per rendered `model:`): their rows
    # keep `plan_json = ''` and read the plan from here by hash (store/plans.py), so the plan
    # is stored once per sweep, not once per cell. gc drops a plan with its last such run.
    _script(
        conn,
        """
        CREATE TABLE plans (
            plan_hash TEXT PRIMARY KEY,
            plan_json TEXT NOT NULL,
            created_at REAL NOT NULL
        ) WITHOUT ROWID;
        """,
    )


def m018_lease_fence(conn: sqlite3.Connection) -> None:
    # PostgreSQL's lease fence as a function the server checks (store/pgschema.py): SQLite
    # drives by its lock file and has no leases, so there is nothing to do here; the id keeps
    # the two ledgers one.
    del conn


_ATTEMPTS_REBUILD = """
        DROP VIEW units;
        DROP TRIGGER events_insert;
        DROP VIEW events;
        CREATE TABLE attempts_{suffix} (
            attempt_pk INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            workflow TEXT NOT NULL,
            step_id TEXT NOT NULL,
            unit_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            dispatch_id TEXT NOT NULL UNIQUE,
            phase TEXT NOT NULL CHECK (phase IN ('work','gate','score')),
            loop INTEGER NOT NULL,
            item_index INTEGER,
            runner TEXT NOT NULL,
            model TEXT,
            status TEXT NOT NULL CHECK (status IN ('running','succeeded','failed','reused')),
            input_hash TEXT NOT NULL,
            charged INTEGER NOT NULL,
            tokens_in {tokens},
            tokens_out {tokens},
            cost REAL,
            saved_tokens INTEGER NOT NULL DEFAULT 0,
            reused_from TEXT,
            session_id TEXT,
            output_json TEXT,
            failure TEXT,
            transient INTEGER,
            started_at REAL NOT NULL,
            finished_at REAL,
            started_seq INTEGER,
            finished_seq INTEGER,
            finish_data TEXT,
            UNIQUE (run_id, unit_id, attempt)
        );
        INSERT INTO attempts_{suffix} (attempt_pk, run_id, workflow, step_id, unit_id, attempt,
            dispatch_id, phase, loop, item_index, runner, model, status, input_hash, charged,
            tokens_in, tokens_out, cost, saved_tokens, reused_from, session_id, output_json,
            failure, transient, started_at, finished_at, started_seq, finished_seq, finish_data)
            SELECT attempt_pk, run_id, workflow, step_id, unit_id, attempt, dispatch_id, phase,
            loop, item_index, runner, model, status, input_hash, charged, tokens_in, tokens_out,
            cost, saved_tokens, reused_from, session_id, output_json, failure, transient,
            started_at, finished_at, started_seq, finished_seq, finish_data
            FROM attempts ORDER BY attempt_pk;
        INSERT INTO sqlite_sequence (name, seq)
            SELECT 'attempts_{suffix}', seq FROM sqlite_sequence WHERE name = 'attempts'
            AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'attempts_{suffix}');
        UPDATE sqlite_sequence SET seq = MAX(seq,
            COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'attempts'), 0))
            WHERE name = 'attempts_{suffix}';
        DROP TABLE attempts;
        ALTER TABLE attempts_{suffix} RENAME TO attempts;
        CREATE INDEX attempts_reuse ON attempts(workflow, input_hash);
        CREATE TRIGGER attempts_terminal_immutable BEFORE UPDATE ON attempts
        WHEN OLD.status != 'running'
        BEGIN SELECT RAISE(ABORT, 'attempts are append-only: a terminal attempt is never updated'); END;
        CREATE TRIGGER attempts_no_delete_live BEFORE DELETE ON attempts
        WHEN EXISTS (SELECT 1 FROM runs WHERE run_id = OLD.run_id AND status IN ('active','blocked'))
        BEGIN SELECT RAISE(ABORT, 'attempts of a live run are never deleted'); END;
"""
"""The attempt table rebuilt as ``attempts_{suffix}`` with ``{tokens}`` token columns, its
rows and counter copied, renamed back; the views and trigger over it follow (m019, m022)."""


def _rebuild_attempts(conn: sqlite3.Connection, suffix: str, *, tokens: str) -> None:
    """Rebuild the attempt table with ``tokens`` as its token columns' type (the documented
    12-step way: SQLite cannot change a CHECK or a NOT NULL in place). The views and the
    trigger reading it are dropped first and made again after; the rows and the
    AUTOINCREMENT counter are kept; the index and triggers are made again."""
    script = _ATTEMPTS_REBUILD.replace("{suffix}", suffix).replace("{tokens}", tokens)
    _script(
        conn,
        script
        + UNIT_EVENTS_VIEW
        + """
        CREATE TRIGGER events_insert INSTEAD OF INSERT ON events
        BEGIN"""
        + EVENTS_INSERT_BODY
        + """
        END;
        """,
    )


def m019_score_phase(conn: sqlite3.Connection) -> None:
    # Scores (drive/scoring.py) are journaled units of their own phase, `score`. SQLite cannot
    # widen a CHECK in place, so the attempt table is rebuilt (the documented 12-step way).
    _rebuild_attempts(conn, "m019", tokens="INTEGER NOT NULL DEFAULT 0")


def m020_otel_sent(conn: sqlite3.Connection) -> None:
    # The OpenTelemetry export cursor (wf_magic/otel/): per run and endpoint, which spans
    # were sent in which form, so a live export resumes after a crash without resending.
    _script(
        conn,
        """
        CREATE TABLE otel_sent (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            endpoint TEXT NOT NULL,
            span_id TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            PRIMARY KEY (run_id, endpoint, span_id)
        ) WITHOUT ROWID;
        """,
    )


def m021_calls(conn: sqlite3.Connection) -> None:
    # One row per model call an agent attempt made through the bridge (wf_magic/bridge/),
    # journaled as each call finishes: a killed driver's calls so far stay on record.
    _script(
        conn,
        """
        CREATE TABLE calls (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            step_id TEXT NOT NULL,
            unit_id TEXT NOT NULL,
            dispatch_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            call INTEGER NOT NULL CHECK (call >= 1),
            model TEXT,
            status TEXT NOT NULL CHECK (status IN ('ok','error','refused')),
            tokens_in INTEGER NOT NULL CHECK (tokens_in >= 0),
            tokens_out INTEGER NOT NULL CHECK (tokens_out >= 0),
            cache_read INTEGER NOT NULL CHECK (cache_read >= 0),
            cache_write INTEGER NOT NULL CHECK (cache_write >= 0),
            cost REAL,
            price_source TEXT,
            latency_s REAL NOT NULL,
            started_at REAL NOT NULL,
            error TEXT,
            PRIMARY KEY (dispatch_id, call)
        );
        CREATE INDEX calls_by_run ON calls (run_id, started_at);
        """,
    )


def m022_null_usage(conn: sqlite3.Connection) -> None:
    # Usage a server did not report is unknown, never 0 and never estimated (issue 31): the
    # token counts become nullable. SQLite cannot drop a NOT NULL in place, so the attempt
    # table is rebuilt as m019 did. Every existing row keeps its counts.
    _rebuild_attempts(conn, "m022", tokens="INTEGER DEFAULT 0")


def m023_call_bodies(conn: sqlite3.Connection) -> None:
    # What each bridged model call sent and got back (wf_magic/bridge/tape.py): the request
    # and the answer as the CLI received it, redacted and capped per call, for
    # `wf export-cassette` and an agent step's replay. Headers are never kept.
    _script(
        conn,
        """
        CREATE TABLE call_bodies (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            dispatch_id TEXT NOT NULL,
            call INTEGER NOT NULL CHECK (call >= 1),
            method TEXT NOT NULL,
            path TEXT NOT NULL,
            tools TEXT,
            request TEXT,
            request_truncated INTEGER NOT NULL CHECK (request_truncated IN (0, 1)),
            status INTEGER,
            content_type TEXT,
            response TEXT,
            response_truncated INTEGER NOT NULL CHECK (response_truncated IN (0, 1)),
            PRIMARY KEY (dispatch_id, call)
        );
        CREATE INDEX call_bodies_by_run ON call_bodies (run_id);
        """,
    )


def m024_sweep_charges_kept(conn: sqlite3.Connection) -> None:
    # What a sweep paid through runs `wf gc` deleted: its charges go with their run (the
    # attempts they name are deleted), so gc keeps their totals per sweep and run, in the
    # delete's transaction. A sweep's ceiling and its `paid` still count them.
    _script(
        conn,
        """
        CREATE TABLE sweep_charges_kept (
            sweep_id TEXT NOT NULL REFERENCES sweeps(sweep_id) ON DELETE CASCADE,
            run_id TEXT NOT NULL,
            units INTEGER NOT NULL,
            tokens INTEGER NOT NULL,
            cost REAL NOT NULL,
            PRIMARY KEY (sweep_id, run_id)
        ) WITHOUT ROWID;
        """,
    )
