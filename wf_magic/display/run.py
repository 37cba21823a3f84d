"""Text and HTML summaries of one run (its header, steps, gates, budget, reuse, result)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..store.records import BudgetUse, RunRow, StepRow
from ..store.summary import RunTally, StepTally
from ..visible import visible
from .badges import badge
from .facts import (
    Rejection,
    TokenSplit,
    budget_text,
    gate_rejections,
    loop_text,
    merge_rejections,
    result_text,
    reuse_line,
    shown_note,
    shown_reason,
    token_text,
    unit_total,
)

# The plan models (pydantic) load on first use, not here: `wf status` renders a run from its
# rows and the plan's JSON.
if TYPE_CHECKING:
    from ..drive.context import DriveStats


class Run(Protocol):
    """What a run rendering reads (a :class:`wf_magic.Run` handle is one)."""

    run_id: str
    stats: DriveStats | None
    warnings: list[str]

    @property
    def row(self) -> RunRow: ...

    @property
    def superseded_by(self) -> str | None: ...

    @property
    def steps(self) -> list[StepRow]: ...

    def tally(self) -> RunTally: ...

    def budget_use(self) -> BudgetUse: ...


GATES_STYLE = (
    "<style>.wf-gates table{border-collapse:collapse;margin:4px 0}"
    ".wf-gates th,.wf-gates td{padding:3px 10px;text-align:left;vertical-align:top;"
    "border-bottom:1px solid #d0d7de}.wf-gates td:nth-child(2){white-space:nowrap}</style>"
)
"""The gate panel's table style: padded cells, headers aligned with their columns."""


def gates_html(rejections: Sequence[Rejection]) -> str:
    """The gate panel: one row per rejection (identical consecutive ones merged), with the
    feedback and what is missing in cells of their own; reused verdicts are marked."""
    rows = "".join(
        f"<tr><td><code>{html.escape(r.step_id)}</code></td><td>{r.loops}</td>"
        f"<td>{html.escape(r.judge)}"
        f"{' <small>(reused from an earlier run)</small>' if r.is_reused else ''}</td>"
        f"<td>{html.escape(r.feedback)}</td><td>{html.escape(', '.join(r.missing))}</td></tr>"
        for r in merge_rejections(rejections)
    )
    return (
        f"<details open class='wf-gates'>{GATES_STYLE}<summary><b>Gate rejections</b> "
        f"({len(rejections)})</summary><table><thead><tr><th>step</th><th>loop</th>"
        "<th>judge</th><th>feedback</th><th>missing</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></details>"
    )


