"""One event as a text line, a JSON object or a CSV row, as ``wf events`` streams it."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from ..store.records import EventRow
from ..visible import visible_line
from .spreadsheet import csv_cell

EVENT_COLUMNS: tuple[str, ...] = (
    "event_id",
    "run",
    "at",
    "kind",
    "step",
    "unit",
    "dispatch_id",
    "data_json",
)
"""The CSV columns of a streamed event: the columns of the events frame, in its order."""

DATA_CHARS = 160
"""A text line shows an event's data only up to this many characters."""


def event_at(at: float) -> str:
    """An event's time as ISO 8601 in UTC with milliseconds (``2026-01-31T09:30:00.123Z``)."""
    stamp = datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def event_json(row: EventRow) -> dict[str, Any]:
    """An event as one JSON object: ``cursor`` (its event id: pass it to ``--since`` to resume
    after it), ``event_id``, ``run``, ``at`` (ISO 8601, UTC), ``kind``, ``step``, ``unit``,
    ``dispatch_id`` and ``data`` (the redacted payload, decoded; None when it has none)."""
    return {
        "cursor": row.event_id,
        "event_id": row.event_id,
        "run": row.run_id,
        "at": event_at(row.at),
        "kind": row.kind,
        "step": row.step_id,
        "unit": row.unit_id,
        "dispatch_id": row.dispatch_id,
        "data": json.loads(row.data_json) if row.data_json else None,
    }


def event_csv_row(row: EventRow) -> list[str]:
    """An event's cells under :data:`EVENT_COLUMNS` (empty for a missing value), text that a
    spreadsheet would evaluate escaped (:func:`~wf_magic.display.spreadsheet.csv_cell`)."""
    cells = (row.event_id, row.run_id, event_at(row.at), row.kind, row.step_id, row.unit_id)
    tail = (row.dispatch_id, row.data_json)
    return ["" if v is None else csv_cell(str(v)) for v in (*cells, *tail)]


def event_text(row: EventRow, *, with_id: bool = True) -> str:
    """An event on one line: its id (the cursor), local time, kind, step and unit, short data."""
    stamp = time.strftime("%H:%M:%S", time.localtime(row.at))
    where = " ".join(x for x in (row.step_id, row.unit_id) if x)
    data = f"  {row.data_json}" if row.data_json and len(row.data_json) <= DATA_CHARS else ""
    head = f"{row.event_id:>6}  " if with_id else ""
    # One terminal line: a model's text in the data shows its controls, never runs them.
    return visible_line(f"{head}{stamp}  {row.kind:<14} {where}{data}".rstrip())
