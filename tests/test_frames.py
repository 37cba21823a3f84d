"""Specification of the DataFrames over the state database (wf_magic.store.frames)."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic.errors import UsageError
from wf_magic.store.db import DB_FILENAME, connect
from wf_magic.store.frames import (
    JOURNAL_COLUMNS,
    TOKENS_KEYS,
    _ints,
    budget_frame,
    events_frame,
    journal_frame,
    runs_frame,
    tokens_frame,
)
from wf_magic.store.migrations import apply_migrations

T0 = 1_700_000_000.25  # a binary fraction, so nanosecond conversion is exact

JOURNAL_DTYPES = {
    "run": "string",
    "step": "string",
    "unit": "string",
    "attempt": "Int64",
    "dispatch_id": "string",
    "phase": "string",
    "runner": "string",
    "model": "string",
    "status": "string",
    "input_hash": "string",
    "tokens_in": "Int64",
    "tokens_out": "Int64",
    "cost": "float64",
    "reused_from": "string",
    "started_at": "datetime64[ns, UTC]",
    "finished_at": "datetime64[ns, UTC]",
    "duration_s": "float64",
    "failure": "string",
    "loop": "Int64",
    "charged": "boolean",
    "saved_tokens": "Int64",
    "session_id": "string",
    "reused_from_run": "string",
    "reused_from_unit": "string",
    "verdict": "string",
}
TOKENS_SUM_DTYPES = {
    "attempts": "Int64",
    "tokens_in": "Int64",
    "tokens_out": "Int64",
    "tokens": "Int64",
    "cost": "float64",
    "saved_tokens": "Int64",
    "tokens_paid": "Int64",
    "tokens_reused": "Int64",
    "tokens_judge": "Int64",
}
RUNS_DTYPES = {
    "params": "string",
    "run": "string",
    "workflow": "string",
    "status": "string",
    "status_reason": "string",
    "parent_run": "string",
    "root_run": "string",
    "forked_from": "string",
    "fork_step": "string",
    "scope_key": "string",
    "plan_hash": "string",
    "plan_version": "Int64",
    "source_path": "string",
    "use_cache": "boolean",
    "created_at": "datetime64[ns, UTC]",
    "updated_at": "datetime64[ns, UTC]",
    "finished_at": "datetime64[ns, UTC]",
    "owner": "string",
    "duration_s": "float64",
}
EVENTS_DTYPES = {
    "event_id": "Int64",
    "run": "string",
    "at": "datetime64[ns, UTC]",
    "kind": "string",
    "step": "string",
    "unit": "string",
    "dispatch_id": "string",
    "data_json": "string",
}
BUDGET_DTYPES = {
    "ceiling": "string",
    "used": "float64",
    "limit": "float64",
    "remaining": "float64",
    "used_fraction": "float64",
    "saved": "float64",
    "judge": "float64",
}


def dtypes(frame: pd.DataFrame) -> dict[str, str]:
    return {str(name): str(dtype) for name, dtype in frame.dtypes.items()}


def utc(seconds: float) -> pd.Timestamp:
    return pd.Timestamp(seconds, unit="s", tz="UTC")


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    connection = connect(tmp_path / DB_FILENAME)
    apply_migrations(connection)
    return connection


def add_run(
    conn: sqlite3.Connection,
    run_id: str,
    *,
    budget: dict[str, float | None] | None = None,
    parent: str | None = None,
    root: str | None = None,
    created_at: float = T0,
    finished_at: float | None = None,
    status: str = "active",
) -> None:
    plan = {"steps": [], "budget": budget or {}}
    conn.execute(
        "INSERT INTO runs (run_id, workflow, plan_json, plan_hash, plan_version, source_hash,"
        " params_json, params_hash, status, scope_key, parent_run_id, invocation_key, root_run_id,"
        " created_at, updated_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (run_id, "demo", json.dumps(plan), "p" * 64, 1, "s" * 64, "{}", "h" * 64, status,
         "demo{}", parent, parent and f"call-{run_id}", root or run_id, created_at, created_at,
         finished_at),
    )  # fmt: skip


def add_attempt(
    conn: sqlite3.Connection,
    run_id: str,
    unit_id: str,
    *,
    step: str | None = None,
    attempt: int = 1,
    phase: str = "work",
    status: str = "succeeded",
    tokens: tuple[int, int] = (0, 0),
    cost: float | None = None,
    charged: bool | None = None,
    saved: int = 0,
    reused_from: str | None = None,
    model: str | None = "gpt-test",
    runner: str = "scripted",
    loop: int = 1,
    started: float = T0,
    finished: float | None = T0 + 1.5,
    failure: str | None = None,
) -> str:
    dispatch_id = f"{run_id}/{unit_id}/{attempt}"
    is_charged = charged if charged is not None else (phase == "work" and status != "reused")
    conn.execute(
        "INSERT INTO attempts (run_id, workflow, step_id, unit_id, attempt, dispatch_id, phase,"
        " loop, runner, model, status, input_hash, charged, tokens_in, tokens_out, cost,"
        " saved_tokens, reused_from, failure, started_at, finished_at)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (run_id, "demo", step or unit_id.split("[")[0].split(".")[0], unit_id, attempt,
         dispatch_id, phase, loop, runner, model, status, f"hash-{unit_id}", int(is_charged),
         tokens[0], tokens[1], cost, saved, reused_from, failure, started, finished),
    )  # fmt: skip
    return dispatch_id


def add_event(
    conn: sqlite3.Connection, run_id: str, kind: str, *, at: float, unit: str | None = None
) -> None:
    conn.execute(
        "INSERT INTO event_log (event_id, run_id, at, kind, step_id, unit_id, dispatch_id,"
        " data_json) VALUES ((SELECT n + 1 FROM journal_seq),?,?,?,?,?,?,?)",
        (run_id, at, kind, unit and unit.split("[")[0], unit, unit and f"{run_id}/{unit}/1",
         json.dumps({"kind": kind})),
    )  # fmt: skip
    conn.execute("UPDATE journal_seq SET n = n + 1")


def seed_demo_run(conn: sqlite3.Connection) -> dict[str, str]:
    """r-1: two work units (one retried), a gate verdict, a reused unit, a running unit."""
    add_run(conn, "r-0", created_at=T0 - 100, finished_at=T0 - 50, status="completed")
    source = add_attempt(conn, "r-0", "draft[2]", tokens=(70, 30), cost=0.5, started=T0 - 90)
    add_run(conn, "r-1", budget={"max_units": 10, "max_tokens": 1000, "max_cost": 2.0})
    ids = {
        "fail": add_attempt(conn, "r-1", "draft[0]", status="failed", tokens=(10, 0), cost=0.01,
                            failure="RunnerError: timed out", finished=T0 + 2.0),
        "retry": add_attempt(conn, "r-1", "draft[0]", attempt=2, tokens=(100, 40), cost=0.25,
                             started=T0 + 2.0, finished=T0 + 4.5),
        "second": add_attempt(conn, "r-1", "draft[1]", tokens=(120, 60), cost=0.5, model="gpt-big",
                              started=T0 + 0.5, finished=T0 + 3.0),
        "reused": add_attempt(conn, "r-1", "draft[2]", status="reused", saved=100,
                              reused_from=source, started=T0 + 0.75, finished=T0 + 0.75),
        "gate": add_attempt(conn, "r-1", "draft.gate:l1", phase="gate", tokens=(30, 5),
                            cost=0.05, runner="openai_chat", started=T0 + 5.0, finished=T0 + 6.0),
        "running": add_attempt(conn, "r-1", "summary", model=None, runner="process",
                               status="running", started=T0 + 6.5, finished=None),
    }  # fmt: skip
    return ids


# --- journal_frame -------------------------------------------------------------------------


def test_journal_frame_of_an_empty_journal_has_every_column_and_dtype() -> None:
    assert list(JOURNAL_DTYPES) == [
        "run", "step", "unit", "attempt", "dispatch_id", "phase", "runner", "model", "status",
        "input_hash", "tokens_in", "tokens_out", "cost", "reused_from", "started_at",
        "finished_at", "duration_s", "failure", "loop", "charged", "saved_tokens", "session_id",
        "reused_from_run", "reused_from_unit", "verdict",
    ]  # fmt: skip
    assert list(JOURNAL_COLUMNS) == list(JOURNAL_DTYPES)


def test_journal_frame_is_empty_but_typed_when_there_are_no_attempts(
    conn: sqlite3.Connection,
) -> None:
    frame = journal_frame(conn)

    assert frame.shape == (0, 25)
    assert dtypes(frame) == JOURNAL_DTYPES
    assert dtypes(journal_frame(conn, "r-missing")) == JOURNAL_DTYPES


def test_journal_frame_has_one_typed_row_per_attempt_in_reservation_order(
    conn: sqlite3.Connection,
) -> None:
    ids = seed_demo_run(conn)

    frame = journal_frame(conn, "r-1")

    assert dtypes(frame) == JOURNAL_DTYPES
    assert frame["dispatch_id"].tolist() == list(ids.values())
    assert frame["unit"].tolist() == [
        "draft[0]", "draft[0]", "draft[1]", "draft[2]", "draft.gate:l1", "summary",
    ]  # fmt: skip
    assert frame["attempt"].tolist() == [1, 2, 1, 1, 1, 1]
    assert frame["phase"].tolist() == ["work"] * 4 + ["gate", "work"]
    assert frame["status"].tolist() == [
        "failed", "succeeded", "succeeded", "reused", "succeeded", "running",
    ]  # fmt: skip
    assert frame["tokens_in"].tolist() == [10, 100, 120, 0, 30, 0]
    assert frame["tokens_out"].tolist() == [0, 40, 60, 0, 5, 0]
    assert frame["charged"].tolist() == [True, True, True, False, False, True]
    assert frame["saved_tokens"].tolist() == [0, 0, 0, 100, 0, 0]
    assert frame["loop"].tolist() == [1] * 6
    assert set(frame["run"]) == {"r-1"}
    assert frame["step"].tolist() == ["draft"] * 5 + ["summary"]
    assert frame["input_hash"].iloc[0] == "hash-draft[0]"


def test_journal_frame_keeps_missing_values_as_na_nan_and_nat(conn: sqlite3.Connection) -> None:
    ids = seed_demo_run(conn)

    frame = journal_frame(conn, "r-1").set_index("dispatch_id")

    running, reused, failed = (
        frame.loc[ids["running"]],
        frame.loc[ids["reused"]],
        frame.loc[ids["fail"]],
    )
    assert running["model"] is pd.NA
    assert running["finished_at"] is pd.NaT
    assert math.isnan(running["duration_s"])
    assert math.isnan(running["cost"])
    assert reused["reused_from"] == "r-0/draft[2]/1"
    assert failed["failure"] == "RunnerError: timed out"
    assert frame.loc[ids["retry"], "failure"] is pd.NA
    assert frame.loc[ids["retry"], "reused_from"] is pd.NA


def test_journal_frame_converts_epoch_seconds_to_utc_timestamps_and_durations(
    conn: sqlite3.Connection,
) -> None:
    ids = seed_demo_run(conn)

    row = journal_frame(conn, "r-1").set_index("dispatch_id").loc[ids["retry"]]

    assert row["started_at"] == utc(T0 + 2.0)
    assert row["finished_at"] == utc(T0 + 4.5)
    assert row["duration_s"] == 2.5
    assert row["cost"] == 0.25


def test_journal_frame_without_a_run_lists_every_run_and_with_children_adds_child_runs(
    conn: sqlite3.Connection,
) -> None:
    seed_demo_run(conn)
    add_run(conn, "r-1.child", parent="r-1", root="r-1")
    add_attempt(conn, "r-1.child", "inner[0]", tokens=(1, 1))

    assert len(journal_frame(conn)) == 1 + 6 + 1
    assert len(journal_frame(conn, "r-1")) == 6
    with_children = journal_frame(conn, "r-1", with_children=True)
    assert with_children["run"].tolist() == ["r-1"] * 6 + ["r-1.child"]
    assert dtypes(with_children) == JOURNAL_DTYPES


def test_journal_frame_reads_through_a_read_only_connection(tmp_path: Path) -> None:
    writer = connect(tmp_path / DB_FILENAME)
    apply_migrations(writer)
    seed_demo_run(writer)

    reader = connect(tmp_path / DB_FILENAME, read_only=True)

    assert len(journal_frame(reader, "r-1")) == 6


# --- tokens_frame --------------------------------------------------------------------------


@pytest.mark.parametrize("by", TOKENS_KEYS)
def test_tokens_frame_of_no_attempts_has_stable_columns_and_dtypes(
    conn: sqlite3.Connection, by: str
) -> None:
    frame = tokens_frame(conn, "r-missing", by=by)

    key_dtype = "Int64" if by == "loop" else "string"
    assert frame.shape == (0, 10)
    assert dtypes(frame) == {by: key_dtype, **TOKENS_SUM_DTYPES}


def test_tokens_frame_by_step_includes_gate_rows_and_sums_to_the_journal(
    conn: sqlite3.Connection,
) -> None:
    seed_demo_run(conn)

    tokens = tokens_frame(conn, "r-1", by="step")
    journal = journal_frame(conn, "r-1")

    assert dtypes(tokens) == {"step": "string", **TOKENS_SUM_DTYPES}
    assert tokens["step"].tolist() == ["draft", "summary"]
    assert tokens["attempts"].tolist() == [5, 1]
    assert tokens["tokens_in"].tolist() == [260, 0]
    assert tokens["tokens_out"].tolist() == [105, 0]
    assert tokens["tokens"].tolist() == [365, 0]
    assert tokens["saved_tokens"].tolist() == [100, 0]
    assert tokens["cost"].iloc[0] == pytest.approx(0.81)
    assert math.isnan(tokens["cost"].iloc[1])
    assert tokens["tokens"].sum() == (journal["tokens_in"] + journal["tokens_out"]).sum()


def test_tokens_frame_by_model_groups_runners_without_a_model_under_na(
    conn: sqlite3.Connection,
) -> None:
    seed_demo_run(conn)

    tokens = tokens_frame(conn, "r-1", by="model")

    assert tokens["model"].tolist() == ["gpt-test", "gpt-big", pd.NA]
    assert tokens["tokens"].tolist() == [185, 180, 0]


def test_tokens_frame_by_phase_splits_gate_from_work(conn: sqlite3.Connection) -> None:
    seed_demo_run(conn)

    tokens = tokens_frame(conn, "r-1", by="phase")

    assert tokens.set_index("phase")["tokens"].to_dict() == {"work": 330, "gate": 35}


def test_tokens_frame_by_run_covers_all_runs_or_a_run_with_its_children(
    conn: sqlite3.Connection,
) -> None:
    seed_demo_run(conn)
    add_run(conn, "r-1.child", parent="r-1", root="r-1")
    add_attempt(conn, "r-1.child", "inner[0]", tokens=(3, 4))

    everything = tokens_frame(conn, by="run").set_index("run")["tokens"].to_dict()
    family = tokens_frame(conn, "r-1", by="run", with_children=True)

    assert everything == {"r-0": 100, "r-1": 365, "r-1.child": 7}
    assert family["run"].tolist() == ["r-1", "r-1.child"]


def test_tokens_frame_rejects_an_unknown_key(conn: sqlite3.Connection) -> None:
    with pytest.raises(UsageError, match=r"step, model, runner, loop, run, phase \(got 'unit'\)"):
        tokens_frame(conn, "r-1", by="unit")


attempt_rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),  # step
        st.sampled_from(["work", "gate"]),
        st.sampled_from(["succeeded", "failed", "reused"]),
        st.sampled_from(["m1", "m2", None]),
        st.integers(0, 10_000),
        st.integers(0, 10_000),
        st.integers(1, 3),  # loop
    ),
    max_size=25,
)


@settings(max_examples=30, deadline=None)
@given(rows=attempt_rows)
def test_tokens_frame_sums_equal_journal_sums_for_every_key(
    rows: list[tuple[str, str, str, str | None, int, int, int]],
) -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    apply_migrations(conn)
    add_run(conn, "r-1")
    for n, (step, phase, status, model, t_in, t_out, loop) in enumerate(rows):
        add_attempt(conn, "r-1", f"{step}[{n}]", step=step, phase=phase, status=status,
                    model=model, tokens=(t_in, t_out), loop=loop)  # fmt: skip
    journal = journal_frame(conn, "r-1")

    for by in TOKENS_KEYS:
        tokens = tokens_frame(conn, "r-1", by=by)
        assert tokens["attempts"].sum() == len(journal)
        assert tokens["tokens_in"].sum() == journal["tokens_in"].sum()
        assert tokens["tokens_out"].sum() == journal["tokens_out"].sum()
        assert tokens["tokens"].sum() == (journal["tokens_in"] + journal["tokens_out"]).sum()


# --- events_frame and runs_frame ------------------------------------------------------------


def test_events_frame_lists_a_runs_events_in_order_with_typed_columns(
    conn: sqlite3.Connection,
) -> None:
    add_run(conn, "r-1")
    add_run(conn, "r-2")
    add_event(conn, "r-1", "run_started", at=T0)
    add_event(conn, "r-2", "run_started", at=T0 + 0.5)
    add_event(conn, "r-1", "unit_started", at=T0 + 1.0, unit="draft[0]")

    frame = events_frame(conn, "r-1")

    assert dtypes(frame) == EVENTS_DTYPES
    assert frame["kind"].tolist() == ["run_started", "unit_started"]
    assert frame["event_id"].tolist() == [1, 3]
    assert frame["at"].tolist() == [utc(T0), utc(T0 + 1.0)]
    assert frame["unit"].iloc[0] is pd.NA
    assert frame["dispatch_id"].iloc[1] == "r-1/draft[0]/1"
    assert json.loads(frame["data_json"].iloc[1]) == {"kind": "unit_started"}
    assert len(events_frame(conn)) == 3


def test_events_frame_of_a_run_without_events_is_empty_but_typed(conn: sqlite3.Connection) -> None:
    frame = events_frame(conn, "r-none")

    assert frame.shape == (0, 8)
    assert dtypes(frame) == EVENTS_DTYPES


def test_runs_frame_lists_runs_oldest_first_with_lineage_and_duration(
    conn: sqlite3.Connection,
) -> None:
    seed_demo_run(conn)
    add_run(conn, "r-1.child", parent="r-1", root="r-1", created_at=T0 + 1)

    frame = runs_frame(conn)

    assert dtypes(frame) == RUNS_DTYPES
    assert frame["run"].tolist() == ["r-0", "r-1", "r-1.child"]
    assert frame["status"].tolist() == ["completed", "active", "active"]
    assert frame["parent_run"].tolist()[2] == "r-1"
    assert frame["root_run"].tolist() == ["r-0", "r-1", "r-1"]
    assert frame["duration_s"].iloc[0] == 50.0
    assert math.isnan(frame["duration_s"].iloc[1])
    assert frame["created_at"].iloc[0] == utc(T0 - 100)
    assert frame["use_cache"].tolist() == [True, True, True]


def test_runs_frame_of_an_empty_database_is_typed(conn: sqlite3.Connection) -> None:
    frame = runs_frame(conn)

    assert frame.shape == (0, 19)
    assert dtypes(frame) == RUNS_DTYPES


# --- budget_frame --------------------------------------------------------------------------


def test_budget_frame_charges_work_attempts_only_and_reports_saved_tokens(
    conn: sqlite3.Connection,
) -> None:
    seed_demo_run(conn)

    frame = budget_frame(conn, "r-1")

    assert dtypes(frame) == BUDGET_DTYPES
    assert frame["ceiling"].tolist() == ["units", "tokens", "cost"]
    # charged: failed, retry, second and the running one; not the gate or the reused attempt
    assert frame["used"].tolist() == pytest.approx([4, 330, 0.76])
    assert frame["limit"].tolist() == [10, 1000, 2.0]
    assert frame["remaining"].tolist() == pytest.approx([6, 670, 1.24])
    assert frame["used_fraction"].tolist() == pytest.approx([0.4, 0.33, 0.38])
    assert frame["saved"].tolist() == [1, 100, 0.5]  # one reused unit, its tokens, its source cost


def test_budget_frame_charges_child_runs_to_their_root(conn: sqlite3.Connection) -> None:
    seed_demo_run(conn)
    add_run(conn, "r-1.child", parent="r-1", root="r-1")
    add_run(conn, "r-1.grandchild", parent="r-1.child", root="r-1")
    add_run(conn, "r-9", budget={"max_units": 1})
    add_attempt(conn, "r-1.child", "inner[0]", tokens=(10, 10), cost=0.1)
    add_attempt(conn, "r-1.grandchild", "deep[0]", tokens=(5, 5))
    add_attempt(conn, "r-9", "other[0]", tokens=(999, 999))

    used = budget_frame(conn, "r-1").set_index("ceiling")["used"]

    assert used.to_dict() == pytest.approx({"units": 6, "tokens": 360, "cost": 0.86})
    assert budget_frame(conn, "r-9")["used"].tolist() == [1, 1998, 0]


def test_budget_frame_leaves_unset_ceilings_as_nan(conn: sqlite3.Connection) -> None:
    add_run(conn, "r-1", budget={"max_units": 5, "max_tokens": None})
    add_attempt(conn, "r-1", "a[0]", tokens=(2, 3))

    frame = budget_frame(conn, "r-1").set_index("ceiling")

    assert frame.loc["units", "remaining"] == 4
    for ceiling in ("tokens", "cost"):
        assert np.isnan(
            frame.loc[ceiling, ["limit", "remaining", "used_fraction"]].to_numpy()
        ).all()
    assert frame.loc["tokens", "used"] == 5


def test_budget_frame_of_a_run_with_no_attempts_uses_nothing(conn: sqlite3.Connection) -> None:
    add_run(conn, "r-1", budget={"max_units": 3, "max_tokens": 100, "max_cost": 1.0})

    frame = budget_frame(conn, "r-1")

    assert frame["used"].tolist() == [0, 0, 0]
    assert frame["remaining"].tolist() == [3, 100, 1.0]
    assert frame["saved"].tolist() == [0, 0, 0]


def test_budget_frame_of_an_unknown_run_is_a_usage_error(conn: sqlite3.Connection) -> None:
    with pytest.raises(UsageError, match="No run r-404 in this state database"):
        budget_frame(conn, "r-404")


def test_integer_columns_holding_null_become_masked_int64() -> None:
    # Every INTEGER column read today is NOT NULL; this guards a nullable one added later.
    converted = _ints(np.array([1, None, 3], dtype=object))

    assert str(converted.dtype) == "Int64"
    assert converted.tolist() == [1, pd.NA, 3]
