"""Numbered, append-only schema migrations and the ledger check (DESIGN.md §7).

A shipped migration is never edited: add ``m00N_...`` at the end instead.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from ..errors import MigrationError
from .db import immediate
from .derived import EVENTS_INSERT_BODY, UNIT_EVENTS_VIEW

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[Migration] = []
migration = MIGRATIONS.append


@migration
def m001_initial(conn: sqlite3.Connection) -> None:
    _script(
        conn,
        """
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            workflow TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            plan_hash TEXT NOT NULL,
            plan_version INTEGER NOT NULL,
            source_hash TEXT NOT NULL,
            source_path TEXT,
            params_json TEXT NOT NULL,
            params_hash TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('active','blocked','completed','failed','abandoned')),
            status_reason TEXT,
            scope_key TEXT NOT NULL,
            parent_run_id TEXT REFERENCES runs(run_id) ON DELETE CASCADE,
            invocation_key TEXT,
            root_run_id TEXT NOT NULL,
            forked_from TEXT,
            fork_step TEXT,
            use_cache INTEGER NOT NULL DEFAULT 1,
            stop_requested INTEGER NOT NULL DEFAULT 0,
            result_json TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            finished_at REAL,
            UNIQUE (parent_run_id, invocation_key)
        );
        CREATE INDEX runs_scope ON runs(scope_key, created_at);
        CREATE INDEX runs_root ON runs(root_run_id);

        CREATE TABLE steps (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            step_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            kind TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending','completed','failed','skipped','blocked')),
            loop INTEGER NOT NULL DEFAULT 1,
            max_loops INTEGER NOT NULL DEFAULT 1,
            note TEXT,
            output_json TEXT,
            updated_at REAL NOT NULL,
            PRIMARY KEY (run_id, step_id)
        );

        CREATE TABLE units (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            unit_id TEXT NOT NULL,
            step_id TEXT NOT NULL,
            phase TEXT NOT NULL CHECK (phase IN ('work','gate')),
            item_index INTEGER,
            loop INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('running','succeeded','failed','reused')),
            input_hash TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (run_id, unit_id)
        );

        CREATE TABLE attempts (
            attempt_pk INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            workflow TEXT NOT NULL,
            step_id TEXT NOT NULL,
            unit_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            dispatch_id TEXT NOT NULL UNIQUE,
            phase TEXT NOT NULL CHECK (phase IN ('work','gate')),
            loop INTEGER NOT NULL,
            item_index INTEGER,
            runner TEXT NOT NULL,
            model TEXT,
            status TEXT NOT NULL CHECK (status IN ('running','succeeded','failed','reused')),
            input_hash TEXT NOT NULL,
            charged INTEGER NOT NULL,
            tokens_in INTEGER NOT NULL DEFAULT 0,
            tokens_out INTEGER NOT NULL DEFAULT 0,
            cost REAL,
            saved_tokens INTEGER NOT NULL DEFAULT 0,
            reused_from TEXT,
            session_id TEXT,
            output_json TEXT,
            failure TEXT,
            transient INTEGER,
            started_at REAL NOT NULL,
            finished_at REAL,
            UNIQUE (run_id, unit_id, attempt)
        );
        CREATE INDEX attempts_run ON attempts(run_id, unit_id, attempt);
        CREATE INDEX attempts_reuse ON attempts(workflow, input_hash, status);

        -- The journal is append-only: a terminal attempt is never updated, none is deleted
        -- while its run is live (gc removes finished runs whole).
        CREATE TRIGGER attempts_terminal_immutable BEFORE UPDATE ON attempts
        WHEN OLD.status != 'running'
        BEGIN SELECT RAISE(ABORT, 'attempts are append-only: a terminal attempt is never updated'); END;
        CREATE TRIGGER attempts_no_delete_live BEFORE DELETE ON attempts
        WHEN EXISTS (SELECT 1 FROM runs WHERE run_id = OLD.run_id AND status IN ('active','blocked'))
        BEGIN SELECT RAISE(ABORT, 'attempts of a live run are never deleted'); END;

        CREATE TABLE events (
            event_id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            step_id TEXT,
            unit_id TEXT,
            dispatch_id TEXT,
            data_json TEXT
        );
        CREATE INDEX events_run ON events(run_id, event_id);
        """,
    )


@migration
def m002_step_stops_run(conn: sqlite3.Connection) -> None:
    # A budget stop fails the run even on an `on_error: continue` step; the step row says so.
    conn.execute("ALTER TABLE steps ADD COLUMN stops_run INTEGER NOT NULL DEFAULT 0")


@migration
def m003_inputs(conn: sqlite3.Connection) -> None:
    # What each attempt was sent, kept once per input hash (content-addressed: every attempt,
    # loop and run with the same resolved input shares one redacted copy). Attempts journaled
    # before this migration have no row here and read as "input not recorded".
    conn.execute(
        "CREATE TABLE inputs (input_hash TEXT PRIMARY KEY, input_json TEXT NOT NULL,"
        " created_at REAL NOT NULL) WITHOUT ROWID"
    )


@migration
def m004_lean_journal_writes(conn: sqlite3.Connection) -> None:
    # Every reserve and finish pays for each b-tree it touches. `attempts_run` duplicated the
    # index that UNIQUE (run_id, unit_id, attempt) already builds, and the `units` projection
    # kept a rowid table plus a separate primary-key index; keyed WITHOUT ROWID it is one
    # b-tree. Same columns, same constraints, same rows.
    _script(
        conn,
        """
        DROP INDEX IF EXISTS attempts_run;
        CREATE TABLE units_lean (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            unit_id TEXT NOT NULL,
            step_id TEXT NOT NULL,
            phase TEXT NOT NULL CHECK (phase IN ('work','gate')),
            item_index INTEGER,
            loop INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('running','succeeded','failed','reused')),
            input_hash TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (run_id, unit_id)
        ) WITHOUT ROWID;
        INSERT INTO units_lean SELECT run_id, unit_id, step_id, phase, item_index, loop, status,
            input_hash, attempts, updated_at FROM units;
        DROP TABLE units;
        ALTER TABLE units_lean RENAME TO units;
        """,
    )


@migration
def m005_launch_keys(conn: sqlite3.Connection) -> None:
    # Idempotent launches: a caller's key names one run and the request (plan hash + params
    # hash) that launched it. The primary key is the compare-and-set: of two starts with one
    # key, exactly one inserts, in the run insert's own transaction. A gc'd run frees its key.
    conn.execute(
        "CREATE TABLE launch_keys (key TEXT PRIMARY KEY,"
        " run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,"
        " plan_hash TEXT NOT NULL, params_hash TEXT NOT NULL, created_at REAL NOT NULL)"
    )
    conn.execute("CREATE INDEX launch_keys_run ON launch_keys(run_id)")


@migration
def m006_run_receipts(conn: sqlite3.Connection) -> None:
    # gc deletes whole finished runs; a receipt per deleted run keeps what history needs (the
    # run row's own columns bar the plan, and its journal totals), written in the delete's
    # transaction, so `runs(include_deleted=True)` and token history outlive retention.
    _script(
        conn,
        """
        CREATE TABLE run_receipts (
            run_id TEXT PRIMARY KEY,
            workflow TEXT NOT NULL,
            status TEXT NOT NULL,
            status_reason TEXT,
            parent_run_id TEXT,
            root_run_id TEXT NOT NULL,
            forked_from TEXT,
            fork_step TEXT,
            scope_key TEXT NOT NULL,
            params_json TEXT NOT NULL,
            plan_hash TEXT NOT NULL,
            plan_version INTEGER NOT NULL,
            source_path TEXT,
            use_cache INTEGER NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            finished_at REAL,
            units INTEGER NOT NULL,
            dispatched INTEGER NOT NULL,
            tokens_in INTEGER NOT NULL,
            tokens_out INTEGER NOT NULL,
            cost REAL,
            saved_tokens INTEGER NOT NULL,
            deleted_at REAL NOT NULL
        );
        CREATE INDEX run_receipts_root ON run_receipts(root_run_id);
        """,
    )


def _script(conn: sqlite3.Connection, script: str) -> None:
    """Run a multi-statement script inside the caller's transaction.

    ``executescript`` would COMMIT first and break the one-transaction guarantee.
    """
    pending = ""
    for line in script.splitlines(keepends=True):
        if line.strip().startswith("--"):
            continue
        pending += line
        if sqlite3.complete_statement(pending):
            conn.execute(pending)
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement in migration: {pending.strip()[:80]}")


def migration_ids() -> list[str]:
    """The ids of this version's registry, in order."""
    return [m.__name__ for m in MIGRATIONS]


