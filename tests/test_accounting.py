"""Accounting on real runs (DESIGN.md §5): the journal, tokens and budget frames, CLI, plots."""

from __future__ import annotations

import io
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from wf_magic import Engine, Run
from wf_magic.store.frames import JOURNAL_COLUMNS

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

# An outline rejected once by an llm judge (loop 2 sees the feedback), a map of three drafts on
# another model, and an exec unit (no model, no tokens): every kind of row a ledger has.
LEDGER = """
name: ledger
budget: {max_units: 20, max_tokens: 5000}
runner: scripted
runners:
  scripted:
    rules:
      - {match: '"thin"', kind: judge, tokens_in: 30, tokens_out: 5,
         reply: {complete: false, feedback: "more depth", missing: [depth]}}
      - {match: "Judge", kind: judge, tokens_in: 25, tokens_out: 4,
         reply: {complete: true, feedback: "", missing: []}}
      - {match: "Gate feedback", reply: deep, tokens_in: 12, tokens_out: 6}
      - {match: "^Outline", reply: thin, tokens_in: 10, tokens_out: 3}
      - {match: "^Draft (\\\\w)", reply: "draft {{ groups[1] }}", tokens_in: 8, tokens_out: 4}
steps:
  - id: outline
    prompt: "Outline the topic"
    model: small-model
    gate: {judge: llm, criteria: [deep], max_loops: 2}
  - id: draft
    map: "{{ ['a', 'b', 'c'] }}"
    prompt: "Draft {{ item }}"
    model: big-model
  - id: check
    exec: [PYTHON, -c, "print('ok')"]
    cache: true
""".replace("PYTHON", json.dumps(sys.executable))

JOURNAL_DTYPES = {
    "run": "string", "step": "string", "unit": "string", "attempt": "Int64",
    "dispatch_id": "string", "phase": "string", "runner": "string", "model": "string",
    "status": "string", "input_hash": "string", "tokens_in": "Int64", "tokens_out": "Int64",
    "cost": "float64", "reused_from": "string", "started_at": "datetime64[ns, UTC]",
    "finished_at": "datetime64[ns, UTC]", "duration_s": "float64", "failure": "string",
    "loop": "Int64", "charged": "boolean", "saved_tokens": "Int64", "session_id": "string",
    "reused_from_run": "string", "reused_from_unit": "string", "verdict": "string",
}  # fmt: skip
# (unit, phase, loop, attempt, runner, model, status, tokens_in, tokens_out, charged)
FIRST_RUN_ROWS = [
    ("outline", "work", 1, 1, "scripted", "small-model", "succeeded", 10, 3, True),
    ("outline.gate:l1", "gate", 1, 1, "scripted", "small-model", "succeeded", 30, 5, False),
    ("outline", "work", 2, 2, "scripted", "small-model", "succeeded", 12, 6, True),
    ("outline.gate:l2", "gate", 2, 1, "scripted", "small-model", "succeeded", 25, 4, False),
    ("draft[0]", "work", 1, 1, "scripted", "big-model", "succeeded", 8, 4, True),
    ("draft[1]", "work", 1, 1, "scripted", "big-model", "succeeded", 8, 4, True),
    ("draft[2]", "work", 1, 1, "scripted", "big-model", "succeeded", 8, 4, True),
    ("check", "work", 1, 1, "exec", None, "succeeded", 0, 0, True),
]


@pytest.fixture
def ledger(engine: Engine) -> Iterator[Run]:
    run = engine.run(LEDGER)
    assert run.status == "completed", run.reason
    yield run


def plain(value: object) -> object:
    """A frame cell as a plain Python value (<NA>/NaN/NaT → None)."""
    if value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def journal_rows(frame: pd.DataFrame) -> list[tuple[object, ...]]:
    columns = [
        "unit",
        "phase",
        "loop",
        "attempt",
        "runner",
        "model",
        "status",
        "tokens_in",
        "tokens_out",
        "charged",
    ]
    return [tuple(plain(v) for v in row) for row in frame[columns].itertuples(index=False)]


