"""Frames carry scores and rows (issue 34 item 2): ``run.journal()`` shows score units,
``run.scores()`` is one row per score, the sweep frame has ``score.<step>.<name>`` and one
column per rows-file field; m019 keeps an older journal whole on both backends."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import db_rows, wf_inproc
from tests.test_unit_events import legacy_state
from wf_magic import Engine
from wf_magic.store.scoreframes import SCORE_COLUMNS

FLOW = """
name: quiz
params:
  question: {type: string}
  expected: {type: string}
  style: {type: string, default: terse}
runners:
  scripted:
    rules:
      - match: "Score the output"
        reply: {value: 3, explanation: "fine"}
      - match: "France"
        reply: "Paris"
      - match: "Japan"
        reply: "Kyoto"
steps:
  - id: answer
    prompt: "{{ params.style }}: {{ params.question }}"
    score:
      - {name: exact, equals: "{{ params.expected }}"}
      - {name: quality, judge: llm, rubric: "Right, given {{ params.expected }}?", scale: [1, 5]}
  - id: letters
    map: "{{ steps.answer.output | list }}"
    prompt: "letter {{ item }}"
    score:
      - {name: upper, regex: "letter [A-Z]$"}
"""


def test_run_scores_is_one_row_per_score_with_typed_columns(engine: Engine) -> None:
    run = engine.run(FLOW, params={"question": "Capital of France?", "expected": "Paris"})

    frame = run.scores()
    assert tuple(frame.columns) == SCORE_COLUMNS
    assert {c: str(t) for c, t in frame.dtypes.items()} == {
        "run": "string",
        "step": "string",
        "name": "string",
        "item": "Int64",
        "value": "float64",
        "explanation": "string",
        "unit": "string",
        "status": "string",
    }
    assert frame[["step", "name", "unit"]].values.tolist()[:2] == [
        ["answer", "exact", "answer.score:exact"],
        ["answer", "quality", "answer.score:quality"],
    ]
    letters = frame[frame["step"] == "letters"]
    assert letters["item"].tolist() == [0, 1, 2, 3, 4]
    assert letters["unit"].tolist() == [f"letters.score:upper[{i}]" for i in range(5)]
    assert (frame["run"] == run.run_id).all()
    pd.testing.assert_frame_equal(engine.scores(run.run_id), frame)


def test_the_journal_shows_score_units_with_phase_score(engine: Engine) -> None:
    run = engine.run(FLOW, params={"question": "Capital of France?", "expected": "Paris"})

    journal = run.journal()
    assert sorted(set(journal["phase"])) == ["score", "work"]
    scored = journal[journal["phase"] == "score"]
    assert len(scored) == 2 + 5 and (scored["status"] == "succeeded").all()
    tokens = engine.tokens(run.run_id, by="phase").set_index("phase")
    assert tokens.loc["score", "tokens_judge"] == tokens.loc["score", "tokens"] > 0
    assert tokens.loc["score", "tokens_paid"] == 0  # the llm scorer is an uncharged judge


def test_an_empty_scores_frame_keeps_its_columns(engine: Engine) -> None:
    run = engine.run("name: none\nsteps:\n  - id: s\n    prompt: hi\n")
    frame = run.scores()
    assert frame.empty and tuple(frame.columns) == SCORE_COLUMNS


def _rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "quiz.csv"
    path.write_text(
        "question,expected\nCapital of France?,Paris\nCapital of Japan?,Tokyo\n", encoding="utf-8"
    )
    return path


def test_the_sweep_frame_has_a_column_per_score_and_per_rows_field(
    engine: Engine, tmp_path: Path
) -> None:
    sweep = engine.sweep(FLOW, grid={"style": ["terse", "chatty"]}, rows=_rows_file(tmp_path))

    frame = sweep.frame()
    columns = list(frame.columns)
    assert columns[:3] == ["style", "expected", "question"]  # the rows' fields beside the axes
    score_columns = [c for c in columns if c.startswith("score.")]
    assert score_columns == ["score.answer.exact", "score.answer.quality", "score.letters.upper"]
    table = frame.set_index(["style", "question"])
    assert table.loc[("terse", "Capital of France?"), "expected"] == "Paris"
    assert table.loc[("chatty", "Capital of Japan?"), "expected"] == "Tokyo"
    assert table.loc[("terse", "Capital of France?"), "score.answer.exact"] == 1.0
    assert table.loc[("terse", "Capital of Japan?"), "score.answer.exact"] == 0.0  # Kyoto
    assert (frame["score.answer.quality"] == 3.0).all()
    # a map step's column is the mean over its items: 1 upper-case letter of 5
    assert frame["score.letters.upper"].tolist() == pytest.approx([0.2] * 4)
    # every cell's value is its run's own scores' mean
    for _, cell in frame.iterrows():
        scores = engine.scores(cell["run_id"])
        mean = scores[scores["step"] == "letters"]["value"].mean()
        assert cell["score.letters.upper"] == mean


def test_a_map_score_column_is_the_mean_over_items_and_a_failed_score_is_nan(
    engine: Engine,
) -> None:
    src = """