def ledger_is_current(conn: sqlite3.Connection) -> bool:
    """Whether the ledger holds this version's registry (or it plus newer ids); reads only."""
    has_ledger = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if has_ledger is None:
        return False
    known = migration_ids()
    ledger = [r[0] for r in conn.execute("SELECT id FROM schema_migrations ORDER BY position")]
    return ledger[: len(known)] == known


def apply_migrations(conn: sqlite3.Connection) -> list[str]:
    """Bring the database up to this version's registry in one BEGIN IMMEDIATE transaction.

    Returns:
        The ids applied now (empty when the ledger was current or newer).

    Raises:
        MigrationError: the ledger is neither a prefix of the registry nor the registry plus
            newer unknown ids.
    """
    known = migration_ids()
    with immediate(conn):
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " id TEXT PRIMARY KEY, position INTEGER NOT NULL, applied_at REAL NOT NULL)"
        )
        ledger = [r[0] for r in conn.execute("SELECT id FROM schema_migrations ORDER BY position")]
        if ledger[: len(known)] == known:
            return []  # current, or newer: a later version wrote extra migrations; leave them be
        if ledger != known[: len(ledger)]:
            raise MigrationError(
                "The state database's migration ledger diverges from this wf_magic version "
                f"(database has {ledger}, this version knows {known}). It was written by an "
                "incompatible build: point WF_MAGIC_HOME (or --db) at a fresh directory, or "
                "install the wf_magic version that created it."
            )
        applied = []
        for position, step in enumerate(MIGRATIONS):
            if position < len(ledger):
                continue
            step(conn)
            conn.execute(
                "INSERT INTO schema_migrations (id, position, applied_at) VALUES (?, ?, ?)",
                (step.__name__, position, time.time()),
            )
            applied.append(step.__name__)
        return applied


