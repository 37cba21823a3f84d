"""wf_magic under the peer harness's contract: ``seq|fanout|resume N`` prints one JSON line.

The contract is ``../shared/bench-peers/README.md``; ``run_all.sh`` runs this script next to
LangGraph, DBOS and the bare SQLite floor when given ``ENGINE_CMD``::

    python bench/engine_bench.py seq N      # N no-op units, one after another
    python bench/engine_bench.py fanout N   # one map step of N no-op units, 8 in flight
    python bench/engine_bench.py resume N   # N+1 units; the first process dies at unit N+1

Workloads, each in a fresh ``tempfile.mkdtemp()`` state dir deleted afterwards:

* ``seq`` (``WF_BENCH_SEQ``, default ``map``):

  - ``map``: one map step of N ``scripted`` no-op units with ``max_concurrency: 1`` (what
    ``bench/peers.py`` measures). **This is the comparable one**: every peer's ``seq`` runs
    one step *definition* N times in a row (DBOS: a loop calling one ``@DBOS.step``;
    LangGraph: one node looping N super-steps), each invocation durably recorded before the
    next starts. In wf_magic that is a map unit: each unit's attempt is reserved and
    finished in the journal before the next unit is dispatched.
  - ``steps``: a plan of N ``scripted`` prompt steps in a chain. Each step also pays the
    plan walk, its template context and the step spine (complete_step); it measures
    per-step cost against plan length (plans allow up to 10 000 steps), not the peers.

* ``fanout``: one map step of N ``scripted`` no-op units, ``max_concurrency: 8``.

* ``resume`` (``WF_BENCH_RESUME``, default ``map``): a first child process drives a run of
  N+1 units; the last one is a ``python:`` unit that calls ``os._exit(137)`` when it starts
  (N units succeeded, its attempt left ``running``, checked before the second process). A
  fresh child process opens the engine and ``Engine.resume``s the run.

  - ``map``: N+1 ``python:`` units in map steps of at most 10 000 units (the map bound), the
    last map full, so the unit left is the last of a 10 000-unit map when N >= 9 999: the
    resume must find the one owed unit among its finished siblings.
  - ``tail``: a map step of N ``scripted`` units, then one ``python:`` step.
  - ``steps``: N ``scripted`` steps, then one ``python:`` step (N+1 <= 10 000).

Timing: ``total_s`` is the whole run (``Engine.run`` of a loaded workflow: start + drive);
opening and migrating the state database and freezing the plan (``load_s``) are outside it,
as the peers keep their saver setup and graph compile outside theirs. ``resume_s`` runs from
``Engine(...)`` in the second process to the finished run's status (imports excluded,
``import_s``); ``open_s`` + ``drive_s`` split it; ``resume_process_s`` is the whole second
process as seen by the parent. ``summarize.py`` groups lines by peer, workload, n and
``pragmas``, not by shape: keep one shape per results file.

On PostgreSQL: ``BENCH_DATABASE_URL=postgresql://…`` (the same variable the peers' DBOS script
reads) journals to a fresh schema of that server instead (dropped afterwards), so wf_magic
and DBOS are timed against the same server; ``pragmas`` then reads ``postgresql``.

Env: ``WF_BENCH_SEQ=map|steps``, ``WF_BENCH_RESUME=map|tail|steps``,
``WF_BENCH_DURABILITY=normal|full`` (default ``normal``: WAL + synchronous=NORMAL).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "")

T_IMPORT0 = time.perf_counter()
from wf_magic import Engine, register_function  # noqa: E402  (resolves the lazy engine import)

T_IMPORTED = time.perf_counter()

MAP_BOUND = 10_000
"""Units per map step and steps per plan that wf_magic accepts."""
DURABILITY = os.environ.get("WF_BENCH_DURABILITY", "normal")
PRAGMAS = {
    "normal": "journal_mode=WAL;synchronous=NORMAL",
    "full": "journal_mode=WAL;synchronous=FULL",
}
SCRIPTED = "runners:\n  scripted:\n    rules:\n      - match: '.'\n        reply: ok\n"
CRASH_ENV = "WF_BENCH_CRASH_AT"


def bench_unit(item: int) -> int:
    """A no-op ``python:`` unit; the one at index ``$WF_BENCH_CRASH_AT`` kills the process."""
    if str(item) == os.environ.get("WF_BENCH_CRASH_AT"):
        sys.stdout.flush()
        os._exit(137)  # a crash at the start of the unit: its attempt stays running
    return item


register_function("bench_unit", bench_unit)


# -- workflow sources ---------------------------------------------------------------------
def map_source(units: int, concurrency: int) -> str:
    """One map step of ``units`` scripted no-op units, ``concurrency`` in flight."""
    return (
        f"name: bench\nexecution:\n  max_concurrency: {concurrency}\n{SCRIPTED}steps:\n"
        f"  - id: s\n    map: '{{{{ range({units}) | list }}}}'\n"
        "    prompt: 'unit {{ item }}'\n"
    )


def steps_source(steps: int, *, tail: str = "") -> str:
    """A chain of ``steps`` scripted prompt steps (plus ``tail``, more step text)."""
    body = "".join(f"  - id: s{i}\n    prompt: 'step {i}'\n" for i in range(steps))
    return f"name: bench\n{SCRIPTED}steps:\n{body}{tail}"


def python_step(index: int) -> str:
    return f"  - id: last\n    python: bench_unit\n    with:\n      item: {index}\n"


def resume_source(n: int, shape: str) -> str:
    """N+1 units whose last (index N) is a ``bench_unit`` python unit."""
    if shape == "tail":
        return map_source(n, 1) + python_step(n)
    if shape == "steps":
        if n + 1 > MAP_BOUND:
            raise SystemExit(f"resume steps: N+1 = {n + 1} steps, over the plan bound {MAP_BOUND}")
        return steps_source(n, tail=python_step(n))
    if shape != "map":
        raise SystemExit(f"WF_BENCH_RESUME: expected map, tail or steps (got {shape!r})")
    sizes, left = [], n + 1
    while left:  # the last map is the full one, so the crashing unit has the most siblings
        sizes.insert(0, min(left, MAP_BOUND))
        left -= sizes[0]
    steps, first = [], 0
    for k, size in enumerate(sizes):
        steps.append(
            f"  - id: m{k}\n    map: '{{{{ range({first}, {first + size}) | list }}}}'\n"
            "    python: bench_unit\n"
        )
        first += size
    return "name: bench\nexecution:\n  max_concurrency: 1\nsteps:\n" + "".join(steps)


# -- workloads ----------------------------------------------------------------------------
def timed_run(source: str, n: int, state_dir: Path) -> dict[str, object]:
    """Load outside the clock, then time ``Engine.run`` (start + drive) of the whole run."""
    with Engine(state_dir, durability=DURABILITY) as engine:
        engine.store.open()  # create + migrate outside the timed region, like the peers' setup
        t0 = time.perf_counter()
        workflow = engine.load(source)
        t1 = time.perf_counter()
        run = engine.run(workflow)
        t2 = time.perf_counter()
        if run.status != "completed":
            raise SystemExit(f"bench run ended {run.status}: {run.reason}")
    total = t2 - t1
    return {
        "load_s": round(t1 - t0, 4),
        "total_s": round(total, 4),
        "us_per_step": round(total / n * 1e6, 1),
    }


def run_seq(n: int, state_dir: Path) -> dict[str, object]:
    shape = os.environ.get("WF_BENCH_SEQ", "map")
    if shape not in ("map", "steps"):
        raise SystemExit(f"WF_BENCH_SEQ: expected map or steps (got {shape!r})")
    _within_bound(n, shape)
    source = map_source(n, 1) if shape == "map" else steps_source(n)
    return {"shape": shape, **timed_run(source, n, state_dir)}


def run_fanout(n: int, state_dir: Path) -> dict[str, object]:
    _within_bound(n, "map")
    return {"shape": "map", "max_concurrency": 8, **timed_run(map_source(n, 8), n, state_dir)}


def _phase(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """This script run again as one phase of the resume workload, its output captured."""
    me = str(Path(__file__).resolve())
    return subprocess.run(
        [sys.executable, me, *args], env=env, capture_output=True, text=True, check=False
    )


def run_resume(n: int, state_dir: Path) -> dict[str, object]:
    shape = os.environ.get("WF_BENCH_RESUME", "map")
    env = {**os.environ, CRASH_ENV: str(n), "WF_BENCH_RESUME": shape}
    ta = time.perf_counter()
    first = _phase(env, "_resume1", str(n), str(state_dir))
    tb = time.perf_counter()
    if first.returncode != 137:
        raise SystemExit(f"phase 1 rc={first.returncode}: {first.stderr[-2000:]}")
    run_id = first.stdout.split()[0]
    at_crash = attempt_counts(state_dir, run_id)
    if at_crash != {"succeeded": n, "running": 1}:
        raise SystemExit(f"phase 1 left {at_crash}, expected {n} succeeded and 1 running")
    env.pop(CRASH_ENV)
    tc = time.perf_counter()
    second = _phase(env, "_resume2", str(n), str(state_dir), run_id)
    td = time.perf_counter()
    if second.returncode != 0:
        raise SystemExit(f"phase 2 rc={second.returncode}: {second.stderr[-2000:]}")
    after = attempt_counts(state_dir, run_id)
    if after != {"succeeded": n + 1}:
        raise SystemExit(f"resume left {after}, expected {n + 1} succeeded")
    return {
        "shape": shape,
        **json.loads(second.stdout.strip().splitlines()[-1]),
        "resume_process_s": round(td - tc, 4),
        "phase1_process_s": round(tb - ta, 4),
        "phase1_us_per_step": round((tb - ta) / n * 1e6, 1),
    }


def resume_phase1(n: int, state_dir: Path) -> None:
    """Start and drive the run; the last unit kills this process (exit code 137)."""
    engine = Engine(state_dir, durability=DURABILITY)
    run = engine.start(engine.load(resume_source(n, os.environ.get("WF_BENCH_RESUME", "map"))))
    print(run.run_id, flush=True)
    engine.drive(run)
    raise SystemExit("phase 1 was expected to crash")


def resume_phase2(state_dir: Path, run_id: str) -> None:
    """Open the engine and resume the run; print the in-process timings."""
    t0 = time.perf_counter()
    engine = Engine(state_dir, durability=DURABILITY)
    engine.store.open()
    t1 = time.perf_counter()
    run = engine.resume(run_id)
    status = run.status
    t2 = time.perf_counter()
    if status != "completed":
        raise SystemExit(f"resumed run ended {status}: {run.reason}")
    engine.close()
    print(
        json.dumps(
            {
                "import_s": round(T_IMPORTED - T_IMPORT0, 4),
                "open_s": round(t1 - t0, 4),
                "drive_s": round(t2 - t1, 4),
                "invoke_s": round(t2 - t1, 4),  # LangGraph's name: summarize.py shows it
                "resume_s": round(t2 - t0, 4),
            }
        )
    )


def attempt_counts(state_dir: Path, run_id: str) -> dict[str, int]:
    """Attempts by status, read-only (no checkpoint of the crashed process's WAL on close)."""
    if DATABASE_URL:
        with Engine(str(state_dir)) as engine:
            rows = [(a.status, 1) for a in engine.store.attempts_of(run_id)]
        counts: dict[str, int] = {}
        for status, _ in rows:
            counts[str(status)] = counts.get(str(status), 0) + 1
        return counts
    uri = f"file:{state_dir / 'state.db'}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        rows = conn.execute(
            "SELECT status, count(*) FROM attempts WHERE run_id = ? GROUP BY status", (run_id,)
        ).fetchall()
    finally:
        conn.close()
    return {str(status): int(count) for status, count in rows}


