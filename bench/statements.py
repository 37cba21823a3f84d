"""Statements and round trips per unit of a sequential map, or per cell of a sweep.

Counts what one no-op unit of a ``max_concurrency: 1`` map costs the journal: the statements
the Store sends (by verb and table; on SQLite every connection's, the writer's and the
readers'), and on PostgreSQL the round trips to the server (each ``execute`` of any of its
connections is one). Two runs of N and 2N units are counted and subtracted, so the run's
fixed cost (start, plan, step spine) drops out. ``--cells N`` counts a sweep of N one-unit
cells instead (one prompt step, the scripted runner, a rows list), N against 2N cells, so
the sweep's own fixed cost drops out:

    python bench/statements.py [--units N | --cells N] [--pg postgresql://USER@HOST:PORT/DB]

Prints one JSON line per backend: ``{"backend", "statements_per_unit" (or "_per_cell"),
"round_trips_per_unit" (or "_per_cell"), "by_statement"}``. Run it with an older wf_magic
on ``PYTHONPATH`` to compare releases.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from wf_magic import Engine

SOURCE = """name: seq
params:
  items: {type: array}
execution: {max_concurrency: 1}
steps:
  - id: m
    map: "{{ params.items }}"
    prompt: "say {{ item }}"
"""
_VERB = re.compile(
    r"^\s*(SELECT|INSERT(?:\s+OR\s+\w+)?\s+INTO\s+\w+|UPDATE\s+\w+|DELETE\s+FROM\s+\w+|\w+)",
    re.IGNORECASE,
)


def _verb(sql: str) -> str:
    match = _VERB.match(sql)
    words = (match.group(1) if match else sql[:12]).split()
    return " ".join(
        w for w in words if w.upper() not in ("OR", "IGNORE", "REPLACE", "INTO", "FROM")
    )


SWEEP = """name: cells
params:
  i: {type: integer}
runner: scripted
steps:
  - id: s
    prompt: "say {{ params.i }}"
"""


def map_run(units: int) -> Callable[[Engine], None]:
    """A sequential map of ``units`` no-op units."""
    return lambda engine: engine.run(SOURCE, params={"items": list(range(units))})


def sweep_run(cells: int) -> Callable[[Engine], None]:
    """A sweep of ``cells`` one-unit cells (a rows list, one prompt step, scripted)."""

    def run(engine: Engine) -> None:
        sweep = engine.sweep(SWEEP, rows=[{"i": i} for i in range(cells)], max_concurrency=1)
        assert sweep.status == "completed", sweep.status

    return run


@contextlib.contextmanager
def counting(
    engine: Engine, *, readers: bool
) -> Iterator[tuple[collections.Counter[str], list[int]]]:
    """Count the statements ``engine``'s Store sends while the block runs: (by verb and
    table, [round trips]). On SQLite the writer's, and with ``readers`` every reader
    connection's too; on PostgreSQL every connection's, and each ``execute`` is a round trip."""
    from wf_magic.store import pgconn
    from wf_magic.store import store as store_module

    statements: collections.Counter[str] = collections.Counter()
    trips = [0]
    orig_execute = pgconn.PgConnection.execute

    def execute(self: Any, sql: str, params: Any = ()) -> Any:
        statements[_verb(sql)] += 1
        return orig_execute(self, sql, params)

    def traced(conn: Any) -> None:
        last = [""]

        def trace(sql: str) -> None:
            # SQLite reports a trigger's program starting as its statement again.
            if sql != last[0]:
                statements[_verb(sql)] += 1
            last[0] = sql

        conn.set_trace_callback(trace)

    engine.store.open()
    writer = engine.store._writer
    on_pg = isinstance(writer, pgconn.PgConnection)
    orig_reader = store_module.connect_reader
    if on_pg:
        import psycopg

        orig_raw = psycopg.Connection.execute

        def raw(self: Any, *args: Any, **kwargs: Any) -> Any:
            trips[0] += 1  # every connection's: the writer's and the readers'
            return orig_raw(self, *args, **kwargs)

        psycopg.Connection.execute = raw  # type: ignore[method-assign]
        pgconn.PgConnection.execute = execute  # type: ignore[method-assign]
    else:
        traced(writer)
        if readers:
            for conn in engine.store._readers:
                traced(conn)

            def reader(path: Any) -> Any:
                conn = orig_reader(path)
                traced(conn)
                return conn

            store_module.connect_reader = reader  # type: ignore[assignment]
    try:
        yield statements, trips
    finally:
        pgconn.PgConnection.execute = orig_execute  # type: ignore[method-assign]
        store_module.connect_reader = orig_reader  # type: ignore[assignment]
        if on_pg:
            psycopg.Connection.execute = orig_raw  # type: ignore[method-assign]
        else:
            writer.set_trace_callback(None)
            for conn in engine.store._readers:
                conn.set_trace_callback(None)


def count(
    state: str, run: Callable[[Engine], None], *, readers: bool = False
) -> tuple[collections.Counter[str], int]:
    """(statements by verb and table, round trips) of ``run`` on a fresh Engine of ``state``."""
    with Engine(state) as engine, counting(engine, readers=readers) as (statements, trips):
        run(engine)
    return statements, trips[0]


def per_n(
    state_of: Callable[[], str],
    n: int,
    run_of: Callable[[int], Callable[[Engine], None]],
    *,
    readers: bool = False,
    unit: str = "unit",
) -> dict[str, Any]:
    """Statements and round trips of ``run_of(2n)`` less those of ``run_of(n)``, per one."""
    small, small_trips = count(state_of(), run_of(n), readers=readers)
    large, large_trips = count(state_of(), run_of(2 * n), readers=readers)
    diff = {k: (large[k] - small[k]) / n for k in sorted(set(large) | set(small))}
    diff = {k: round(v, 2) for k, v in diff.items() if abs(v) > 0.005}
    return {
        f"statements_per_{unit}": round(sum(diff.values()), 2),
        f"round_trips_per_{unit}": round((large_trips - small_trips) / n, 2),
        "by_statement": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument(
        "--cells", type=int, help="count a sweep of N one-unit cells instead of a map"
    )
    parser.add_argument("--pg", default=os.environ.get("BENCH_DATABASE_URL"))
    args = parser.parse_args()
    os.environ.setdefault("WF_MAGIC_LOCAL_DIR", tempfile.mkdtemp())
    if args.cells:
        n, run_of, readers, unit = args.cells, sweep_run, True, "cell"
    else:
        n, run_of, readers, unit = args.units, map_run, False, "unit"

    def measured(state_of: Callable[[], str]) -> dict[str, Any]:
        return per_n(state_of, n, run_of, readers=readers, unit=unit)

    print(json.dumps({"backend": "sqlite", **measured(tempfile.mkdtemp)}))
    if args.pg:
        sep = "&" if "?" in args.pg else "?"

        def schema() -> str:
            return f"{args.pg}{sep}schema=bench_stmts_{os.urandom(4).hex()}"

        print(json.dumps({"backend": "postgresql", **measured(schema)}))


if __name__ == "__main__":
    main()
