"""How ``wf`` prints a frame (:func:`print_frame`): CSV cells a spreadsheet will not evaluate
(text that starts like a formula is prefixed with a single quote, as OWASP recommends; every
CSV that ``wf`` writes goes through here), JSON with raw values, or a table whose control
characters are made visible."""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

FORMULA_STARTS: tuple[str, ...] = ("=", "+", "-", "@", "\t", "\r")
"""The first characters that make a spreadsheet (Excel, LibreOffice, Google Sheets) read a
cell as a formula (OWASP "CSV Injection"): such a cell is written as ``'`` + its text."""


def csv_cell(value: Any) -> Any:
    """``value`` as a CSV cell: text starting like a formula gets a leading ``'``; an object
    or a list (a JSONL row's field) is its JSON, not Python's repr; numbers, None and other
    text are returned as they are (a negative *number* is a number)."""
    if isinstance(value, dict | list):
        import json

        value = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text cells and column names are safe CSV cells."""
    out = frame.copy()
    out.columns = [csv_cell(str(c)) for c in frame.columns]
    for position, dtype in enumerate(frame.dtypes):
        if str(dtype) in ("object", "string", "str"):
            out.isetitem(position, frame.iloc[:, position].map(csv_cell))
    return out


def write_csv_frame(frame: pd.DataFrame, out: IO[str]) -> None:
    """Write ``frame`` as CSV (no index) to ``out``, its cells escaped (:func:`csv_cell`)."""
    csv_frame(frame).to_csv(out, index=False)


def print_frame(frame: pd.DataFrame, fmt: str) -> None:
    """``frame`` on stdout as ``csv`` (cells escaped: :func:`csv_frame`), ``json`` (records,
    values raw, times ISO 8601) or a ``table`` (its header alone when it has no row, never
    pandas' "Empty DataFrame"), a model's control characters made visible."""
    import sys

    import pandas as pd

    from ..visible import visible

    if fmt == "csv":
        write_csv_frame(frame, sys.stdout)
    elif fmt == "json":
        print(frame.to_json(orient="records", date_format="iso"))
    elif frame.empty:
        print(visible("  ".join(map(str, frame.columns))))
    else:
        with pd.option_context("display.max_rows", None, "display.width", 200):
            print(visible(frame.to_string(index=False)))
