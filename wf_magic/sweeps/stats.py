"""A sweep's metrics over its frame: ``summary`` (per group and score, with a clustered
interval) and ``paired`` (two variants compared row by row, with a permutation test)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import UsageError, clip, clip_list
from ..hashing import canonical_json
from . import resampling as rs

if TYPE_CHECKING:
    import pandas as pd

SCORE_PREFIX = "score."
"""A sweep frame's score columns are ``score.<step>.<name>``."""
SUMMARY_COLUMNS = (
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
)
"""The summary's columns after the ``by`` columns."""


def score_columns(frame: pd.DataFrame) -> list[str]:
    """The frame's ``score.<step>.<name>`` columns, in order."""
    return [str(c) for c in frame.columns if str(c).startswith(SCORE_PREFIX)]


def score_column(frame: pd.DataFrame, score: str, *, where: str) -> str:
    """The column of ``score`` (``answer.quality`` or ``score.answer.quality``).

    Raises:
        UsageError: the frame has no such score column.
    """
    column = score if score.startswith(SCORE_PREFIX) else SCORE_PREFIX + score
    if column not in frame.columns:
        known = ", ".join(c.removeprefix(SCORE_PREFIX) for c in score_columns(frame)) or "none"
        raise UsageError(
            f"{where}: no score {score!r} in this sweep (its scores: {known}); "
            "name one as <step>.<name>"
        )
    return column


def check_columns(frame: pd.DataFrame, names: Sequence[str], *, where: str, what: str) -> None:
    """Refuse a name that is not a column of the frame, naming the axes it could be.

    Raises:
        UsageError: a name is not a column.
    """
    for name in names:
        if not isinstance(name, str) or name not in frame.columns:
            raise UsageError(
                f"{where}: {clip(repr(name), 60)} is not {what} of this sweep (its columns: "
                f"{clip_list(map(str, frame.columns), 30)})"
            )


def cluster_keys(frame: pd.DataFrame, axes: Sequence[str]) -> list[object]:
    """The resampling cluster of each cell: its dataset row, or (without one) its grid
    point, so a row's repeats (and a point's repeats) are drawn together."""
    import pandas as pd

    rows = frame["row"].tolist() if "row" in frame.columns else [None] * len(frame)
    points = frame[list(axes)].astype(str).agg("\x1f".join, axis=1).tolist() if axes else []
    return [
        ("row", r) if not pd.isna(r) else ("cell", points[i] if points else i)
        for i, r in enumerate(rows)
    ]


def method_attrs(*, confidence: float, resamples: int, seed: int) -> dict[str, Any]:
    """The ``attrs`` naming how a frame's statistics were computed."""
    return {
        "confidence": confidence,
        "ci_method": rs.CI_METHOD.format(resamples=resamples, seed=seed, level=100 * confidence),
        "stderr_method": rs.STDERR_METHOD,
        "resamples": resamples,
        "seed": seed,
    }


def summary_frame(
    frame: pd.DataFrame,
    by: Sequence[str] = (),
    *,
    axes: Sequence[str] = (),
    latencies: Mapping[tuple[int, str], Sequence[float]] | None = None,
    confidence: float = rs.CONFIDENCE,
    resamples: int = rs.RESAMPLES,
    seed: int = rs.SEED,
) -> pd.DataFrame:
    """One row per group of ``by`` and score: ``n`` (cells scored), ``missing`` (cells of the
    group without that score), ``mean``, ``stderr``, ``ci_low``, ``ci_high``, and the group's
    ``tokens_paid``, ``cost_paid``, ``latency_p50``, ``latency_p90`` (seconds, over the
    attempt durations in ``latencies``: (frame position, step) → seconds, one entry per
    attempt as a list; NaN without them).

    Raises:
        UsageError: a ``by`` name is not a column, the frame has no score column, or
            ``confidence`` / ``resamples`` is out of range.
    """
    import numpy as np
    import pandas as pd

    check_settings(confidence, resamples)
    by = group_names(by, where="sweep summary")
    check_columns(frame, by, where="sweep summary by", what="an axis or row field")
    scores = score_columns(frame)
    if not scores:
        raise UsageError(
            "sweep summary: this sweep has no scores (no score.<step>.<name> column); "
            "add a score: list to a step (docs/evaluations.md)"
        )
    clusters = rs.clusters_of(cluster_keys(frame, axes))
    records: list[dict[str, Any]] = []
    for key, group in _groups(frame, by):
        positions = frame.index.get_indexer(group.index)
        paid = _group_paid(group)
        for column in scores:
            values = pd.to_numeric(group[column], errors="coerce").to_numpy(dtype=np.float64)
            mask = ~np.isnan(values)
            stats = _describe(
                values[mask],
                clusters[positions][mask],
                confidence=confidence,
                resamples=resamples,
                seed=seed,
            )
            step = column.removeprefix(SCORE_PREFIX).split(".", 1)[0]
            durations = _durations(latencies, positions, step)
            records.append(
                {
                    **dict(zip(by, key, strict=True)),
                    "score": column.removeprefix(SCORE_PREFIX),
                    "n": int(mask.sum()),
                    "missing": int((~mask).sum()),
                    **stats,
                    **paid,
                    "latency_p50": _quantile(durations, 0.5),
                    "latency_p90": _quantile(durations, 0.9),
                }
            )
    out = pd.DataFrame(records, columns=[*by, *SUMMARY_COLUMNS])
    out.attrs.update(method_attrs(confidence=confidence, resamples=resamples, seed=seed))
    return out


