"""Usage a server does not report is unknown (issue 31, item 9): the attempt's tokens are NULL
in the journal and <NA> in frames (never 0, never a 4-characters-a-token estimate), sums skip
them, a ``max_tokens`` budget charges such an attempt the tokens it was offered (durably: a
resumed budget charges them again), and states journaled before m022 upgrade in place."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import db_rows
from tests.openai_server import FakeChatServer, completion_body, isolate_openai_env
from wf_magic import Engine
from wf_magic.drive.attempts import unknown_usage_charge
from wf_magic.drive.outcomes import result_problem
from wf_magic.inspection import record_text
from wf_magic.runners.base import UnitResult
from wf_magic.store import migrations, pgopen, pgschema
from wf_magic.store.records import AttemptRow

pytestmark = pytest.mark.backends

KEY_ENV = "WF_TEST_NULL_USAGE_KEY"
NO_USAGE = {"prompt_tokens": None}
"""``completion_body`` fields for a reply without a ``usage`` object."""


@pytest.fixture(autouse=True)
def openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_openai_env(monkeypatch, KEY_ENV, "null-usage-key")


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as running:
        yield running


def workflow(url: str, steps: str, *, head: str = "", prices: bool = True) -> str:
    priced = ", prices: {m1: {input_per_mtok: 1.0, output_per_mtok: 2.0}}" if prices else ""
    return (
        f"name: nullusage\nrunner: openai\nrunners:\n"
        f"  openai: {{base_url: '{url}', api_key_env: {KEY_ENV}, model: m1{priced}}}\n"
        f"{head}steps:\n{textwrap.indent(textwrap.dedent(steps).strip(), '  ')}\n"
    )


def work(engine: Engine, run_id: str) -> list[AttemptRow]:
    return [a for a in engine.attempts(run_id) if a.phase == "work"]


# -- the journal and the frames ------------------------------------------------------------------
def test_a_server_without_usage_journals_null_tokens_and_a_null_cost(
    engine: Engine, server: FakeChatServer, state_dir: Path
) -> None:
    # (A stream without usage reads the same at the runner: tests/test_openai_usage.py.)
    server.push_reply("x" * 40, **NO_USAGE)
    run = engine.run(workflow(server.url, "- {id: a, prompt: " + "y" * 80 + "}"))
    assert run.status == "completed", run.reason
    (attempt,) = work(engine, run.run_id)
    assert (attempt.tokens_in, attempt.tokens_out, attempt.cost) == (None, None, None)
    assert db_rows(state_dir, "SELECT tokens_in, tokens_out, cost FROM attempts") == [
        (None, None, None)
    ]
    frame = engine.journal(run.run_id)
    assert str(frame["tokens_in"].dtype) == "Int64" and str(frame["tokens_out"].dtype) == "Int64"
    assert frame["tokens_in"].isna().tolist() == [True]
    assert frame["tokens_out"].isna().tolist() == [True]
    assert run.budget_use().tokens == 0  # no token ceiling: nothing is charged


def test_one_unreported_count_is_null_and_the_other_kept(
    engine: Engine, server: FakeChatServer
) -> None:
    body = completion_body("x" * 40)
    body["usage"] = {"prompt_tokens": 7, "completion_tokens": None}
    server.push(200, body)
    run = engine.run(workflow(server.url, "- {id: a, prompt: hi}"))
    (attempt,) = work(engine, run.run_id)
    assert (attempt.tokens_in, attempt.tokens_out, attempt.cost) == (7, None, None)


def test_sums_skip_unknown_counts(engine: Engine, server: FakeChatServer) -> None:
    server.push_reply("known", prompt_tokens=11, completion_tokens=4)
    server.push_reply("unknown", **NO_USAGE)
    run = engine.run(
        workflow(server.url, "- {id: a, prompt: one}\n- {id: b, prompt: two}", prices=False)
    )
    assert run.status == "completed", run.reason
    frame = engine.journal(run.run_id)
    assert frame["tokens_in"].tolist() == [11, pd.NA]
    assert int(frame["tokens_in"].sum()) == 11 and int(frame["tokens_out"].sum()) == 4
    by_step = engine.tokens(run.run_id, by="step").set_index("step")
    assert str(by_step["tokens_in"].dtype) == "Int64"
    assert int(by_step.loc["a", "tokens"]) == 15
    assert by_step.loc["b", "tokens"] is pd.NA
    assert run.budget_use().tokens == 15


def test_an_attempt_with_unknown_usage_shows_question_marks_not_numbers(
    engine: Engine, server: FakeChatServer
) -> None:
    server.push_reply("x", **NO_USAGE)
    run = engine.run(workflow(server.url, "- {id: a, prompt: hi}"))
    text = record_text(run.attempt("a"))
    assert "?+? tokens" in text and "None" not in text.splitlines()[0]


# -- budgets -------------------------------------------------------------------------------------
def test_a_token_ceiling_charges_each_unknown_attempt_its_offer_and_holds(
    engine: Engine, server: FakeChatServer, state_dir: Path
) -> None:
    server.default = lambda request: _no_usage(request)
    src = workflow(
        server.url,
        """
        - id: fan
          map: "{{ range(12) | list }}"
          prompt: "item {{ item }}"
        """,
        head="budget: {max_tokens: 1000}\nexecution: {max_concurrency: 1}\n",
    )
    run = engine.run(src)
    offers = [int(r.body["max_tokens"]) for r in server.requests]
    assert run.status == "failed" and "max_tokens" in (run.reason or "")
    assert sum(offers) >= 1000 and sum(offers[:-1]) < 1000  # the ceiling bound, then stopped
    assert run.budget_use().tokens == sum(offers)
    assert db_rows(
        state_dir, "SELECT COUNT(*) FROM attempts WHERE tokens_in IS NULL AND status = 'succeeded'"
    ) == [(len(offers),)]
    # The charge is journaled with each attempt: a fresh engine (a resume) reads the same use.
    with Engine(state_dir) as fresh:
        assert fresh.handle(run.run_id).budget_use().tokens == sum(offers)
        frame = fresh.budget(run.run_id).set_index("ceiling")
        assert frame.loc["tokens", "used"] == sum(offers)


def _no_usage(request: Any) -> Any:
    from tests.openai_server import ScriptedResponse

    return ScriptedResponse(200, completion_body("ok", **NO_USAGE))


@settings(max_examples=200, deadline=None)
@given(
    tokens_in=st.none() | st.integers(min_value=0, max_value=10**9),
    tokens_out=st.none() | st.integers(min_value=0, max_value=10**9),
    offer=st.none() | st.integers(min_value=0, max_value=10**9),
)
def test_the_unknown_usage_charge(
    tokens_in: int | None, tokens_out: int | None, offer: int | None
) -> None:
    charge = unknown_usage_charge(tokens_in, tokens_out, offer)
    if tokens_in is not None and tokens_out is not None:
        assert charge is None  # known counts are charged as they are
    else:
        assert charge == (tokens_in or 0) + (tokens_out or 0) + (offer or 0)


@pytest.mark.parametrize(
    ("tokens_in", "tokens_out", "problem"),
    [
        (None, None, None),
        (3, None, None),
        (None, -1, "tokens_out is -1, expected a whole number from 0"),
        (float("nan"), None, "tokens_in is nan, expected a whole number from 0"),
        ("3", None, "tokens_in is a str, expected a whole number or None"),
        (True, 0, "tokens_in is a bool, expected a whole number or None"),
    ],
)
def test_a_runner_may_report_none_but_nothing_else_odd(
    tokens_in: Any, tokens_out: Any, problem: str | None
) -> None:
    result = UnitResult(output="x", tokens_in=tokens_in, tokens_out=tokens_out)
    assert result_problem(result) == problem


# -- states journaled before m022 ----------------------------------------------------------------
def test_a_state_from_before_m022_upgrades_with_its_counts_and_accepts_null(
    state_dir: Path, backend: str, server: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = migrations.migration_ids().index("m022_null_usage")
    server.push_reply("old", prompt_tokens=5, completion_tokens=2)
    with monkeypatch.context() as before_m022:
        before_m022.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:at])
        before_m022.setattr(pgschema, "MIGRATIONS", pgschema.MIGRATIONS[:at])
        with Engine(state_dir) as old:
            before = old.run(workflow(server.url, "- {id: a, prompt: old}"))
            assert before.status == "completed", before.reason
            old_events = old.events(before.run_id)[["kind", "unit"]].values.tolist()
    assert _nullable(state_dir, backend) == {"tokens_in": False, "tokens_out": False}
    # The upgrade is a new wf_magic process: it has not checked this schema's ledger yet.
    monkeypatch.setattr(pgopen, "_migrated", set())

    server.push_reply("new", **NO_USAGE)
    with Engine(state_dir) as new:
        after = new.run(workflow(server.url, "- {id: a, prompt: new}"), new=True)
        assert after.status == "completed", after.reason
        assert _nullable(state_dir, backend) == {"tokens_in": True, "tokens_out": True}
        (kept,) = work(new, before.run_id)
        assert (kept.tokens_in, kept.tokens_out) == (5, 2)
        assert new.events(before.run_id)[["kind", "unit"]].values.tolist() == old_events
        (fresh,) = work(new, after.run_id)
        assert (fresh.tokens_in, fresh.tokens_out) == (None, None)
        kinds = new.events(after.run_id)["kind"].tolist()
        assert "unit_started" in kinds and "unit_finished" in kinds
    ledger = [r[0] for r in db_rows(state_dir, "SELECT id FROM schema_migrations")]
    assert "m022_null_usage" in ledger
    # A finished attempt stays immutable after the rebuild (its trigger was made again).
    with pytest.raises(Exception, match="append-only"):
        db_rows(state_dir, "UPDATE attempts SET tokens_in = 1 WHERE tokens_in IS NULL")


def _nullable(state_dir: Path, backend: str) -> dict[str, bool]:
    if backend == "postgresql":
        rows = db_rows(
            state_dir,
            "SELECT column_name, is_nullable FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = 'attempts'"
            " AND column_name IN ('tokens_in', 'tokens_out')",
        )
        return {str(name): flag == "YES" for name, flag in rows}
    rows = db_rows(state_dir, "SELECT name, \"notnull\" FROM pragma_table_info('attempts')")
    return {str(n): not f for n, f in rows if n in ("tokens_in", "tokens_out")}
