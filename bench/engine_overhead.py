"""Per-unit engine cost against two floors: the bare SQLite journal and our own journal's SQL.

Runs, in one process, interleaved rep by rep, each in a fresh temp dir:

* bare floor: ``../shared/bench-peers/sqlite_floor.py``'s reserve + finish, WAL +
  synchronous=NORMAL — one table without an index; per unit one row INSERTed in one
  ``BEGIN IMMEDIATE ... COMMIT`` and UPDATEd in another. The cost of the journal contract
  itself (issue 11's target: engine <= 3x this);
* journal replay: the statements a real engine run of the same workflow issued (recorded
  with their parameters, reads and BEGIN/COMMIT included), replayed in order without the
  engine on a fresh migrated state dir. Engine / replay shows what the Python around the
  journal costs; replay / bare floor what our schema and group commit cost;
* engine: one map step of N no-op ``scripted`` units (``max_concurrency: 1``), whole run
  (``Engine.run`` of a loaded workflow: start + drive; opening the database and freezing
  the plan are outside the clock, as for the floors).

Prints the best of R reps of each and the ratios::

    python bench/engine_overhead.py [--units N] [--repeat R]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from peers import floor_us  # bench/ is sys.path[0] when run as a script
from peers import workflow as bench_workflow

from wf_magic import Engine
from wf_magic.store.checkpoint import BACKSTOP_PAGES


def bare_floor_per_unit(state_dir: Path, units: int) -> float:
    """sqlite_floor.py's reserve + finish (WAL + NORMAL), in seconds per unit."""
    del state_dir  # floor_us makes its own temp dir
    return floor_us(units) / 1e6


class _Recording(sqlite3.Connection):
    """A connection that notes every statement and its parameters, in order, with its own id."""

    log: list[tuple[int, str, Any]] = []

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.log.append((id(self), sql, parameters))
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        rows = list(parameters)
        self.log.append((id(self), sql, ("many", rows)))
        return super().executemany(sql, rows)


STATEMENTS_PER_UNIT: Counter[str] = Counter()
"""The last replay's statements per unit by verb (``INSERT events``, ``COMMIT``, ...)."""


def _verb(sql: str) -> str:
    words = sql.split()
    verb = words[0].upper() if words else "?"
    table = next(
        (words[i + 1] for i, w in enumerate(words[:-1]) if w.upper() in ("INTO", "UPDATE", "FROM")),
        "",
    )
    return f"{verb} {table}".strip() if verb in ("INSERT", "UPDATE", "SELECT", "DELETE") else verb


def record_run(state_dir: Path, units: int) -> list[tuple[int, str, Any]]:
    """Every statement wf_magic's connections issue while running a ``units``-unit map (c=1)."""
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return real_connect(*args, **kwargs, factory=_Recording)

    sqlite3.connect = connect  # type: ignore[assignment]
    try:
        with Engine(state_dir) as engine:
            engine.store.open()
            workflow = engine.load(bench_workflow(units, 1))
            _Recording.log = []  # from here on: the run, as engine_per_unit times it
            run = engine.run(workflow)
    finally:
        sqlite3.connect = real_connect  # type: ignore[assignment]
    if run.status != "completed":
        raise SystemExit(f"recorded run ended {run.status}: {run.reason}")
    return _Recording.log


def journal_replay_per_unit(state_dir: Path, units: int) -> float:
    """The SQL of a real engine run, replayed without the engine: seconds per unit.

    The statements (writes, reads, BEGIN/COMMIT, with their recorded parameters) run in the
    same order on as many connections, opened with the engine's pragmas, against a fresh
    migrated state dir. The checkpoint thread's statements are left out (it runs beside the
    driver); the writer keeps its backstop. What the engine costs above this is Python.
    (A unit's start and finish events and the ``units`` projection are read from its attempt
    row since m016: there are no such writes left to leave out.)
    """
    log = record_run(state_dir / "record", units)
    target = state_dir / "replay"
    with Engine(target) as engine:
        engine.store.open()
    conns: dict[int, sqlite3.Connection] = {}
    for conn_id, _sql, _params in log:
        if conn_id not in conns:
            conn = sqlite3.connect(target / "state.db", isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
            conns[conn_id] = conn
    global STATEMENTS_PER_UNIT
    STATEMENTS_PER_UNIT = Counter(_verb(sql) for _c, sql, _p in log)
    for verb in STATEMENTS_PER_UNIT:
        STATEMENTS_PER_UNIT[verb] /= units  # type: ignore[assignment]
    steps = [
        (conns[conn_id], sql, params)
        for conn_id, sql, params in log
        if "wal_checkpoint" not in sql and "journal_mode" not in sql
    ]
    start = time.perf_counter()
    for conn, sql, params in steps:
        if isinstance(params, tuple) and len(params) == 2 and params[0] == "many":
            conn.executemany(sql, params[1])
        else:
            conn.execute(sql, params).fetchall()
    elapsed = time.perf_counter() - start
    for conn in conns.values():
        conn.close()
    return elapsed / units


def engine_per_unit(state_dir: Path, units: int) -> float:
    """One map step of ``units`` scripted no-op units, whole run, in seconds per unit."""
    source = bench_workflow(units, 1)
    with Engine(state_dir) as engine:
        engine.store.open()  # open + migrate outside the timed region, like the floors
        workflow = engine.load(source)
        start = time.perf_counter()
        run = engine.run(workflow)
        elapsed = time.perf_counter() - start
        if run.status != "completed":
            raise SystemExit(f"bench run ended {run.status}: {run.reason}")
    return elapsed / units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    measures = {
        "bare": bare_floor_per_unit,
        "replay": journal_replay_per_unit,
        "engine": engine_per_unit,
    }
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(args.repeat):  # interleaved: machine noise hits every row alike
        for name, measure in measures.items():
            with tempfile.TemporaryDirectory() as tmp:
                samples[name].append(measure(Path(tmp), args.units))
    bare, replay, eng = (min(samples[name]) for name in measures)
    print(f"units per run:                  {args.units} (best of {args.repeat})")
    print(f"bare floor (sqlite_floor.py):   {bare * 1e6:8.1f} us/unit")
    print(f"journal replay (our SQL):       {replay * 1e6:8.1f} us/unit")
    print(f"engine (scripted no-op, c=1):   {eng * 1e6:8.1f} us/unit")
    print(f"ratio engine/bare floor:        {eng / bare:8.2f}x  (target <= 3x)")
    print(f"ratio engine/journal replay:    {eng / replay:8.2f}x  (the Python around the journal)")
    per_unit = ", ".join(f"{v:.2f} {k}" for k, v in STATEMENTS_PER_UNIT.most_common())
    print(f"journal statements per unit:    {sum(STATEMENTS_PER_UNIT.values()):.2f} ({per_unit})")
    print(f"ratio journal replay/bare:      {replay / bare:8.2f}x  (our schema and commits)")


if __name__ == "__main__":
    main()
