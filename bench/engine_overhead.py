"""Per-unit engine overhead vs the floor of two committed SQLite transactions per unit.

Runs, in one process and side by side:

* floor: for each of N units, two BEGIN IMMEDIATE ... COMMIT transactions on a state DB with
  the same pragmas (an INSERT of a running attempt row + unit row + event, then an UPDATE
  finishing it + unit + event) — the minimum the journal contract costs;
* engine: a workflow with one map step of N no-op units on the ``scripted`` runner, driven
  by ``Engine.run`` (rendering, hashing, resume lookups, budget, reserve/finish, spine).

Prints both per-unit figures and their ratio (target: engine <= 3x floor).

    python bench/engine_overhead.py [--units N] [--repeat R]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

from wf_magic import Engine
from wf_magic.store.db import connect
from wf_magic.store.migrations import apply_migrations


def floor_per_unit(state_dir: Path, units: int) -> float:
    conn = connect(state_dir / "state.db")
    apply_migrations(conn)
    now = time.time()
    conn.execute(
        "INSERT INTO runs (run_id, workflow, plan_json, plan_hash, plan_version, source_hash,"
        " params_json, params_hash, status, scope_key, root_run_id, created_at, updated_at)"
        " VALUES ('r', 'w', '{}', 'h', 1, 's', '{}', 'p', 'active', 'k', 'r', ?, ?)",
        (now, now),
    )
    start = time.perf_counter()
    for i in range(units):
        did = uuid.uuid4().hex
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
    source = "name: bench\n" + (
        "runners:\n  scripted:\n    rules:\n      - match: '.'\n        reply: ok\n"
        "steps:\n  - id: s\n"
        f"    map: '{{{{ range({units}) | list }}}}'\n"
        "    prompt: 'unit {{ item }}'\n"
    )
    engine = Engine(state_dir)
    engine.store.open()  # open + migrate outside the timed region, like the floor
    start = time.perf_counter()
    run = engine.run(source)
    elapsed = time.perf_counter() - start
    assert run.status == "completed", run.reason
    engine.close()
    return elapsed / units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    floors, engines = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            floors.append(floor_per_unit(Path(a), args.units))
            engines.append(engine_per_unit(Path(b), args.units))
    floor, eng = min(floors), min(engines)
    print(f"units per run:              {args.units} (best of {args.repeat})")
    print(f"floor (2 txns/unit):        {floor * 1e6:8.1f} us/unit")
    print(f"engine (scripted no-op):    {eng * 1e6:8.1f} us/unit")
    print(f"ratio engine/floor:         {eng / floor:8.2f}x  (target <= 3x)")


if __name__ == "__main__":
    main()
