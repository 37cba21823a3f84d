"""One row per model call (issue 35 item 2): the ``calls`` table on both backends, numbered
per attempt as each call is journaled, ``engine.calls(run)`` and ``wf calls RUN``, and
``wf show``'s line when the CLI's own report disagrees with its calls."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import run_wf
from wf_magic import Engine
from wf_magic.display.agent import agent_lines
from wf_magic.errors import UsageError
from wf_magic.store.callframes import CALL_COLUMNS
from wf_magic.store.calls import CallRow

pytestmark = pytest.mark.backends  # the calls table on SQLite and PostgreSQL

COLUMNS = [
    "run", "step", "unit", "dispatch_id", "attempt", "call", "model", "status", "tokens_in",
    "tokens_out", "cache_read", "cache_write", "cost", "latency_s", "started_at", "error",
    "price_source",
]  # fmt: skip


def _run(engine: Engine, tmp_path: Path) -> str:
    path = tmp_path / "wf.yaml"
    path.write_text("name: calls\nrunner: scripted\nsteps:\n  - id: a\n    prompt: hi\n")
    return engine.run(str(path)).run_id


def _row(run_id: str, dispatch: str, unit: str = "a", **kw: Any) -> CallRow:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "step_id": "a",
        "unit_id": unit,
        "dispatch_id": dispatch,
        "attempt": 1,
        "model": "claude-sonnet-4-5",
        "status": "ok",
        "tokens_in": 120,
        "tokens_out": 8,
        "cache_read": 0,
        "cache_write": 0,
        "cost": 0.00048,
        "price_source": "genai-prices 0.2.3",
        "latency_s": 0.25,
        "started_at": 1_800_000_000.5,
        "error": None,
    }
    fields.update(kw)
    return CallRow(**fields)


def test_calls_are_numbered_per_attempt_and_a_later_launch_continues(
    engine: Engine, tmp_path: Path
) -> None:
    run_id = _run(engine, tmp_path)
    numbers = [engine.store.record_call(_row(run_id, "d1", started_at=1e9 + i)) for i in range(3)]
    other = engine.store.record_call(_row(run_id, "d2", started_at=2e9))
    assert (numbers, other) == ([1, 2, 3], 1)
    totals = engine.store.call_totals(run_id, "d1")
    assert (totals.calls, totals.tokens_in, totals.tokens_out) == (3, 360, 24)
    assert totals.cost == pytest.approx(3 * 0.00048)
    engine.store.record_call(_row(run_id, "d1", cost=None, price_source=None, started_at=1e9 + 9))
    assert engine.store.call_totals(run_id, "d1").cost is None  # one unpriced call: unknown
    assert engine.store.call_totals(run_id, "nothing").calls == 0
    rows = engine.store.calls_of(run_id)
    assert [(r.dispatch_id, r.call) for r in rows] == [
        ("d1", 1), ("d1", 2), ("d1", 3), ("d1", 4), ("d2", 1)
    ]  # fmt: skip
    assert rows[0] == _row(run_id, "d1", started_at=1e9, call=1)


def test_the_calls_frame_has_the_issues_columns_in_order_with_their_types(
    engine: Engine, tmp_path: Path
) -> None:
    run_id = _run(engine, tmp_path)
    assert engine.calls(run_id).columns.tolist() == COLUMNS  # empty, still typed
    assert [c for c, _ in CALL_COLUMNS] == COLUMNS
    engine.store.record_call(_row(run_id, "d1"))
    engine.store.record_call(
        _row(run_id, "d1", status="error", tokens_in=0, tokens_out=0, error="HTTP 529: busy")
    )
    frame = engine.calls(run_id[:12])
    assert frame["call"].tolist() == [1, 2]
    assert frame["status"].tolist() == ["ok", "error"]
    assert str(frame["tokens_in"].dtype) == "Int64" and str(frame["model"].dtype) == "string"
    assert str(frame["started_at"].dtype) == "datetime64[ns, UTC]"
    assert frame["error"].isna().tolist() == [True, False]
    assert frame["started_at"][0] == pd.Timestamp(1_800_000_000.5, unit="s", tz="UTC")


def test_wf_calls_prints_a_table_csv_and_json_and_filters_by_unit(
    engine: Engine, tmp_path: Path, state_dir: Path
) -> None:
    run_id = _run(engine, tmp_path)
    engine.store.record_call(_row(run_id, "d1", unit="a", error="=HYPERLINK(1)", status="error"))
    engine.store.record_call(_row(run_id, "d2", unit="b", started_at=1_800_000_001.0))
    as_json = run_wf(state_dir, "calls", run_id, "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [(r["unit"], r["call"], r["tokens_in"]) for r in rows] == [("a", 1, 120), ("b", 1, 120)]
    assert list(rows[0]) == COLUMNS
    as_csv = run_wf(state_dir, "calls", run_id, "--unit", "b", "--format", "csv")
    frame = pd.read_csv(io.StringIO(as_csv.stdout))
    assert frame.columns.tolist() == COLUMNS and frame["unit"].tolist() == ["b"]
    escaped = run_wf(state_dir, "calls", run_id, "--unit", "a", "--format", "csv").stdout
    assert "'=HYPERLINK(1)" in escaped  # a formula-like cell is escaped in CSV
    table = run_wf(state_dir, "calls", run_id)
    assert table.returncode == 0 and "claude-sonnet-4-5" in table.stdout


def test_wf_calls_of_an_unknown_run_is_one_line_naming_it(state_dir: Path) -> None:
    done = run_wf(state_dir, "calls", "r-nope")
    assert done.returncode != 0
    assert "r-nope" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@given(
    st.sampled_from(["tokens_in", "tokens_out", "cache_read", "cache_write"]),
    st.integers(min_value=-(2**63), max_value=-1),
)
def test_the_table_refuses_a_negative_count(field: str, bad: int) -> None:
    # The CHECK constraints are the last line: the bridge never writes one (usage.py drops it).
    import sqlite3

    from wf_magic.store.migrations import MIGRATIONS

    [calls_migration] = [m for m in MIGRATIONS if m.__name__.endswith("_calls")]
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY)")
    calls_migration(conn)
    conn.execute("INSERT INTO runs VALUES ('r')")
    values = {"tokens_in": 1, "tokens_out": 1, "cache_read": 0, "cache_write": 0, field: bad}
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO calls (run_id, step_id, unit_id, dispatch_id, attempt, call, status,"
            " tokens_in, tokens_out, cache_read, cache_write, latency_s, started_at)"
            " VALUES ('r','a','a','d',1,1,'ok',?,?,?,?,0,0)",
            (
                values["tokens_in"],
                values["tokens_out"],
                values["cache_read"],
                values["cache_write"],
            ),
        )


def _facts(cli: dict[str, Any], bridge: dict[str, Any]) -> dict[str, Any]:
    return {
        "harness": "claude",
        "bridge": {**bridge, "cli_report": {"cost_source": "estimate: own table", **cli}},
    }


SHOW_CASES = [
    ({"tokens_in": 240, "tokens_out": 16, "cost": 0.00096}, None),
    ({"tokens_in": 120, "tokens_out": 16, "cost": 0.00096}, "tokens"),
    ({"tokens_in": 240, "tokens_out": 16, "cost": 0.002}, "cost"),
    ({"tokens_in": 240, "tokens_out": 15, "cost": 0.5}, "tokens and cost"),
    ({"tokens_in": 240, "tokens_out": 16, "cost": None}, None),  # Codex reports no cost
]


@pytest.mark.parametrize(("cli", "differs"), SHOW_CASES)
def test_wf_show_puts_the_clis_report_beside_the_calls_and_flags_a_disagreement(
    cli: dict[str, Any], differs: str | None
) -> None:
    bridge = {"calls": 2, "tokens_in": 240, "tokens_out": 16, "cost": 0.00096}
    lines = agent_lines(_facts(cli, bridge), 0.00096)
    assert "calls      2 through the bridge: 240 in / 16 out, $0.000960" in lines
    assert any(line.startswith("cli report ") for line in lines)
    flagged = [line for line in lines if line.startswith("DISAGREE")]
    if differs is None:
        assert flagged == []
    else:
        assert flagged == [
            f"DISAGREE   the CLI's report and its calls differ in {differs}; the calls count"
        ]


def test_a_runs_calls_go_with_it_on_gc(engine: Engine, tmp_path: Path, state_dir: Path) -> None:
    run_id = _run(engine, tmp_path)
    engine.store.record_call(_row(run_id, "d1"))
    engine.close()
    gone = run_wf(state_dir, "gc", "--older-than", "0s")
    assert gone.returncode == 0, gone.stderr
    again = Engine(state_dir)
    try:
        assert again.store.call_totals(run_id, "d1").calls == 0
    finally:
        again.close()


def test_wf_calls_without_calls_prints_the_header_and_says_why_and_names_a_mistyped_unit(
    engine: Engine, tmp_path: Path, state_dir: Path
) -> None:
    run_id = _run(engine, tmp_path)
    table = run_wf(state_dir, "calls", run_id)
    assert table.returncode == 0
    assert table.stdout.split() == COLUMNS  # the header, never pandas' "Empty DataFrame"
    assert table.stderr == (
        f"warning: run {run_id} made no model call through the agent bridge: calls are "
        "recorded for bridged agent steps (docs/agents.md); `wf journal` shows every attempt\n"
    )
    assert (
        json.loads(run_wf(state_dir, "calls", run_id, "--unit", "a", "--format", "json").stdout)
        == []
    )
    mistyped = run_wf(state_dir, "calls", run_id, "--unit", "aa")
    assert mistyped.returncode == 2 and mistyped.stdout == ""
    assert mistyped.stderr == (f"error: Run {run_id} has no attempts of unit 'aa'; its units: a\n")
    with pytest.raises(UsageError, match="has no attempts of unit 'aa'; its units: a$"):
        engine.calls(run_id, unit="aa")
