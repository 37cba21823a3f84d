"""Outputs side by side: one static HTML table with a row per dataset row and a column per
variant, each output clipped and expandable beside its scores, tokens, cost and latency."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..errors import UsageError
from ..hashing import canonical_json
from .stats import SCORE_PREFIX, check_columns, plain, score_column, score_columns

if TYPE_CHECKING:
    import pandas as pd

Only = Literal["different", "failed"]
"""Which rows ``side_by_side(only=…)`` keeps:

- ``different``: the variants' outputs or scores differ (a variant without a cell differs).
- ``failed``: a variant's cell did not complete, or it has no value for a shown score.
"""
ONLY: tuple[str, ...] = ("different", "failed")
CLIP = 160
"""Characters of an output shown before it folds into an expandable ``<details>``."""
CELL_FIELDS = ("output", "status", "tokens_paid", "cost_paid", "latency_s")
"""A variant's fields in ``.frame()`` (its scores come between ``status`` and tokens)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SideBySide:
    """The table ``Sweep.side_by_side`` renders: rows by ``keys``, a column per variant."""

    keys: list[str]
    """The row's columns: ``row`` (when the sweep has rows), the ``index`` fields, the other
    axes and ``repeat`` (when the sweep repeats)."""
    variants: list[str]
    scores: list[str]
    """The score names shown (``<step>.<name>``)."""
    rows: list[tuple[tuple[Any, ...], dict[str, dict[str, Any]]]] = field(default_factory=list)
    """Each row's key values and, per variant, its cell's fields."""
    clip: int = CLIP

    def frame(self) -> pd.DataFrame:
        """One row per table row (indexed by ``keys``); columns (variant, field): ``output``,
        ``status``, each score, ``tokens_paid``, ``cost_paid``, ``latency_s``."""
        import pandas as pd

        fields = [CELL_FIELDS[0], CELL_FIELDS[1], *self.scores, *CELL_FIELDS[2:]]
        columns = pd.MultiIndex.from_tuples(
            [(v, f) for v in self.variants for f in fields], names=["variant", "field"]
        )
        data = [
            [cells.get(v, {}).get(f) for v in self.variants for f in fields]
            for _, cells in self.rows
        ]
        # An index label must be hashable: a row field holding an object or a list (a JSONL
        # row's ``meta``) is labelled by its canonical JSON.
        keys = [tuple(_label(v) for v in k) for k, _ in self.rows]
        index = pd.MultiIndex.from_tuples(keys, names=self.keys)
        if len(self.keys) == 1:
            index = pd.Index([k[0] for k in keys], name=self.keys[0])
        return pd.DataFrame(data, index=index, columns=columns)

    def to_html(self) -> str:
        """The table as static HTML, every value escaped."""
        head = "".join(f"<th>{_e(k)}</th>" for k in self.keys) + "".join(
            f"<th>{_e(v)}</th>" for v in self.variants
        )
        body = "".join(
            "<tr>"
            + "".join(f"<td>{_e(_text(k))}</td>" for k in key)
            + "".join(self._cell_html(cells.get(v)) for v in self.variants)
            + "</tr>"
            for key, cells in self.rows
        )
        empty = "" if self.rows else "<p>no rows to show</p>"
        return (
            "<div class='wf-side-by-side'><table style='border-collapse:collapse'>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{empty}</div>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()

    def __repr__(self) -> str:
        return (
            f"<SideBySide {len(self.rows)} row(s) × {len(self.variants)} variant(s) "
            f"({', '.join(self.variants)}); .frame() is the table>"
        )

    def _cell_html(self, cell: dict[str, Any] | None) -> str:
        """A variant's cell. Its values may come from a hand-made frame, so each is shown as
        escaped text whatever its type, and a missing one (None, NaN, NA) as nothing."""
        style = "vertical-align:top;border:1px solid #ddd;padding:4px"
        if cell is None:
            return f"<td style='{style}'><i>no cell</i></td>"
        output = _shown(cell.get("output"))
        if len(output) > self.clip:
            shown = (
                f"<details><summary>{_e(output[: self.clip])}…</summary>"
                f"<pre style='white-space:pre-wrap'>{_e(output)}</pre></details>"
            )
        else:
            shown = f"<pre style='white-space:pre-wrap;margin:0'>{_e(output)}</pre>"
        status = _shown(cell.get("status"))
        badge = "" if status in ("", "completed") else f"<b>{_e(status)}</b> "
        scores = " · ".join(f"{_e(s)} {_e(_text(cell.get(s)))}" for s in self.scores)
        usage = (
            f"{_e(_text(cell.get('tokens_paid')))} tokens · cost {_e(_text(cell.get('cost_paid')))}"
            f" · {_e(_seconds(cell.get('latency_s')))}"
        )
        return (
            f"<td style='{style}'>{badge}{shown}"
            f"<div style='font-size:smaller'>{scores}</div>"
            f"<div style='font-size:smaller;color:#666'>{usage}</div></td>"
        )


def build(
    frame: pd.DataFrame,
    *,
    axes: Sequence[str],
    row_fields: Sequence[str],
    columns: str | Sequence[str],
    index: str | Sequence[str] | None,
    score: str | Sequence[str] | None,
    only: str | None,
    clip: int = CLIP,
) -> SideBySide:
    """The side-by-side table of a sweep frame (see ``Sweep.side_by_side``).

    Raises:
        UsageError: ``columns`` is not an axis, an ``index`` name or a score is not in the
            frame, ``only`` is not one of ``ONLY``, or ``clip`` is not a positive count.
    """
    where = "sweep side_by_side"
    variant_axes = [columns] if isinstance(columns, str) else list(columns)
    if not variant_axes or any(c not in axes for c in variant_axes):
        raise UsageError(
            f"{where}: columns names the axes that make the variants (got {columns!r}; "
            f"its axes: {', '.join(axes) or 'none'})"
        )
    if only is not None and only not in ONLY:
        raise UsageError(f"{where}: only is None, 'different' or 'failed' (got {only!r})")
    if isinstance(clip, bool) or not isinstance(clip, int) or clip < 1:
        raise UsageError(f"{where}: clip is a count of characters >= 1 (got {clip!r})")
    shown = (
        [f for f in row_fields if f in frame.columns]
        if index is None
        else ([index] if isinstance(index, str) else list(index))
    )
    check_columns(frame, shown, where=f"{where} index", what="a column")
    names = (
        score_columns(frame)
        if score is None
        else [
            score_column(frame, s, where=where)
            for s in ([score] if isinstance(score, str) else score)
        ]
    )
    has_rows = "row" in frame.columns and frame["row"].notna().any()
    repeats = "repeat" in frame.columns and frame["repeat"].nunique() > 1
    others = [a for a in axes if a not in variant_axes and a not in shown]
    keys = list(dict.fromkeys([*(["row"] if has_rows else []), *shown, *others]))
    keys += ["repeat"] if repeats and "repeat" not in keys else []
    # keyed by canonical JSON, so any axis value (a list, an object) keys a row
    table: dict[str, tuple[tuple[Any, ...], dict[str, dict[str, Any]]]] = {}
    variants: list[str] = []
    for rec in frame.to_dict(orient="records"):
        label = " · ".join(_text(rec[a]) for a in variant_axes)
        variants.append(label) if label not in variants else None
        key = tuple(plain(rec[k]) for k in keys)
        table.setdefault(canonical_json(key), (key, {}))[1][label] = _cell(rec, names)
    rows = [(k, cells) for k, cells in table.values() if _keep(cells, variants, names, only)]
    return SideBySide(
        keys=keys,
        variants=variants,
        scores=[n.removeprefix(SCORE_PREFIX) for n in names],
        rows=[(k, {v: _rename(c) for v, c in cells.items()}) for k, cells in rows],
        clip=clip,
    )


def _label(value: Any) -> Any:
    return canonical_json(value) if isinstance(value, dict | list) else value


def _cell(rec: dict[str, Any], names: list[str]) -> dict[str, Any]:
    result = rec.get("result")
    output = (
        None
        if plain(result) is None
        else (
            result
            if isinstance(result, str)
            else json.dumps(result, ensure_ascii=False, indent=1, default=str)
        )
    )
    return {
        "output": output,
        "status": plain(rec.get("status")),  # NA from a hand-made frame: None, so no crash
        **{n: plain(rec.get(n)) for n in names},
        "tokens_paid": plain(rec.get("tokens_paid")),
        "cost_paid": plain(rec.get("cost_paid")),
        "latency_s": plain(rec.get("duration_s")),
    }


def _rename(cell: dict[str, Any]) -> dict[str, Any]:
    return {k.removeprefix(SCORE_PREFIX): v for k, v in cell.items()}


def _keep(
    cells: dict[str, dict[str, Any]], variants: list[str], names: list[str], only: str | None
) -> bool:
    if only is None:
        return True
    present = [cells.get(v) for v in variants]
    if only == "failed":
        return any(
            c is None or c["status"] != "completed" or any(c[n] is None for n in names)
            for c in present
        )
    if any(c is None for c in present):
        return True
    outputs = {canonical_json(c["output"]) for c in present if c is not None}
    scores = {canonical_json([c[n] for n in names]) for c in present if c is not None}
    return len(outputs) > 1 or len(scores) > 1


def _text(value: Any) -> str:
    value = plain(value)
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple | dict | int):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)  # a datetime, bytes, a Decimal: whatever a hand-made frame holds


def _shown(value: Any) -> str:
    """``value`` as the text of a cell's output or status ('' when missing)."""
    return "" if plain(value) is None else _text(value)


def _seconds(value: Any) -> str:
    value = plain(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.2f} s"
    return _text(value)


def _e(text: str) -> str:
    return html.escape(text, quote=True)
