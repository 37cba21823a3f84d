"""Side by side: one static HTML table (a row per dataset row, a column per variant), every
model word escaped, long outputs folded into <details>, ``only=`` filters, and ``.frame()``."""

from __future__ import annotations

import html
import re
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic.errors import UsageError
from wf_magic.sweeps.sidebyside import CLIP, build

NAN = float("nan")


def frame(cells: list[dict[str, Any]]) -> pd.DataFrame:
    base = {
        "status": "completed",
        "tokens_paid": 7,
        "cost_paid": 0.25,
        "duration_s": 1.5,
        "repeat": 0,
    }
    return pd.DataFrame([{**base, **c} for c in cells])


def two_models(
    outputs: dict[tuple[str, int], Any], scores: dict[tuple[str, int], float]
) -> pd.DataFrame:
    questions = ["Capital of France?", "2 + 2?", "Colour of the sky?"]
    return frame(
        [
            {
                "model": model,
                "row": row,
                "question": questions[row],
                "result": outputs[(model, row)],
                "score.answer.exact": scores[(model, row)],
            }
            for model in ("m1", "m2")
            for row in range(3)
        ]
    )


OUTPUTS = {
    ("m1", 0): "Paris",
    ("m2", 0): "Paris",
    ("m1", 1): "4",
    ("m2", 1): "four",
    ("m1", 2): "Blue",
    ("m2", 2): "Blue",
}
SCORES = {
    ("m1", 0): 1.0,
    ("m2", 0): 1.0,
    ("m1", 1): 1.0,
    ("m2", 1): 0.0,
    ("m1", 2): 1.0,
    ("m2", 2): NAN,
}


def table(data: pd.DataFrame, **options: Any) -> Any:
    return build(
        data,
        axes=["model"],
        row_fields=["question"],
        columns=options.pop("columns", "model"),
        index=options.pop("index", None),
        score=options.pop("score", None),
        only=options.pop("only", None),
        **options,
    )


def test_a_row_per_dataset_row_and_a_column_per_variant() -> None:
    view = table(two_models(OUTPUTS, SCORES))
    assert view.keys == ["row", "question"]
    assert view.variants == ["m1", "m2"]
    out = view.frame()
    assert list(out.index) == [(0, "Capital of France?"), (1, "2 + 2?"), (2, "Colour of the sky?")]
    assert list(out.columns.get_level_values(0).unique()) == ["m1", "m2"]
    assert list(out["m1"].columns) == [
        "output",
        "status",
        "answer.exact",
        "tokens_paid",
        "cost_paid",
        "latency_s",
    ]
    assert out[("m2", "output")].tolist() == ["Paris", "four", "Blue"]
    assert out[("m2", "answer.exact")].tolist()[:2] == [1.0, 0.0]
    page = view._repr_html_()
    assert page.count("<tr>") == 4 and "<th>m1</th><th>m2</th>" in page
    assert "answer.exact 0" in page and "7 tokens · cost 0.25 · 1.50 s" in page


def test_only_different_keeps_rows_whose_outputs_or_scores_differ() -> None:
    view = table(two_models(OUTPUTS, SCORES), only="different")
    assert [k[0] for k, _ in view.rows] == [1, 2]  # row 1 outputs differ, row 2 a score
    same_scores = {**SCORES, ("m2", 2): 1.0}
    view = table(two_models(OUTPUTS, same_scores), only="different")
    assert [k[0] for k, _ in view.rows] == [1]


def test_only_failed_keeps_rows_with_a_failed_cell_or_a_missing_score() -> None:
    data = two_models(OUTPUTS, SCORES)
    data.loc[(data["model"] == "m1") & (data["row"] == 0), "status"] = "failed"
    view = table(data, only="failed")
    assert [k[0] for k, _ in view.rows] == [0, 2]
    assert "<b>failed</b>" in view.to_html()


def test_a_long_output_folds_into_details_and_keeps_its_whole_text() -> None:
    long = "word " * 100
    view = table(two_models({**OUTPUTS, ("m1", 0): long}, SCORES), clip=40)
    page = view.to_html()
    assert "<details><summary>" + long[:40] + "…</summary>" in page
    assert long in page
    assert CLIP == 160


