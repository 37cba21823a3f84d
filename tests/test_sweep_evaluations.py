"""A real sweep with two scorers read end to end: ``summary``, ``paired``, ``side_by_side``,
the sweep-wide ``tokens`` and ``latency`` by role, and ``wf sweep-summary`` (formats, exit
codes)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers_flow import run_cli
from wf_magic import Engine
from wf_magic.errors import UsageError

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

WORKFLOW = """
name: eval-demo
params:
  model: {type: string, default: m1}
  question: {type: string, default: "?"}
  expected: {type: string, default: "?"}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "Score the output", reply: '{"value": 4, "explanation": "close"}',
         tokens_in: 5, tokens_out: 3}
      - {match: "m2.*France", reply: "paris", tokens_in: 4, tokens_out: 1}
      - {match: "France", reply: "Paris", tokens_in: 4, tokens_out: 1}
      - {match: "ocean", reply: "=HYPERLINK(\\"x\\") <b>Pacific</b>", tokens_in: 4, tokens_out: 2}
      - {match: ".*", reply: "Four", tokens_in: 4, tokens_out: 1}
steps:
  - id: answer
    model: "{{ params.model }}"
    prompt: "On {{ params.model }} answer in one word: {{ params.question }}"
    score:
      - {name: exact, equals: "{{ params.expected }}"}
      - {name: quality, judge: llm, rubric: "How correct is it, given {{ params.expected }}?",
         scale: [1, 5]}
