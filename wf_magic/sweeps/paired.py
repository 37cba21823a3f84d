"""Two variants of a sweep compared cell by cell: pairs by row (and repeat and the other
axes), the mean difference with its interval, a permutation p-value, wins/ties/losses, and
every cell left unpaired named with why."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import UsageError, clip
from ..hashing import canonical_json
from . import resampling as rs
from .stats import check_settings, cluster_keys, method_attrs, plain, score_column

if TYPE_CHECKING:
    import pandas as pd

PAIR_COLUMNS = ("a", "b", "difference")
"""The pairs frame's columns after the pairing keys."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Paired:
    """The comparison of variant ``a`` with variant ``b`` on one score (``a - b``)."""

    score: str
    a: dict[str, Any]
    b: dict[str, Any]
    keys: list[str]
    """The columns a pair shares: the axes ``a`` and ``b`` do not name, ``row``, ``repeat``."""
    n_pairs: int
    mean_a: float
    mean_b: float
    mean_difference: float
    """The mean over pairs of ``a - b``."""
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    """Two-sided, of a mean difference of zero (``test`` says how)."""
    wins: int
    """Pairs where ``a`` scored higher."""
    ties: int
    losses: int
    """Pairs where ``b`` scored higher."""
    unpaired: int
    """Cells of one variant with no cell of the other at their keys."""
    missing: int
    """Pairs dropped because one side (or both) has no value for the score (a pending or
    failed cell, a failed scorer)."""
    excluded: list[dict[str, Any]] = field(default_factory=list)
    """Each cell left out: its keys, ``side`` (``a``, ``b`` or ``both``), ``reason``."""
    test: str = ""
    ci_method: str = ""
    pairs: list[dict[str, Any]] = field(default_factory=list)
    """Each pair: its keys, ``a``, ``b``, ``difference``."""

    def frame(self) -> pd.DataFrame:
        """One row per pair: the keys, ``a``, ``b``, ``difference``."""
        import pandas as pd

        return pd.DataFrame(self.pairs, columns=[*self.keys, *PAIR_COLUMNS])

    def excluded_frame(self) -> pd.DataFrame:
        """One row per cell left out: the keys, ``side``, ``reason``."""
        import pandas as pd

        return pd.DataFrame(self.excluded, columns=[*self.keys, "side", "reason"])

    def as_dict(self) -> dict[str, Any]:
        """The figures and methods as plain values (no pairs)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out.pop("pairs")
        return out

    def __str__(self) -> str:
        level = f"{100 * self.confidence:g} %"
        lines = [
            f"{self.score}: {_label(self.a)} - {_label(self.b)} = {self.mean_difference:.4g} "
            f"({level} CI {self.ci_low:.4g} .. {self.ci_high:.4g}), p = {self.p_value:.4g}, "
            f"over {self.n_pairs} pairs",
            f"  wins {self.wins} · ties {self.ties} · losses {self.losses}; "
            f"means {self.mean_a:.4g} vs {self.mean_b:.4g}",
        ]
        if self.unpaired or self.missing:
            lines.append(
                f"  left out: {self.unpaired} unpaired cell(s), {self.missing} pair(s) missing "
                "a value (.excluded_frame() names them)"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Paired {str(self).splitlines()[0]}>"

    def _repr_html_(self) -> str:
        return f"<pre class='wf-paired'>{html.escape(str(self))}</pre>"


def paired(
    frame: pd.DataFrame,
    *,
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    score: str,
    axes: Sequence[str],
    confidence: float = rs.CONFIDENCE,
    resamples: int = rs.RESAMPLES,
    seed: int = rs.SEED,
) -> Paired:
    """Compare the cells selected by ``a`` with those selected by ``b`` on ``score``.

    Raises:
        UsageError: ``a``/``b`` are not dicts over the same axes, name a value no cell has,
            select the same cells, or ``score`` is not a score of the frame.
    """
    import numpy as np

    check_settings(confidence, resamples, where="sweep paired")
    if not isinstance(score, str):
        raise UsageError(
            f"sweep paired: score names one score, as 'step.name' (got {clip(repr(score), 60)})"
        )
    column = score_column(frame, score, where="sweep paired")
    names = _check_selectors(frame, a, b, axes)
    keys = [x for x in axes if x not in names] + [k for k in ("row", "repeat") if k in frame]
    pairs, excluded, unpaired, missing = _match(_select(frame, a), _select(frame, b), keys, column)
    diffs = np.array([p["difference"] for p in pairs], dtype=np.float64)
    clusters = rs.clusters_of(_pair_clusters(pairs, keys, axes))
    attrs = method_attrs(confidence=confidence, resamples=resamples, seed=seed)
    low, high = (
        rs.bootstrap_ci(diffs, clusters, confidence=confidence, resamples=resamples, seed=seed)
        if len(diffs)
        else (math.nan, math.nan)
    )
    return Paired(
        score=column.removeprefix("score."),
        a=dict(a),
        b=dict(b),
        keys=keys,
        n_pairs=len(pairs),
        mean_a=_mean([p["a"] for p in pairs]),
        mean_b=_mean([p["b"] for p in pairs]),
        mean_difference=_mean(list(diffs)),
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        p_value=rs.sign_flip_p_value(diffs, clusters, seed=seed),
        wins=int(np.sum(diffs > 0)),
        ties=int(np.sum(diffs == 0)),
        losses=int(np.sum(diffs < 0)),
        unpaired=unpaired,
        missing=missing,
        excluded=excluded,
        test=rs.TEST_METHOD.format(exact=rs.EXACT_CLUSTERS, flips=rs.FLIPS, seed=seed),
        ci_method=str(attrs["ci_method"]),
        pairs=pairs,
    )


def _match(
    side_a: pd.DataFrame, side_b: pd.DataFrame, keys: list[str], column: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
    """Pair ``a``'s cells with ``b``'s on ``keys``: the pairs with both values, every cell
    left out (named with its side and why), the unpaired count and the missing count."""
    # canonical JSON makes any axis value (a list, an object) a dict key
    by_key_b = {_json(list(_key(side_b, j, keys))): j for j in side_b.index}
    pairs: list[dict[str, Any]] = []
    excluded: list[dict[str, Any]] = []
    seen_b: set[Any] = set()
    unpaired = missing = 0
    for i in side_a.index:
        k = _key(side_a, i, keys)
        j = by_key_b.get(_json(list(k)))
        if j is None:
            unpaired += 1
            excluded.append(_left_out(keys, k, "a", "no cell of b at these keys"))
            continue
        seen_b.add(j)
        va, vb = _value(side_a.at[i, column]), _value(side_b.at[j, column])
        if va is None or vb is None:
            missing += 1
            side = "both" if va is None and vb is None else ("a" if va is None else "b")
            cell, at = (side_b, j) if side == "b" else (side_a, i)
            status = cell.at[at, "status"] if "status" in cell else None
            reason = f"no value for {column.removeprefix('score.')}" + (
                f" (cell {status})" if status is not None else ""
            )
            excluded.append(_left_out(keys, k, side, reason))
            continue
        pairs.append({**dict(zip(keys, k, strict=True)), "a": va, "b": vb, "difference": va - vb})
    for j in side_b.index:
        if j not in seen_b:
            unpaired += 1
            excluded.append(
                _left_out(keys, _key(side_b, j, keys), "b", "no cell of a at these keys")
            )
    return pairs, excluded, unpaired, missing


def _check_selectors(
    frame: pd.DataFrame, a: Mapping[str, Any], b: Mapping[str, Any], axes: Sequence[str]
) -> list[str]:
    for side, sel in (("a", a), ("b", b)):
        if not isinstance(sel, Mapping) or not sel:
            raise UsageError(
                f"sweep paired: {side} is a dict of axis values, e.g. {{'model': 'm1'}} "
                f"(got {sel!r})"
            )
        for name, value in sel.items():
            if name not in axes:
                raise UsageError(
                    f"sweep paired: {side} names {name!r}, which is not an axis of this sweep "
                    f"(its axes: {', '.join(axes) or 'none'})"
                )
            values = list({_json(v): plain(v) for v in frame[name].tolist()}.values())
            if _json(value) not in {_json(v) for v in values}:
                raise UsageError(
                    f"sweep paired: {side} asks {name}={value!r}, which no cell has "
                    f"(its values: {', '.join(map(repr, values))})"
                )
    if sorted(a) != sorted(b):
        raise UsageError(
            f"sweep paired: a and b must name the same axes (a names {', '.join(a)}; "
            f"b names {', '.join(b)})"
        )
    if dict(a) == dict(b):
        raise UsageError("sweep paired: a and b select the same cells; give two variants")
    return list(a)


def _select(frame: pd.DataFrame, sel: Mapping[str, Any]) -> pd.DataFrame:
    mask = None
    for name, value in sel.items():
        wanted = _json(value)
        hit = frame[name].map(lambda v, wanted=wanted: _json(v) == wanted).astype(bool)
        mask = hit if mask is None else mask & hit
    return frame[mask]


def _json(value: Any) -> str:
    """An axis value compared as canonical JSON (1 and 1.0 alike; lists and objects too)."""
    value = plain(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return canonical_json(value)


def _key(frame: pd.DataFrame, index: Any, keys: list[str]) -> tuple[Any, ...]:
    return tuple(plain(frame.at[index, k]) for k in keys)


def _left_out(keys: list[str], key: tuple[Any, ...], side: str, reason: str) -> dict[str, Any]:
    return {**dict(zip(keys, key, strict=True)), "side": side, "reason": reason}


def _pair_clusters(pairs: list[dict[str, Any]], keys: list[str], axes: Sequence[str]) -> list[Any]:
    """A pair's cluster: its dataset row, else its point on the other axes (its repeats)."""
    import pandas as pd

    frame = pd.DataFrame(pairs, columns=[*keys, *PAIR_COLUMNS])
    return cluster_keys(frame, [x for x in axes if x in keys])


def _value(value: Any) -> float | None:
    if _is_na(value) or isinstance(value, str):
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _is_na(value: Any) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or dict is a value, not a missing one
        return False


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def _label(sel: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sel.items())
