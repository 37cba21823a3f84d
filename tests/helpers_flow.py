"""Shared helpers of the control-flow tests (gates, routes, map, children, forks, budgets).

Not a test module: workflows stay inline in the tests; this holds the plumbing they share —
python runners registered by name, journal counters, and the crash harness that runs
``wf run`` in a real process, waits for a point in the journal and kills it with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wf_magic import Engine, ScriptedRunner, UnitRequest, register_runner
from wf_magic.store.records import AttemptRow

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Recorder:
    """A python runner body that records every request and answers through ``reply``."""

    reply: Callable[[UnitRequest], Any]
    requests: list[UnitRequest] = field(default_factory=list)

    def __call__(self, request: UnitRequest) -> Any:
        self.requests.append(request)
        return self.reply(request)

    def prompts(self, kind: str = "prompt") -> list[str]:
        """The prompts seen, in order, of requests of ``kind``."""
        return [r.prompt or "" for r in self.requests if r.kind == kind]


def use_runner(name: str, reply: Callable[[UnitRequest], Any]) -> Recorder:
    """Register a scripted runner answering through ``reply`` (replacing any earlier one)."""
    recorder = Recorder(reply)
    register_runner(name, lambda ctx: ScriptedRunner(fn=recorder), replace=True)
    return recorder


def by_unit(attempts: list[AttemptRow]) -> dict[str, list[AttemptRow]]:
    """Attempts grouped by unit id, in journal order."""
    out: dict[str, list[AttemptRow]] = {}
    for a in attempts:
        out.setdefault(a.unit_id, []).append(a)
    return out


def journal_counts(engine: Engine, run_id: str) -> tuple[int, int, int]:
    """(attempt rows, event rows, steps updated_at checksum) of a run: 'nothing was written'."""

    def q(conn: sqlite3.Connection) -> tuple[int, int, int]:
        attempts = conn.execute(
            "SELECT COUNT(*) FROM attempts WHERE run_id = ?", (run_id,)
        ).fetchone()[0]
        events = conn.execute("SELECT COUNT(*) FROM events WHERE run_id = ?", (run_id,)).fetchone()[
            0
        ]
        stamp = conn.execute(
            "SELECT COALESCE(MAX(updated_at), 0) FROM steps WHERE run_id = ?", (run_id,)
        ).fetchone()[0]
        return int(attempts), int(events), stamp

    conn = sqlite3.connect(engine.db_path, timeout=30)
    try:
        return q(conn)
    finally:
        conn.close()


def attempt_rows(engine: Engine, run_id: str) -> list[tuple[str, str, int, str]]:
    """(unit, phase, loop, status) per attempt, in journal order."""
    return [(a.unit_id, a.phase, a.loop, a.status) for a in engine.attempts(run_id)]


def work_attempts(engine: Engine, run_id: str) -> list[AttemptRow]:
    """The run's work-phase attempts (no gate verdicts), in journal order."""
    return [a for a in engine.attempts(run_id) if a.phase == "work"]


def step_statuses(engine: Engine, run_id: str) -> dict[str, str]:
    """step id → status of a run's steps."""
    return {s.step_id: s.status for s in engine.steps(run_id)}


def children_of(engine: Engine, run_id: str) -> list[str]:
    """The run ids of the child runs ``run_id`` published, oldest first."""
    return [r.run_id for r in engine.list_runs(include_children=True) if r.parent_run_id == run_id]


def counting_judge(calls: list[str]) -> Callable[[UnitRequest], object]:
    """A runner body appending each request's kind to ``calls``.

    The work answers "v1" to a prompt starting with "Write" and "v2" once it sees the feedback
    "more"; the judge rejects "v1" once (feedback "more") and passes anything else.
    """

    def reply(request: UnitRequest) -> object:
        text = request.prompt or ""
        calls.append(request.kind)
        if request.kind == "judge":
            if '"v1"' in text:
                return {"complete": False, "feedback": "more", "missing": ["x"]}
            return {"complete": True, "feedback": "", "missing": []}
        if "more" in text:
            return "v2"
        return "v1" if text.startswith("Write") else f"b:{text}"

    return reply


def run_cli(state_dir: Path, *args: str) -> int:
    """``wf --db STATE ARGS...`` in-process; returns the exit code."""
    from wf_magic.cli import main

    return main(["--db", str(state_dir), *args])


# -- the crash harness ------------------------------------------------------------------------
def _query(db: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # tables not created yet
        return []
    finally:
        conn.close()


@contextmanager
def wf_process(
    state_dir: Path, workflow_file: Path, *args: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``wf run FILE`` in a real child process; killed (SIGKILL) on exit if still alive."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wf_magic.cli",
            "--db",
            str(state_dir),
            "run",
            str(workflow_file),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=str(REPO),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def wait_for_journal(
    proc: subprocess.Popen[bytes],
    state_dir: Path,
    sql: str,
    args: tuple[Any, ...] = (),
    *,
    timeout_s: float = 20.0,
) -> list[Any]:
    """Poll the state DB until ``sql`` returns a truthy first cell; the rows found.

    Fails (AssertionError) when the process exits first or the timeout passes.
    """
    db = state_dir / "state.db"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = _query(db, sql, args)
        if rows and rows[0] and rows[0][0]:
            return rows
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(
                f"wf exited ({proc.returncode}) before the journal showed "
                f"{sql!r}:\n{out.decode()}\n{err.decode()}"
            )
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {sql!r}")


def kill9(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and reap it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL


def only_run_id(state_dir: Path) -> str:
    """The run id of the single root run in ``state_dir``."""
    rows = _query(state_dir / "state.db", "SELECT run_id FROM runs WHERE parent_run_id IS NULL")
    assert len(rows) == 1, rows
    return str(rows[0][0])
