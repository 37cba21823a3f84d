"""What each attempt was sent and what it answered: attempt records, their text, and diffs.

A record joins an attempt row with its journaled input (``inputs`` table, content-addressed
by ``input_hash``); diffs compare two records of one unit (loop against loop) or the units of
two runs (what an edit changed, and what it cost).
"""

from __future__ import annotations

import difflib
import html
import json
from dataclasses import dataclass
from typing import Any

from .errors import UsageError
from .store import Store
from .store.records import AttemptRow

NOT_RECORDED = "(input not recorded: the attempt predates journaled inputs)"


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One attempt of one unit: what it was sent, what it answered, what it cost."""

    run_id: str
    step_id: str
    unit_id: str
    attempt: int
    loop: int
    phase: str
    status: str
    runner: str
    model: str | None
    dispatch_id: str
    input_hash: str
    input: dict[str, Any] | None
    """The resolved input (redacted): rendered prompt with its feedback block, argv, bindings,
    or the judge's input; None for attempts journaled before inputs were recorded."""
    output: Any
    failure: str | None
    tokens_in: int | None
    """None: the server reported no count (unknown, shown as ``?``)."""
    tokens_out: int | None
    cost: float | None
    reused_from: str | None
    reused_from_run: str | None
    """The run whose attempt answered this reused one (None otherwise, or when gc'd)."""
    reused_from_unit: str | None
    """That attempt's unit."""
    saved_tokens: int
    started_at: float
    finished_at: float | None
    price_source: str | None = None
    """Where ``cost`` came from: ``runner``, ``runners.NAME.prices``, ``runners.NAME.local`` or
    ``genai-prices X.Y.Z``; None when nobody priced the attempt (its cost is null)."""

    @property
    def traceback(self) -> str | None:
        """A failed python step's traceback in its own frames (None otherwise)."""
        if self.failure and isinstance(self.output, dict):
            text = self.output.get("traceback")
            return text if isinstance(text, str) else None
        return None

    session_id: str | None = None
    agent: dict[str, Any] | None = None
    """An agent attempt's facts (harness, version, turns, worktree…); None for other kinds."""

    @property
    def duration_s(self) -> float | None:
        """Wall seconds from reserve to finish (None while running)."""
        return None if self.finished_at is None else self.finished_at - self.started_at

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON values (``wf show --format json``)."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["duration_s"] = self.duration_s
        return data


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitChange:
    """A unit whose input differs between two runs (or exists in only one)."""

    unit_id: str
    before: AttemptRecord | None
    after: AttemptRecord | None

    @property
    def tokens_delta(self) -> int:
        """Tokens the later run spent on this unit minus the earlier run's."""
        return _tokens(self.after) - _tokens(self.before)


def unit_attempts(store: Store, run_id: str, unit_id: str) -> list[AttemptRow]:
    """Every attempt of ``unit_id`` in the run, oldest first.

    Raises:
        UsageError: the run has no attempt of that unit (the units it has are named).
    """
    every = store.attempts_of(run_id)
    rows = [a for a in every if a.unit_id == unit_id]
    if not rows:
        units = sorted({a.unit_id for a in every})
        shown = ", ".join(units[:12]) + (" …" if len(units) > 12 else "")
        raise UsageError(
            f"Run {run_id} has no attempts of unit {unit_id!r}; its units: {shown or 'none yet'}",
            run_id=run_id,
        )
    return rows


def attempt_record(
    store: Store, run_id: str, unit_id: str, *, attempt: int | None = None, loop: int | None = None
) -> AttemptRecord:
    """The record of ``unit_id``'s attempt number ``attempt`` (default: the newest one).

    ``loop`` picks the newest attempt of that loop instead (a gated step's loop-by-loop view).

    Raises:
        UsageError: the run has no such unit or attempt (the units it has are named).
    """
    rows = unit_attempts(store, run_id, unit_id)
    if loop is not None:
        rows = [a for a in rows if a.loop == loop]
    if attempt is not None:
        rows = [a for a in rows if a.attempt == attempt]
    if not rows:
        what = f"attempt {attempt}" if attempt is not None else f"loop {loop}"
        raise UsageError(f"Run {run_id} unit {unit_id} has no {what}.", run_id=run_id)
    return record_of(store, rows[-1], with_agent=True)


