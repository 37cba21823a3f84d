"""Frames as the ``%workflow`` verbs return them: the full DataFrame, displayed readably.

A verb returns the very frame the Python API gives (every column, the documented dtypes),
as a subclass whose notebook display is the readable one: a compact column set, short ids,
no ``<NA>``/``NaN`` noise, whole numbers as integers, "no limit" for an unset ceiling, and
cells that do not wrap a run id over three lines. Indexing or computing on it gives plain
DataFrames; ``--all`` returns the plain frame itself.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pandas as pd

JOURNAL_COLUMNS = (
    "step", "unit", "attempt", "loop", "phase", "status", "runner", "model",
    "tokens_in", "tokens_out", "duration_s", "started", "reused_from", "failure",
)  # fmt: skip
"""The columns ``%workflow journal`` shows (``--all``: every column of the frame)."""
LIST_COLUMNS = ("run", "workflow", "status", "owner", "status_reason", "created", "duration_s")
"""The columns ``%workflow list`` shows (``--all``: every run and column)."""
SHORT_ID = 8
"""Characters of a dispatch id or hash shown (enough to tell them apart in one run)."""
FAILURE_CHARS = 80
"""Characters of a failure message shown in the compact journal."""
NO_LIMIT = "no limit"


class ReadableFrame(pd.DataFrame):  # type: ignore[misc]  # pandas ships no type stubs
    """A DataFrame whose notebook display is :meth:`readable` (the data stays whole)."""

    @property
    def _constructor(self) -> Any:
        return pd.DataFrame  # whatever is computed from it is an ordinary frame

    def readable(self) -> pd.DataFrame:
        """What the notebook shows: strings, already formatted."""
        return pd.DataFrame(self)

    def __repr__(self) -> str:
        return repr(self.readable())

    def _repr_html_(self) -> str:
        shown: str = self.readable().to_html(index=False, na_rep="", border=0)
        # JupyterLab wraps table cells (`white-space: normal`): keep ids and times on one line.
        return shown.replace("<td>", '<td style="white-space:nowrap">')


class JournalFrame(ReadableFrame):
    """``%workflow journal``: one row per attempt, in :data:`JOURNAL_COLUMNS`."""

    def readable(self) -> pd.DataFrame:
        frame = pd.DataFrame(self)
        out = pd.DataFrame(index=frame.index)
        for column in JOURNAL_COLUMNS:
            if column == "started":
                out[column] = _clock(frame["started_at"])
            elif column == "duration_s":
                out[column] = [_seconds(v) for v in frame["duration_s"]]
            elif column == "reused_from":
                out[column] = _origins(frame)
            elif column == "failure":
                out[column] = [_clip(_text(v), FAILURE_CHARS) for v in frame["failure"]]
            elif column in frame.columns:
                out[column] = [_text(v) for v in frame[column]]
        for column in ("reused_from", "failure", "model"):
            if (out[column] == "").all():
                out = out.drop(columns=column)  # a column of blanks says nothing
        return out.reset_index(drop=True)


def _origins(frame: pd.DataFrame) -> list[str]:
    """Where each reused attempt's answer came from: ``<run id> · <unit>``.

    Falls back to the source dispatch id when that run was deleted (gc keeps no attempts).
    """
    if "reused_from_run" not in frame.columns:
        return [_text(v)[:SHORT_ID] for v in frame["reused_from"]]
    out = []
    for source, run, unit in zip(
        frame["reused_from"], frame["reused_from_run"], frame["reused_from_unit"], strict=True
    ):
        if _text(run):
            out.append(f"{_text(run)} · {_text(unit)}")
        else:
            out.append(_text(source)[:SHORT_ID])
    return out


class RunsFrame(ReadableFrame):
    """``%workflow list``: root runs, newest first, in :data:`LIST_COLUMNS`."""

    def readable(self) -> pd.DataFrame:
        frame = pd.DataFrame(self)
        out = pd.DataFrame(index=frame.index)
        for column in LIST_COLUMNS:
            if column == "created":
                out[column] = _clock(frame["created_at"], with_date=True)
            elif column == "duration_s":
                out[column] = [_seconds(v) for v in frame["duration_s"]]
            else:
                out[column] = [_text(v) for v in frame[column]]
        return out.reset_index(drop=True)


class BudgetFrame(ReadableFrame):
    """``%workflow budget``: one row per ceiling; counts as integers, "no limit" for unset."""

    def readable(self) -> pd.DataFrame:
        frame = pd.DataFrame(self)
        rows = []
        for record in frame.to_dict("records"):
            is_cost = record["ceiling"] == "cost"
            limited = not pd.isna(record["limit"])
            rows.append(
                {
                    "ceiling": str(record["ceiling"]),
                    "used": _amount(record["used"], is_cost=is_cost),
                    "limit": _amount(record["limit"], is_cost=is_cost) if limited else NO_LIMIT,
                    "remaining": _amount(record["remaining"], is_cost=is_cost) if limited else "",
                    "used %": f"{100 * record['used_fraction']:.0f}%" if limited else "",
                    "saved": _amount(record["saved"], is_cost=is_cost),
                    "judge": _amount(record["judge"], is_cost=is_cost),
                }
            )
        return pd.DataFrame(rows)


def _text(value: Any) -> str:
    return "" if value is None or _is_nan(value) else str(value)


def _is_nan(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or array is not "missing"
        return False


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _seconds(value: Any) -> str:
    return "" if _is_nan(value) else f"{float(value):.2f}"


def _amount(value: Any, *, is_cost: bool) -> str:
    if _is_nan(value):
        return ""
    return f"{float(value):.4g}" if is_cost else f"{int(round(float(value))):,}"


def _clock(times: pd.Series, *, with_date: bool = False) -> list[str]:
    """Local wall-clock times (``19:22:07``), the date too for a listing of runs."""
    pattern = "%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S"
    zone = datetime.now().astimezone().tzinfo
    return ["" if _is_nan(t) else t.tz_convert(zone).strftime(pattern) for t in times]
