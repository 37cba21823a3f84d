"""Text and HTML renderings of runs and plans (no IPython): shared by CLI, reprs and widgets."""

from __future__ import annotations

import difflib
import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .store.records import AttemptRow, BudgetUse, RunRow, StepRow
from .store.summary import RunTally, StepTally

# The plan models (pydantic), the drive and Jinja load on first use, not here: `wf status`
# renders a run from its rows and the plan's JSON, and counts a map's items only if it has one.
if TYPE_CHECKING:
    from .drive.context import DriveStats
    from .spec.plan import Plan, PlanStep


class Run(Protocol):
    """What a run rendering reads (a :class:`wf_magic.Run` handle is one)."""

    run_id: str
    stats: DriveStats | None
    warnings: list[str]

    @property
    def row(self) -> RunRow: ...

    @property
    def steps(self) -> list[StepRow]: ...

    def tally(self) -> RunTally: ...

    def budget_use(self) -> BudgetUse: ...


STATUS_COLOURS = {
    "completed": "#1a7f37",
    "active": "#0969da",
    "pending": "#6e7781",
    "blocked": "#bf8700",
    "failed": "#cf222e",
    "skipped": "#8c959f",
    "abandoned": "#8c959f",
    # Attempt statuses (the plots' timeline bars): in flight reads like an active run, a
    # reused answer like skipped work, since nothing ran and nothing was charged for it.
    "running": "#0969da",
    "succeeded": "#1a7f37",
    "reused": "#8c959f",
    # A step that completed with failed units (a map under ``on_error: continue``): done,
    # but not all of it, so neither green nor red.
    "partial": "#bf8700",
}
"""The one colour of each run, step and attempt status: badges, the live view and the plots."""
UNKNOWN_STATUS_COLOUR = "#6e7781"
"""The colour of a status the table does not know."""
RESULT_CHARS = 400
"""How much of a completed run's result the renderings show."""
_DONE = ("succeeded", "reused")


# -- facts shared with the live view (notebook/snapshot.py) ------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A gate verdict that sent a step back (or stopped it)."""

    step_id: str
    loop: int
    judge: str
    feedback: str
    missing: tuple[str, ...]
    is_reused: bool = False
    """The verdict was taken from an earlier run (a fork's prefix, the same judge input)."""
    last_loop: int | None = None
    """Set when identical rejections of loops ``loop``..``last_loop`` are shown as one."""

    @property
    def loops(self) -> str:
        """``2``, or ``1–3`` for merged identical rejections."""
        if self.last_loop is None or self.last_loop == self.loop:
            return f"{self.loop}"
        return f"{self.loop}–{self.last_loop}"


def gate_rejections(attempts: Iterable[AttemptRow]) -> list[Rejection]:
    """The journaled gate verdicts (``<step>.gate:l<n>``) that said "not complete", including
    verdicts reused from an earlier run."""
    out = []
    for a in attempts:
        if a.phase != "gate" or a.status not in _DONE or not a.output_json:
            continue
        verdict = json.loads(a.output_json)
        if not isinstance(verdict, dict) or verdict.get("complete", True):
            continue
        out.append(
            Rejection(
                step_id=a.step_id,
                loop=a.loop,
                judge=str(verdict.get("judge", "")),
                feedback=str(verdict.get("feedback") or ""),
                missing=tuple(str(m) for m in verdict.get("missing") or ()),
                is_reused=a.status == "reused",
            )
        )
    return out


def merge_rejections(rejections: Sequence[Rejection]) -> list[Rejection]:
    """Consecutive identical rejections of one step as one row (each message shown once)."""
    out: list[Rejection] = []
    for r in rejections:
        last = out[-1] if out else None
        if (
            last is not None
            and (last.step_id, last.judge, last.feedback, last.missing, last.is_reused)
            == (r.step_id, r.judge, r.feedback, r.missing, r.is_reused)
            and r.loop == (last.last_loop or last.loop) + 1
        ):
            out[-1] = Rejection(
                step_id=last.step_id,
                loop=last.loop,
                judge=last.judge,
                feedback=last.feedback,
                missing=last.missing,
                is_reused=last.is_reused,
                last_loop=r.loop,
            )
        else:
            out.append(r)
    return out


def shown_note(note: str | None, rejections: Sequence[Rejection], step_id: str) -> str:
    """A step's note without the gate feedback the rejections table already shows."""
    text = note or ""
    mine = [r for r in rejections if r.step_id == step_id]
    head, sep, _feedback = text.partition("; last feedback: ")
    return head if sep and mine else text