def record_of(store: Store, row: AttemptRow, *, with_agent: bool = False) -> AttemptRecord:
    """A journal row with its input, decoded output and, when reused, where it came from
    (``with_agent``: and its agent facts)."""
    source = store.attempt_by_dispatch(row.reused_from) if row.reused_from else None
    return AttemptRecord(
        run_id=row.run_id,
        step_id=row.step_id,
        unit_id=row.unit_id,
        attempt=row.attempt,
        loop=row.loop,
        phase=row.phase,
        status=row.status,
        runner=row.runner,
        model=row.model,
        dispatch_id=row.dispatch_id,
        input_hash=row.input_hash,
        input=store.input_of(row.input_hash),
        output=None if row.output_json is None else json.loads(row.output_json),
        failure=row.failure,
        tokens_in=row.tokens_in,
        tokens_out=row.tokens_out,
        cost=row.cost,
        reused_from=row.reused_from,
        reused_from_run=source.run_id if source else None,
        reused_from_unit=source.unit_id if source else None,
        saved_tokens=row.saved_tokens,
        started_at=row.started_at,
        finished_at=row.finished_at,
        price_source=(
            store.price_source_of(row.run_id, row.dispatch_id) if row.cost is not None else None
        ),
        session_id=row.session_id,
        agent=store.agent_facts(row.dispatch_id) if with_agent and row.phase == "work" else None,
    )


def record_text(record: AttemptRecord) -> str:
    """A readable page of one attempt: header, input, output or failure."""
    cost = f", ${record.cost:.8f}".rstrip("0").rstrip(".") if record.cost is not None else ""
    if cost and record.price_source:
        cost += f" ({record.price_source})"
    took = f", {record.duration_s:.2f}s" if record.duration_s is not None else ""
    head = (
        f"{record.unit_id} attempt {record.attempt} (loop {record.loop}, {record.phase}) "
        f"{record.status} — {record.runner}{f'/{record.model}' if record.model else ''}, "
        f"{_count(record.tokens_in)}+{_count(record.tokens_out)} tokens{cost}{took}"
    )
    lines = [head]
    if record.reused_from:
        origin = (
            f"run {record.reused_from_run} unit {record.reused_from_unit} "
            f"(dispatch {record.reused_from})"
            if record.reused_from_run
            else f"dispatch {record.reused_from} (its run was deleted)"
        )
        lines.append(f"reused from {origin}; first cost {record.saved_tokens} tokens")
    if record.agent:
        from .display import agent_lines

        lines += ["", "── agent ──", *agent_lines(record.agent, record.cost)]
    lines += ["", "── input ──", input_text(record.input), "", "── output ──"]
    lines.append(f"failed: {record.failure}" if record.failure else _value_text(record.output))
    if record.traceback:
        lines += ["", "── traceback ──", record.traceback]
    return "\n".join(lines)


def input_text(data: dict[str, Any] | None) -> str:
    """The input as a person reads it: the prompt or argv first, then the other fields."""
    if data is None:
        return NOT_RECORDED
    parts = []
    if data.get("prompt") is not None:
        parts.append(str(data["prompt"]))
    if data.get("argv") is not None:
        parts.append("argv: " + json.dumps(data["argv"]))
    rest = {k: v for k, v in data.items() if k not in ("prompt", "argv") and v is not None}
    if rest:
        parts.append(json.dumps(rest, indent=2, sort_keys=True, default=str))
    return "\n".join(parts)


def unit_diff(a: AttemptRecord | None, b: AttemptRecord | None) -> str:
    """A unified diff of two attempts' inputs then outputs ('' when both are the same)."""
    label_a = _label(a)
    label_b = _label(b)
    sections = []
    for title, left, right in (
        ("input", _input_or_blank(a), _input_or_blank(b)),
        ("output", _output_or_blank(a), _output_or_blank(b)),
    ):
        diff = list(
            difflib.unified_diff(
                left.splitlines(),
                right.splitlines(),
                fromfile=f"{label_a} {title}",
                tofile=f"{label_b} {title}",
                lineterm="",
            )
        )
        if diff:
            sections.append("\n".join(diff))
    return "\n\n".join(sections)