# -- the journal ------------------------------------------------------------------------------
def test_journal_of_a_real_run_has_the_documented_columns_and_dtypes(
    engine: Engine, ledger: Run
) -> None:
    frame = engine.journal(ledger.run_id)
    assert list(frame.columns) == list(JOURNAL_COLUMNS) == list(JOURNAL_DTYPES)
    assert {c: str(t) for c, t in frame.dtypes.items()} == JOURNAL_DTYPES
    assert journal_rows(frame) == FIRST_RUN_ROWS
    pd.testing.assert_frame_equal(ledger.journal(), frame)


def test_journal_figures_match_the_attempt_rows(engine: Engine, ledger: Run) -> None:
    frame = engine.journal(ledger.run_id)
    attempts = engine.attempts(ledger.run_id)
    assert len(frame) == len(attempts) == 8
    for row, a in zip(frame.itertuples(index=False), attempts, strict=True):
        assert (row.run, row.step, row.unit, row.attempt, row.dispatch_id, row.phase) == (
            a.run_id,
            a.step_id,
            a.unit_id,
            a.attempt,
            a.dispatch_id,
            a.phase,
        )
        assert (row.runner, plain(row.model), row.status, row.input_hash) == (
            a.runner,
            a.model,
            a.status,
            a.input_hash,
        )
        assert (row.tokens_in, row.tokens_out, plain(row.cost), plain(row.reused_from)) == (
            a.tokens_in,
            a.tokens_out,
            a.cost,
            a.reused_from,
        )
        assert (plain(row.failure), row.loop, row.charged, row.saved_tokens) == (
            a.failure,
            a.loop,
            bool(a.charged),
            a.saved_tokens,
        )
        assert a.finished_at is not None
        assert abs(row.started_at.timestamp() - a.started_at) < 1e-6
        assert abs(row.finished_at.timestamp() - a.finished_at) < 1e-6
        assert row.duration_s == pytest.approx(a.finished_at - a.started_at, abs=1e-6)


def test_reused_attempts_show_zero_tokens_their_source_and_what_they_saved(
    engine: Engine, ledger: Run
) -> None:
    again = engine.run(LEDGER, new=True)
    assert again.status == "completed"
    frame = engine.journal(again.run_id)
    sources = dict(
        zip(
            engine.journal(ledger.run_id)["unit"]
            + "@"
            + engine.journal(ledger.run_id)["loop"].astype(str),
            engine.journal(ledger.run_id)["dispatch_id"],
            strict=True,
        )
    )
    rows = [
        (
            r.unit,
            r.loop,
            r.status,
            r.tokens_in + r.tokens_out,
            r.charged,
            r.saved_tokens,
            plain(r.reused_from),
        )
        for r in frame.itertuples(index=False)
    ]
    assert rows == [
        ("outline", 1, "reused", 0, False, 13, sources["outline@1"]),
        # an unchanged judge input reuses its llm verdict too (never a person's)
        ("outline.gate:l1", 1, "reused", 0, False, 35, sources["outline.gate:l1@1"]),
        ("outline", 2, "reused", 0, False, 18, sources["outline@2"]),
        ("outline.gate:l2", 2, "reused", 0, False, 29, sources["outline.gate:l2@2"]),
        ("draft[0]", 1, "reused", 0, False, 12, sources["draft[0]@1"]),
        ("draft[1]", 1, "reused", 0, False, 12, sources["draft[1]@1"]),
        ("draft[2]", 1, "reused", 0, False, 12, sources["draft[2]@1"]),
        ("check", 1, "reused", 0, False, 0, sources["check@1"]),
    ]
    assert again.stats is not None and (again.stats.reused, again.stats.saved_tokens) == (8, 131)
    everything = engine.journal()
    assert len(everything) == 16
    assert everything["run"].tolist() == [ledger.run_id] * 8 + [again.run_id] * 8