"""
ROWS = "question,expected\nCapital of France?,Paris\n=2+2?,Four\nLargest ocean?,Pacific\n"


@pytest.fixture
def swept(tmp_path: Path, state_dir: Path) -> tuple[Engine, str, Path]:
    (tmp_path / "wf.yaml").write_text(WORKFLOW)
    (tmp_path / "rows.csv").write_text(ROWS)
    engine = Engine(state_dir)
    sweep = engine.sweep(
        tmp_path / "wf.yaml", grid={"model": ["m1", "m2"]}, rows=tmp_path / "rows.csv"
    )
    assert sweep.status == "completed"
    return engine, sweep.sweep_id, state_dir


def test_summary_per_model_and_score(swept: tuple[Engine, str, Path]) -> None:
    engine, sweep_id, _ = swept
    sweep = engine.sweep_handle(sweep_id)
    table = sweep.summary(by="model")
    assert list(table[["model", "score"]].itertuples(index=False, name=None)) == [
        ("m1", "answer.exact"),
        ("m1", "answer.quality"),
        ("m2", "answer.exact"),
        ("m2", "answer.quality"),
    ]
    exact = table[table["score"] == "answer.exact"].set_index("model")
    # m1: Paris, Four, "=HYPERLINK..." → 1, 1, 0; m2: paris (not equal), Four, … → 0, 1, 0
    assert exact.loc["m1", "mean"] == pytest.approx(2 / 3)
    assert exact.loc["m2", "mean"] == pytest.approx(1 / 3)
    assert list(table["n"]) == [3, 3, 3, 3] and list(table["missing"]) == [0, 0, 0, 0]
    quality = table[table["score"] == "answer.quality"]
    assert list(quality["mean"]) == [4.0, 4.0]
    frame = sweep.frame()
    for model, group in frame.groupby("model"):
        assert exact.loc[model, "tokens_paid"] == group["tokens_paid"].sum()
    assert (table["latency_p50"] >= 0).all() and (
        table["latency_p90"] >= table["latency_p50"]
    ).all()
    assert "cluster bootstrap" in table.attrs["ci_method"]
    whole = sweep.summary()
    assert list(whole.columns[:2]) == ["score", "n"] and list(whole["n"]) == [6, 6]


def test_paired_models_on_the_exact_score(swept: tuple[Engine, str, Path]) -> None:
    engine, sweep_id, _ = swept
    result = engine.sweep_handle(sweep_id).paired(
        a={"model": "m1"}, b={"model": "m2"}, score="answer.exact"
    )
    assert (result.n_pairs, result.unpaired, result.missing) == (3, 0, 0)
    assert (result.wins, result.ties, result.losses) == (1, 2, 0)
    assert result.mean_difference == pytest.approx(1 / 3)
    assert result.p_value == pytest.approx(1.0)  # one of 3 rows differs: 4 of 8 flips tie it
    with pytest.raises(UsageError, match="which no cell has"):
        engine.sweep_handle(sweep_id).paired(
            a={"model": "m1"}, b={"model": "m3"}, score="answer.exact"
        )


def test_side_by_side_shows_the_rows_fields_and_escapes_outputs(
    swept: tuple[Engine, str, Path],
) -> None:
    engine, sweep_id, _ = swept
    sweep = engine.sweep_handle(sweep_id)
    view = sweep.side_by_side(columns="model", score="answer.exact")
    assert view.keys == ["row", "expected", "question"]  # as the frame has them
    assert view.variants == ["m1", "m2"]
    page = view._repr_html_()
    assert "Capital of France?" in page and "&lt;b&gt;Pacific&lt;/b&gt;" in page
    assert "<b>Pacific</b>" not in page
    different = sweep.side_by_side(columns="model", index="question", only="different")
    assert [key for key, _ in different.rows] == [(0, "Capital of France?")]
    assert different.frame().loc[0, ("m2", "output")].item() == "paris"
    assert sweep.side_by_side(columns="model", only="failed").rows == []


def test_tokens_and_latency_over_all_cells_by_role(swept: tuple[Engine, str, Path]) -> None:
    engine, sweep_id, _ = swept
    sweep = engine.sweep_handle(sweep_id)
    by_step = sweep.tokens(by="step")
    assert list(by_step[["step", "role", "attempts"]].itertuples(index=False, name=None)) == [
        ("answer", "work", 6),
        ("answer", "scorer", 12),
    ]
    work = by_step.iloc[0]
    assert (work["tokens"], work["tokens_paid"]) == (6 * 4 + 8, sweep.totals()["tokens"])
    scorer = by_step.iloc[1]
    assert scorer["tokens_paid"] == 0 and scorer["tokens_judge"] == scorer["tokens"] > 0
    by_model = sweep.tokens(by="model")
    assert set(by_model["model"].dropna()) == {"m1", "m2"}
    by_axis = sweep.tokens(by="model_axis")
    assert list(by_axis["model_axis"].unique()) == ["m1", "m2"]
    assert by_axis["tokens"].sum() == by_step["tokens"].sum()
    by_phase = sweep.tokens(by="phase")
    assert set(by_phase["phase"]) == {"work", "score"}
    latency = sweep.latency(by="model_axis")
    assert list(latency.columns) == ["model_axis", "role", "count", "p50", "p90", "p99"]
    assert latency["count"].sum() == len(
        sweep.attempts().query("status in ['succeeded', 'failed']")
    )
    assert (latency["p99"] >= latency["p50"]).all()
    with pytest.raises(UsageError, match="by is one of step, model, phase, runner, model_axis"):
        sweep.tokens(by="colour")


def test_wf_sweep_summary_formats_and_exit_codes(
    swept: tuple[Engine, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    engine, sweep_id, state = swept
    engine.close()
    assert run_cli(state, "sweep-summary", sweep_id, "--by", "model", "--format", "json") == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["model"], r["score"], r["n"]) for r in records] == [
        ("m1", "answer.exact", 3),
        ("m1", "answer.quality", 3),
        ("m2", "answer.exact", 3),
        ("m2", "answer.quality", 3),
    ]
    assert run_cli(state, "sweep-summary", sweep_id[:8], "--format", "csv") == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["score"] for r in rows] == ["answer.exact", "answer.quality"]
    assert run_cli(state, "sweep-summary", sweep_id, "--by", "model", "--by", "question") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["model", "question", "score"]
    assert out.splitlines()[-1].startswith("interval: cluster bootstrap")
    for spelled in (["--by", "model", "question"], ["--by", "model,question"]):
        assert run_cli(state, "sweep-summary", sweep_id, *spelled) == 0
        assert capsys.readouterr().out == out, spelled
    assert run_cli(state, "sweep-summary", sweep_id, "--by", "question", "--format", "csv") == 0
    cells = [r["question"] for r in csv.DictReader(io.StringIO(capsys.readouterr().out))]
    assert "'=2+2?" in cells  # a formula-like cell is escaped (display/spreadsheet.py)
    assert run_cli(state, "sweep-summary", sweep_id, "--by", "question", "--format", "json") == 0
    assert "=2+2?" in [r["question"] for r in json.loads(capsys.readouterr().out)]
    assert run_cli(state, "sweep-frame", sweep_id, "--format", "json") == 0
    frame = json.loads(capsys.readouterr().out)
    assert [(r["question"], r["score.answer.exact"]) for r in frame][:3] == [
        ("Capital of France?", 1.0),
        ("=2+2?", 1.0),
        ("Largest ocean?", 0.0),
    ]
    assert run_cli(state, "sweep-summary", sweep_id, "--by", "colour") == 2
    assert "sweep summary by: 'colour' is not an axis or row field" in capsys.readouterr().err
    assert run_cli(state, "sweep-summary", "sw-nothing") == 2
    with pytest.raises(SystemExit) as exited:
        run_cli(state, "sweep-summary", sweep_id, "--format", "xml")
    assert exited.value.code == 2


def test_wf_sweep_summary_refuses_a_sweep_without_scores(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "wf.yaml").write_text(
        "name: plain\nparams: {model: {type: string, default: m1}}\nrunner: scripted\n"
        "steps:\n  - id: a\n    prompt: 'hi {{ params.model }}'\n"
    )
    state = state_dir
    assert (
        run_cli(state, "sweep", str(tmp_path / "wf.yaml"), "--grid", "model=m1,m2", "--quiet") == 0
    )
    sweep_id = capsys.readouterr().out.split()[1]
    assert run_cli(state, "sweep-summary", sweep_id) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: sweep summary: this sweep has no scores (no score.<step>.<name> column); "
        "add a score: list to a step (docs/evaluations.md)"
    )


PARENT = """
name: parent
params:
  model: {type: string, default: m1}
