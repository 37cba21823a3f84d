"""A rows file's columns that are no param of the workflow (an id, a category) ride along as
row fields: in the sweep frame, ``summary(by=…)`` and side by side, never given to a run;
a column whose name is a near miss of a param is refused as the typo it likely is."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wf_magic import Engine
from wf_magic.errors import UsageError

WORKFLOW = """
name: fields
params:
  question: {type: string}
  expected: {type: string, default: "?"}
runner: scripted
steps:
  - id: answer
    prompt: "Answer: {{ params.question }}"
    score:
      - {name: exact, equals: "{{ params.expected }}"}
"""
PARAMS = ["question", "expected"]


def test_extra_columns_are_row_fields_in_the_frame_and_summary_not_params(
    tmp_path: Path,
) -> None:
    (tmp_path / "wf.yaml").write_text(WORKFLOW)
    (tmp_path / "rows.csv").write_text(
        "id,question,category,expected\nq1,Capital?,geo,x\nq2,Sum?,math,x\nq3,Sea?,geo,x\n"
    )
    with Engine(tmp_path / "state") as engine:
        sweep = engine.sweep(tmp_path / "wf.yaml", rows=tmp_path / "rows.csv")
        assert sweep.status == "completed"
        frame = sweep.frame()
        assert list(frame["id"]) == ["q1", "q2", "q3"]
        assert list(frame["category"]) == ["geo", "math", "geo"]
        assert list(frame["question"]) == ["Capital?", "Sum?", "Sea?"]
        for run_id in frame["run_id"]:
            params = engine.status(run_id).params
            assert set(params) == {"question", "expected"}, params  # no row field is a param
        table = sweep.summary(by="category")
        assert list(table["category"]) == ["geo", "math"]
        assert list(table["n"]) == [2, 1]


_names = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=_names)
def test_a_column_is_a_row_field_unless_it_is_a_near_miss_of_a_param(
    tmp_path: Path, name: str
) -> None:
    (tmp_path / "wf.yaml").write_text(WORKFLOW)
    engine = Engine(tmp_path / f"state-{name}")
    rows = [{"question": "a?", name: "v"}] if name not in PARAMS else [{"question": "a?"}]
    near = difflib.get_close_matches(name, PARAMS, n=1, cutoff=0.8)
    try:
        if near and name not in PARAMS:
            with pytest.raises(UsageError) as caught:
                engine.sweep(tmp_path / "wf.yaml", rows=rows)
            assert f"column {name!r}, which is not a param" in str(caught.value)
            assert f"did you mean {near[0]!r}?" in str(caught.value)
        else:
            sweep = engine.sweep(tmp_path / "wf.yaml", rows=rows)
            assert sweep.status == "completed"
            if name not in PARAMS:
                assert list(sweep.frame()[name]) == ["v"]
    finally:
        engine.close()


_reserved = st.one_of(
    st.sampled_from(
        [
            "row",
            "repeat",
            "run_id",
            "status",
            "result",
            "tokens_paid",
            "tokens_original",
            "cost_paid",
            "cost_original",
            "duration_s",
        ]
    ),
    st.from_regex(r"score\.[a-z]{1,6}\.[a-z]{1,6}", fullmatch=True),
    st.from_regex(r"gate_[a-z]{1,8}", fullmatch=True),
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=_reserved, as_axis=st.booleans())
def test_a_column_the_frame_fills_itself_is_refused_as_a_rows_field_or_an_axis(
    tmp_path: Path, name: str, as_axis: bool
) -> None:
    """A rows field (or a param swept as an axis) named like a frame column (``status``,
    ``tokens_paid``, ``score.answer.exact``) would overwrite it in the frame and break
    ``summary``: refused in one line naming it, before anything runs."""
    import uuid

    state = tmp_path / uuid.uuid4().hex
    rows = [{"question": "Capital?", name: "x"}, {"question": "Sum?", name: "y"}]
    source = WORKFLOW
    if as_axis and "." not in name:
        source = WORKFLOW.replace("params:\n", f"params:\n  {name}: {{type: string}}\n", 1)
    with Engine(state) as engine:
        with pytest.raises(UsageError) as info:
            if as_axis and "." not in name:
                engine.sweep(source, grid={name: ["a", "b"]}, rows=[{"question": "Q?"}])
            else:
                engine.sweep(source, rows=rows)
        kind = "grid axis" if as_axis and "." not in name else "rows column"
        assert str(info.value).startswith(
            f"sweep {kind} {name!r} has the name of a column the sweep frame fills itself"
        )
        assert engine.list_runs() == []