def test_an_object_result_shows_as_json() -> None:
    view = table(two_models({**OUTPUTS, ("m1", 0): {"answer": "Paris", "n": 1}}, SCORES))
    assert view.frame().iloc[0][("m1", "output")] == '{\n "answer": "Paris",\n "n": 1\n}'


def test_other_axes_and_repeats_become_keys_of_the_row() -> None:
    cells = [
        {"model": m, "style": s, "row": 0, "repeat": k, "question": "q", "result": f"{m}{s}{k}"}
        for m in ("m1", "m2")
        for s in ("terse", "long")
        for k in (0, 1)
    ]
    view = build(
        frame(cells),
        axes=["model", "style"],
        row_fields=["question"],
        columns="model",
        index=None,
        score=None,
        only=None,
    )
    assert view.keys == ["row", "question", "style", "repeat"]
    assert len(view.rows) == 4
    both = build(
        frame(cells),
        axes=["model", "style"],
        row_fields=["question"],
        columns=["model", "style"],
        index="question",
        score=None,
        only=None,
    )
    assert both.variants == ["m1 · terse", "m1 · long", "m2 · terse", "m2 · long"]


MODEL_TEXT = st.lists(
    st.sampled_from([*"<>&\"'ab /=\n\u00e9\u2028", "<script>", "</td>", "<b>"]),
    min_size=1,
    max_size=120,
).map("".join)


@settings(max_examples=60, deadline=None)
@given(output=MODEL_TEXT, question=MODEL_TEXT, model=MODEL_TEXT)
def test_model_text_is_always_escaped(output: str, question: str, model: str) -> None:
    data = frame(
        [
            {"model": model, "row": 0, "question": question, "result": output},
            {"model": "other", "row": 0, "question": question, "result": "x"},
        ]
    )
    page = table(data, clip=50).to_html()
    # nothing but our own tags: every '<' in the page opens one of them
    tags = set(re.findall(r"<(/?[a-z]+)", page))
    assert tags <= {
        "div",
        "/div",
        "table",
        "/table",
        "thead",
        "/thead",
        "tbody",
        "/tbody",
        "tr",
        "/tr",
        "th",
        "/th",
        "td",
        "/td",
        "pre",
        "/pre",
        "details",
        "/details",
        "summary",
        "/summary",
        "b",
        "/b",
        "i",
        "/i",
        "p",
        "/p",
    }
    assert html.escape(output, quote=True) in page or html.escape(output[:50]) in page
    assert page.count("<td") == 4  # row, question, two variants: no injected cell


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"columns": "size"}, "columns names the axes"),
        ({"columns": []}, "columns names the axes"),
        ({"only": "same"}, "only is None, 'different' or 'failed'"),
        ({"index": "nope"}, "'nope' is not a column"),
        ({"score": "answer.nope"}, "no score 'answer.nope'"),
        ({"clip": 0}, "clip is a count"),
    ],
)
def test_bad_options_are_one_line_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        table(two_models(OUTPUTS, SCORES), **options)
    assert "\n" not in str(info.value)


def test_the_tour_saves_side_by_side_as_static_escaped_html() -> None:
    """notebooks/07_evaluations.ipynb is saved by nbclient (scripts/nbval_outputs.py) and
    re-run under nbval: its side-by-side output is HTML a reader sees without a kernel."""
    from pathlib import Path

    import nbformat

    path = Path(__file__).resolve().parent.parent / "notebooks" / "07_evaluations.ipynb"
    nb = nbformat.read(path, as_version=4)
    [cell] = [c for c in nb.cells if c.cell_type == "code" and "side_by_side" in c.source]
    [out] = cell.outputs
    assert set(out["data"]) == {"text/html", "text/plain"}
    page = out["data"]["text/html"]
    assert page.startswith("<div class='wf-side-by-side'>")
    assert "<th>small</th><th>large</th>" in page and "Capital of France?" in page
    assert out["data"]["text/plain"].startswith("<SideBySide 2 row(s) × 2 variant(s)")