# -- tokens -----------------------------------------------------------------------------------
def test_tokens_by_step_sum_to_the_journal_tokens(engine: Engine, ledger: Run) -> None:
    journal = engine.journal(ledger.run_id)
    tokens = engine.tokens(ledger.run_id, by="step")
    assert list(tokens.columns) == [
        "step",
        "attempts",
        "tokens_in",
        "tokens_out",
        "tokens",
        "cost",
        "saved_tokens",
        "tokens_paid",
        "tokens_reused",
        "tokens_judge",
    ]
    assert [
        (r.step, r.attempts, r.tokens_in, r.tokens_out, r.tokens, r.saved_tokens)
        for r in tokens.itertuples(index=False)
    ] == [("outline", 4, 77, 18, 95, 0), ("draft", 3, 24, 12, 36, 0), ("check", 1, 0, 0, 0, 0)]
    per_step = (
        (journal["tokens_in"] + journal["tokens_out"]).groupby(journal["step"], sort=False).sum()
    )
    assert tokens.set_index("step")["tokens"].to_dict() == per_step.to_dict()
    assert tokens["tokens"].sum() == (journal["tokens_in"] + journal["tokens_out"]).sum() == 131
    assert tokens["cost"].isna().all()  # the scripted runner reports no cost
    pd.testing.assert_frame_equal(ledger.tokens(), tokens)


@pytest.mark.parametrize(
    ("by", "expected"),
    [
        ("model", [("small-model", 4, 95), ("big-model", 3, 36), (None, 1, 0)]),
        ("runner", [("scripted", 7, 131), ("exec", 1, 0)]),
        ("loop", [(1, 6, 84), (2, 2, 47)]),
    ],
)
def test_tokens_by_model_runner_and_loop(
    engine: Engine, ledger: Run, by: str, expected: list[tuple[object, int, int]]
) -> None:
    tokens = engine.tokens(ledger.run_id, by=by)
    assert list(tokens.columns)[0] == by
    assert [(plain(r[0]), r[1], r[4]) for r in tokens.itertuples(index=False)] == expected
    journal = engine.journal(ledger.run_id)
    assert tokens["attempts"].sum() == len(journal)
    assert tokens["tokens"].sum() == (journal["tokens_in"] + journal["tokens_out"]).sum()


def test_tokens_by_run_across_runs_report_saved_tokens(engine: Engine, ledger: Run) -> None:
    again = engine.run(LEDGER, new=True)
    tokens = engine.tokens(by="run")
    assert [
        (r.run, r.attempts, r.tokens, r.saved_tokens) for r in tokens.itertuples(index=False)
    ] == [(ledger.run_id, 8, 131, 0), (again.run_id, 8, 0, 131)]  # judges reused too


# -- budget -----------------------------------------------------------------------------------
def test_budget_frame_reports_used_against_limit(engine: Engine, ledger: Run) -> None:
    # Charged: outline ×2, three drafts, the exec unit; judges are free.
    expected = pd.DataFrame(
        {
            "ceiling": pd.array(["units", "tokens", "cost"], dtype="string"),
            "used": [6.0, 67.0, 0.0],
            "limit": [20.0, 5000.0, math.nan],
            "remaining": [14.0, 4933.0, math.nan],
            "used_fraction": [0.3, 67 / 5000, math.nan],
            "saved": [0.0, 0.0, 0.0],
            "judge": [2.0, 64.0, 0.0],  # the two free verdicts (35 + 29), beside it
        }
    )
    pd.testing.assert_frame_equal(engine.budget(ledger.run_id), expected)
    pd.testing.assert_frame_equal(ledger.budget(), expected)
    journal = engine.journal(ledger.run_id)
    charged = journal[journal["charged"]]
    assert len(charged) == 6
    assert (charged["tokens_in"] + charged["tokens_out"]).sum() == 67
    use = ledger.budget_use()
    assert (use.units, use.tokens, use.max_units, use.max_tokens) == (6, 67, 20, 5000)

    again = engine.run(LEDGER, new=True)
    frame = engine.budget(again.run_id)
    assert frame["used"].tolist() == [0.0, 0.0, 0.0]
    assert frame["saved"].tolist() == [6.0, 131.0, 0.0]  # 6 work units; tokens incl. judges


