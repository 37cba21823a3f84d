"""The PostgreSQL backend's parts that need no server, and the switch that selects it.

A ``postgresql://`` state is never taken as a folder name; a bad URL, schema or unreachable
server is one line naming what to do, and the password never appears; the translation of the
Store's SQL leaves string literals alone; both backends keep the same migration ledger. The
tests that need a server skip without ``WF_MAGIC_TEST_PG``.
"""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from wf_magic import Engine
from wf_magic.errors import StateDBError, UsageError
from wf_magic.store import migrations, pgschema
from wf_magic.store.location import PgLocation, parse_state
from wf_magic.store.pgconn import translate

from .backends import PgState, pg_server
from .conftest import ROOT, run_wf, write_file

needs_server = pytest.mark.skipif(
    pg_server() is None, reason="needs a PostgreSQL server: set WF_MAGIC_TEST_PG (see .ci/run)"
)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_both_backends_keep_the_same_migration_ledger() -> None:
    assert pgschema.migration_ids() == migrations.migration_ids()


def test_a_folder_stays_a_folder_and_a_url_becomes_a_schema(tmp_path: Path) -> None:
    assert parse_state(str(tmp_path)) == tmp_path
    loc = parse_state("postgresql://ann:pw@db.example:5433/wf?schema=team_a&sslmode=disable")
    assert isinstance(loc, PgLocation)
    assert loc.schema == "team_a"
    assert loc.url == "postgresql://ann:pw@db.example:5433/wf?sslmode=disable"
    assert loc.where == "postgresql://ann:***@db.example:5433/wf?schema=team_a"
    default = parse_state("postgres://db.example/wf")
    assert isinstance(default, PgLocation) and default.schema == "public"


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        ("mysql://db/wf", "neither a folder nor a postgresql:// URL"),
        ("postgresql://db/wf?schema=Bad-Name", "schema 'Bad-Name' is not a plain lowercase name"),
        ("postgresql://db/wf?schema=", "schema '' is not a plain lowercase name"),
    ],
)
def test_a_bad_state_url_is_one_line_and_writes_no_folder(
    tmp_path: Path, state: str, needle: str
) -> None:
    with pytest.raises(UsageError, match=needle):
        parse_state(state)
    done = subprocess.run(
        [sys.executable, "-m", "wf_magic.cli", "--db", state, "list"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing like ./postgresql:/… was written


def _unreachable_message(password: str) -> str:
    """What listing the runs of a closed server's URL with ``password`` says."""
    url = f"postgresql://ann:{password}@127.0.0.1:{_closed_port()}/wf?schema=s1"
    engine = Engine(url)
    try:
        with pytest.raises(StateDBError) as caught:
            engine.list_runs()
    finally:
        engine.close()
    return str(caught.value)


@functools.cache
def _message_text() -> str:
    """The message's own words, with a password that cannot be among them (``;`` is not
    generated): a generated password that is one of those words ("Connec") is no leak."""
    return _unreachable_message(";;;;;;")


@settings(max_examples=40, deadline=None)
@given(password=st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=6))
def test_an_unreachable_server_is_one_line_that_never_shows_the_password(password: str) -> None:
    assume(password not in _message_text())
    message = _unreachable_message(password)
    assert password not in message
    assert "postgresql://ann:***@127.0.0.1" in message
    assert "Check that the PostgreSQL server is up and reachable" in message
    assert "\n" not in message


def test_the_cli_says_an_unreachable_server_in_one_line(tmp_path: Path) -> None:
    url = f"postgresql://ann:s3cret-pw@127.0.0.1:{_closed_port()}/wf"
    path = write_file(tmp_path, "wf.yaml", "name: x\nsteps:\n  - id: a\n    prompt: hi\n")
    done = run_wf(url, "run", str(path))  # type: ignore[arg-type]
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "s3cret-pw" not in done.stderr, done.stderr
    assert "PostgreSQL server is up and reachable" in lines[0]


_LITERAL = st.text(st.sampled_from("ab ?:%$'.x"), max_size=12).map(
    lambda s: "'" + s.replace("'", "''") + "'"
)


@settings(max_examples=200)
@given(literal=_LITERAL)
def test_translation_leaves_string_literals_alone(literal: str) -> None:
    sql = f"SELECT {literal}, x FROM t WHERE a = ? AND b = :name AND c LIKE 'p%'"
    assert translate(sql) == (
        f"SELECT {literal}, x FROM t WHERE a = %s AND b = %(name)s AND c LIKE 'p%'"
    )


def test_translation_of_the_sqlite_spellings() -> None:
    assert translate("BEGIN IMMEDIATE") == "BEGIN"
    assert translate("INSERT OR IGNORE INTO inputs (a, b) VALUES (?, ?)") == (
        "INSERT INTO inputs (a, b) VALUES (%s, %s) ON CONFLICT DO NOTHING"
    )
    assert translate("INSERT OR REPLACE INTO agent_facts (dispatch_id, run_id) VALUES (?, ?)") == (
        "INSERT INTO agent_facts (dispatch_id, run_id) VALUES (%s, %s)"
        " ON CONFLICT (dispatch_id) DO UPDATE SET run_id = EXCLUDED.run_id"
    )
    # A key the database assigns is asked for by the statement itself, as on SQLite.
    assert translate("INSERT INTO attempts (run_id) VALUES (?)") == (
        "INSERT INTO attempts (run_id) VALUES (%s)"
    )
    assert translate("INSERT INTO attempts (run_id) VALUES (?) RETURNING attempt") == (
        "INSERT INTO attempts (run_id) VALUES (%s) RETURNING attempt"
    )
    assert translate("SELECT json_group_array(i), total(c) FROM t") == (
        "SELECT coalesce(json_agg(i)::text, '[]'), coalesce(sum(c), 0.0) FROM t"
    )


@needs_server
def test_two_schemas_on_one_server_are_two_states(tmp_path: Path) -> None:
    server = pg_server()
    assert server is not None
    a, b = PgState(server, tmp_path / "a"), PgState(server, tmp_path / "b")
    with Engine(a) as team_a, Engine(b) as team_b:
        run = team_a.run("name: x\nsteps:\n  - id: a\n    prompt: hi\n")
        assert run.status == "completed"
        assert [r.run_id for r in team_a.list_runs()] == [run.run_id]
        assert team_b.list_runs() == []
    ledger = a.rows("SELECT id FROM schema_migrations ORDER BY position")
    assert [r[0] for r in ledger] == migrations.migration_ids()


@needs_server
def test_a_divergent_ledger_is_refused_on_postgresql_too(tmp_path: Path) -> None:
    server = pg_server()
    assert server is not None
    state = PgState(server, tmp_path / "s")
    with Engine(state) as engine:
        engine.list_runs()
    state.tamper("UPDATE schema_migrations SET id = 'm003_something_else' WHERE position = 2")
    from wf_magic.store import pgopen

    pgopen._migrated.clear()  # a new process would check the ledger again
    with Engine(state) as engine, pytest.raises(Exception, match="ledger diverges"):
        engine.run("name: x\nsteps:\n  - id: a\n    prompt: hi\n")


@needs_server
def test_a_first_opener_waits_for_the_writers_lock_before_it_touches_the_schema(
    tmp_path: Path,
) -> None:
    # Two `wf` processes opening one fresh schema at once: the one that loses the writers'
    # lock must not create the schema meanwhile (CREATE SCHEMA IF NOT EXISTS is not safe
    # against a concurrent one: it fails on pg_namespace's key, which CI saw as a `wf sweep`
    # exiting 1 with "UniqueViolation"). Here the winner is held mid-migration, its schema
    # created and not committed, until the loser has had time to run ahead.
    import threading
    import time

    import psycopg

    from wf_magic.store import pgopen

    server = pg_server()
    assert server is not None
    state = PgState(server, tmp_path / "s")
    location = parse_state(state.url)
    assert isinstance(location, PgLocation)
    errors: list[BaseException] = []
    with psycopg.connect(server, autocommit=True) as winner:
        winner.execute("BEGIN")
        winner.execute(f"SELECT pg_advisory_xact_lock({location.lock_key})")
        winner.execute(f'CREATE SCHEMA "{location.schema}"')

        def open_it() -> None:
            try:
                with Engine(state) as engine:
                    engine.list_runs()
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)

        pgopen._migrated.discard(location.where)
        loser = threading.Thread(target=open_it)
        loser.start()
        time.sleep(1.0)
        assert loser.is_alive()  # it waits for the lock, having written nothing
        winner.execute("COMMIT")
        loser.join(30)
    assert errors == []
    ledger = state.rows("SELECT id FROM schema_migrations ORDER BY position")
    assert [r[0] for r in ledger] == migrations.migration_ids()


