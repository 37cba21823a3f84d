"""A rows file's cell that is no value of its param (``NaN`` or ``inf`` in a number column, a
word in an integer one, a number off the schema) is refused while the file is read: one line
naming the file, the row, its line, the column and what to do (exit 2) — not a bare
``param n: expected a number`` after the fact (issue 31, item 19)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import run_wf
from tests.helpers_secrets import wf

WORKFLOW = """
name: rows-cells
params:
  topic: {type: string, default: cats}
  n: {type: number, default: 1}
  k: {type: integer, default: 1, minimum: 0}
  on: {type: boolean, default: false}
runner: scripted
steps:
  - id: write
    prompt: "{{ params.topic }} {{ params.n }} {{ params.k }} {{ params.on }}"
"""
BAD_CELLS = {
    "n": ["NaN", "nan", "inf", "-inf", "Infinity", "1e999", "abc", "0x10", "1_000", "--1"],
    "k": ["NaN", "2.5", "-1", "many", "1e999", "true"],
    "on": ["yes", "1", "NaN"],
}
"""Cells a spreadsheet may hold, by column: none is a value of that column's param."""


def _write(tmp_path: Path, fmt: str, column: str, cell: str, row: int) -> Path:
    good = {"topic": "cats", "n": "2", "k": "3", "on": "true"}
    rows = [dict(good) for _ in range(row + 1)]
    rows[row][column] = cell
    if fmt == "csv":
        path = tmp_path / "rows.csv"
        lines = ["topic,n,k,on", *(",".join(r.values()) for r in rows)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        path = tmp_path / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


CASES = st.sampled_from(sorted((c, v) for c, vs in BAD_CELLS.items() for v in vs))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=CASES, fmt=st.sampled_from(["csv", "jsonl"]), row=st.integers(0, 3))
def test_a_bad_cell_is_one_line_naming_file_row_line_and_column(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, str], fmt: str, row: int
) -> None:
    root = tmp_path_factory.mktemp("rows")
    column, cell = case
    path = _write(root, fmt, column, cell, row)
    flow = root / "flow.yaml"
    flow.write_text(WORKFLOW, encoding="utf-8")
    code, shown = wf(root / "state", "sweep", str(flow), "--rows", str(path))
    assert code == 2, shown
    line = row + 2 if fmt == "csv" else row + 1
    [message] = shown.strip().splitlines()
    assert message.startswith(
        f"error: sweep rows: {path} row {row} (line {line}), column {column!r}: "
    ), message
    assert message.endswith(
        "; fix the cell, or drop the column so the param's default applies to every row"
    )


def test_the_audits_nan_cell_through_the_real_cli(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(WORKFLOW, encoding="utf-8")
    rows = tmp_path / "rows.csv"
    rows.write_text("topic,n\ncats,2\ndogs,NaN\n", encoding="utf-8")
    done = run_wf(tmp_path / "state", "sweep", str(flow), "--rows", str(rows))
    assert done.returncode == 2
    assert done.stderr == (
        f"error: sweep rows: {rows} row 1 (line 3), column 'n': expected a number (got 'NaN'); "
        "fix the cell, or drop the column so the param's default applies to every row\n"
    )