# -- the CLI ----------------------------------------------------------------------------------
def wf(state_dir: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from wf_magic.cli import main

    capsys.readouterr()
    code = main(["--db", str(state_dir), *args])
    return code, capsys.readouterr().out


def test_wf_journal_csv_parses_back_to_the_same_rows(
    state_dir: Path, engine: Engine, ledger: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = wf(state_dir, capsys, "journal", ledger.run_id, "--format", "csv")
    assert code == 0
    parsed = pd.read_csv(io.StringIO(out))
    journal = engine.journal(ledger.run_id)
    assert len(parsed) == len(journal) == 8
    assert list(parsed.columns) == list(JOURNAL_COLUMNS)
    assert parsed["dispatch_id"].tolist() == journal["dispatch_id"].tolist()
    assert parsed["tokens_in"].tolist() == journal["tokens_in"].tolist()


def test_wf_journal_json_is_valid_json_with_one_record_per_attempt(
    state_dir: Path, ledger: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = wf(state_dir, capsys, "journal", ledger.run_id, "--format", "json")
    assert code == 0
    records = json.loads(out)
    assert [list(r) for r in records] == [list(JOURNAL_COLUMNS)] * 8
    assert [(r["unit"], r["model"], r["tokens_in"]) for r in records][-2:] == [
        ("draft[2]", "big-model", 8),
        ("check", None, 0),
    ]


def test_wf_tokens_by_step_as_a_table(
    state_dir: Path, ledger: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = wf(state_dir, capsys, "tokens", ledger.run_id, "--by", "step", "--format", "table")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "step",
        "attempts",
        "tokens_in",
        "tokens_out",
        "tokens",
        "cost",
        "saved_tokens",
        "tokens_paid",
        "tokens_reused",
        "tokens_judge",
    ]
    assert [line.split()[:5] for line in lines[1:]] == [
        ["outline", "4", "77", "18", "95"],
        ["draft", "3", "24", "12", "36"],
        ["check", "1", "0", "0", "0"],
    ]


# -- plots ------------------------------------------------------------------------------------
def test_timeline_of_a_real_run_has_one_bar_per_attempt(engine: Engine, ledger: Run) -> None:
    pytest.importorskip("matplotlib")
    from wf_magic.plots import GATE_HATCH, timeline, token_chart

    journal = engine.journal(ledger.run_id)
    fig = timeline(ledger)
    (bars,) = fig.axes[0].containers
    assert len(bars.patches) == len(journal) == 8
    assert [bar.get_gid() for bar in bars.patches] == journal["dispatch_id"].tolist()
    assert [bar.get_hatch() == GATE_HATCH for bar in bars.patches] == (
        journal["phase"] == "gate"
    ).tolist()

    chart = token_chart(ledger, by="step")
    paid, judge, reused = chart.axes[0].containers
    tokens = engine.tokens(ledger.run_id, by="step")
    assert [bar.get_height() for bar in paid.patches] == tokens["tokens_paid"].tolist()
    assert [bar.get_height() for bar in judge.patches] == tokens["tokens_judge"].tolist()
    assert [bar.get_height() for bar in reused.patches] == [0, 0, 0]
    # paid + judge is every token the runners reported (95, 36, 0 by step)
    assert [p.get_height() + j.get_height() for p, j in zip(paid, judge, strict=True)] == [
        95,
        36,
        0,
    ]
