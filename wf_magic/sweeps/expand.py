"""A sweep's definition (grid × rows × repeat) checked against the plan's params, expanded into
cells, and hashed into the sweep's identity."""

from __future__ import annotations

import csv
import difflib
import io
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FileRefused, UsageError, clip
from ..hashing import canonical_json, hash_value
from ..reading import read_bounded
from ..sealing import unseal
from ..spec.params import SWEEP_PARAM, check_param, coerce_param, normalise, resolve_params
from ..spec.plan import Plan
from .secrets import holds_secret, not_an_axis

MAX_ROWS_BYTES = 64 * 1024 * 1024
"""The largest rows file (``--rows FILE``, ``rows="data.csv"``) a sweep reads: 64 MiB.

A sweep keeps every row in memory and stores them in its definition; a bigger dataset is
split over several sweeps. A larger file, or a special one (``/dev/zero``, a FIFO), is refused
in one line naming it, before more than the bound + 1 byte is read.
"""
SWEEP_ID_PREFIX = "sw-"


@dataclass(frozen=True, slots=True, kw_only=True)
class Definition:
    """What a sweep is: its grid (axis → values, in the given order), rows and repeat count."""

    grid: dict[str, list[Any]]
    rows: list[dict[str, Any]] | None
    repeat: int
    params: dict[str, Any] = field(default_factory=dict)
    """The params every cell shares (``--param``, ``params=``), secret values as their seals
    (:mod:`wf_magic.sealing`): a secret is one value for the whole sweep, never an axis."""

    def as_json(self) -> str:
        """Canonical JSON of the definition (stored with the sweep)."""
        return canonical_json(self._identity())

    def _identity(self) -> dict[str, Any]:
        out = {"grid": self.grid, "rows": self.rows, "repeat": self.repeat}
        return {**out, "params": self.params} if self.params else out

    @property
    def axes(self) -> list[str]:
        return list(self.grid)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One cell: a grid point, a row (its index in the rows) and a repeat index."""

    index: int
    point: dict[str, Any]
    row_index: int | None
    repeat: int
    params: dict[str, Any]
    """The run's params: the point ∪ the row's fields (∪ ``sweep.repeat`` when repeat > 1)."""


def definition(
    plan: Plan,
    *,
    grid: Mapping[str, Sequence[Any]] | None,
    rows: Any,
    repeat: int,
    from_strings: bool = False,
    params: Mapping[str, Any] | None = None,
) -> Definition:
    """Check a sweep's grid, rows and repeat against ``plan``'s params.

    ``params``: the params every cell shares, their secrets sealed
    (:func:`wf_magic.sweeps.secrets.fixed_params`).

    Raises:
        UsageError: an axis or row column the workflow does not declare, a secret param as
            an axis or a column, an axis that is also a column or a fixed param, an empty
            axis, no rows in a given rows source, a bad repeat.
    """
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise UsageError(f"sweep repeat: expected an integer >= 1 (got {repeat!r})")
    declared = sorted(plan.params)
    axes: dict[str, list[Any]] = {}
    for name, values in (grid or {}).items():
        _not_reserved("grid axis", str(name))
        if name not in plan.params:
            raise UsageError(
                f"sweep grid axis {name!r} is not a param of workflow {plan.name!r}; "
                f"declared: {declared or 'none'}"
            )
        if not isinstance(values, str | Sequence | set | frozenset):
            raise UsageError(
                f"sweep grid axis {name!r}: expected a list of values "
                f"(got {clip(repr(values), 60)})"
            )
        listed = [values] if isinstance(values, str) else list(values)
        if holds_secret(name, listed):
            raise not_an_axis("grid axis", name)
        try:
            json.dumps(listed, allow_nan=False)
        except (TypeError, ValueError):
            raise UsageError(
                f"sweep grid axis {name!r}: expected JSON values with finite numbers "
                f"(got {clip(repr(listed), 80)})"
            ) from None
        if name in (params or {}):
            raise UsageError(
                f"sweep grid axis {name!r} is also given as a param of every cell; keep it in "
                "one of the two"
            )
        if not listed:
            raise UsageError(f"sweep grid axis {name!r} has no values; give at least one")
        schema = plan.params[name]
        axes[name] = [
            normalise(
                coerce_param(schema, v, name=name) if from_strings and isinstance(v, str) else v
            )
            for v in listed
        ]
    table = None if rows is None else load_rows(rows)
    if table is not None:
        _check_columns(plan, table, axes, declared, fixed=params or {})
        table = [
            {
                k: _row_param(plan, table, i, k, v) if k in plan.params else _row_field(v)
                for k, v in row.items()
            }
            for i, row in enumerate(table)
        ]
    cells = math.prod(len(v) for v in axes.values()) * (1 if table is None else len(table)) * repeat
    if cells > MAX_CELLS:
        raise UsageError(
            f"sweep: {cells:,} cells ({' × '.join(_sizes(axes, table, repeat))}) is more than "
            f"{MAX_CELLS:,}; split it into several sweeps (each with its own `key`)"
        )
    return Definition(grid=axes, rows=table, repeat=repeat, params=dict(params or {}))


MAX_CELLS = 1_000_000
"""The most cells a sweep holds: each is a row written at once (a billion never fit)."""


def _sizes(
    axes: Mapping[str, list[Any]], table: list[dict[str, Any]] | None, repeat: int
) -> list[str]:
    sizes = [f"{len(v):,} {k}" for k, v in axes.items()]
    sizes += [f"{len(table):,} rows"] if table is not None else []
    return [*sizes, f"{repeat:,} repeats"]


def _row_field(value: Any) -> Any:
    """A row's cell that is no param (a row field): kept as JSON keeps it; a missing number
    (a DataFrame's NaN) is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return normalise(value)


def _row_param(plan: Plan, table: list[dict[str, Any]], i: int, name: str, value: Any) -> Any:
    """A row's cell as the param ``name``: a text cell coerced to the declared type (a CSV
    cell is text; JSON rows keep theirs), then checked against the param's schema — here,
    so that a bad cell is refused naming the file, row, line and column, not the first run.

    Raises:
        UsageError: ``sweep rows: FILE row I (line N), column 'n': expected a number (got
            'NaN'); …`` — the cell is not a value of the param.
    """
    schema = plan.params[name]
    try:
        if isinstance(value, str) and schema.get("type") not in (None, "string"):
            value = coerce_param(schema, value, name=name)
        return check_param(schema, value, name=name)
    except UsageError as exc:
        problem = str(exc).removeprefix(f"param {name}: ")
        raise UsageError(
            f"{_where_row(table, i)}, column {name!r}: {problem}; fix the cell, or drop the "
            "column so the param's default applies to every row"
        ) from None


def _where_row(table: list[dict[str, Any]], i: int) -> str:
    """``sweep rows: FILE row I (line N)`` where a file's reader remembered the lines, else
    ``sweep rows: row I``."""
    source = getattr(table, "source", None)
    lines = getattr(table, "lines", None)
    if source is None:
        return f"sweep rows: row {i}"
    line = f" (line {lines[i]})" if lines is not None and i < len(lines) else ""
    return f"sweep rows: {source} row {i}{line}"


class RowsTable(list[dict[str, Any]]):
    """A rows file's rows, remembering the file and each row's first line (for messages)."""

    def __init__(
        self, rows: Iterable[dict[str, Any]] = (), *, source: str, lines: list[int] | None = None
    ) -> None:
        super().__init__(rows)
        self.source = source
        self.lines: list[int] = [] if lines is None else lines


FRAME_COLUMNS = (
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
)
"""The sweep frame's fixed columns, after one column per grid axis and rows field (result
fields come after): a grid axis or a rows field of one of these names is refused."""


def reserved_column(name: str) -> bool:
    """Whether ``name`` is a column the sweep frame fills itself (a fixed column, a score's
    ``score.<step>.<name>``, a gate's ``gate_<step>…``)."""
    return name in FRAME_COLUMNS or name.startswith(("score.", "gate_"))


def _not_reserved(kind: str, name: str) -> None:
    if reserved_column(name):
        raise UsageError(
            f"sweep {kind} {name!r} has the name of a column the sweep frame fills itself "
            f"({', '.join(FRAME_COLUMNS)}, score.*, gate_*); rename it"
        )


def _misspelt_param(column: str, params: Iterable[str]) -> str | None:
    """The param a rows column's name most likely misspells (a near miss, or the same name in
    another case), else None."""
    names = [str(p) for p in params]
    near = difflib.get_close_matches(column, names, n=1, cutoff=0.8)
    if near:
        return near[0]
    return next((p for p in names if p.lower() == column.lower()), None)


def _check_columns(
    plan: Plan,
    table: list[dict[str, Any]],
    axes: Mapping[str, Any],
    declared: list[str],
    *,
    fixed: Mapping[str, Any],
) -> None:
    for i, row in enumerate(table):
        for column, value in row.items():
            if i == 0 or column not in table[0]:
                _not_reserved("rows column", str(column))
            if column not in plan.params:
                # A dataset's own fields (an id, a category, the expected answer a scorer
                # reads through a param) ride along as row fields: in the frame, summary and
                # side-by-side, not given to the workflow. A near miss of a param is a typo.
                meant = _misspelt_param(str(column), plan.params)
                if meant is not None:
                    raise UsageError(
                        f"sweep rows: row {i} has column {column!r}, which is not a param of "
                        f"workflow {plan.name!r}; did you mean {meant!r}? (declared: "
                        f"{declared or 'none'}; a column that is no param is kept as a row "
                        "field only when its name is not that close to one)"
                    )
            if holds_secret(column, value):
                raise not_an_axis("rows column", column)
            if column in fixed:
                raise UsageError(
                    f"sweep rows: column {column!r} is also given as a param of every cell; "
                    "keep it in one of the two"
                )
            if column in axes:
                raise UsageError(
                    f"sweep rows: column {column!r} is also a grid axis; keep it in one of the two"
                )


def load_rows(rows: Any) -> list[dict[str, Any]]:
    """Rows as a list of dicts, from a DataFrame, a list of dicts or a .csv / .jsonl path.

    Raises:
        UsageError: the file is missing or of another kind, a line or item is not an object,
            a DataFrame's column names repeat, a value is missing (NaN, a pandas NA) or not a
            finite number, or there are no rows.
    """
    table: list[Any]
    if isinstance(rows, (str, Path)):
        table = read_rows_file(Path(rows))
    elif hasattr(rows, "to_dict") and hasattr(rows, "columns"):  # a pandas DataFrame
        table = _frame_rows(rows)
    elif isinstance(rows, RowsTable):
        table = rows
    elif isinstance(rows, Iterable) and not isinstance(rows, Mapping):
        table = list(rows)
    else:
        raise UsageError(
            "sweep rows: expected a DataFrame, a list of dicts or a path to a .csv or "
            f".jsonl file (got {type(rows).__name__})"
        )
    for i, row in enumerate(table):
        if not isinstance(row, Mapping):
            raise UsageError(f"sweep rows: row {i} is not an object (got {type(row).__name__})")
        for column, value in row.items():
            if _missing(value):
                raise _missing_value("sweep rows:", i, column, value)
    if not table:
        raise UsageError("sweep rows: no rows; give at least one or leave rows out")
    out = [{str(k): v for k, v in row.items()} for row in table]
    if isinstance(table, RowsTable):  # a file's rows keep where they came from
        return RowsTable(out, source=table.source, lines=table.lines)
    return out


def _frame_rows(frame: Any) -> list[dict[str, Any]]:
    """A DataFrame's rows as dicts: its column names unique, its missing cells refused."""
    import pandas as pd

    columns = [str(c) for c in frame.columns]
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise UsageError(
            f"sweep rows: the DataFrame has the column {repeated[0]!r} more than once; "
            "rename or drop the copies"
        )
    table = [dict(r) for r in frame.to_dict(orient="records")]
    for i, row in enumerate(table):
        for column, value in row.items():
            if not isinstance(value, (list, dict, tuple)) and bool(pd.isna(value)):
                raise _missing_value("sweep rows:", i, column, value)
    return table


def _missing(value: Any) -> bool:
    """Whether ``value`` is a missing or non-finite number (NaN, inf), at any depth."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(_missing(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_missing(v) for v in value)
    return False


def _missing_value(where: str, row: int, column: Any, value: Any) -> UsageError:
    shown = "an empty field" if value == "" else repr(value)
    return UsageError(
        f"{where} row {row}, column {column!r}: the value is missing or not a finite number "
        f"({shown}); fill it in, "
        "or drop the column so the param's default applies to every row"
    )


def read_rows_file(path: Path) -> RowsTable:
    """The rows of a ``.csv`` or ``.jsonl`` file, read bounded (``MAX_ROWS_BYTES``).

    A UTF-8 byte order mark (what a spreadsheet writes) is skipped. A CSV's empty field is a
    missing value (a spreadsheet's blank cell): refused, like a JSONL ``NaN``.

    Raises:
        UsageError: one line naming the file (and the row and column where there is one):
            not .csv/.jsonl, missing, special, too large, not UTF-8, a line that is not JSON
            or not an object, a column named twice, a missing or non-finite value, a row
            longer or shorter than the header, or a CSV field over the csv module's limit.
    """
    if path.suffix not in (".csv", ".jsonl"):
        raise UsageError(f"sweep rows: expected a .csv or .jsonl file (got {path.name!r})")
    text = _rows_text(path).removeprefix("\ufeff")
    table = _csv_rows(path, text) if path.suffix == ".csv" else _jsonl_rows(path, text)
    for i, row in enumerate(table):
        for column, value in row.items():
            if _missing(value):
                raise _missing_value(f"sweep rows: {path}", i, column, value)
    return table


def _csv_rows(path: Path, text: str) -> RowsTable:
    """The rows of a CSV text: a header of unique names, then records of as many fields."""
    lines = _Lines(text)
    reader = csv.reader(lines)
    out = RowsTable(source=str(path))
    header: list[str] | None = None
    try:
        header = next(reader, None)
        if header is None:
            return out
        repeated = sorted({c for c in header if header.count(c) > 1})
        if repeated:
            raise UsageError(
                f"sweep rows: {path} line 1 (the header) names the column {repeated[0]!r} "
                "more than once; rename or drop the copies"
            )
        for record in reader:
            i = len(out)
            if not record:
                continue  # a blank line
            if len(record) != len(header):
                raise UsageError(
                    f"sweep rows: {path} row {i} (line {reader.line_num}) has {len(record)} "
                    f"field(s), the header {len(header)}; give every row one field per column"
                )
            for column, value in zip(header, record, strict=True):
                if value == "":
                    raise _missing_value(f"sweep rows: {path}", i, column, value)
            out.append(dict(zip(header, record, strict=True)))
            out.lines.append(lines.record_start)
    except csv.Error as exc:
        row = "the header" if header is None else f"row {len(out)}"
        column = _long_column(lines.record, header=header)
        raise UsageError(
            f"sweep rows: {path} {row} (line {lines.record_start}){column}: {exc}; "
            "a rows file's fields are short values (params), not documents"
        ) from None
    return out


class _Lines:
    """The lines of a CSV text for ``csv.reader``, remembering the record being read."""

    def __init__(self, text: str) -> None:
        self._lines = iter(io.StringIO(text, newline=""))
        self._line = 0
        self._record_open = False
        self.record_start = 1
        self.record = ""

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        line = next(self._lines)
        self._line += 1
        # A record continues while a quoted field is open (an odd count of quotes so far).
        if not self._record_open:
            self.record_start, self.record = self._line, ""
        self.record += line
        self._record_open = self.record.count('"') % 2 == 1
        return line


def _long_column(record: str, *, header: list[str] | None) -> str:
    """``, column 'x'``: the column of the first field of ``record`` over the csv limit."""
    limit = csv.field_size_limit()
    index, length, quoted = 0, 0, False
    for char in record:
        if char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            index, length = index + 1, 0
        else:
            length += 1
            if length > limit:
                if header is not None and index < len(header):
                    return f", column {header[index]!r}"
                return f", field {index + 1}"
    return ""


def _jsonl_rows(path: Path, text: str) -> RowsTable:
    """The objects of a JSONL text, one per non-blank line; a key twice is refused."""
    out = RowsTable(source=str(path))
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line, object_pairs_hook=_unique_keys)
        except _RepeatedKey as exc:
            raise UsageError(
                f"sweep rows: {path} row {len(out)} (line {n}) has the key {exc.key!r} more "
                "than once; keep one"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"sweep rows: {path} line {n} is not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise UsageError(
                f"sweep rows: {path} row {len(out)} (line {n}) is not an object "
                f"(got {type(value).__name__})"
            )
        out.append(value)
        out.lines.append(n)
    return out


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def _rows_text(path: Path) -> str:
    """The text of a rows file, read bounded (``MAX_ROWS_BYTES``; regular files only).

    Raises:
        UsageError: one line naming the file: missing, special, too large or not UTF-8.
    """
    try:
        data = read_bounded(path, limit=MAX_ROWS_BYTES)
    except FileRefused as exc:
        if exc.reason == "missing":
            raise UsageError(f"sweep rows: no file {str(path)!r} ({exc.problem})") from None
        advice = "; split the rows over several sweeps" if exc.reason == "too_large" else ""
        raise UsageError(f"sweep rows: cannot read {str(path)!r}: {exc.problem}{advice}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"sweep rows: {str(path)!r} is not UTF-8 text (byte {exc.start})"
        ) from None


def expand(plan: Plan, spec: Definition, *, secrets: Mapping[str, Any] | None = None) -> list[Cell]:
    """Every cell of ``spec``: grid points (axes in order) × rows × repeats, in that order.

    ``secrets``: seal → value of ``spec.params``' secrets; a cell is checked with the values
    and stores the seals.

    Raises:
        UsageError: a cell's params are invalid (a missing required param, a wrong type).
    """
    fixed = unseal(spec.params, secrets or {}, run_id="(a new sweep)")
    points = [
        dict(zip(spec.grid, combo, strict=True)) for combo in itertools.product(*spec.grid.values())
    ]
    rows: list[tuple[int | None, dict[str, Any]]] = (
        [(None, {})] if spec.rows is None else list(enumerate(spec.rows))
    )
    cells: list[Cell] = []
    for point, (row_index, row), rep in itertools.product(points, rows, range(spec.repeat)):
        fields = {k: v for k, v in row.items() if k in plan.params}  # the rest: row fields
        given: dict[str, Any] = {**fixed, **point, **fields}
        if spec.repeat > 1:
            given[SWEEP_PARAM] = {"repeat": rep}
        try:
            params = {**resolve_params(plan, given), **spec.params}  # secrets as their seals
        except UsageError as exc:
            where = f"cell {len(cells)} (point {point}, row {row_index}, repeat {rep})"
            raise UsageError(f"sweep {where}: {exc}") from None
        cells.append(
            Cell(index=len(cells), point=point, row_index=row_index, repeat=rep, params=params)
        )
    return cells


def sweep_identity(plan_hash: str, spec: Definition) -> tuple[str, str]:
    """(sweep id, definition hash): the hash of the plan, grid, rows and repeat."""
    digest = hash_value({"plan_hash": plan_hash, **spec._identity()})
    return SWEEP_ID_PREFIX + digest[:16], digest
