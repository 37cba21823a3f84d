"""Storage: migration ledger states, append-only journal triggers, pragmas, journal modes."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import pytest

from wf_magic import Engine, MigrationError
from wf_magic.store import db as dbmod
from wf_magic.store.db import connect
from wf_magic.store.migrations import apply_migrations, migration_ids

from .conftest import db_rows, tamper, wf_inproc, write_file

TWO_STEPS = "name: two\nsteps:\n  - id: a\n    prompt: hi\n  - id: b\n    prompt: there\n"


def _ledger(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM schema_migrations ORDER BY position")]
    finally:
        conn.close()


def test_fresh_database_applies_every_migration_once(tmp_path: Path) -> None:
    conn = connect(tmp_path / "state.db")
    assert apply_migrations(conn) == migration_ids()
    assert apply_migrations(conn) == []
    conn.close()
    assert _ledger(tmp_path / "state.db") == migration_ids()


def test_ledger_with_unknown_newer_id_opens(tmp_path: Path) -> None:
    conn = connect(tmp_path / "state.db")
    apply_migrations(conn)
    conn.execute("INSERT INTO schema_migrations VALUES ('m999_from_the_future', 999, 0)")
    assert apply_migrations(conn) == []
    conn.close()
    engine = Engine(tmp_path)
    assert engine.run("name: n\nsteps:\n  - id: a\n    prompt: x\n").status == "completed"
    engine.close()


def test_divergent_ledger_is_refused_with_guidance(tmp_path: Path) -> None:
    conn = connect(tmp_path / "state.db")
    apply_migrations(conn)
    conn.execute("UPDATE schema_migrations SET id = 'm001_someone_elses' WHERE position = 0")
    with pytest.raises(MigrationError, match="diverges .* point WF_MAGIC_HOME"):
        apply_migrations(conn)
    conn.close()


def test_migrations_apply_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wf_magic.store import migrations

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, broken])
    conn = connect(tmp_path / "state.db")
    with pytest.raises(RuntimeError):
        apply_migrations(conn)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "runs" not in tables and "half_done" not in tables
    conn.close()


def test_terminal_attempts_are_never_updated_or_deleted(engine: Engine) -> None:
    run = engine.run(
        "name: n\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n", max_steps=1
    )
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        tamper(engine, "UPDATE attempts SET tokens_in = 0")
    with pytest.raises(sqlite3.IntegrityError, match="never deleted"):
        tamper(engine, "DELETE FROM attempts")
    assert len(engine.attempts(run.run_id)) == 1


def test_duplicate_finish_adds_no_tokens_and_no_event(engine: Engine) -> None:
    from wf_magic.store import journal as jsql

    _started = engine.start("name: n\nsteps:\n  - id: a\n    prompt: x\n")
    run_id = _started.run_id
    key = jsql.UnitKey(
        run_id=run_id,
        workflow="n",
        step_id="a",
        unit_id="a",
        phase="work",
        loop=1,
        item_index=None,
        runner="scripted",
        model=None,
        input_hash="h",
    )
    attempt = engine.store.reserve_attempt(key, charged=True)
    finish = jsql.Finish(status="succeeded", output_json='"x"', tokens_in=3, tokens_out=4)
    assert engine.store.finish_attempt(attempt, finish) is True
    events = db_rows(engine.state_dir, "SELECT COUNT(*) FROM events")
    assert engine.store.finish_attempt(attempt, finish) is False
    assert db_rows(engine.state_dir, "SELECT COUNT(*) FROM events") == events
    assert engine.store.budget_usage(run_id) == (1, 7, 0.0)


def test_pragmas_wal_busy_timeout_foreign_keys(tmp_path: Path) -> None:
    conn = connect(tmp_path / "state.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == dbmod.BUSY_TIMEOUT_MS
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    conn.close()
    full = connect(tmp_path / "state.db", durability="full")
    assert full.execute("PRAGMA synchronous").fetchone()[0] == 2
    full.close()
    ro = connect(tmp_path / "state.db", read_only=True)
    assert ro.execute("PRAGMA busy_timeout").fetchone()[0] == dbmod.BUSY_TIMEOUT_MS
    ro.close()


def test_network_filesystem_falls_back_to_delete_journal_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dbmod, "filesystem_type", lambda path: "nfs4")
    monkeypatch.setattr(dbmod, "_warned_paths", set())
    with pytest.warns(dbmod.StateDirWarning, match="network filesystem"):
        conn = connect(tmp_path / "state.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        connect(tmp_path / "state.db").close()  # warned once per state dir


def test_journal_mode_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WF_MAGIC_SQLITE_JOURNAL_MODE", "truncate")
    conn = connect(tmp_path / "state.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "truncate"
    conn.close()


def test_state_dir_default_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WF_MAGIC_HOME", str(tmp_path / "elsewhere"))
    assert Engine().state_dir == tmp_path / "elsewhere"
    monkeypatch.delenv("WF_MAGIC_HOME")
    monkeypatch.chdir(tmp_path)
    assert Engine().state_dir == tmp_path / ".wf_magic"


def test_gc_deletes_only_finished_runs(engine: Engine) -> None:
    done = engine.run("name: g\nsteps:\n  - id: a\n    prompt: x\n")
    live = engine.run(
        "name: h\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n", max_steps=1
    )
    assert engine.gc(older_than_s=0) == [done.run_id]
    assert [r.run_id for r in engine.list_runs()] == [live.run_id]


def test_a_newer_ledger_opens_and_a_divergent_one_exits_1_from_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    wf = write_file(tmp_path, "two.yaml", TWO_STEPS)
    wf_inproc(capsys, state_dir, "run", str(wf))
    conn = sqlite3.connect(state_dir / "state.db")
    conn.execute("INSERT INTO schema_migrations VALUES ('m999_future', 999, 0)")
    conn.commit()
    assert wf_inproc(capsys, state_dir, "list").returncode == 0
    first = conn.execute("SELECT id FROM schema_migrations ORDER BY position LIMIT 1").fetchone()[0]
    conn.execute("UPDATE schema_migrations SET id = 'x_other' WHERE id = ?", (first,))
    conn.commit()
    conn.close()
    res = wf_inproc(capsys, state_dir, "list")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "WF_MAGIC_HOME" in res.stderr or "--db" in res.stderr


def test_storage_status_vocabularies_are_enforced(engine: Engine) -> None:
    engine.run(TWO_STEPS)
    schema = " ".join(
        str(r[0])
        for r in db_rows(engine.state_dir, "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")
    )
    for vocab in (
        "'active','blocked','completed','failed','abandoned'",
        "'pending','completed','failed','skipped','blocked'",
        "'running','succeeded','failed','reused'",
    ):
        assert vocab in schema
    for column in (
        "plan_json",
        "plan_hash",
        "plan_version",
        "source_hash",
        "params_json",
        "scope_key",
        "parent_run_id",
        "invocation_key",
    ):
        assert column in schema
