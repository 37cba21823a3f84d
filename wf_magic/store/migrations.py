"""The schema migrations' registry, in order, and the ledger check (DESIGN.md §7); the steps
themselves are in ``migration_steps.py`` (m001–m015) and ``migration_steps_late.py`` (m016 on).

A shipped migration is never edited: add ``m0NN_...`` at the end of the registry instead.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from ..errors import MigrationError
from . import migration_steps, migration_steps_late
from .db import immediate

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[Migration] = [
    migration_steps.m001_initial,
    migration_steps.m002_step_stops_run,
    migration_steps.m003_inputs,
    migration_steps.m004_lean_journal_writes,
    migration_steps.m005_launch_keys,
    migration_steps.m006_run_receipts,
    migration_steps.m007_library_cache,
    migration_steps.m008_reuse_index_without_status,
    migration_steps.m009_loop_contexts,
    migration_steps.m010_agent_facts,
    migration_steps.m012_sweeps,
    migration_steps.m013_run_owner,
    migration_steps.m014_run_leases,
    migration_steps.m015_sweep_charges,
    migration_steps_late.m016_derived_unit_events,
    migration_steps_late.m017_shared_plans,
    migration_steps_late.m018_lease_fence,
    migration_steps_late.m019_score_phase,
    migration_steps_late.m020_otel_sent,
    migration_steps_late.m021_calls,
    migration_steps_late.m022_null_usage,
    migration_steps_late.m023_call_bodies,
    migration_steps_late.m024_sweep_charges_kept,
]


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