def _groups(frame: pd.DataFrame, by: list[str]) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """The frame's groups by ``by`` in order of appearance, keyed by canonical JSON so that
    any value groups (a list or object axis; NaN as None)."""
    if not by:
        return [((), frame)]
    columns = [frame[b].tolist() for b in by]
    keys = [canonical_json([plain(v) for v in values]) for values in zip(*columns, strict=True)]
    order: dict[str, list[int]] = {}
    for position, key in enumerate(keys):
        order.setdefault(key, []).append(position)
    return [
        (tuple(plain(frame[b].iloc[rows[0]]) for b in by), frame.iloc[rows])
        for rows in order.values()
    ]


def group_names(by: Any, *, where: str) -> list[str]:
    """``by`` (a name or a sequence of names) as a list of distinct names.

    Raises:
        UsageError: ``by`` is neither, or names a column twice.
    """
    if isinstance(by, str):
        return [by]
    if by is None or isinstance(by, Mapping) or not isinstance(by, Sequence | set | frozenset):
        raise UsageError(
            f"{where}: by is an axis or row field name, or a list of them "
            f"(got {clip(repr(by), 60)})"
        )
    names = list(by)
    twice = sorted({str(n) for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"{where}: by names {', '.join(twice)} twice; name each column once")
    return names


def check_settings(confidence: float, resamples: int, *, where: str = "sweep summary") -> None:
    """Refuse a confidence level outside [0.5, 1) or fewer than 100 resamples."""
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, (int, float))
        or not 0.5 <= confidence < 1.0
    ):
        raise UsageError(f"{where}: confidence is a level in [0.5, 1) (got {confidence!r})")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise UsageError(f"{where}: resamples is a count of at least 100 (got {resamples!r})")


def _describe(
    values: Any, clusters: Any, *, confidence: float, resamples: int, seed: int
) -> dict[str, float]:
    if len(values) == 0:
        nan = float("nan")
        return {"mean": nan, "stderr": nan, "ci_low": nan, "ci_high": nan}
    low, high = rs.bootstrap_ci(
        values, clusters, confidence=confidence, resamples=resamples, seed=seed
    )
    return {
        "mean": float(values.mean()),
        "stderr": rs.clustered_stderr(values, clusters),
        "ci_low": low,
        "ci_high": high,
    }


def _group_paid(group: pd.DataFrame) -> dict[str, float]:
    import pandas as pd

    def total(name: str) -> float:
        if name not in group.columns:
            return float("nan")
        return float(pd.to_numeric(group[name], errors="coerce").fillna(0).sum())

    tokens = total("tokens_paid")
    return {
        "tokens_paid": tokens if math.isnan(tokens) else int(tokens),
        "cost_paid": total("cost_paid"),
    }


def _durations(
    latencies: Mapping[tuple[int, str], Sequence[float]] | None, positions: Any, step: str
) -> list[float]:
    if latencies is None:
        return []
    out: list[float] = []
    for position in positions:
        out.extend(latencies.get((int(position), step), ()))
    return out


def _quantile(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.quantile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def plain(value: Any) -> Any:
    """A frame value as plain JSON-able Python (numpy scalars unwrapped; NaN, NA, NaT: None)."""
    if isinstance(value, (list, dict, str)):
        return value
    import pandas as pd

    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        return value
    return value.item() if hasattr(value, "item") else value
