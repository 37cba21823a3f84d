"""Statements and round trips per unit of a sequential map, on SQLite and on PostgreSQL.

Counts what one no-op unit of a ``max_concurrency: 1`` map costs the journal: the statements
the Store's writer sends (by verb and table; on PostgreSQL the readers' too), and on
PostgreSQL the round trips to the server (each ``execute`` of any of its connections is one).
Two runs of N and 2N units are counted and subtracted, so the run's fixed cost (start, plan,
step spine) drops out:

    python bench/statements.py [--units N] [--pg postgresql://USER@HOST:PORT/DB]

Prints one JSON line per backend: ``{"backend", "statements_per_unit", "round_trips_per_unit",
"by_statement"}``. Run it with an older wf_magic on ``PYTHONPATH`` to compare releases.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import tempfile
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


def count(state: str, units: int) -> tuple[collections.Counter[str], int]:
    """(statements by verb and table, round trips) of one run of ``units`` units."""
    from wf_magic.store import pgconn

    statements: collections.Counter[str] = collections.Counter()
    trips = [0]
    orig_execute = pgconn.PgConnection.execute

    def execute(self: Any, sql: str, params: Any = ()) -> Any:
        statements[_verb(sql)] += 1
        return orig_execute(self, sql, params)

    with Engine(state) as engine:
        engine.store.open()
        writer = engine.store._writer
        on_pg = isinstance(writer, pgconn.PgConnection)
        if on_pg:
            import psycopg

            orig_raw = psycopg.Connection.execute

            def raw(self: Any, *args: Any, **kwargs: Any) -> Any:
                trips[0] += 1  # every connection's: the writer's and the readers'
                return orig_raw(self, *args, **kwargs)

            psycopg.Connection.execute = raw  # type: ignore[method-assign]
            pgconn.PgConnection.execute = execute  # type: ignore[method-assign]
        else:
            last = [""]

            def trace(sql: str) -> None:
                # SQLite reports a trigger's program starting as its statement again.
                if sql != last[0]:
                    statements[_verb(sql)] += 1
                last[0] = sql

            writer.set_trace_callback(trace)
        try:
            engine.run(SOURCE, params={"items": list(range(units))})
        finally:
            pgconn.PgConnection.execute = orig_execute  # type: ignore[method-assign]
            if on_pg:
                psycopg.Connection.execute = orig_raw  # type: ignore[method-assign]
    return statements, trips[0]


def per_unit(state_of: Any, units: int) -> dict[str, Any]:
    small, small_trips = count(state_of(), units)
    large, large_trips = count(state_of(), 2 * units)
    diff = {k: (large[k] - small[k]) / units for k in sorted(set(large) | set(small))}
    diff = {k: round(v, 2) for k, v in diff.items() if abs(v) > 0.005}
    return {
        "statements_per_unit": round(sum(diff.values()), 2),
        "round_trips_per_unit": round((large_trips - small_trips) / units, 2),
        "by_statement": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--pg", default=os.environ.get("BENCH_DATABASE_URL"))
    args = parser.parse_args()
    os.environ.setdefault("WF_MAGIC_LOCAL_DIR", tempfile.mkdtemp())
    print(json.dumps({"backend": "sqlite", **per_unit(tempfile.mkdtemp, args.units)}))
    if args.pg:
        sep = "&" if "?" in args.pg else "?"

        def schema() -> str:
            return f"{args.pg}{sep}schema=bench_stmts_{os.urandom(4).hex()}"

        print(json.dumps({"backend": "postgresql", **per_unit(schema, args.units)}))


if __name__ == "__main__":
    main()