def result_html(text: str) -> str:
    """A clipped result as a small scrollable block."""
    return (
        "<div><b>result</b><pre style='max-height:12em;overflow:auto;white-space:pre-wrap'>"
        f"{html.escape(text, quote=False)}</pre></div>"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _StepLine:
    row: StepRow
    done: int
    total: int | None
    tokens: TokenSplit
    loop: str

    @property
    def units(self) -> str:
        return f"{self.done}/{self.total if self.total is not None else '?'}"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Facts:
    steps: list[_StepLine]
    rejections: list[Rejection]
    reuse: str | None
    result: str | None

    @property
    def tokens(self) -> TokenSplit:
        """The run's own tokens over its steps (paid · reused · judge)."""
        total = TokenSplit()
        for s in self.steps:
            total += s.tokens
        return total


@dataclass(frozen=True, slots=True)
class _PlanStepView:
    """The two fields of a frozen plan step a run view reads, straight from the plan's JSON."""

    map: str | None
    has_gate: bool


def _plan_steps(plan_json: str) -> dict[str, _PlanStepView]:
    # A run view reads two fields of each step straight from the plan's JSON and never
    # decodes the plan: `wf status` must show a run whose plan this version cannot drive
    # (hand-edited, or frozen by a newer wf_magic) from its rows, with the warning that says
    # why (spec/stored.py). A step it cannot read shows as a single unit without a gate.
    try:
        steps = json.loads(plan_json)["steps"]
    except (ValueError, LookupError, TypeError):
        return {}
    views = {}
    for s in steps if isinstance(steps, list) else ():
        if isinstance(s, dict) and isinstance(s.get("id"), str):
            shown = s.get("map") if isinstance(s.get("map"), str) else None
            views[s["id"]] = _PlanStepView(shown, s.get("gate") is not None)
    return views


_UNREAD_STEP = _PlanStepView(None, False)


def _facts(run: Run) -> _Facts:
    row = run.row
    plan = _plan_steps(row.plan_json)
    params: dict[str, Any] = json.loads(row.params_json)
    rows = run.steps
    tally = run.tally()  # counted in SQL: a 10 000-unit run is not read row by row
    lines = []
    for step in rows:
        counts = tally.steps.get(step.step_id, StepTally())
        plan_step = plan.get(step.step_id, _UNREAD_STEP)
        seen = counts.seen
        total = seen if step.status == "skipped" else unit_total(plan_step, params, rows)
        lines.append(
            _StepLine(
                row=step,
                done=counts.done,
                total=seen if total is None and seen else total,
                tokens=TokenSplit(
                    paid=counts.tokens, reused=counts.saved_tokens, judge=counts.judge_tokens
                ),
                loop=loop_text(step, has_gate=plan_step.has_gate),
            )
        )
    return _Facts(
        steps=lines,
        rejections=gate_rejections(tally.gate_attempts),
        reuse=reuse_line(tally.reused, tally.reused_saved_tokens),
        result=result_text(row.result_json) if row.status == "completed" else None,
    )


def run_text(run: Run) -> str:
    """A plain-text summary of a run: header, steps, gates, budget, reuse, warnings, result,
    with control characters made visible (wf_magic/visible.py)."""
    row = run.row
    facts = _facts(run)
    lines = [f"Run {row.run_id}  {row.workflow}  [{row.status}]"]
    if row.status_reason:
        lines.append(f"  reason: {row.status_reason}")
    successor = run.superseded_by
    if successor:
        lines.append(f"  superseded by {successor}")
    for s in facts.steps:
        loop = f"  loop {s.loop}" if s.loop else ""
        note = f"  — {s.row.note}" if s.row.note else ""
        lines.append(
            f"  {s.row.step_id:<16} {s.row.status:<9} units {s.units}  "
            f"tokens {token_text(s.tokens)}{loop}{note}"
        )
    for r in facts.rejections:
        missing = f"; missing: {', '.join(r.missing)}" if r.missing else ""
        lines.append(
            f"  gate rejected {r.step_id} loop {r.loop} ({r.judge}): {r.feedback}{missing}"
        )
    lines.append(f"  tokens: {token_text(facts.tokens)}")
    lines.append(f"  budget: {budget_text(run.budget_use(), sep='  ')}")
    if facts.reuse:
        lines.append(f"  {facts.reuse}")
    if run.stats is not None:
        lines.append(f"  {_stats_text(run)}")
    lines.extend(f"  warning: {w}" for w in run.warnings)
    if facts.result is not None:
        lines.append(f"  result: {facts.result}")
    return visible("\n".join(lines))  # a model's words never reach a terminal as escapes


def _stats_text(run: Run) -> str:
    s = run.stats
    if s is None:
        return ""
    stopped = f", stopped by {s.stopped_by}" if s.stopped_by else ""
    return (
        f"this drive: {s.dispatched} dispatched, {s.reused} reused "
        f"({s.saved_tokens} tokens saved){stopped}"
    )


def run_html(run: Run) -> str:
    """An HTML summary of a run (for notebooks without widgets, and nbconvert): the live
    view's header, step table, gate panel, budget, reuse and warnings, plus the result."""
    row = run.row
    facts = _facts(run)
    head = (
        f"<div><b>{html.escape(row.workflow)}</b> <code>{html.escape(row.run_id)}</code> "
        f"{badge(row.status)}</div>"
    )
    # Each message once: a reason a step row states, or feedback the gate panel lists, is
    # not repeated in the header or the row.
    reason = shown_reason(row.status_reason, (s.row.note for s in facts.steps))
    if reason:
        head += f"<div><i>{html.escape(reason)}</i></div>"
    successor = run.superseded_by
    if successor:
        head += f"<div>superseded by <code>{html.escape(successor)}</code></div>"
    body = ""
    for s in facts.steps:
        note = shown_note(s.row.note, facts.rejections, s.row.step_id)
        body += (
            f"<tr><td><code>{html.escape(s.row.step_id)}</code></td>"
            f"<td>{badge(s.row.status)}</td><td>{s.units}</td><td>{token_text(s.tokens)}</td>"
            f"<td>{s.loop}</td><td>{html.escape(note)}</td></tr>"
        )
    table = (
        "<table><thead><tr><th>step</th><th>status</th><th>units</th><th>tokens</th>"
        f"<th>loop</th><th>note</th></tr></thead><tbody>{body}</tbody></table>"
    )
    gates = gates_html(facts.rejections) if facts.rejections else ""
    budget = (
        f"<div>tokens — {html.escape(token_text(facts.tokens))}</div>"
        f"<div>budget — {html.escape(budget_text(run.budget_use()))}</div>"
    )
    notes = [facts.reuse] if facts.reuse else []
    notes.extend(run.warnings)
    warn = "".join(f"<div>⚠ {html.escape(w)}</div>" for w in notes)
    stats = f"<div><small>{html.escape(_stats_text(run))}</small></div>" if run.stats else ""
    result = result_html(facts.result) if facts.result is not None else ""
    return f"<div class='wf-run'>{head}{result}{table}{gates}{budget}{warn}{stats}</div>"


def stop_text(run_id: str, status: str, *, driven: bool) -> str:
    """What ``wf stop`` / ``%workflow stop`` say of an unfinished run: its driver stops after
    the units in flight, or (nobody drives it) that nothing stops."""
    if driven:
        return f"stop requested for {run_id}; its driver stops after the units in flight"
    return (
        f"run {run_id} ({status}) is not being driven now: nothing stops; a drive started "
        "later runs as usual"
    )