def _within_bound(n: int, shape: str) -> None:
    if n > MAP_BOUND:
        what = "units per map step" if shape == "map" else "steps per plan"
        raise SystemExit(f"N = {n} is over wf_magic's bound of {MAP_BOUND} {what}")


def main() -> None:
    mode, n = sys.argv[1], int(sys.argv[2])
    if mode == "_resume1":
        return resume_phase1(n, _state(sys.argv[3]))
    if mode == "_resume2":
        return resume_phase2(_state(sys.argv[3]), sys.argv[4])
    workloads = {"seq": run_seq, "fanout": run_fanout, "resume": run_resume}
    if mode not in workloads:
        raise SystemExit(f"usage: {sys.argv[0]} {{seq|fanout|resume}} N")
    if DURABILITY not in PRAGMAS:
        raise SystemExit(f"WF_BENCH_DURABILITY: expected normal or full (got {DURABILITY!r})")
    local = Path(tempfile.mkdtemp(prefix="bench_wf_magic_"))
    schema = f"bench_{os.urandom(6).hex()}"
    if DATABASE_URL:
        os.environ["WF_MAGIC_LOCAL_DIR"] = str(local)
        sep = "&" if "?" in DATABASE_URL else "?"
        state_dir = _state(f"{DATABASE_URL}{sep}schema={schema}")
    else:
        state_dir = local
    try:
        out: dict[str, object] = {
            "peer": "wf_magic",
            "workload": mode,
            "n": n,
            "pragmas": "postgresql" if DATABASE_URL else PRAGMAS[DURABILITY],
        }
        out.update(workloads[mode](n, state_dir))
        print(json.dumps(out), flush=True)
    finally:
        shutil.rmtree(local, ignore_errors=True)
        if DATABASE_URL:
            import psycopg

            with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _state(text: str) -> Path:
    """A state as the phases pass it on: a folder path, or the URL (typed as a Path for the
    workload functions, which only hand it to ``Engine``)."""
    return text if "://" in text else Path(text)  # type: ignore[return-value]


if __name__ == "__main__":
    main()
