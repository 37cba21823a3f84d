"""Sweep metrics: ``summary`` and ``paired`` against references computed independently here
(statistics / itertools / scipy when importable), the interval's coverage over simulated
sweeps, unpaired and missing cells counted and named, bad arguments refused in one line."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic.errors import UsageError
from wf_magic.sweeps import resampling as rs
from wf_magic.sweeps.paired import paired
from wf_magic.sweeps.stats import summary_frame


def sweep_frame(
    scores: dict[str, list[list[float]]], *, name: str = "score.answer.quality"
) -> pd.DataFrame:
    """A sweep frame with a ``model`` axis: ``scores[model][row][repeat]``."""
    records = [
        {
            "model": model,
            "row": row,
            "repeat": repeat,
            "status": "completed",
            "tokens_paid": 10,
            "cost_paid": 0.5,
            name: value,
        }
        for model, rows in scores.items()
        for row, repeats in enumerate(rows)
        for repeat, value in enumerate(repeats)
    ]
    return pd.DataFrame(records)


def reference_stderr(rows: list[list[float]]) -> float:
    """Cluster-robust stderr by hand: rows are the clusters."""
    values = [v for r in rows for v in r]
    mean = statistics.fmean(values)
    sums = [math.fsum(v - mean for v in r) for r in rows]
    g = len(rows)
    return math.sqrt(g / (g - 1) * math.fsum(s * s for s in sums)) / len(values)


def test_summary_matches_a_reference_per_group_and_score() -> None:
    rng = np.random.default_rng(7)
    data = {m: rng.normal(mu, 1.0, (30, 2)).round(3).tolist() for m, mu in (("m1", 3), ("m2", 4))}
    frame = sweep_frame(data)
    out = summary_frame(frame, ["model"], axes=["model"])
    assert list(out.columns) == [
        "model",
        "score",
        "n",
        "missing",
        "mean",
        "stderr",
        "ci_low",
        "ci_high",
        "tokens_paid",
        "cost_paid",
        "latency_p50",
        "latency_p90",
    ]
    assert list(out["model"]) == ["m1", "m2"]
    assert list(out["score"]) == ["answer.quality", "answer.quality"]
    for model, rec in zip(("m1", "m2"), out.to_dict(orient="records"), strict=True):
        values = [v for r in data[model] for v in r]
        assert rec["n"] == 60 and rec["missing"] == 0
        assert rec["mean"] == pytest.approx(statistics.fmean(values), rel=1e-12)
        assert rec["stderr"] == pytest.approx(reference_stderr(data[model]), rel=1e-9)
        # the bootstrap interval is close to the t interval on the row-clustered stderr
        half = 2.045 * rec["stderr"]  # t(0.975, 29)
        assert rec["ci_low"] == pytest.approx(rec["mean"] - half, abs=0.15 * half)
        assert rec["ci_high"] == pytest.approx(rec["mean"] + half, abs=0.15 * half)
        assert rec["tokens_paid"] == 600 and rec["cost_paid"] == pytest.approx(30.0)
    assert "cluster bootstrap" in out.attrs["ci_method"] and out.attrs["seed"] == 0
    assert out.attrs["confidence"] == 0.95


def test_stderr_is_the_plain_one_when_each_row_is_one_cell() -> None:
    values = [1.0, 4.0, 2.0, 5.0, 3.0, 3.5]
    frame = sweep_frame({"m1": [[v] for v in values]})
    rec = summary_frame(frame, axes=["model"]).iloc[0]
    assert rec["stderr"] == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)))


def test_summary_is_seeded_and_names_missing_values() -> None:
    frame = sweep_frame({"m1": [[1.0, 2.0], [3.0, float("nan")], [5.0, 4.0]]})
    first = summary_frame(frame, axes=["model"])
    again = summary_frame(frame, axes=["model"])
    pd.testing.assert_frame_equal(first, again)
    assert (first.loc[0, "n"], first.loc[0, "missing"]) == (5, 1)
    other = summary_frame(frame, axes=["model"], seed=1)
    assert other.loc[0, "mean"] == first.loc[0, "mean"]


def test_summary_latency_is_over_the_scored_steps_attempts() -> None:
    frame = sweep_frame({"m1": [[1.0], [2.0]], "m2": [[3.0], [4.0]]})
    latencies = {(0, "answer"): [1.0, 3.0], (1, "answer"): [2.0], (2, "answer"): [10.0]}
    latencies[(0, "other")] = [99.0]
    out = summary_frame(frame, ["model"], axes=["model"], latencies=latencies)
    assert out.loc[0, "latency_p50"] == 2.0
    assert out.loc[0, "latency_p90"] == pytest.approx(float(np.quantile([1.0, 3.0, 2.0], 0.9)))
    assert out.loc[1, "latency_p50"] == 10.0


def test_interval_covers_the_known_mean_in_at_least_93_percent_of_200_sweeps() -> None:
    # 200 simulated sweeps as one frame (a `sim` axis): 25 rows x 2 repeats each, a row
    # effect shared by its repeats (so the clustering matters) around a known mean of 3.
    rng = np.random.default_rng(20261206)
    sims, rows, repeats = 200, 25, 2
    row_effect = rng.normal(0.0, 1.0, (sims, rows, 1))
    values = 3.0 + row_effect + rng.normal(0.0, 0.7, (sims, rows, repeats))
    frame = pd.DataFrame(
        {
            "sim": np.repeat(np.arange(sims), rows * repeats),
            "row": np.tile(np.repeat(np.arange(rows), repeats), sims),
            "repeat": np.tile(np.arange(repeats), sims * rows),
            "score.answer.quality": values.ravel(),
        }
    )
    out = summary_frame(frame, ["sim"], axes=["sim"], resamples=1000)
    covered = ((out["ci_low"] <= 3.0) & (out["ci_high"] >= 3.0)).mean()
    assert len(out) == sims and covered >= 0.93


def test_paired_matches_an_exact_reference() -> None:
    a = [[4.0], [3.0], [5.0], [2.0], [4.0], [3.0], [5.0], [4.0], [1.0]]
    b = [[3.0], [3.0], [4.0], [1.0], [5.0], [2.0], [3.0], [4.0], [2.0]]
    result = paired(
        sweep_frame({"m1": a, "m2": b}),
        a={"model": "m1"},
        b={"model": "m2"},
        score="answer.quality",
        axes=["model"],
    )
    diffs = [x[0] - y[0] for x, y in zip(a, b, strict=True)]
    observed = abs(statistics.fmean(diffs))
    flips = [
        abs(statistics.fmean(s * d for s, d in zip(signs, diffs, strict=True)))
        for signs in itertools.product((1, -1), repeat=len(diffs))
    ]
    assert result.n_pairs == 9
    assert result.mean_difference == pytest.approx(statistics.fmean(diffs))
    assert result.mean_a == pytest.approx(statistics.fmean(x[0] for x in a))
    assert result.p_value == pytest.approx(sum(f >= observed - 1e-12 for f in flips) / len(flips))
    assert (result.wins, result.ties, result.losses) == (5, 2, 2)
    assert (result.unpaired, result.missing, result.excluded) == (0, 0, [])
    assert result.ci_low < result.mean_difference < result.ci_high
    assert "permutation" in result.test and "bootstrap" in result.ci_method
    assert list(result.frame().columns) == ["row", "repeat", "a", "b", "difference"]


def test_paired_random_flips_agree_with_full_enumeration() -> None:
    rng = np.random.default_rng(3)
    a = rng.normal(3.2, 1.0, 14).round(2)
    b = rng.normal(3.0, 1.0, 14).round(2)
    diffs = a - b
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=14)))
    exact = float(np.mean(np.abs(signs @ diffs) >= abs(diffs.sum()) - 1e-9))
    result = paired(
        sweep_frame({"m1": [[x] for x in a], "m2": [[y] for y in b]}),
        a={"model": "m1"},
        b={"model": "m2"},
        score="score.answer.quality",
        axes=["model"],
    )
    assert result.p_value == pytest.approx(exact, abs=0.02)
    try:
        from scipy import stats as scipy_stats
    except ImportError:
        return
    ref = scipy_stats.permutation_test(
        (a, b),
        lambda x, y: np.mean(x - y),
        permutation_type="samples",
        n_resamples=np.inf,
    )
    assert result.p_value == pytest.approx(ref.pvalue, abs=0.02)


def test_paired_counts_and_names_missing_and_unpaired_cells() -> None:
    nan = float("nan")
    frame = sweep_frame({"m1": [[4.0], [nan], [5.0], [2.0]], "m2": [[3.0], [3.0], [nan], [2.0]]})
    frame.loc[1, "status"] = "failed"
    frame = frame[~((frame["model"] == "m2") & (frame["row"] == 3))]  # no m2 cell for row 3
    result = paired(
        frame, a={"model": "m1"}, b={"model": "m2"}, score="answer.quality", axes=["model"]
    )
    assert result.n_pairs == 1 and result.mean_difference == 1.0
    assert (result.unpaired, result.missing) == (1, 2)
    excluded = result.excluded_frame()
    assert excluded.to_dict(orient="records") == [
        {"row": 1, "repeat": 0, "side": "a", "reason": "no value for answer.quality (cell failed)"},
        {
            "row": 2,
            "repeat": 0,
            "side": "b",
            "reason": "no value for answer.quality (cell completed)",
        },
        {"row": 3, "repeat": 0, "side": "a", "reason": "no cell of b at these keys"},
    ]
    assert "1 unpaired cell(s), 2 pair(s) missing a value" in str(result)


def test_paired_pairs_across_the_other_axes_and_repeats() -> None:
    records = [
        {"model": m, "style": s, "row": r, "repeat": k, "score.answer.exact": float(m == "m1")}
        for m in ("m1", "m2")
        for s in ("terse", "long")
        for r in range(3)
        for k in range(2)
    ]
    result = paired(
        pd.DataFrame(records),
        a={"model": "m1"},
        b={"model": "m2"},
        score="answer.exact",
        axes=["model", "style"],
    )
    assert result.keys == ["style", "row", "repeat"]
    assert (result.n_pairs, result.wins, result.mean_difference) == (12, 12, 1.0)
    # 3 rows are the clusters: all 2**3 sign flips, two of which reach |12|
    assert result.p_value == pytest.approx(2 / 8)


BAD_SELECTORS: list[tuple[Any, Any, str]] = [
    ({}, {"model": "m2"}, "a is a dict of axis values"),
    ({"model": "m1"}, "m2", "b is a dict of axis values"),
    ({"size": "x"}, {"model": "m2"}, "a names 'size', which is not an axis"),
    ({"model": "m9"}, {"model": "m2"}, "a asks model='m9', which no cell has"),
    ({"model": "m1"}, {"model": "m1"}, "a and b select the same cells"),
]


@pytest.mark.parametrize(("a", "b", "message"), BAD_SELECTORS)
def test_paired_refuses_bad_selectors_in_one_line(a: Any, b: Any, message: str) -> None:
    frame = sweep_frame({"m1": [[1.0]], "m2": [[2.0]]})
    with pytest.raises(UsageError, match=message) as info:
        paired(frame, a=a, b=b, score="answer.quality", axes=["model"])
    assert "\n" not in str(info.value)


def test_paired_refuses_an_unknown_score_naming_the_known_ones() -> None:
    frame = sweep_frame({"m1": [[1.0]], "m2": [[2.0]]})
    with pytest.raises(UsageError, match=r"no score 'answer\.nope'.*its scores: answer\.quality"):
        paired(frame, a={"model": "m1"}, b={"model": "m2"}, score="answer.nope", axes=["model"])


@settings(max_examples=40, deadline=None)
@given(name=st.text(min_size=1, max_size=12).filter(lambda n: n not in ("model", "row")))
def test_summary_refuses_any_unknown_group_column(name: str) -> None:
    frame = sweep_frame({"m1": [[1.0]]})
    if name in frame.columns:
        return
    with pytest.raises(UsageError, match="is not an axis or row field") as info:
        summary_frame(frame, [name], axes=["model"])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"confidence": 1.0}, "confidence is a level"),
        ({"confidence": 0.2}, "confidence is a level"),
        ({"resamples": 10}, "resamples is a count"),
        ({"resamples": True}, "resamples is a count"),
    ],
)
def test_summary_refuses_bad_settings(settings_: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        summary_frame(sweep_frame({"m1": [[1.0]]}), axes=["model"], **settings_)


def test_summary_without_scores_says_how_to_add_them() -> None:
    frame = sweep_frame({"m1": [[1.0]]}).drop(columns=["score.answer.quality"])
    with pytest.raises(UsageError, match="has no scores.*add a score: list to a step"):
        summary_frame(frame, axes=["model"])


def test_one_cluster_gives_no_interval_rather_than_a_false_one() -> None:
    frame = sweep_frame({"m1": [[1.0, 3.0]]})
    rec = summary_frame(frame, axes=["model"]).iloc[0]
    assert rec["mean"] == 2.0 and math.isnan(rec["stderr"]) and math.isnan(rec["ci_low"])


def test_t_quantile_is_close_to_the_table() -> None:
    z = statistics.NormalDist().inv_cdf(0.975)
    table = {3: 3.182, 5: 2.571, 10: 2.228, 29: 2.045, 100: 1.984}
    for dof, t in table.items():
        assert rs.t_quantile(z, dof) == pytest.approx(t, abs=0.005)


def test_paired_and_side_by_side_take_list_valued_axes() -> None:
    from wf_magic.sweeps.sidebyside import build

    records = [
        {
            "stops": stops,
            "row": r,
            "repeat": 0,
            "status": "completed",
            "result": f"{r}{stops}",
            "score.answer.exact": float(r % 2) + (0.5 if stops == ["\n"] else 0.0),
        }
        for stops in (["\n"], ["."])
        for r in range(4)
    ]
    frame = pd.DataFrame(records)
    result = paired(
        frame, a={"stops": ["\n"]}, b={"stops": ["."]}, score="answer.exact", axes=["stops"]
    )
    assert (result.n_pairs, result.mean_difference, result.wins) == (4, 0.5, 4)
    view = build(
        frame, axes=["stops"], row_fields=[], columns="stops", index=None, score=None, only=None
    )
    assert view.variants == ['["\\n"]', '["."]'] and len(view.rows) == 4


def test_summary_groups_by_a_list_valued_axis() -> None:
    frame = pd.DataFrame(
        [
            {"stops": stops, "row": r, "repeat": 0, "score.answer.exact": float(r)}
            for stops in (["\n"], ["."])
            for r in range(3)
        ]
    )
    out = summary_frame(frame, ["stops"], axes=["stops"])
    assert out["stops"].tolist() == [["\n"], ["."]] and out["mean"].tolist() == [1.0, 1.0]
