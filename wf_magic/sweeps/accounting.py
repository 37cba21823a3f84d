"""Sweep-wide accounting: every attempt of every cell's runs (child runs included), labelled
with its cell, axes and role, grouped into tokens and latency frames."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..store import Store
from ..store.sweeps import SweepCellRow

if TYPE_CHECKING:
    import pandas as pd

ROLES = {"work": "work", "gate": "judge", "score": "scorer"}
"""An attempt's ``role`` by its journal ``phase``: a step's own work, a gate's judge, a
scorer (an llm scorer is a judge too; it is labelled ``scorer``)."""
ATTEMPT_KEYS = ("step", "model", "phase", "runner")
"""Journal columns ``tokens`` / ``latency`` group by, beside the sweep's axes, ``row`` and
``repeat``."""
TOKENS_COLUMNS = (
    "role",
    "attempts",
    "tokens_in",
    "tokens_out",
    "tokens",
    "tokens_paid",
    "tokens_reused",
    "tokens_judge",
    "cost",
    "cost_paid",
)
"""The tokens frame's columns after the key."""
LATENCY_COLUMNS = ("role", "count", "p50", "p90", "p99")
"""The latency frame's columns after the key."""


def sweep_attempts(
    store: Store, cells: Sequence[SweepCellRow], axes: Sequence[str]
) -> pd.DataFrame:
    """The journal rows (``Store.journal_frame``'s columns) of every cell's run and the runs
    below it, with ``cell`` (its position in the sweep frame), the axes, ``row``, ``repeat``
    and ``role`` in front."""
    import pandas as pd

    from ..store.frames import JOURNAL_COLUMNS

    owners = {c.run_id: i for i, c in enumerate(cells) if c.run_id is not None}
    if owners:
        runs = store.runs_frame()
        below = runs[runs["root_run"].isin(list(owners)) & ~runs["run"].isin(list(owners))]
        for run, root in zip(below["run"], below["root_run"], strict=True):
            owners[str(run)] = owners[str(root)]
    parts = [store.journal_frame(run) for run in owners]
    journal = pd.concat(parts, ignore_index=True) if parts else store.journal_frame("\x00no run")
    cell = journal["run"].map(owners).astype("Int64")
    points = [json.loads(c.point_json) for c in cells]
    front: dict[str, Any] = {"cell": cell}
    for axis in axes:
        front[axis_column(axis, JOURNAL_COLUMNS)] = [
            None if pd.isna(i) else points[int(i)].get(axis) for i in cell
        ]
    front["row"] = pd.array(
        [None if pd.isna(i) else cells[int(i)].row_index for i in cell], dtype="Int64"
    )
    front["repeat"] = pd.array(
        [None if pd.isna(i) else cells[int(i)].repeat for i in cell], dtype="Int64"
    )
    front["role"] = journal["phase"].map(lambda p: ROLES.get(str(p), str(p))).astype("string")
    head = pd.DataFrame(front, index=journal.index)
    return pd.concat([head, journal], axis=1)


def axis_column(axis: str, journal_columns: Sequence[str]) -> str:
    """An axis's column in the attempts frame: its name, or ``<name>_axis`` when the journal
    has a column of that name (a ``model`` axis beside the model each attempt asked)."""
    return f"{axis}_axis" if axis in journal_columns or axis in ("cell", "role") else axis


def check_by(by: str, axes: Sequence[str], *, where: str) -> None:
    """Refuse a ``by`` that is not a journal key, an axis, ``row`` or ``repeat``.

    Raises:
        UsageError: naming the keys it can be.
    """
    from ..store.frames import JOURNAL_COLUMNS

    keys = [*ATTEMPT_KEYS, *(axis_column(a, JOURNAL_COLUMNS) for a in axes), "row", "repeat"]
    if not isinstance(by, str) or by not in keys:
        raise UsageError(f"{where}: by is one of {', '.join(keys)} (got {by!r})")


def tokens_frame(attempts: pd.DataFrame, by: str) -> pd.DataFrame:
    """Attempts, tokens and cost per value of ``by`` and role, in order of first appearance:
    ``tokens_paid`` (charged attempts: what a budget counts), ``tokens_reused`` (what reused
    answers first cost), ``tokens_judge`` (judges' and scorers' uncharged calls), ``cost``
    (NaN when no attempt reported one) and ``cost_paid``."""
    import pandas as pd

    work = pd.DataFrame(
        {
            by: attempts[by],
            "role": attempts["role"],
            "attempts": 1,
            "tokens_in": attempts["tokens_in"].fillna(0).astype("int64"),
            "tokens_out": attempts["tokens_out"].fillna(0).astype("int64"),
        }
    )
    charged = attempts["charged"].fillna(False).astype(bool)
    reused = (attempts["status"] == "reused").fillna(False).astype(bool)
    judging = attempts["role"].isin(["judge", "scorer"]).fillna(False).astype(bool)
    work["tokens"] = work["tokens_in"] + work["tokens_out"]
    work["tokens_paid"] = work["tokens"].where(charged, 0)
    work["tokens_reused"] = attempts["saved_tokens"].fillna(0).astype("int64").where(reused, 0)
    work["tokens_judge"] = work["tokens"].where(judging & ~charged & ~reused, 0)
    work["cost"] = attempts["cost"].astype("float64")
    work["cost_paid"] = work["cost"].where(charged, 0.0).fillna(0.0)
    grouped = work.groupby([by, "role"], sort=False, dropna=False)
    sums = grouped.sum(min_count=0)
    sums["cost"] = grouped["cost"].sum(min_count=1)
    out = sums.reset_index()
    return out[[by, *TOKENS_COLUMNS]]


def latency_frame(attempts: pd.DataFrame, by: str) -> pd.DataFrame:
    """The count and the 50th, 90th and 99th percentiles of finished attempts' durations
    (seconds) per value of ``by`` and role; reused attempts (no call) are left out."""
    import pandas as pd

    finished = attempts[
        attempts["status"].isin(["succeeded", "failed"]).fillna(False).astype(bool)
        & attempts["duration_s"].notna()
    ]
    grouped = finished.groupby([by, "role"], sort=False, dropna=False)["duration_s"]
    out = pd.DataFrame(
        {
            "count": grouped.size(),
            "p50": grouped.quantile(0.5),
            "p90": grouped.quantile(0.9),
            "p99": grouped.quantile(0.99),
        }
    ).reset_index()
    out["count"] = out["count"].astype("int64")
    return out[[by, *LATENCY_COLUMNS]]


def step_latencies(attempts: pd.DataFrame) -> dict[tuple[int, str], list[float]]:
    """(cell, step) → the durations of that step's finished work attempts in that cell."""
    import pandas as pd

    finished = attempts[
        (attempts["role"] == "work").fillna(False).astype(bool)
        & attempts["status"].isin(["succeeded", "failed"]).fillna(False).astype(bool)
        & attempts["duration_s"].notna()
    ]
    out: dict[tuple[int, str], list[float]] = {}
    for cell, step, seconds in zip(
        finished["cell"], finished["step"], finished["duration_s"], strict=True
    ):
        if not pd.isna(cell):
            out.setdefault((int(cell), str(step)), []).append(float(seconds))
    return out