def shown_reason(reason: str | None, notes: Iterable[str | None]) -> str:
    """A run's status reason, unless a step row already says it (``step X: <note>``)."""
    if not reason:
        return ""
    for note in notes:
        if note and reason.endswith(note):
            return ""
    return reason


def unit_counts(step: StepRow, attempts: Iterable[AttemptRow]) -> tuple[int, int]:
    """(done, seen) work units of the step's current loop, by each unit's latest attempt."""
    latest: dict[str, AttemptRow] = {}
    for a in attempts:
        if a.phase == "work" and a.step_id == step.step_id:
            latest[a.unit_id] = a
    current = [a for a in latest.values() if a.loop == step.loop]
    return sum(a.status in _DONE for a in current), len(current)


class MapStep(Protocol):
    """What counting a step's units reads (a ``PlanStep`` is one)."""

    @property
    def map(self) -> str | None: ...


def unit_total(plan_step: MapStep, params: dict[str, Any], rows: Sequence[StepRow]) -> int | None:
    """How many work units the step has: 1, a map's expansion, or None while its input is owed."""
    if plan_step.map is None:
        return 1
    from .drive.units import StepInputError, map_items

    outputs = {
        r.step_id: json.loads(r.output_json) if r.output_json else None
        for r in rows
        if r.status in ("completed", "skipped")
    }
    try:
        items = map_items(plan_step.map, params, outputs)
    except StepInputError:
        return None  # an earlier step has not produced the map's input yet
    return len(items)


def result_text(result_json: str | None, *, limit: int = RESULT_CHARS) -> str | None:
    """A completed run's result for display: text as is, anything else as JSON, clipped."""
    if result_json is None:
        return None
    value = json.loads(result_json)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def budget_text(use: BudgetUse, *, sep: str = " · ") -> str:
    """``units 5/10 · tokens 66/∞`` (cost only when it is limited or spent)."""
    parts = [
        f"units {use.units:,}/{_limit(use.max_units)}",
        f"tokens {use.tokens:,}/{_limit(use.max_tokens)}",
    ]
    if use.max_cost or use.cost:
        parts.append(f"cost {use.cost:.4g}/{_limit(use.max_cost)}")
    return sep.join(parts)


def _limit(value: float | None) -> str:
    return "∞" if not value else f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def reuse_text(attempts: Iterable[AttemptRow]) -> str | None:
    """``reused 4 results from earlier runs (60 tokens saved)``, or None when nothing was."""
    reused = [a for a in attempts if a.status == "reused"]
    return _reuse_line(len(reused), sum(a.saved_tokens for a in reused))


def _reuse_line(count: int, saved: int) -> str | None:
    if not count:
        return None
    plural = "s" if count != 1 else ""
    return f"reused {count} result{plural} from earlier runs ({saved:,} tokens saved)"


def origin_text(
    *, created: bool, done_before: int, total: int, stats: DriveStats | None
) -> str | None:
    """How a drive began, for the header of a re-run: ``existing run, nothing dispatched``,
    ``resumed: 6/8 already done, 2 dispatched`` (None for a fresh run or an unknown drive)."""
    if created or stats is None:
        return None
    if not stats.dispatched and not stats.reused:
        return "existing run, nothing dispatched"
    return f"resumed: {done_before}/{total} already done, {stats.dispatched} dispatched"


def good_news_html(text: str) -> str:
    """A line of good news (reuse, nothing to re-pay): green, with a check mark."""
    colour = STATUS_COLOURS["completed"]
    return f'<div style="color:{colour}">✓ {html.escape(text)}</div>'


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


# -- the review panel of a blocked gate -------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class ArtifactUnit:
    """One unit of the artifact a gate waits on, with its output of the previous loop."""

    unit_id: str
    output: Any
    previous: Any = None
    has_previous: bool = False
    """The unit has an output in the previous loop (``previous`` may be None as a value)."""


