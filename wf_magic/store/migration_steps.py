"""Schema migrations m001–m015: the run journal, its inputs and receipts, the library cache,
loop contexts, agent facts, sweeps, owners, leases and sweep charges (registered in order by
``store/migrations.py``; a shipped migration is never edited)."""

from __future__ import annotations

import sqlite3


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


def m002_step_stops_run(conn: sqlite3.Connection) -> None:
    # A budget stop fails the run even on an `on_error: continue` step; the step row says so.
    conn.execute("ALTER TABLE steps ADD COLUMN stops_run INTEGER NOT NULL DEFAULT 0")


def m003_inputs(conn: sqlite3.Connection) -> None:
    # What each attempt was sent, kept once per input hash (content-addressed: every attempt,
    # loop and run with the same resolved input shares one redacted copy). Attempts journaled
    # before this migration have no row here and read as "input not recorded".
    conn.execute(
        "CREATE TABLE inputs (input_hash TEXT PRIMARY KEY, input_json TEXT NOT NULL,"
        " created_at REAL NOT NULL) WITHOUT ROWID"
    )


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
