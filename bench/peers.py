"""wf_magic beside the bare SQLite floor and its peers, per no-op unit, in one run.

Workloads (the peer harness's contract, ``../shared/bench-peers/README.md``):

* ``seq``: one map step of N no-op ``scripted`` units, one in flight (``max_concurrency: 1``);
* ``fanout``: the same with eight in flight (``max_concurrency: 8``);

each timed as a whole run (``Engine.run``: start + drive) in a fresh state dir. The floor is
the bare one of the harness's ``sqlite_floor.py`` (one table, no index: INSERT a running row
in one transaction, UPDATE it in another, WAL + synchronous=NORMAL), not our own schema.
LangGraph + SqliteSaver and DBOS run when the harness's venv exists (``setup.sh``), else they
are skipped with a note. Reps are interleaved; medians are printed with ratios to the floor.

    python bench/peers.py [--units N] [--reps R] [--peers DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wf_magic import Engine

HARNESS = Path(__file__).resolve().parents[2] / "shared" / "bench-peers"
PEER_VENV = Path(os.environ.get("PEERBENCH_DIR", "/tmp/peerbench")) / "venv" / "bin" / "python"
PEERS = {
    "langgraph-seq": ("langgraph_bench.py", "seq", {"BENCH_SQLITE_PRAGMAS": "synchronous=NORMAL"}),
    "langgraph-fanout": (
        "langgraph_bench.py",
        "fanout",
        {"BENCH_SQLITE_PRAGMAS": "synchronous=NORMAL"},
    ),
    "dbos-seq": (
        "dbos_bench.py",
        "seq",
        {"BENCH_SQLITE_PRAGMAS": "journal_mode=WAL;synchronous=NORMAL"},
    ),
    "dbos-fanout": (
        "dbos_bench.py",
        "fanout",
        {"BENCH_SQLITE_PRAGMAS": "journal_mode=WAL;synchronous=NORMAL"},
    ),
}


def floor_us(units: int) -> float:
    """sqlite_floor.py's reserve + finish per unit (WAL + NORMAL), in microseconds."""
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "floor.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE attempts (id INTEGER PRIMARY KEY, unit_key TEXT NOT NULL,"
            " state TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL, result BLOB)"
        )
        payload = b"x" * 64
        start = time.perf_counter()
        for i in range(units):
            conn.execute("BEGIN IMMEDIATE")
            cur = conn.execute(
                "INSERT INTO attempts (unit_key, state, started_at) VALUES (?, 'running', ?)",
                (f"u{i}", time.time()),
            )
            conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "UPDATE attempts SET state='done', finished_at=?, result=? WHERE id=?",
                (time.time(), payload, cur.lastrowid),
            )
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        conn.close()
    return elapsed / units * 1e6


def workflow(units: int, concurrency: int) -> str:
    """A map step of ``units`` no-op scripted units, ``concurrency`` in flight."""
    return (
        f"name: bench\nexecution:\n  max_concurrency: {concurrency}\n"
        "runners:\n  scripted:\n    rules:\n      - match: '.'\n        reply: ok\n"
        "steps:\n  - id: s\n"
        f"    map: '{{{{ range({units}) | list }}}}'\n"
        "    prompt: 'unit {{ item }}'\n"
    )


def engine_us(units: int, concurrency: int) -> float:
    """wf_magic's whole run (start + drive) per unit, in microseconds."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(Path(tmp))
        engine.store.open()  # create + migrate outside the timed region, like the floor
        source = workflow(units, concurrency)
        start = time.perf_counter()
        run = engine.run(source)
        elapsed = time.perf_counter() - start
        if run.status != "completed":
            raise SystemExit(f"bench run ended {run.status}: {run.reason}")
        engine.close()
    return elapsed / units * 1e6


def peer_us(name: str, units: int) -> float | None:
    """A peer's us_per_step from its harness script (None when it failed)."""
    script, workload, env = PEERS[name]
    out = subprocess.run(
        [str(PEER_VENV), str(HARNESS / script), workload, str(units)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    if out.returncode != 0 or not out.stdout.strip():
        print(f"note: {name} failed: {out.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return float(json.loads(out.stdout.strip().splitlines()[-1])["us_per_step"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="wf_magic and the floor only")
    args = parser.parse_args()
    has_peers = not args.no_peers and PEER_VENV.exists() and HARNESS.exists()
    if not has_peers:
        print(
            f"note: peers skipped (no harness venv at {PEER_VENV}; run setup.sh)", file=sys.stderr
        )
    samples: dict[str, list[float]] = {}
    for _ in range(args.reps):  # interleaved: machine noise hits every row alike
        samples.setdefault("floor", []).append(floor_us(args.units))
        samples.setdefault("wf_magic-seq", []).append(engine_us(args.units, 1))
        samples.setdefault("wf_magic-fanout", []).append(engine_us(args.units, 8))
        for name in PEERS if has_peers else ():
            value = peer_us(name, args.units)
            if value is not None:
                samples.setdefault(name, []).append(value)
    floor = statistics.median(samples["floor"])
    print(f"{args.units} units, median of {args.reps} interleaved reps (min-max)")
    print(f"{'row':<18} {'us/unit':>9} {'range':>15} {'x floor':>8}")
    for name, values in samples.items():
        med = statistics.median(values)
        spread = f"{min(values):.0f}-{max(values):.0f}"
        print(f"{name:<18} {med:9.0f} {spread:>15} {med / floor:8.1f}")


if __name__ == "__main__":
    main()