runner: scripted
runners:
  scripted:
    rules:
      - {match: '^kid', reply: "kid says hi", tokens_in: 7, tokens_out: 1}
      - {match: '.*', reply: "top", tokens_in: 2, tokens_out: 1}
steps:
  - id: top
    prompt: "top {{ params.model }}"
  - id: sub
    workflow: kid
    with: {model: "{{ params.model }}"}
---
name: kid
params:
  model: {type: string}
runners:
  scripted:
    rules:
      - {match: '^kid', reply: "kid says hi", tokens_in: 7, tokens_out: 1}
steps:
  - id: inner
    prompt: "kid {{ params.model }}"
"""


def test_tokens_count_the_child_runs_of_each_cell(tmp_path: Path, state_dir: Path) -> None:
    (tmp_path / "wf.yaml").write_text(PARENT)
    engine = Engine(state_dir)
    sweep = engine.sweep(tmp_path / "wf.yaml", grid={"model": ["m1", "m2"]})
    assert sweep.status == "completed"
    by_step = sweep.tokens(by="step").set_index("step")
    assert by_step.loc["inner", "attempts"] == 2 and by_step.loc["inner", "tokens"] == 16
    assert by_step.loc["top", "tokens"] == 6
    attempts = sweep.attempts()
    inner = attempts[attempts["step"] == "inner"]
    assert inner["model_axis"].tolist() == ["m1", "m2"] and inner["cell"].tolist() == [0, 1]
    assert sweep.latency(by="model_axis")["count"].sum() == len(attempts)


def test_a_stopped_sweep_reads_its_pending_cells_as_missing(
    tmp_path: Path, state_dir: Path
) -> None:
    (tmp_path / "wf.yaml").write_text(WORKFLOW)
    (tmp_path / "rows.csv").write_text(ROWS)
    engine = Engine(state_dir)
    sweep = engine.sweep(
        tmp_path / "wf.yaml",
        grid={"model": ["m1", "m2"]},
        rows=tmp_path / "rows.csv",
        budget={"max_units": 4},
    )
    assert sweep.status == "stopped"
    table = sweep.summary(by="model").set_index(["model", "score"])
    assert (
        table.loc[("m2", "answer.exact"), "missing"] == 3 - table.loc[("m2", "answer.exact"), "n"]
    )
    assert int(table["n"].sum() + table["missing"].sum()) == 12
    result = sweep.paired(a={"model": "m1"}, b={"model": "m2"}, score="answer.exact")
    assert result.n_pairs + result.missing == 3 and result.missing >= 1
    assert set(result.excluded_frame()["side"]) <= {"b", "both"}
    failed = sweep.side_by_side(columns="model", only="failed")
    assert len(failed.rows) == result.missing
    assert sweep.tokens(by="model_axis")["attempts"].sum() == len(sweep.attempts())


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.summary(by=123), "sweep summary: by is an axis or row field name"),
        (lambda s: s.summary(by=None), "sweep summary: by is an axis or row field name"),
        (lambda s: s.summary(by=["model", "model"]), "sweep summary: by names model twice"),
        (lambda s: s.summary(confidence=True), "sweep summary: confidence is a level in"),
        (
            lambda s: s.paired(a={"model": "m1"}, b={"model": "m2"}, score=None),
            "sweep paired: score names one score",
        ),
        (
            lambda s: s.paired(a={"model": "m1"}, b={"model": "m2"}, score="a.b", confidence=0.3),
            "sweep paired: confidence is a level in [0.5, 1) (got 0.3)",
        ),
        (
            lambda s: s.paired(a={"model": "m1"}, b={"model": "m2"}, score="a.b", resamples=5),
            "sweep paired: resamples is a count of at least 100",
        ),
    ],
)
def test_summary_and_paired_refuse_bad_arguments_in_one_line(
    tmp_path: Path, call: Any, message: str
) -> None:
    with Engine(tmp_path / "state") as engine:
        sweep = engine.sweep(
            "name: e\nparams:\n  model: {type: string}\nrunner: scripted\nsteps:\n"
            "  - id: a\n    prompt: 'x {{ params.model }}'\n    score:\n"
            "      - {name: b, contains: x}\n",
            grid={"model": ["m1", "m2"]},
        )
        with pytest.raises(UsageError) as info:
            call(sweep)
        assert str(info.value).startswith(message), str(info.value)