def value_text(value: Any) -> str:
    """A unit's output as a person reads it: text as is, anything else as indented JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def text_diff(before: str, after: str, *, before_name: str, after_name: str) -> str:
    """A unified diff of two texts ('' when they are the same)."""
    return "\n".join(
        difflib.unified_diff(
            before.splitlines(),
            after.splitlines(),
            fromfile=before_name,
            tofile=after_name,
            lineterm="",
        )
    )


def diff_lines_html(diff: str) -> str:
    """A unified diff as HTML: additions green, removals red, hunk headers grey."""
    rows = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            style = "color:#57606a"
        elif line.startswith("+"):
            style = f"color:{STATUS_COLOURS['completed']};background:#dafbe1"
        elif line.startswith("-"):
            style = f"color:{STATUS_COLOURS['failed']};background:#ffebe9"
        elif line.startswith("@@"):
            style = "color:#8250df"
        else:
            style = ""
        attr = f' style="{style}"' if style else ""
        rows.append(f"<div{attr}>{html.escape(line) or '&nbsp;'}</div>")
    return (
        "<pre class='wf-diff' style='font-size:12px;margin:2px 0;white-space:pre-wrap'>"
        + "".join(rows)
        + "</pre>"
    )


def rich_text_html(text: str) -> str:
    """A string artifact rendered for reading: Markdown when markdown-it-py is installed
    (raw HTML in it is escaped, never run), else the text with its line breaks kept."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return f"<div style='white-space:pre-wrap'>{html.escape(text)}</div>"
    rendered: str = MarkdownIt("commonmark", {"html": False}).render(text)
    return f"<div class='wf-markdown'>{rendered}</div>"


def criteria_html(criteria: Sequence[str]) -> str:
    """The gate's criteria (rendered) as a checklist to judge against."""
    if not criteria:
        return "<div><i>No criteria written: judge whether the step did what it asked.</i></div>"
    items = "".join(f"<li>{html.escape(c)}</li>" for c in criteria)
    return f"<div class='wf-criteria'><b>Criteria</b><ul style='margin:2px 0'>{items}</ul></div>"


def artifact_cards_html(units: Sequence[ArtifactUnit], *, loop: int) -> str:
    """One card per unit of the artifact (text as Markdown, data as JSON), each with the
    diff against its output of the previous loop when there was one."""
    cards = []
    for unit in units:
        output = unit.output
        data = html.escape(value_text(output))
        body = (
            rich_text_html(output)
            if isinstance(output, str)
            else f"<pre style='margin:0;white-space:pre-wrap'>{data}</pre>"
        )
        diff = ""
        if unit.has_previous:
            text = text_diff(
                value_text(unit.previous),
                value_text(output),
                before_name=f"loop {loop - 1}",
                after_name=f"loop {loop}",
            )
            diff = (
                f"<details class='wf-card-diff'><summary>changes since loop {loop - 1}</summary>"
                f"{diff_lines_html(text)}</details>"
                if text
                else f"<div><small>unchanged since loop {loop - 1}</small></div>"
            )
        cards.append(
            "<div class='wf-card' style='border:1px solid #d0d7de;border-radius:6px;"
            "padding:4px 10px;margin:4px 0;max-height:20em;overflow:auto'>"
            f"<div><code>{html.escape(unit.unit_id)}</code></div>{body}{diff}</div>"
        )
    count = f"{len(units)} unit{'s' if len(units) != 1 else ''}"
    return f"<div class='wf-artifact'><b>Artifact</b> ({count}){''.join(cards)}</div>"


def loop_text(step: StepRow, *, has_gate: bool) -> str:
    """``2/3`` for a gated or looping step, else empty."""
    return f"{step.loop}/{step.max_loops}" if has_gate or step.max_loops > 1 else ""


# -- one run ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class _StepLine:
    row: StepRow
    done: int
    total: int | None
    tokens: int
    saved_tokens: int
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


@dataclass(frozen=True, slots=True)
class _PlanStepView:
    """The two fields of a frozen plan step a run view reads, straight from the plan's JSON."""

    map: str | None
    has_gate: bool


def _plan_steps(plan_json: str) -> dict[str, _PlanStepView]:
    # The stored plan is our own canonical JSON (its hash is verified before every drive):
    # reading two fields needs no pydantic validation of the whole plan.
    try:
        steps = json.loads(plan_json)["steps"]
        return {s["id"]: _PlanStepView(s.get("map"), s.get("gate") is not None) for s in steps}
    except (ValueError, LookupError, TypeError, AttributeError):
        pass  # not the shape we froze: the plan models say what is wrong with it
    from .spec.plan import Plan

    plan = Plan.model_validate_json(plan_json)
    return {s.id: _PlanStepView(s.map, s.gate is not None) for s in plan.steps}


