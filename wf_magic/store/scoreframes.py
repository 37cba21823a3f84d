"""Score frames: one row per score unit of runs (``run.scores()``), and each run's mean per
score (the sweep frame's ``score.<step>.<name>`` columns)."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Sequence
from typing import Any

import pandas as pd

from .inlists import in_chunks

SCORE_COLUMNS: tuple[str, ...] = (
    "run", "step", "name", "item", "value", "explanation", "unit", "status",
)  # fmt: skip
"""The columns of :func:`scores_frame`, in order."""
_UNIT = re.compile(r"^(?P<step>.*)\.score:(?P<name>[^\[\]]+)(?:\[(?P<item>\d+)\])?$")
_DONE = ("succeeded", "reused")


def scores_frame(conn: sqlite3.Connection, run_ids: Sequence[str]) -> pd.DataFrame:
    """One row per score unit of ``run_ids`` (their own units, not their child runs').

    A unit measured more than once (a failure measured again on resume) shows its newest
    succeeded or reused attempt, else its newest attempt.

    Returns:
        A DataFrame with the columns of :data:`SCORE_COLUMNS`, in journal order:

        - ``run``, ``step``, ``name`` (string): the run, the step scored, the score's name.
        - ``item`` (Int64): the map item scored, <NA> for a step without ``map:``.
        - ``value`` (float64): the score, NaN for a failed (or unfinished) unit.
        - ``explanation`` (string): why; a failed unit's failure message.
        - ``unit`` (string): ``<step>.score:<name>`` (``[i]`` per item).
        - ``status`` (string): the attempt's status: ``succeeded``, ``reused``, ``failed``
          or ``running``.
    """
    chosen: dict[tuple[str, str], tuple[Any, ...]] = {}
    order: list[tuple[str, str]] = []
    ids = sorted(set(run_ids))
    for chunk, marks in in_chunks(ids):
        rows = conn.execute(
            "SELECT run_id, unit_id, status, output_json, failure, attempt_pk FROM attempts"
            f" WHERE phase = 'score' AND run_id IN ({marks}) ORDER BY attempt_pk",
            tuple(chunk),
        ).fetchall()
        for row in rows:
            key = (str(row[0]), str(row[1]))
            if key not in chosen:
                order.append(key)
            elif chosen[key][2] in _DONE and row[2] not in _DONE:
                continue  # a done measurement is never hidden by a later failed one
            chosen[key] = tuple(row)
    order.sort(key=lambda k: int(chosen[k][5]))
    return _frame([chosen[k] for k in order])


def _frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    data: dict[str, list[Any]] = {c: [] for c in SCORE_COLUMNS}
    for run_id, unit_id, status, output_json, failure, _ in rows:
        found = _UNIT.match(str(unit_id))
        value, explanation = _measured(output_json) if status in _DONE else (math.nan, failure)
        data["run"].append(run_id)
        data["step"].append(found.group("step") if found else None)
        data["name"].append(found.group("name") if found else None)
        item = found.group("item") if found else None
        data["item"].append(int(item) if item is not None else None)
        data["value"].append(value)
        data["explanation"].append(explanation)
        data["unit"].append(unit_id)
        data["status"].append(status)
    return pd.DataFrame(
        {
            **{c: pd.array(data[c], dtype="string") for c in ("run", "step", "name")},
            "item": pd.array(data["item"], dtype="Int64"),
            "value": pd.array(data["value"], dtype="float64"),
            "explanation": pd.array(data["explanation"], dtype="string"),
            "unit": pd.array(data["unit"], dtype="string"),
            "status": pd.array(data["status"], dtype="string"),
        }
    )


def _measured(output_json: Any) -> tuple[float, str | None]:
    """(value, explanation) of a done score unit's output (NaN when unreadable)."""
    try:
        data = json.loads(output_json) if isinstance(output_json, str) else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return math.nan, None
    value = data.get("value")
    number = (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    )
    explanation = data.get("explanation")
    return number, explanation if isinstance(explanation, str) else None


def score_means(frame: pd.DataFrame) -> pd.DataFrame:
    """Each run's mean value per score (over a map's items): one row per run, one column
    ``score.<step>.<name>`` per score, NaN where a run has none — and where any of its units
    failed or is unfinished: a mean over the items that happened to succeed would be a
    biased value, read as a measurement (the cell counts as ``missing`` instead)."""
    if frame.empty:
        return pd.DataFrame(index=pd.Index([], dtype="string", name="run"))
    column = "score." + frame["step"].astype(str) + "." + frame["name"].astype(str)
    values = frame.assign(column=column).groupby(["run", "column"], sort=True)["value"]
    means = values.mean().where(values.count() == values.size())
    table = means.unstack("column")
    table.columns.name = None
    return table
