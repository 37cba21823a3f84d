"""Per-unit and per-step cost, and peak memory, as runs grow (issue 11: flat in N).

Two workloads, every size in a fresh child interpreter (so ``ru_maxrss`` is that size's
peak) and a fresh ``tempfile.mkdtemp()`` state dir deleted afterwards:

* ``units``: N no-op ``scripted`` units in map steps of at most ``--per-map`` units (the
  map bound, 10 000; 50 000 units are five map steps), at each ``--concurrency``;
* ``steps``: a plan of N ``scripted`` prompt steps in a chain (plans allow 10 000 steps).

The clock covers the whole run (``Engine.run`` of a loaded workflow: start + drive);
opening the database and freezing the plan (``load_s``) are outside it. Memory: ``rss_mib``
is the child's peak RSS, ``run_rss_mib`` its growth during the run (peak after the run
minus peak before it); ``--tracemalloc`` adds the Python heap's peak during the run
(``heap_mib``; tracing slows the run, so its times are not comparable). ``x_first`` is the
per-unit cost over that of the smallest size of the same workload and concurrency: flat is
1.0.

    python bench/scaling.py                                  # 1k/10k/50k units, 100/1k/10k steps
    python bench/scaling.py --units 1000,10000 --steps 100,1000 --concurrency 1
    python bench/scaling.py --units 500 --steps 100 --jsonl  # also one JSON line per size
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPTED = "runners:\n  scripted:\n    rules:\n      - match: '.'\n        reply: ok\n"


def units_source(units: int, *, concurrency: int, per_map: int) -> tuple[str, int]:
    """``units`` scripted no-op units in map steps of at most ``per_map``; (source, maps)."""
    maps = -(-units // per_map)
    steps, first = [], 0
    for k in range(maps):
        size = units // maps + (1 if k < units % maps else 0)
        steps.append(
            f"  - id: m{k}\n    map: '{{{{ range({first}, {first + size}) | list }}}}'\n"
            "    prompt: 'unit {{ item }}'\n"
        )
        first += size
    head = f"name: scaling\nexecution:\n  max_concurrency: {concurrency}\n{SCRIPTED}steps:\n"
    return head + "".join(steps), maps


def steps_source(steps: int) -> str:
    """A chain of ``steps`` scripted prompt steps."""
    body = "".join(f"  - id: s{i}\n    prompt: 'step {i}'\n" for i in range(steps))
    return f"name: scaling\n{SCRIPTED}steps:\n{body}"


def peak_rss_mib() -> float:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_one(kind: str, n: int, *, concurrency: int, per_map: int, trace: bool) -> dict:
    """One size in this (fresh) process: the whole run's time and memory."""
    import tracemalloc

    from wf_magic import Engine

    if kind == "units":
        source, maps = units_source(n, concurrency=concurrency, per_map=per_map)
    else:
        source, maps = steps_source(n), 0
    state_dir = Path(tempfile.mkdtemp(prefix="bench_scaling_"))
    try:
        with Engine(state_dir) as engine:
            engine.store.open()
            t0 = time.perf_counter()
            workflow = engine.load(source)
            t1 = time.perf_counter()
            rss_before = peak_rss_mib()
            if trace:
                tracemalloc.start()
            t2 = time.perf_counter()
            run = engine.run(workflow)
            t3 = time.perf_counter()
            heap = tracemalloc.get_traced_memory()[1] / 2**20 if trace else None
            if run.status != "completed":
                raise SystemExit(f"{kind} {n}: run ended {run.status}: {run.reason}")
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    rss = peak_rss_mib()
    row = {
        "kind": kind,
        "n": n,
        "concurrency": concurrency if kind == "units" else 1,
        "maps": maps,
        "load_s": round(t1 - t0, 4),
        "total_s": round(t3 - t2, 4),
        "us_per_unit": round((t3 - t2) / n * 1e6, 1),
        "rss_mib": round(rss, 1),
        "run_rss_mib": round(rss - rss_before, 1),
    }
    if heap is not None:
        row["heap_mib"] = round(heap, 1)
    return row


def measure_in_child(kind: str, n: int, args: argparse.Namespace, concurrency: int) -> dict:
    """``measure_one`` in a fresh interpreter, so its peak RSS is this size's alone."""
    argv = [sys.executable, str(Path(__file__).resolve()), "_one", kind, str(n), str(concurrency)]
    argv += [str(args.per_map), "1" if args.tracemalloc else "0"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, env=os.environ)
    if out.returncode != 0:
        return {"kind": kind, "n": n, "concurrency": concurrency, "error": out.stderr[-500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_table(rows: list[dict]) -> None:
    first: dict[tuple[str, int], float] = {}
    print(
        f"{'workload':<8} {'n':>7} {'c':>3} {'maps':>4} {'load_s':>7} {'total_s':>8}"
        f" {'us/unit':>8} {'x_first':>7} {'rss_mib':>8} {'run_rss':>8} {'heap_mib':>8}"
    )
    for row in rows:
        if "error" in row:
            print(f"{row['kind']:<8} {row['n']:>7} {row['concurrency']:>3}  FAILED: {row['error']}")
            continue
        key = (row["kind"], row["concurrency"])
        base = first.setdefault(key, row["us_per_unit"])
        heap = f"{row['heap_mib']:8.1f}" if "heap_mib" in row else f"{'-':>8}"
        print(
            f"{row['kind']:<8} {row['n']:>7} {row['concurrency']:>3} {row['maps']:>4}"
            f" {row['load_s']:7.3f} {row['total_s']:8.3f} {row['us_per_unit']:8.1f}"
            f" {row['us_per_unit'] / base:7.2f} {row['rss_mib']:8.1f} {row['run_rss_mib']:8.1f}"
            f" {heap}"
        )


def sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_one":
        kind, n, concurrency, per_map, trace = sys.argv[2:7]
        row = measure_one(
            kind, int(n), concurrency=int(concurrency), per_map=int(per_map), trace=trace == "1"
        )
        print(json.dumps(row))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=sizes, default=[1000, 10000, 50000], help="e.g. 1000,10000")
    parser.add_argument("--steps", type=sizes, default=[100, 1000, 10000], help="e.g. 100,1000")
    parser.add_argument("--concurrency", type=sizes, default=[1, 8], help="for units, e.g. 1,8")
    parser.add_argument("--per-map", type=int, default=10000, help="units per map step at most")
    parser.add_argument("--tracemalloc", action="store_true", help="add the Python heap peak")
    parser.add_argument("--jsonl", action="store_true", help="also print one JSON line per size")
    args = parser.parse_args()
    plan = [("units", n, c) for c in args.concurrency for n in args.units]
    plan += [("steps", n, 1) for n in args.steps]
    rows = []
    for kind, n, concurrency in plan:
        rows.append(measure_in_child(kind, n, args, concurrency))
        print(f"  {kind} {n} c={concurrency} done", file=sys.stderr)
    print_table(rows)
    if args.jsonl:
        for row in rows:
            print(json.dumps(row))


if __name__ == "__main__":
    main()
