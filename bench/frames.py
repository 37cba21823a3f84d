"""Benchmark the journal and tokens frames against a raw pandas read of the attempts table."""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd

from wf_magic.store.db import DB_FILENAME, connect, immediate
from wf_magic.store.frames import journal_frame, tokens_frame
from wf_magic.store.migrations import apply_migrations

STEPS = ("fetch", "summarise", "classify", "review", "report")
MODELS = ("gpt-4o-mini", "gpt-4o", "claude-haiku", None)
RUNNERS = {
    "gpt-4o-mini": "openai_chat",
    "gpt-4o": "openai_chat",
    "claude-haiku": "openai_chat",
    None: "process",
}
_ATTEMPT_SQL = (
    "INSERT INTO attempts (run_id, workflow, step_id, unit_id, attempt, dispatch_id, phase, loop,"
    " item_index, runner, model, status, input_hash, charged, tokens_in, tokens_out, cost,"
    " saved_tokens, reused_from, session_id, output_json, failure, transient, started_at,"
    " finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


def _run_rows(runs: int, now: float) -> Iterator[tuple[object, ...]]:
    plan = json.dumps({"budget": {"max_units": 2000, "max_tokens": 5_000_000, "max_cost": None}})
    for r in range(runs):
        run_id = f"r-{r:06d}"
        yield (
            run_id,
            "bench",
            plan,
            "p" * 64,
            1,
            "s" * 64,
            "{}",
            "h" * 64,
            "completed",
            "bench",
            run_id,
            now + r,
            now + r,
            now + r + 60,
        )


def _status(roll: float) -> str:
    """10 % reused, 5 % failed, 1 % running, the rest succeeded."""
    for status, bound in (("reused", 0.10), ("failed", 0.15), ("running", 0.16)):
        if roll < bound:
            return status
    return "succeeded"


def _attempt_rows(attempts: int, runs: int, now: float) -> Iterator[tuple[object, ...]]:
    rng = random.Random(7)
    per_run = max(1, attempts // runs)
    for n in range(attempts):
        run = min(n // per_run, runs - 1)
        index = n - run * per_run
        step = STEPS[index * len(STEPS) // per_run]
        is_gate = n % 10 == 9
        unit = f"{step}.gate:l{index}" if is_gate else f"{step}[{index}]"  # unique within the run
        model = MODELS[n % len(MODELS)]
        status = _status(rng.random())
        reused = status == "reused"
        tokens_in, tokens_out = (
            (0, 0) if reused else (rng.randrange(50, 2000), rng.randrange(10, 800))
        )
        started = now + n * 0.01
        finished = None if status == "running" else started + rng.random() * 5
        yield (
            f"r-{run:06d}",
            "bench",
            step,
            unit,
            1,
            f"d-{n:08d}",
            "gate" if is_gate else "work",
            1,
            None if is_gate else index,
            RUNNERS[model],
            model,
            status,
            f"{n:064x}",
            int(not (is_gate or reused)),
            tokens_in,
            tokens_out,
            None if model is None else (tokens_in + tokens_out) * 1e-6,
            rng.randrange(100, 2000) if reused else 0,
            f"d-{n - 1:08d}" if reused else None,
            None,
            '{"text": "a short answer"}' if status == "succeeded" else None,
            "RunnerError: upstream timed out" if status == "failed" else None,
            1 if status == "failed" else None,
            started,
            finished,
        )


def build_db(path: Path, *, attempts: int, runs: int) -> sqlite3.Connection:
    """Create a state DB at ``path`` holding ``attempts`` attempts spread over ``runs`` runs."""
    conn = connect(path)
    apply_migrations(conn)
    now = time.time() - attempts
    with immediate(conn):
        conn.executemany(
            "INSERT INTO runs (run_id, workflow, plan_json, plan_hash, plan_version, source_hash,"
            " params_json, params_hash, status, scope_key, root_run_id, created_at, updated_at,"
            " finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            _run_rows(runs, now),
        )
        conn.executemany(_ATTEMPT_SQL, _attempt_rows(attempts, runs, now))
    return conn


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` wall-clock timings of ``fn()``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    """Build the DB, time the three reads and print figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attempts", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        conn = build_db(Path(tmp) / DB_FILENAME, attempts=args.attempts, runs=args.runs)
        built_s = time.perf_counter() - start
        print(f"built {args.attempts:,} attempts over {args.runs:,} runs in {built_s:.1f}s")
        conn.row_factory = None  # the raw baseline gets plain tuples, as pandas prefers
        raw = best_of(lambda: pd.read_sql_query("SELECT * FROM attempts", conn), args.repeat)
        journal = best_of(lambda: journal_frame(conn), args.repeat)
        tokens = best_of(lambda: tokens_frame(conn, by="model"), args.repeat)
        conn.close()
    print(f"raw read_sql_query('SELECT * FROM attempts'): {raw:.3f}s")
    print(
        f"journal_frame(conn):                           {journal:.3f}s ({journal / raw:.2f}x raw)"
    )
    print(f"tokens_frame(conn, by='model'):                {tokens:.3f}s ({tokens / raw:.2f}x raw)")
    target = 1.5
    worst = max(journal, tokens) / raw
    print(f"target <= {target}x raw: {'met' if worst <= target else 'MISSED'} (worst {worst:.2f}x)")
    return 0 if worst <= target else 1


if __name__ == "__main__":
    raise SystemExit(main())