def _tables_wf_magic_creates() -> list[str]:
    import inspect
    import re

    text = inspect.getsource(pgschema) + inspect.getsource(migrations)
    return sorted(set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", text)))


@needs_server
@settings(max_examples=8, deadline=None)
@given(
    table=st.sampled_from(_tables_wf_magic_creates()),
    column=st.sampled_from(["x int", "id text", "run_id bigint", "data jsonb"]),
)
def test_a_schema_holding_a_table_wf_magic_did_not_create_is_one_line_naming_it(
    table: str, column: str
) -> None:
    # Another tool's table of the same name in the schema: the migration cannot create its
    # own, and says so in one line naming the state, the table and what to do (it used to
    # reach the user as "DuplicateTable … not a fault of the state database").
    import tempfile

    import psycopg

    server = pg_server()
    assert server is not None
    state = PgState(server, Path(tempfile.mkdtemp()))
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{state.schema}"')
        conn.execute(f'CREATE TABLE "{state.schema}"."{table}" ({column})')
    with Engine(state) as engine, pytest.raises(UsageError) as caught:
        engine.list_runs()
    text = str(caught.value)
    assert "\n" not in text
    assert f'"{table}"' in text or f"table {table} " in text  # the table, by name
    assert f"schema {state.schema!r}" in text and "?schema=NAME" in text
    assert text.startswith("State postgresql://")
    # Nothing was half-made: the ledger's transaction rolled back whole.
    assert state.rows(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()"
    ) == [(1,)]


@needs_server
def test_the_cli_says_a_schema_holding_another_tools_table_in_one_line(tmp_path: Path) -> None:
    server = pg_server()
    assert server is not None
    state = PgState(server, tmp_path / "s")
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{state.schema}"')
        conn.execute(f'CREATE TABLE "{state.schema}".runs (x int)')
    done = run_wf(state, "list")  # type: ignore[arg-type]
    assert done.returncode == 2  # a usage error, as a SQLite file that is no state database
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: State {server}?schema={state.schema}: the schema ")
    assert 'relation "runs" already exists' in line and "?schema=NAME" in line
    assert "not a fault" not in line


def test_import_wf_magic_does_not_import_psycopg() -> None:
    code = "import sys, wf_magic; print('psycopg' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert done.stdout.strip() == "False"


@needs_server
def test_the_replay_runner_reads_recordings_from_a_postgresql_journal(tmp_path: Path) -> None:
    import pickle

    from wf_magic.runners.base import RunnerContext, UnitRequest
    from wf_magic.runners.replay import ReplayRunner

    server = pg_server()
    assert server is not None
    state = PgState(server, tmp_path / "s")
    with Engine(state) as engine:
        run = engine.run("name: digest\nsteps:\n  - id: outline\n    prompt: Outline tides.\n")
        (attempt,) = engine.attempts(run.run_id)
        journal = engine.store.journal_url
    assert journal is not None and journal.endswith(f"?schema={state.schema}")
    ctx = RunnerContext(
        name="replay", options={}, state_dir=str(tmp_path), workflow="digest", journal=journal
    )
    request = UnitRequest(
        run_id="r-new",
        step_id="outline",
        unit_id="outline",
        dispatch_id="d-new",
        input_hash=attempt.input_hash,
        attempt=1,
        kind="prompt",
        prompt="Outline tides.",
        model=None,
    )
    runner = ReplayRunner.from_context(ctx)
    copy = pickle.loads(pickle.dumps(runner))  # as a Dask worker gets it
    try:
        for each in (runner, copy):
            result = each.run(request)
            assert result.output == json.loads(attempt.output_json or "null")
            assert (result.tokens_in, result.tokens_out) == (0, 0)
    finally:
        runner.close()
        copy.close()


@needs_server
def test_the_server_refuses_a_write_fenced_by_a_lost_lease_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    """The fence goes out with the write it guards (no reply read): when the epoch moved on,
    the server fails the whole transaction and the driver gets LeaseLost naming the run."""
    from wf_magic.errors import LeaseLost

    server = pg_server()
    assert server is not None
    state = PgState(server, tmp_path / "s")
    with Engine(state) as engine:
        run = engine.start("name: x\nsteps:\n  - id: a\n    prompt: hi\n", params={})
        store = engine.store
        with store.run_lock(run.run_id):
            store.record_event(run.run_id, "note", data={"n": 1})  # fenced, and allowed
            before = state.rows("SELECT COUNT(*) FROM events WHERE run_id = ?", (run.run_id,))
            state.tamper(
                "UPDATE runs SET lease_epoch = lease_epoch + 1 WHERE run_id = ?", (run.run_id,)
            )
            with pytest.raises(LeaseLost, match=run.run_id):
                store.record_event(run.run_id, "note", data={"n": 2})
            after = state.rows("SELECT COUNT(*) FROM events WHERE run_id = ?", (run.run_id,))
    assert after == before