def _facts(run: Run) -> _Facts:
    row = run.row
    plan = _plan_steps(row.plan_json)
    params: dict[str, Any] = json.loads(row.params_json)
    rows = run.steps
    tally = run.tally()  # counted in SQL: a 10 000-unit run is not read row by row
    lines = []
    for step in rows:
        counts = tally.steps.get(step.step_id, StepTally())
        plan_step = plan[step.step_id]
        seen = counts.seen
        total = seen if step.status == "skipped" else unit_total(plan_step, params, rows)
        lines.append(
            _StepLine(
                row=step,
                done=counts.done,
                total=seen if total is None and seen else total,
                tokens=counts.tokens,
                saved_tokens=counts.saved_tokens,
                loop=loop_text(step, has_gate=plan_step.has_gate),
            )
        )
    return _Facts(
        steps=lines,
        rejections=gate_rejections(tally.gate_attempts),
        reuse=_reuse_line(tally.reused, tally.reused_saved_tokens),
        result=result_text(row.result_json) if row.status == "completed" else None,
    )


def run_text(run: Run) -> str:
    """A plain-text summary of a run: header, steps, gates, budget, reuse, warnings, result."""
    row = run.row
    facts = _facts(run)
    lines = [f"Run {row.run_id}  {row.workflow}  [{row.status}]"]
    if row.status_reason:
        lines.append(f"  reason: {row.status_reason}")
    for s in facts.steps:
        loop = f"  loop {s.loop}" if s.loop else ""
        note = f"  — {s.row.note}" if s.row.note else ""
        lines.append(
            f"  {s.row.step_id:<16} {s.row.status:<9} units {s.units}  "
            f"tokens {s.tokens}{loop}{note}"
        )
    for r in facts.rejections:
        missing = f"; missing: {', '.join(r.missing)}" if r.missing else ""
        lines.append(
            f"  gate rejected {r.step_id} loop {r.loop} ({r.judge}): {r.feedback}{missing}"
        )
    lines.append(f"  budget: {budget_text(run.budget_use(), sep='  ')}")
    if facts.reuse:
        lines.append(f"  {facts.reuse}")
    if run.stats is not None:
        lines.append(f"  {_stats_text(run)}")
    lines.extend(f"  warning: {w}" for w in run.warnings)
    if facts.result is not None:
        lines.append(f"  result: {facts.result}")
    return "\n".join(lines)


def _stats_text(run: Run) -> str:
    s = run.stats
    if s is None:
        return ""
    stopped = f", stopped by {s.stopped_by}" if s.stopped_by else ""
    return (
        f"this drive: {s.dispatched} dispatched, {s.reused} reused "
        f"({s.saved_tokens} tokens saved){stopped}"
    )


def badge(status: str, *, label: str | None = None) -> str:
    """A status as a coloured pill (HTML): run summaries and the live view's rows and header.

    ``label`` replaces the text (``completed · 2 failed``); the colour stays the status's.
    """
    colour = STATUS_COLOURS.get(status, UNKNOWN_STATUS_COLOUR)
    return (
        f'<span style="background:{colour};color:white;border-radius:8px;padding:1px 8px;'
        f'font-size:85%">{html.escape(label or status)}</span>'
    )


def step_state(status: str, *, running: int = 0, failed: int = 0, is_live: bool = True) -> str:
    """What a step row shows: its status, ``running`` while attempts of a live drive are in
    flight, ``partial`` when it completed with failed units (``on_error: continue``)."""
    if status == "pending" and running and is_live:
        return "running"
    if status == "completed" and failed:
        return "partial"
    return status


def step_badge(status: str, *, running: int = 0, failed: int = 0, is_live: bool = True) -> str:
    """The badge of a step row (see :func:`step_state`): a partial step says what failed."""
    state = step_state(status, running=running, failed=failed, is_live=is_live)
    label = f"completed · {failed} failed" if state == "partial" else None
    return badge(state, label=label)


def stacked_bar_html(done: int, running: int, failed: int, total: int | None) -> str:
    """A progress bar stacked left to right: done (green), in flight (blue), failed (red)."""
    whole = max(total or 0, done + running + failed, 1)
    parts = "".join(
        f'<div title="{count} {name}" style="width:{100 * count / whole:.3f}%;'
        f'background:{STATUS_COLOURS[key]}"></div>'
        for name, key, count in (
            ("done", "completed", done),
            ("in flight", "running", running),
            ("failed", "failed", failed),
        )
        if count
    )
    return (
        '<div class="wf-bar" style="display:flex;width:120px;height:10px;border-radius:3px;'
        f'overflow:hidden;background:#eaeef2">{parts}</div>'
    )


