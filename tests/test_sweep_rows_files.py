"""Rows files a spreadsheet makes: a UTF-8 BOM is read; a column named twice, a missing value
(an empty CSV field, a JSONL ``NaN``, a pandas NaN), a ragged row and a field over the csv
module's limit are one-line usage errors naming the file, row and column (exit 2)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import run_wf
from wf_magic.errors import UsageError
from wf_magic.sweeps.expand import load_rows, read_rows_file

WORKFLOW = """
name: rows-demo
params:
  topic: {type: string, default: cats}
  n: {type: integer, default: 1}
runner: scripted
steps:
  - id: write
    prompt: "Write about {{ params.topic }} x{{ params.n }}"
"""

LONG = "x" * (csv.field_size_limit() + 1)

REFUSED = [
    # (file name, text, the message after "sweep rows: <path> ")
    (
        "dup.csv",
        "topic,topic\na,b\n",
        "line 1 (the header) names the column 'topic' more than once",
    ),
    ("blank.csv", "topic,n\ncats,\n", "row 0, column 'n': the value is missing"),
    ("blank2.csv", "topic,n\ncats,2\n,3\n", "row 1, column 'topic': the value is missing"),
    ("short.csv", "topic,n\ncats,2\ndogs\n", "row 1 (line 3) has 1 field(s), the header 2"),
    ("long.csv", "topic,n\ncats,2,9\n", "row 0 (line 2) has 3 field(s), the header 2"),
    ("huge.csv", f"topic,n\ncats,{LONG}\n", "row 0 (line 2), column 'n': field larger than"),
    ("hugeq.csv", f'topic,n\n"a\nb",2\n"{LONG}",3\n', "row 1 (line 4), column 'topic': field"),
    ("hugeh.csv", f"topic,{LONG}\n", "the header (line 1), field 2: field larger than"),
    (
        "nan.jsonl",
        '{"topic": "a"}\n{"topic": NaN}\n',
        "row 1, column 'topic': the value is missing",
    ),
    ("inf.jsonl", '{"n": 1e999}\n', "row 0, column 'n': the value is missing or not a finite"),
    ("ninf.jsonl", '{"n": {"x": -Infinity}}\n', "row 0, column 'n': the value is missing"),
    ("dupkey.jsonl", '{"topic": "a", "topic": "b"}\n', "row 0 (line 1) has the key 'topic' more"),
    ("list.jsonl", "[1, 2]\n", "row 0 (line 1) is not an object (got list)"),
]


@pytest.mark.parametrize(("name", "text", "expected"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_hostile_rows_file_is_one_line_naming_file_row_and_column(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UsageError) as caught:
        read_rows_file(path)
    message = str(caught.value)
    assert message.startswith(f"sweep rows: {path} {expected}"), message
    assert "\n" not in message and len(message) < 400


def test_a_utf8_bom_from_a_spreadsheet_is_skipped(tmp_path: Path) -> None:
    csv_file, jsonl = tmp_path / "bom.csv", tmp_path / "bom.jsonl"
    csv_file.write_bytes("\ufefftopic,n\r\ncats,2\r\n".encode())
    jsonl.write_bytes('\ufeff{"topic": "cats", "n": 2}\n'.encode())
    assert read_rows_file(csv_file) == [{"topic": "cats", "n": "2"}]
    assert read_rows_file(jsonl) == [{"topic": "cats", "n": 2}]


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (pd.DataFrame({"n": [1.0, float("nan")]}), "sweep rows: row 1, column 'n': the value is"),
        (pd.DataFrame({"topic": ["a", None]}), "sweep rows: row 1, column 'topic': the value is"),
        (
            pd.DataFrame([[1, 2]], columns=["n", "n"]),
            "sweep rows: the DataFrame has the column 'n'",
        ),
        (pd.DataFrame({"n": [pd.NA]}, dtype="Int64"), "sweep rows: row 0, column 'n': the value"),
    ],
)
def test_a_dataframe_with_missing_values_or_repeated_columns_is_refused(
    frame: pd.DataFrame, expected: str
) -> None:
    with pytest.raises(UsageError) as caught:
        load_rows(frame)
    assert str(caught.value).startswith(expected), str(caught.value)


def test_a_list_of_dicts_with_nan_is_refused() -> None:
    with pytest.raises(UsageError, match=r"^sweep rows: row 0, column 'n': the value is missing"):
        load_rows([{"n": float("nan")}])


def test_wf_sweep_refuses_a_hostile_rows_file_with_exit_2_and_one_line(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(WORKFLOW)
    rows = tmp_path / "sheet.csv"
    rows.write_text("\ufefftopic,topic\na,b\n", encoding="utf-8")
    done = run_wf(tmp_path / "state", "sweep", str(flow), "--rows", str(rows))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{rows} line 1 (the header) names the column 'topic' more than once" in lines[0]
    # A BOM alone is fine: the sweep runs its rows.
    rows.write_text("\ufefftopic,n\ncats,2\ndogs,3\n", encoding="utf-8")
    done = run_wf(tmp_path / "state", "sweep", str(flow), "--rows", str(rows), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "2 cells" in done.stdout


# -- a generator of hostile rows files ----------------------------------------------------------
_FIELD = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
    st.sampled_from(["", '"', '""', ",", "\n", "\r\n", "\ufeff", "=1+1", " ", "NaN"]),
    st.just(LONG),
)


@st.composite
def _csv_texts(draw: st.DrawFn) -> str:
    header = draw(st.lists(_FIELD, min_size=1, max_size=4))
    rows = draw(st.lists(st.lists(_FIELD, min_size=0, max_size=5), max_size=4))
    bom = draw(st.sampled_from(["", "\ufeff"]))
    out = []
    for record in [header, *rows]:
        out.append(",".join(draw(st.sampled_from([f, f'"{f}"'])) for f in record))
    return bom + draw(st.sampled_from(["\n", "\r\n"])).join(out)


_JSON_VALUE = st.one_of(
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.none(),
)


@st.composite
def _jsonl_texts(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 4))):
        keys = draw(st.lists(st.sampled_from(["topic", "n", "x", "topic"]), max_size=4))
        pairs = [f"{json.dumps(k)}: {json.dumps(draw(_JSON_VALUE))}" for k in keys]
        lines.append(draw(st.sampled_from(["{" + ", ".join(pairs) + "}", "[1]", "{", "  "])))
    return draw(st.sampled_from(["", "\ufeff"])) + "\n".join(lines)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.one_of(
        _csv_texts().map(lambda t: (".csv", t)), _jsonl_texts().map(lambda t: (".jsonl", t))
    )
)
def test_any_rows_file_reads_as_rows_or_fails_in_one_line_naming_it(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    suffix, text = data
    path = tmp_path / f"hostile{suffix}"
    path.write_text(text, encoding="utf-8", newline="")
    try:
        table = read_rows_file(path)
    except UsageError as exc:
        message = str(exc)
        assert message.startswith(f"sweep rows: {path} "), message
        assert "\n" not in message and "\r" not in message, message
        return
    for row in table:
        assert isinstance(row, dict)
        for column, value in row.items():
            assert column is not None and value is not None or suffix == ".jsonl"
            assert value != "" or suffix == ".jsonl"
            if isinstance(value, float):
                assert value == value and abs(value) != float("inf")
    if suffix == ".csv" and table:
        # no row is silently dropped or cut: every row has every header column
        assert len({tuple(r) for r in table}) == 1