@migration
def m007_library_cache(conn: sqlite3.Connection) -> None:
    # The workflow library's last good copy of each remote document, by URL: an index is
    # refreshed after its TTL (a failed refresh falls back to it), a workflow source is
    # content-addressed by the sha256 its index promises.
    _script(
        conn,
        """
        CREATE TABLE library_cache (
            url TEXT PRIMARY KEY,
            kind TEXT NOT NULL CHECK (kind IN ('index','workflow')),
            body TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            fetched_at REAL NOT NULL
        );
        """,
    )


@migration
def m008_reuse_index_without_status(conn: sqlite3.Connection) -> None:
    # A finish flips an attempt's status; with the status in the reuse index every finish
    # moved its entry too (a delete and an insert on a random page). The lookup still
    # narrows to the few attempts of one (workflow, input_hash) and filters the status there.
    _script(
        conn,
        """
        DROP INDEX attempts_reuse;
        CREATE INDEX attempts_reuse ON attempts(workflow, input_hash);
        """,
    )


@migration
def m009_loop_contexts(conn: sqlite3.Connection) -> None:
    # The context hash a map step's loop first dispatched under (and a mark once it also
    # dispatched under another): a resume trusts the loop's succeeded attempts without
    # rendering their units while the first is the only one (drive/resume.py). Deleted
    # with its run.
    _script(
        conn,
        """
        CREATE TABLE loop_contexts (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            step_id TEXT NOT NULL,
            loop INTEGER NOT NULL,
            which TEXT NOT NULL CHECK (which IN ('first','mixed')),
            context_hash TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (run_id, step_id, loop, which)
        ) WITHOUT ROWID;
        """,
    )


@migration
def m010_agent_facts(conn: sqlite3.Connection) -> None:
    # What an agent attempt's harness reported beyond the attempt row: harness and version,
    # exit code, error class, turns, permission denials, workdir/worktree, changed files and
    # the CLI's final JSON (capped, redacted), as one JSON object per attempt. Written with
    # the attempt's finish; deleted with its run.
    _script(
        conn,
        """
        CREATE TABLE agent_facts (
            dispatch_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            harness TEXT NOT NULL,
            facts_json TEXT NOT NULL
        );
        CREATE INDEX agent_facts_run ON agent_facts(run_id);
        """,
    )