def result_html(text: str) -> str:
    """A clipped result as a small scrollable block."""
    return (
        "<div><b>result</b><pre style='max-height:12em;overflow:auto;white-space:pre-wrap'>"
        f"{html.escape(text, quote=False)}</pre></div>"
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
    body = ""
    for s in facts.steps:
        saved = f" (+{s.saved_tokens:,} reused)" if s.saved_tokens else ""
        note = shown_note(s.row.note, facts.rejections, s.row.step_id)
        body += (
            f"<tr><td><code>{html.escape(s.row.step_id)}</code></td>"
            f"<td>{badge(s.row.status)}</td><td>{s.units}</td><td>{s.tokens:,}{saved}</td>"
            f"<td>{s.loop}</td><td>{html.escape(note)}</td></tr>"
        )
    table = (
        "<table><thead><tr><th>step</th><th>status</th><th>units</th><th>tokens</th>"
        f"<th>loop</th><th>note</th></tr></thead><tbody>{body}</tbody></table>"
    )
    gates = gates_html(facts.rejections) if facts.rejections else ""
    budget = f"<div>budget — {html.escape(budget_text(run.budget_use()))}</div>"
    notes = [facts.reuse] if facts.reuse else []
    notes.extend(run.warnings)
    warn = "".join(f"<div>⚠ {html.escape(w)}</div>" for w in notes)
    stats = f"<div><small>{html.escape(_stats_text(run))}</small></div>" if run.stats else ""
    result = result_html(facts.result) if facts.result is not None else ""
    return f"<div class='wf-run'>{head}{result}{table}{gates}{budget}{warn}{stats}</div>"


def _target(step: PlanStep) -> str:
    from .spec.kinds import KINDS  # plan views have the plan models loaded already

    return KINDS[step.kind].describe(step)


def plan_rows(plan: Plan) -> list[dict[str, str]]:
    """One dict per step: id, kind, runner, target, map, gate (capped loops noted)."""
    rows = []
    for step in plan.steps:
        gate = ""
        if step.gate is not None:
            gate = f"{step.gate.judge}, max_loops {step.max_loops}"
            if step.loops_capped:
                gate += (
                    f" (capped from {step.gate.max_loops}: {step.kind} steps cannot read feedback)"
                )
        elif step.output is not None:
            gate = "schema only"
        rows.append(
            {
                "id": step.id,
                "kind": step.kind,
                "runner": step.runner,
                "target": _target(step),
                "map": step.map or "",
                "gate": gate,
            }
        )
    return rows


def plan_text(plan: Plan, *, plan_hash: str | None = None) -> str:
    """A plain-text plan view (dry runs, ``wf run --dry-run``)."""
    lines = [f"Plan {plan.name}" + (f"  hash {plan_hash[:16]}" if plan_hash else "")]
    for row in plan_rows(plan):
        extra = "".join(f"  {k}: {row[k]}" for k in ("map", "gate") if row[k])
        lines.append(
            f"  {row['id']:<16} {row['kind']:<8} {row['runner']:<9} {row['target']}{extra}"
        )
    return "\n".join(lines)


def plan_mermaid(plan: Plan) -> str:
    """A Mermaid flowchart of the plan (rendered locally by JupyterLab)."""
    out = ["flowchart TD"]
    ids = [s.id for s in plan.steps]
    for step in plan.steps:
        shape = (
            f'{step.id}{{"{step.id}"}}'
            if step.kind == "route"
            else f'{step.id}["{step.id} ({step.kind})"]'
        )
        out.append(f"  {shape}")
    routed = {t for s in plan.steps if s.route for t in s.route.cases.values()}
    for a, b in zip(ids, ids[1:], strict=False):
        if b not in routed:
            out.append(f"  {a} --> {b}")
    for step in plan.steps:
        if step.route:
            for case, target in step.route.cases.items():
                out.append(f"  {step.id} -- {case} --> {target}")
    return "\n".join(out)


def plan_html(plan: Plan, *, plan_hash: str | None = None) -> str:
    """An HTML table of the plan plus a Mermaid block."""
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(r[k])}</td>"
            for k in ("id", "kind", "runner", "target", "map", "gate")
        )
        + "</tr>"
        for r in plan_rows(plan)
    )
    hash_line = f" <code>{html.escape(plan_hash[:16])}</code>" if plan_hash else ""
    return (
        f"<div><b>Plan {html.escape(plan.name)}</b>{hash_line}</div><table><thead><tr>"
        "<th>step</th><th>kind</th><th>runner</th><th>target</th><th>map</th><th>gate</th>"
        f"</tr></thead><tbody>{body}</tbody></table>"
        f"<pre class='mermaid'>{html.escape(plan_mermaid(plan))}</pre>"
    )
