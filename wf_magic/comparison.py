"""Two runs side by side: per unit both outputs (every loop), what changed, and the deltas.

``compare_runs`` lines up the work units of two runs (gate verdicts are folded into the
loops of the unit they judged) and classifies each one:

- ``new`` — only the later run has the unit (an added map item, a new step);
- ``removed`` — only the earlier run has it;
- ``changed`` — both have it, and its loops' inputs or outputs differ (an edited prompt, a
  gate that looped once more, another model);
- ``reused`` — the same inputs and outputs, answered in the later run by reuse;
- ``unchanged`` — the same inputs and outputs, dispatched again (``--no-cache``, sampling).

Token figures are *paid* tokens (charged dispatches); what a reused answer first cost is
``tokens_reused``. The sweeps build their comparison on this one.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .errors import UsageError
from .store import Store
from .store.records import AttemptRow

if TYPE_CHECKING:
    import pandas as pd

ChangeKind = Literal["new", "removed", "changed", "reused", "unchanged"]
CHANGE_ORDER: tuple[ChangeKind, ...] = ("changed", "new", "removed", "reused", "unchanged")
"""The order kinds are counted and listed in."""

_CLIP = 72


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopOutput:
    """The newest attempt of one unit in one gate loop."""

    loop: int
    status: str
    input_hash: str
    output: Any
    failure: str | None
    reused_from: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitComparison:
    """One work unit of two runs: its loops in each, its tokens and cost in each."""

    unit_id: str
    step_id: str
    change: ChangeKind
    before: tuple[LoopOutput, ...]
    """The earlier run's loops (empty when the unit is ``new``)."""
    after: tuple[LoopOutput, ...]
    """The later run's loops (empty when the unit is ``removed``)."""
    tokens_before: int
    tokens_after: int
    tokens_reused: int
    """What the later run's reused answers first cost (tokens saved by reuse)."""
    cost_before: float | None
    cost_after: float | None

    @property
    def tokens_delta(self) -> int:
        """Paid tokens of the later run minus the earlier run's."""
        return self.tokens_after - self.tokens_before

    @property
    def cost_delta(self) -> float | None:
        """Cost of the later run minus the earlier run's (None when neither reported one)."""
        if self.cost_before is None and self.cost_after is None:
            return None
        return (self.cost_after or 0.0) - (self.cost_before or 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunComparison:
    """Two runs unit by unit; prints as text, renders as HTML, and has a ``frame()``."""

    run_a: str
    run_b: str
    units: tuple[UnitComparison, ...]
    show_all: bool = field(default=False)

    def counts(self) -> dict[str, int]:
        """How many units of each kind, in ``CHANGE_ORDER``."""
        out: dict[str, int] = {kind: 0 for kind in CHANGE_ORDER}
        for unit in self.units:
            out[unit.change] += 1
        return out

    def differing(self) -> list[UnitComparison]:
        """The units that are changed, new or removed."""
        return [u for u in self.units if u.change in ("changed", "new", "removed")]

    @property
    def tokens_delta(self) -> int:
        """Paid tokens of the later run minus the earlier run's, over every unit."""
        return sum(u.tokens_delta for u in self.units)

    @property
    def cost_delta(self) -> float | None:
        """The cost delta over every unit (None when no unit reported a cost)."""
        deltas = [u.cost_delta for u in self.units if u.cost_delta is not None]
        return sum(deltas) if deltas else None

    def summary(self) -> str:
        """One line: the runs, the count of each kind, and the token and cost deltas."""
        counts = ", ".join(f"{n} {kind}" for kind, n in self.counts().items())
        cost = "" if self.cost_delta is None else f", cost {_signed_cost(self.cost_delta)}"
        return (
            f"compare {self.run_a} → {self.run_b}: {counts}; "
            f"tokens {self.tokens_delta:+d} paid{cost}"
        )

    def text(self) -> str:
        """The terminal rendering: the summary, then each listed unit loop by loop."""
        listed = list(self.units) if self.show_all else self.differing()
        lines = [self.summary()]
        if not listed:
            lines.append("(no unit differs; --all lists every unit)")
        for unit in listed:
            lines += ["", _unit_head(unit)]
            for loop, left, right in _loop_pairs(unit):
                lines.append(f"  l{loop}  {_clip(left):<{_CLIP}}  │ {_clip(right)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        listed = list(self.units) if self.show_all else self.differing()
        head = (
            "<tr><th>unit</th><th>change</th><th>loop</th>"
            f"<th>{html.escape(self.run_a)}</th><th>{html.escape(self.run_b)}</th>"
            "<th>tokens</th><th>cost</th></tr>"
        )
        rows = []
        for unit in listed:
            pairs = list(_loop_pairs(unit))
            for i, (loop, left, right) in enumerate(pairs):
                first = i == 0
                span = f" rowspan='{len(pairs)}'" if first and len(pairs) > 1 else ""
                lead = (
                    f"<td{span}><code>{html.escape(unit.unit_id)}</code></td>"
                    f"<td{span}>{_CHANGE_BADGE[unit.change]}</td>"
                    if first
                    else ""
                )
                tail = (
                    f"<td{span}>{_tokens_text(unit)}</td><td{span}>{_cost_text(unit)}</td>"
                    if first
                    else ""
                )
                rows.append(
                    f"<tr>{lead}<td>l{loop}</td><td><pre>{html.escape(left)}</pre></td>"
                    f"<td><pre>{html.escape(right)}</pre></td>{tail}</tr>"
                )
        body = "".join(rows) or "<tr><td colspan='7'><i>no unit differs</i></td></tr>"
        return (
            f"<div class='wf-compare'><b>{html.escape(self.summary())}</b>"
            f"<table style='border-collapse:collapse;font-size:12px'>{head}{body}</table></div>"
        )

    def frame(self) -> pd.DataFrame:
        """One row per unit: change, loops and final output in each run, tokens and cost."""
        import pandas as pd

        rows = [
            {
                "unit": u.unit_id,
                "step": u.step_id,
                "change": u.change,
                "loops_a": len(u.before),
                "loops_b": len(u.after),
                "output_a": _final(u.before),
                "output_b": _final(u.after),
                "tokens_a": u.tokens_before,
                "tokens_b": u.tokens_after,
                "tokens_delta": u.tokens_delta,
                "tokens_reused": u.tokens_reused,
                "cost_a": u.cost_before,
                "cost_b": u.cost_after,
                "cost_delta": u.cost_delta,
            }
            for u in self.units
        ]
        columns = list(rows[0]) if rows else ["unit", "step", "change"]
        frame = pd.DataFrame(rows, columns=columns)
        for name in ("cost_a", "cost_b", "cost_delta"):
            if name in frame:
                frame[name] = frame[name].astype("float64")
        return frame


def compare_runs(store: Store, run_a: str, run_b: str, *, show_all: bool = False) -> RunComparison:
    """Line up the work units of ``run_a`` (earlier) and ``run_b`` (later).

    Raises:
        UsageError: either run does not exist.
    """
    for run_id in (run_a, run_b):
        if store.get_run(run_id) is None:
            raise UsageError(f"No run {run_id!r} to compare; `wf list` shows the runs.")
    units_a = _by_unit(store.attempts_of(run_a))
    units_b = _by_unit(store.attempts_of(run_b))
    order = list(units_b) + [u for u in units_a if u not in units_b]
    compared = tuple(_compare_unit(unit, units_a.get(unit), units_b.get(unit)) for unit in order)
    return RunComparison(run_a=run_a, run_b=run_b, units=compared, show_all=show_all)


def _by_unit(rows: Iterable[AttemptRow]) -> dict[str, list[AttemptRow]]:
    out: dict[str, list[AttemptRow]] = {}
    for row in rows:
        if row.phase == "work":
            out.setdefault(row.unit_id, []).append(row)
    return out


def _compare_unit(
    unit_id: str, rows_a: list[AttemptRow] | None, rows_b: list[AttemptRow] | None
) -> UnitComparison:
    before = _loops(rows_a or [])
    after = _loops(rows_b or [])
    if not rows_a:
        change: ChangeKind = "new"
    elif not rows_b:
        change = "removed"
    elif _signature(before) != _signature(after):
        change = "changed"
    elif all(loop.status == "reused" for loop in after):
        change = "reused"
    else:
        change = "unchanged"
    step_id = (rows_b or rows_a or [])[0].step_id
    return UnitComparison(
        unit_id=unit_id,
        step_id=step_id,
        change=change,
        before=before,
        after=after,
        tokens_before=_paid(rows_a),
        tokens_after=_paid(rows_b),
        tokens_reused=sum(r.saved_tokens for r in rows_b or [] if r.status == "reused"),
        cost_before=_cost(rows_a),
        cost_after=_cost(rows_b),
    )


def _loops(rows: list[AttemptRow]) -> tuple[LoopOutput, ...]:
    newest: dict[int, AttemptRow] = {}
    for row in rows:
        newest[row.loop] = row
    return tuple(
        LoopOutput(
            loop=row.loop,
            status=row.status,
            input_hash=row.input_hash,
            output=None if row.output_json is None else json.loads(row.output_json),
            failure=row.failure,
            reused_from=row.reused_from,
        )
        for row in (newest[loop] for loop in sorted(newest))
    )


def _signature(loops: tuple[LoopOutput, ...]) -> list[tuple[str, str, str | None]]:
    """What must match for a unit to count as the same: each loop's input, output, failure."""
    return [
        (loop.input_hash, json.dumps(loop.output, sort_keys=True), loop.failure) for loop in loops
    ]


def _paid(rows: list[AttemptRow] | None) -> int:
    return sum((r.tokens_in or 0) + (r.tokens_out or 0) for r in rows or [] if r.charged)


def _cost(rows: list[AttemptRow] | None) -> float | None:
    costs = [r.cost for r in rows or [] if r.charged and r.cost is not None]
    return sum(costs) if costs else None


def _final(loops: tuple[LoopOutput, ...]) -> Any:
    return loops[-1].output if loops else None


def _loop_pairs(unit: UnitComparison) -> Iterable[tuple[int, str, str]]:
    left = {loop.loop: loop for loop in unit.before}
    right = {loop.loop: loop for loop in unit.after}
    for loop in sorted(set(left) | set(right)):
        yield loop, _loop_text(left.get(loop)), _loop_text(right.get(loop))


def _loop_text(loop: LoopOutput | None) -> str:
    if loop is None:
        return "—"
    if loop.failure:
        return f"failed: {loop.failure}"
    value = loop.output
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return f"{text} (reused)" if loop.status == "reused" else text


def _unit_head(unit: UnitComparison) -> str:
    return f"{unit.change:<9} {unit.unit_id}  tokens {_tokens_text(unit)}  {_cost_text(unit)}"


def _tokens_text(unit: UnitComparison) -> str:
    reused = f" (+{unit.tokens_reused} reused)" if unit.tokens_reused else ""
    return f"{unit.tokens_before} → {unit.tokens_after} ({unit.tokens_delta:+d}){reused}"


def _cost_text(unit: UnitComparison) -> str:
    delta = unit.cost_delta
    return "" if delta is None else f"cost {_signed_cost(delta)}"


def _signed_cost(value: float) -> str:
    return f"{'+' if value >= 0 else '-'}${abs(value):.4f}"


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _CLIP else flat[: _CLIP - 1] + "…"


_CHANGE_BADGE: dict[str, str] = {
    kind: f"<span style='color:{colour};font-weight:600'>{kind}</span>"
    for kind, colour in (
        ("changed", "#9a6700"),
        ("new", "#1a7f37"),
        ("removed", "#cf222e"),
        ("reused", "#57606a"),
        ("unchanged", "#57606a"),
    )
}