@migration
def m012_sweeps(conn: sqlite3.Connection) -> None:
    # A sweep is one workflow over a grid × rows × repeat of cells; each cell is a run. The
    # plan is stored once here (not once per cell), with the definition it was expanded
    # from and its hash (the sweep's identity). A cell's run is recorded once it is known,
    # so a resume after kill -9 finds it again; its status is read from the run itself.
    _script(
        conn,
        """
        CREATE TABLE sweeps (
            sweep_id TEXT PRIMARY KEY,
            workflow TEXT NOT NULL,
            source TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            plan_hash TEXT NOT NULL,
            definition_json TEXT NOT NULL,
            definition_hash TEXT NOT NULL UNIQUE,
            budget_json TEXT NOT NULL,
            sweep_key TEXT UNIQUE,
            status TEXT NOT NULL CHECK (status IN ('running','completed','stopped','failed')),
            status_reason TEXT,
            cells INTEGER NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE TABLE sweep_cells (
            sweep_id TEXT NOT NULL REFERENCES sweeps(sweep_id) ON DELETE CASCADE,
            cell_index INTEGER NOT NULL,
            point_json TEXT NOT NULL,
            row_index INTEGER,
            repeat INTEGER NOT NULL,
            params_json TEXT NOT NULL,
            run_id TEXT,
            note TEXT,
            PRIMARY KEY (sweep_id, cell_index)
        ) WITHOUT ROWID;
        CREATE INDEX sweep_cells_run ON sweep_cells(run_id);
        """,
    )


@migration
def m013_run_owner(conn: sqlite3.Connection) -> None:
    # Who a run belongs to (JUPYTERHUB_USER, else the OS user; wf_magic/users.py): another
    # user's run is read-only until adopted. Rows from before stay NULL: nobody's, so anyone
    # may change them. A receipt keeps its run's owner.
    _script(
        conn,
        """
        ALTER TABLE runs ADD COLUMN owner TEXT;
        ALTER TABLE run_receipts ADD COLUMN owner TEXT;
        """,
    )


@migration
def m014_run_leases(conn: sqlite3.Connection) -> None:
    # The lease of a run's driver (store/leases.py): who holds it, the epoch every write of
    # the run is fenced by, and when it runs out. PostgreSQL drives by it; on SQLite the lock
    # file excludes drivers (one host), and the columns stay empty.
    _script(
        conn,
        """
        ALTER TABLE runs ADD COLUMN lease_holder TEXT;
        ALTER TABLE runs ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE runs ADD COLUMN lease_expires REAL;
        """,
    )


@migration
def m015_sweep_charges(conn: sqlite3.Connection) -> None:
    # Which sweep paid each charged attempt, written with the attempt's reservation: a sweep's
    # paid units, tokens and cost are those of its own attempts, so two sweeps over the same
    # runs (overlapping definitions) do not both count one dispatch. Existing sweeps are
    # backfilled by the rule this replaces (the charged attempts of their cells' runs since
    # they were created), each attempt given to the earliest sweep that counted it.
    _script(
        conn,
        """
        CREATE TABLE sweep_charges (
            dispatch_id TEXT PRIMARY KEY,
            sweep_id TEXT NOT NULL REFERENCES sweeps(sweep_id) ON DELETE CASCADE,
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE
        ) WITHOUT ROWID;
        CREATE INDEX sweep_charges_sweep ON sweep_charges(sweep_id);
        CREATE INDEX sweep_charges_run ON sweep_charges(run_id);
        INSERT OR IGNORE INTO sweep_charges (dispatch_id, sweep_id, run_id)
            SELECT a.dispatch_id, s.sweep_id, a.run_id
            FROM sweeps s
            JOIN sweep_cells c ON c.sweep_id = s.sweep_id AND c.run_id IS NOT NULL
            JOIN runs r ON r.root_run_id = c.run_id
            JOIN attempts a ON a.run_id = r.run_id
            WHERE a.charged = 1 AND a.started_at >= s.created_at
            ORDER BY s.created_at, s.sweep_id;
        """,
    )


@migration
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


@migration
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


@migration
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


@migration
def m019_score_phase(conn: sqlite3.Connection) -> None:
    # Scores (drive/scoring.py) are journaled units of their own phase, `score`. SQLite cannot
    # widen a CHECK in place, so the attempt table is rebuilt (the documented 12-step way).
    _rebuild_attempts(conn, "m019", tokens="INTEGER NOT NULL DEFAULT 0")


@migration
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


@migration
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


@migration
def m022_null_usage(conn: sqlite3.Connection) -> None:
    # Usage a server did not report is unknown, never 0 and never estimated (issue 31): the
    # token counts become nullable. SQLite cannot drop a NOT NULL in place, so the attempt
    # table is rebuilt as m019 did. Every existing row keeps its counts.
    _rebuild_attempts(conn, "m022", tokens="INTEGER DEFAULT 0")


@migration
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
