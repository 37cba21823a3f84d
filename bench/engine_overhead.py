"""Per-unit engine cost against two floors: the bare SQLite journal and our own schema.

Runs, in one process, interleaved rep by rep, each in a fresh temp dir:

* bare floor: ``../shared/bench-peers/sqlite_floor.py``'s reserve + finish, WAL +
  synchronous=NORMAL — one table without an index; per unit one row INSERTed in one
  ``BEGIN IMMEDIATE ... COMMIT`` and UPDATEd in another. The cost of the journal contract
  itself (issue 11's target: engine <= 3x this);
* schema floor: the same two transactions on wf_magic's own schema (as ``Engine`` creates
  it), writing what the journal wrote per unit before the lean-journal work: an attempt
  row + unit row + event, then an update of both + another event. Dispatch ids are
  time-ordered like the engine's. Engine / schema floor shows what the Python around the
  journal costs; schema floor / bare floor what the schema costs;
* engine: one map step of N no-op ``scripted`` units (``max_concurrency: 1``), whole run
  (``Engine.run`` of a loaded workflow: start + drive; opening the database and freezing
  the plan are outside the clock, as for the floors).

Prints the best of R reps of each and the ratios::

    python bench/engine_overhead.py [--units N] [--repeat R]
"""

from __future__ import annotations

import argparse
import secrets
import sqlite3
import tempfile
import time
from pathlib import Path

from peers import floor_us  # bench/ is sys.path[0] when run as a script
from peers import workflow as bench_workflow

from wf_magic import Engine


def bare_floor_per_unit(state_dir: Path, units: int) -> float:
    """sqlite_floor.py's reserve + finish (WAL + NORMAL), in seconds per unit."""
    del state_dir  # floor_us makes its own temp dir
    return floor_us(units) / 1e6


def schema_connection(state_dir: Path) -> sqlite3.Connection:
    """A connection to a state DB that ``Engine`` created and migrated, with its pragmas."""
    engine = Engine(state_dir)
    engine.store.open()
    engine.close()
    conn = sqlite3.connect(engine.db_path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def schema_floor_per_unit(state_dir: Path, units: int) -> float:
    """Reserve + finish on wf_magic's schema (3 writes each), in seconds per unit."""
    conn = schema_connection(state_dir)
    now = time.time()
    conn.execute(
        "INSERT INTO runs (run_id, workflow, plan_json, plan_hash, plan_version, source_hash,"
        " params_json, params_hash, status, scope_key, root_run_id, created_at, updated_at)"
        " VALUES ('r', 'w', '{}', 'h', 1, 's', '{}', 'p', 'active', 'k', 'r', ?, ?)",
        (now, now),
    )
    start = time.perf_counter()
    for i in range(units):
        did = f"{time.time_ns() // 1000:014x}{secrets.token_hex(9)}"  # time-ordered
        uid = f"s[{i}]"
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO attempts (run_id, workflow, step_id, unit_id, attempt, dispatch_id, phase,"
            " loop, item_index, runner, status, input_hash, charged, started_at) VALUES"
            " ('r', 'w', 's', ?, 1, ?, 'work', 1, ?, 'scripted', 'running', 'h', 1, ?)",
            (uid, did, i, time.time()),
        )
        conn.execute(
            "INSERT INTO units (run_id, unit_id, step_id, phase, item_index, loop, status,"
            " input_hash, attempts, updated_at) VALUES ('r', ?, 's', 'work', ?, 1,"
            " 'running', 'h', 1, ?)",
            (uid, i, time.time()),
        )
        conn.execute(
            "INSERT INTO events (run_id, at, kind, unit_id, dispatch_id) VALUES"
            " ('r', ?, 'unit_started', ?, ?)",
            (time.time(), uid, did),
        )
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "UPDATE attempts SET status = 'succeeded', output_json = '\"x\"', tokens_in = 1,"
            " tokens_out = 1, finished_at = ? WHERE dispatch_id = ? AND status = 'running'",
            (time.time(), did),
        )
        conn.execute(
            "UPDATE units SET status = 'succeeded', updated_at = ? WHERE run_id = 'r' AND"
            " unit_id = ?",
            (time.time(), uid),
        )
        conn.execute(
            "INSERT INTO events (run_id, at, kind, unit_id, dispatch_id) VALUES"
            " ('r', ?, 'unit_finished', ?, ?)",
            (time.time(), uid, did),
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
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
        "schema": schema_floor_per_unit,
        "engine": engine_per_unit,
    }
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(args.repeat):  # interleaved: machine noise hits every row alike
        for name, measure in measures.items():
            with tempfile.TemporaryDirectory() as tmp:
                samples[name].append(measure(Path(tmp), args.units))
    bare, schema, eng = (min(samples[name]) for name in measures)
    print(f"units per run:                  {args.units} (best of {args.repeat})")
    print(f"bare floor (sqlite_floor.py):   {bare * 1e6:8.1f} us/unit")
    print(f"schema floor (our tables):      {schema * 1e6:8.1f} us/unit")
    print(f"engine (scripted no-op, c=1):   {eng * 1e6:8.1f} us/unit")
    print(f"ratio engine/bare floor:        {eng / bare:8.2f}x  (target <= 3x)")
    print(f"ratio engine/schema floor:      {eng / schema:8.2f}x")
    print(f"ratio schema floor/bare floor:  {schema / bare:8.2f}x")


if __name__ == "__main__":
    main()
