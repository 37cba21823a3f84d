"""Side by side over a hand-made frame: any value in a cell's status, result, tokens, cost or
latency renders as escaped text (a missing one as nothing), never as an exception or as
markup. tests/test_side_by_side.py has the table's shape and the model text it escapes."""

from __future__ import annotations

import datetime
import decimal
import html
import re
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic.sweeps.sidebyside import SideBySide, build

OUR_TAGS = {"div", "table", "thead", "tbody", "tr", "th", "td", "pre", "details", "summary"}
OUR_TAGS |= {"b", "i", "p"}
STYLE = " style='vertical-align:top;border:1px solid #ddd;padding:4px'>"
"""How a variant's cell opens, after ``<td``."""
MISSING = [None, float("nan"), pd.NA, pd.NaT, np.float64("nan")]
ODD = st.one_of(
    st.sampled_from(MISSING),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.booleans(),
    st.lists(st.sampled_from([*"<>&\"' ab\n\u00e9", "</td>", "<b>", "completed"]), max_size=8).map(
        "".join
    ),
    st.builds(np.int64, st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.datetimes(),
    st.binary(max_size=5),
    st.decimals(allow_nan=False),
)


def _table(only: str | None = None, **odd: Any) -> SideBySide:
    """A one-row table: variant m1's cell carries ``odd``, m2's is plain."""
    base = {"status": "completed", "tokens_paid": 7, "cost_paid": 0.25, "duration_s": 1.5}
    data = pd.DataFrame(
        [
            {**base, "model": "m1", "row": 0, "question": "q", "result": "a", **odd},
            {**base, "model": "m2", "row": 0, "question": "q", "result": "b"},
        ]
    )
    return build(
        data, axes=["model"], row_fields=["question"], columns="model", index=None, score=None,
        only=only,
    )  # fmt: skip


def _page(**odd: Any) -> str:
    return _table(**odd).to_html()


def _first_cell(page: str) -> str:
    """The m1 variant's cell (the third ``<td``: after the row and question cells)."""
    return page.split("<td")[3]


@pytest.mark.parametrize(
    ("status", "badge"),
    [
        (3, "<b>3</b> "),
        (np.int64(3), "<b>3</b> "),
        (2.5, "<b>2.5</b> "),
        (True, "<b>true</b> "),
        ("<failed>", "<b>&lt;failed&gt;</b> "),
        (["a", 1], "<b>[&quot;a&quot;, 1]</b> "),
        (b"x", "<b>b&#x27;x&#x27;</b> "),
        ("completed", ""),
        *((missing, "") for missing in MISSING),
    ],
)
def test_any_status_shows_as_escaped_text_and_a_missing_one_as_nothing(
    status: Any, badge: str
) -> None:
    cell = _first_cell(_page(status=status))
    assert cell.startswith(f"{STYLE}{badge}<pre")


@pytest.mark.parametrize(
    ("odd", "usage"),
    [
        ({}, "7 tokens · cost 0.25 · 1.50 s"),
        ({"tokens_paid": None, "cost_paid": float("nan"), "duration_s": pd.NA}, "– tokens · cost – · –"),
        ({"duration_s": "slow"}, "7 tokens · cost 0.25 · slow"),
        ({"duration_s": float("inf")}, "7 tokens · cost 0.25 · inf s"),
        ({"tokens_paid": "<7>", "cost_paid": decimal.Decimal("0.5")}, "&lt;7&gt; tokens · cost 0.5 · 1.50 s"),
    ],
)  # fmt: skip
def test_odd_usage_values_show_as_escaped_text(odd: dict[str, Any], usage: str) -> None:
    assert f"<div style='font-size:smaller;color:#666'>{usage}</div>" in _first_cell(_page(**odd))


@pytest.mark.parametrize("missing", MISSING)
def test_a_missing_status_is_kept_by_only_failed_and_shown_as_none_in_the_frame(
    missing: Any,
) -> None:
    assert len(_table(only="failed", status=missing).rows) == 1
    assert len(_table(only="different", status=missing).rows) == 1  # the outputs differ
    assert _table(status=missing).frame()[("m1", "status")].tolist() == [None]


def test_a_result_that_is_no_json_shows_as_its_text() -> None:
    when = datetime.datetime(2026, 12, 6, 21, 0)
    cell = _first_cell(_page(result=[when]))
    assert (
        "<pre style='white-space:pre-wrap;margin:0'>[\n &quot;2026-12-06 21:00:00&quot;\n]</pre>"
        in cell
    )


@settings(max_examples=150, deadline=None)
@given(status=ODD, result=ODD, tokens=ODD, cost=ODD, latency=ODD)
def test_any_value_in_any_cell_field_renders_as_text_and_never_as_markup(
    status: Any, result: Any, tokens: Any, cost: Any, latency: Any
) -> None:
    page = _page(
        status=status, result=result, tokens_paid=tokens, cost_paid=cost, duration_s=latency
    )
    assert {t.lstrip("/") for t in re.findall(r"<(/?[a-z]+)", page)} <= OUR_TAGS
    assert page.count("<td") == 4  # row, question, two variants: no injected cell
    cell = _first_cell(page)
    shown = not _is_missing(status) and not (
        isinstance(status, str) and status in ("", "completed")
    )
    assert cell.count("<b>") == (1 if shown else 0)
    if isinstance(status, str) and shown:
        assert cell.startswith(f"{STYLE}<b>{html.escape(status, quote=True)}</b> ")


def _is_missing(value: Any) -> bool:
    return any(value is m for m in (None, pd.NA, pd.NaT)) or (
        isinstance(value, float) and value != value
    )


JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=5),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
"""What a rows file's field holds: any JSON value (a JSONL row's ``meta`` object)."""


@settings(max_examples=40, deadline=None)
@given(field=JSON_VALUES)
def test_any_row_field_value_indexes_the_frame_and_the_page(field: Any) -> None:
    """A row field holding an object or a list (a JSONL row's ``meta``), or any other JSON
    value, labels its row in ``.frame()`` and in the page: never ``unhashable type``."""
    base = {"status": "completed", "tokens_paid": 7, "cost_paid": 0.25, "duration_s": 1.5}
    data = pd.DataFrame(
        [{**base, "model": m, "row": 0, "meta": field, "result": m} for m in ("m1", "m2")]
    )
    table = build(
        data, axes=["model"], row_fields=["meta"], columns="model", index=None, score=None,
        only=None,
    )  # fmt: skip
    frame = table.frame()
    assert frame.shape == (1, 2 * len(frame.columns.levels[1]))
    assert "<table" in table.to_html()
