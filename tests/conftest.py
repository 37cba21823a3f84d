"""Shared fixtures: a fresh state dir and Engine per test, and CLI/subprocess helpers."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from wf_magic import Engine

from .backends import PgState, pg_server, pg_state_of

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test touches ./.wf_magic or the user's WF_MAGIC_HOME."""
    monkeypatch.setenv("WF_MAGIC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WF_MAGIC_SQLITE_JOURNAL_MODE", raising=False)
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)  # runs belong to the OS user
    monkeypatch.delenv("WF_MAGIC_SECRET_KEY_FILE", raising=False)  # each state dir's own key


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "state_dir" in metafunc.fixturenames and metafunc.definition.get_closest_marker("backends"):
        metafunc.parametrize("backend", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def state_dir(tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh state: a folder, or (the PostgreSQL leg of a ``backends`` module) a new schema
    on the test server, whose local folder is under ``tmp_path``."""
    if backend == "postgresql":
        server = pg_server()
        if server is None:
            pytest.skip("PostgreSQL leg: set WF_MAGIC_TEST_PG=postgresql://USER@HOST:PORT/DB")
        local = tmp_path / "pg-local"
        monkeypatch.setenv("WF_MAGIC_LOCAL_DIR", str(local))
        # The default lease (30 s): a unit holding the GIL for seconds (redacting a 10 MB
        # output) must not cost its driver the lease; tests/test_pg_faults.py shortens it.
        monkeypatch.delenv("WF_MAGIC_LEASE_TTL", raising=False)
        return PgState(server, local)  # type: ignore[return-value]
    return tmp_path / "state"


@pytest.fixture
def engine(state_dir: Path) -> Iterator[Engine]:
    eng = Engine(state_dir)
    yield eng
    eng.close()


def db_rows(state_dir: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Rows from the state DB through a fresh connection (as another process would see)."""
    pg = pg_state_of(state_dir)
    if pg is not None:
        return pg.rows(sql, params)
    conn = sqlite3.connect(state_dir / "state.db", timeout=30)
    try:
        return [tuple(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


def db_execute(state_dir: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    """One write to the state DB behind wf_magic's back, committed (either backend)."""
    pg = pg_state_of(state_dir)
    if pg is not None:
        pg.tamper(sql, params)
        return
    conn = sqlite3.connect(state_dir / "state.db", timeout=30)
    try:
        conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def tamper(engine: Engine, sql: str, params: tuple[object, ...] = ()) -> None:
    """Edit the state DB behind wf_magic's back (as a person with the sqlite3 shell would)."""
    state = PgState.for_location(engine.location) if engine.location else engine.state_dir
    db_execute(state, sql, params)  # type: ignore[arg-type]


def table_counts(state_dir: Path) -> dict[str, int]:
    """Row counts of every journal table."""
    return {
        t: int(db_rows(state_dir, f"SELECT COUNT(*) FROM {t}")[0][0])  # noqa: S608
        for t in ("runs", "steps", "units", "attempts", "events")
    }


def wf_cmd(state_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "wf_magic.cli", "--db", str(state_dir), *args]


def run_wf(
    state_dir: Path, *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real `wf` CLI in a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        wf_cmd(state_dir, *args),
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
        check=False,
    )


def spawn_wf(state_dir: Path, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        wf_cmd(state_dir, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
    )


def wait_for(
    predicate: Callable[[], bool], *, timeout: float = 30, what: str = "condition"
) -> None:
    """Poll until ``predicate()`` is true (fails the test after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except sqlite3.OperationalError:
            pass  # the DB may not exist yet
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


class CliResult:
    """What one in-process ``wf`` invocation returned and printed."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def wf_inproc(capsys: pytest.CaptureFixture[str], state_dir: Path, *args: str) -> CliResult:
    """The real ``wf`` entry point, in-process (fast); ``run_wf`` is used where a process matters."""
    from wf_magic.cli import main

    capsys.readouterr()
    try:
        code = main(["--db", str(state_dir), *args])
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return CliResult(code, out.out, out.err)


def write_file(directory: Path, name: str, text: str) -> Path:
    """Write ``text`` to ``directory / name`` and return the path (a workflow file, ...)."""
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def attempts_in(state_dir: Path) -> list[tuple[str, int, str, str]]:
    """(unit, attempt, status, dispatch_id) of every attempt in journal order, read afresh."""
    return [
        (str(u), int(n), str(s), str(d))
        for u, n, s, d in db_rows(
            state_dir,
            "SELECT unit_id, attempt, status, dispatch_id FROM attempts ORDER BY attempt_pk",
        )
    ]