name: mixed
params:
  words: {type: array}
steps:
  - id: w
    map: "{{ params.words }}"
    prompt: "{{ item }}"
    score:
      - {name: loud, regex: "^[A-Z]"}
  - id: judge
    prompt: "x"
    score:
      - {name: bad, judge: llm, rubric: "?", scale: [1, 2]}
runners:
  scripted:
    rules:
      - match: "Score the output"
        reply: "not a verdict"
      - match: "^(\\\\w+)$"
        reply: "{{ groups[1] }}"
"""
    sweep = engine.sweep(src, grid={"words": [["A", "b"], ["A", "B", "c", "D"]]})

    frame = sweep.frame()
    assert frame["score.w.loud"].tolist() == [0.5, 0.75]
    assert frame["score.judge.bad"].isna().all()
    assert (frame["status"] == "completed").all()


def test_a_sweep_without_scores_or_rows_keeps_its_columns(engine: Engine) -> None:
    sweep = engine.sweep(
        "name: plain\nparams:\n  n: {type: integer}\nsteps:\n  - id: s\n    prompt: '{{ params.n }}'\n",
        grid={"n": [1, 2]},
    )
    assert not [c for c in sweep.frame().columns if c.startswith("score.")]
    assert list(sweep.frame().columns)[:2] == ["n", "row"]


def test_wf_sweep_frame_prints_the_score_and_row_columns(
    engine: Engine, tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flow = tmp_path / "quiz.yaml"
    flow.write_text(FLOW, encoding="utf-8")
    sweep = engine.sweep(flow, rows=_rows_file(tmp_path))
    engine.close()

    out = wf_inproc(capsys, state_dir, "sweep-frame", sweep.sweep_id, "--format", "json")
    assert out.returncode == 0, out.stderr
    text = out.stdout.strip()
    records = (
        json.loads(text) if text.startswith("[") else [json.loads(x) for x in text.splitlines()]
    )
    assert [r["question"] for r in records] == ["Capital of France?", "Capital of Japan?"]
    assert [r["score.answer.exact"] for r in records] == [1.0, 0.0]
    assert all(r["score.answer.quality"] == 3.0 for r in records)


# -- m019 on a journal written before it -------------------------------------------------------
def test_m019_keeps_every_attempt_and_the_counter_of_an_older_journal(tmp_path: Path) -> None:
    state = legacy_state(tmp_path)
    conn = sqlite3.connect(state / "state.db")
    before = conn.execute("SELECT * FROM attempts ORDER BY attempt_pk").fetchall()
    seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'attempts'").fetchone()
    conn.close()

    with Engine(state) as engine:
        run = engine.run(FLOW, params={"question": "Capital of France?", "expected": "Paris"})
        assert run.status == "completed"

    after = db_rows(state, "SELECT * FROM attempts ORDER BY attempt_pk")
    # m016 added three columns to the old rows; m019 kept every row and value as it was
    width = len(before[0])
    assert [r[:width] for r in after[: len(before)]] == [tuple(r) for r in before]
    assert min(r[0] for r in after[len(before) :]) > seq[0]
    assert ("m019_score_phase",) in db_rows(state, "SELECT id FROM schema_migrations")
    conn = sqlite3.connect(state / "state.db")
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("UPDATE attempts SET tokens_in = 1 WHERE status = 'succeeded'")
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()


@pytest.mark.backends
def test_scores_journal_and_read_back_on_both_backends(state_dir: Path) -> None:
    with Engine(state_dir) as engine:
        run = engine.run(FLOW, params={"question": "Capital of France?", "expected": "Paris"})
        frame = run.scores()
    assert run.status == "completed", run.reason
    assert frame["value"].tolist()[:2] == [1.0, 3.0]
    assert not math.isnan(frame["value"].sum())
    phases = sorted({r[0] for r in db_rows(state_dir, "SELECT phase FROM attempts")})
    assert phases == ["score", "work"]