def loop_diff(store: Store, run_id: str, unit_id: str, loop_a: int, loop_b: int) -> str:
    """What changed in ``unit_id``'s input and output from ``loop_a`` to ``loop_b``.

    Raises:
        UsageError: the unit has no attempt in one of the loops.
    """
    a = attempt_record(store, run_id, unit_id, loop=loop_a)
    b = attempt_record(store, run_id, unit_id, loop=loop_b)
    return unit_diff(a, b)


def run_changes(
    store: Store, run_a: str, run_b: str, *, unit_id: str | None = None
) -> list[UnitChange]:
    """Units whose newest input differs between two runs (or that only one of them has)."""
    newest_a = _newest_by_unit(store, run_a, unit_id)
    newest_b = _newest_by_unit(store, run_b, unit_id)
    changes = []
    for unit in sorted(set(newest_a) | set(newest_b)):
        row_a, row_b = newest_a.get(unit), newest_b.get(unit)
        if row_a is not None and row_b is not None and row_a.input_hash == row_b.input_hash:
            continue
        changes.append(
            UnitChange(
                unit_id=unit,
                before=record_of(store, row_a) if row_a else None,
                after=record_of(store, row_b) if row_b else None,
            )
        )
    return changes


def changes_text(run_a: str, run_b: str, changes: list[UnitChange]) -> str:
    """``wf diff`` output: each changed unit, its token delta, then its diff."""
    if not changes:
        return f"no unit's input differs between {run_a} and {run_b}"
    delta = sum(c.tokens_delta for c in changes)
    lines = [f"{len(changes)} unit(s) differ between {run_a} and {run_b} ({delta:+d} tokens)"]
    for change in changes:
        lines += ["", f"== {change.unit_id} ({change.tokens_delta:+d} tokens)"]
        lines.append(unit_diff(change.before, change.after) or "(same input text)")
    return "\n".join(lines)


def diff_html(text: str) -> str:
    """A unified diff as HTML for a notebook (additions green, removals red)."""
    rows = []
    for line in text.splitlines():
        colour = "#1a7f37" if line.startswith("+") else "#cf222e" if line.startswith("-") else ""
        style = f" style='color:{colour}'" if colour else ""
        rows.append(f"<div{style}>{html.escape(line) or '&nbsp;'}</div>")
    return "<pre class='wf-diff' style='font-size:12px'>" + "".join(rows) + "</pre>"


class UnitDiff(str):
    """A unified diff that renders as coloured HTML in a notebook ('' when nothing changed)."""

    __slots__ = ()

    def _repr_html_(self) -> str:
        return diff_html(str(self)) if self else "<i>no change</i>"


def _newest_by_unit(store: Store, run_id: str, unit_id: str | None) -> dict[str, AttemptRow]:
    newest: dict[str, AttemptRow] = {}
    for row in store.attempts_of(run_id):
        if unit_id is None or row.unit_id == unit_id:
            newest[row.unit_id] = row
    return newest


def _tokens(record: AttemptRecord | None) -> int:
    """The known tokens of ``record`` (an unknown count adds nothing)."""
    return 0 if record is None else (record.tokens_in or 0) + (record.tokens_out or 0)


def _count(tokens: int | None) -> str:
    """A token count as shown: ``?`` when the server reported none."""
    return "?" if tokens is None else str(tokens)


def _label(record: AttemptRecord | None) -> str:
    if record is None:
        return "(absent)"
    return f"{record.run_id}:{record.unit_id}#{record.attempt}(l{record.loop})"


def _input_or_blank(record: AttemptRecord | None) -> str:
    return "" if record is None else input_text(record.input)


def _output_or_blank(record: AttemptRecord | None) -> str:
    if record is None:
        return ""
    return f"failed: {record.failure}" if record.failure else _value_text(record.output)


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, default=str)
