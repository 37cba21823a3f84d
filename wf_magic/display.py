"""Text and HTML renderings of runs and plans (no IPython): shared by CLI, reprs and widgets."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .spec.plan import Plan, PlanStep

if TYPE_CHECKING:
    from .run import Run

STATUS_COLOURS = {
    "completed": "#1a7f37",
    "active": "#0969da",
    "pending": "#6e7781",
    "blocked": "#bf8700",
    "failed": "#cf222e",
    "skipped": "#8c959f",
    "abandoned": "#8c959f",
}


def _unit_counts(run: Run) -> dict[str, tuple[int, int, int]]:
    """step → (work units done, work units seen, tokens)."""
    out: dict[str, tuple[int, int, int]] = {}
    rows = run.engine.read(
        lambda c: c.execute(
            "SELECT step_id, SUM(status IN ('succeeded','reused')), COUNT(*) FROM units"
            " WHERE run_id = ? AND phase = 'work' GROUP BY step_id",
            (run.run_id,),
        ).fetchall()
    )
    tokens = dict(
        run.engine.read(
            lambda c: c.execute(
                "SELECT step_id, SUM(tokens_in + tokens_out) FROM attempts WHERE run_id = ?"
                " GROUP BY step_id",
                (run.run_id,),
            ).fetchall()
        )
    )
    for step_id, done, seen in rows:
        out[step_id] = (int(done or 0), int(seen), int(tokens.get(step_id) or 0))
    for step_id, tok in tokens.items():
        out.setdefault(step_id, (0, 0, int(tok or 0)))
    return out


def run_text(run: Run) -> str:
    """A plain-text summary of a run: header, one line per step, budget, warnings."""
    row = run.row
    lines = [f"Run {row.run_id}  {row.workflow}  [{row.status}]"]
    if row.status_reason:
        lines.append(f"  reason: {row.status_reason}")
    counts = _unit_counts(run)
    for step in run.steps:
        done, seen, tokens = counts.get(step.step_id, (0, 0, 0))
        loop = f"  loop {step.loop}/{step.max_loops}" if step.max_loops > 1 else ""
        note = f"  — {step.note}" if step.note else ""
        lines.append(
            f"  {step.step_id:<16} {step.status:<9} units {done}/{seen}  "
            f"tokens {tokens}{loop}{note}"
        )
    use = run.budget_use()
    lines.append(
        f"  budget: units {use.units}/{use.max_units or '∞'}  tokens "
        f"{use.tokens}/{use.max_tokens or '∞'}"
    )
    if run.stats is not None:
        s = run.stats
        lines.append(
            f"  this drive: {s.dispatched} dispatched, {s.reused} reused "
            f"({s.saved_tokens} tokens saved)"
            + (f", stopped by {s.stopped_by}" if s.stopped_by else "")
        )
    lines.extend(f"  warning: {w}" for w in run.warnings)
    return "\n".join(lines)


def _badge(status: str) -> str:
    colour = STATUS_COLOURS.get(status, "#6e7781")
    return (
        f'<span style="background:{colour};color:white;border-radius:8px;padding:1px 7px;'
        f'font-size:85%">{html.escape(status)}</span>'
    )


def run_html(run: Run) -> str:
    """An HTML table summary of a run (for notebooks without widgets, and nbconvert)."""
    row = run.row
    counts = _unit_counts(run)
    head = (
        f"<div><b>{html.escape(row.workflow)}</b> <code>{html.escape(row.run_id)}</code> "
        f"{_badge(row.status)}</div>"
    )
    if row.status_reason:
        head += f"<div><i>{html.escape(row.status_reason)}</i></div>"
    body = ""
    for step in run.steps:
        done, seen, tokens = counts.get(step.step_id, (0, 0, 0))
        body += (
            f"<tr><td><code>{html.escape(step.step_id)}</code></td>"
            f"<td>{_badge(step.status)}</td><td>{done}/{seen}</td><td>{tokens}</td>"
            f"<td>{step.loop}/{step.max_loops}</td>"
            f"<td>{html.escape(step.note or '')}</td></tr>"
        )
    table = (
        "<table><thead><tr><th>step</th><th>status</th><th>units</th><th>tokens</th>"
        f"<th>loop</th><th>note</th></tr></thead><tbody>{body}</tbody></table>"
    )
    warn = "".join(f"<div>⚠ {html.escape(w)}</div>" for w in run.warnings)
    return f"<div class='wf-run'>{head}{table}{warn}</div>"


def _target(step: PlanStep) -> str:
    if step.kind == "prompt":
        lines = (step.prompt or "").strip().splitlines()
        return lines[0][:60] if lines else ""
    if step.kind == "exec":
        return " ".join(step.argv or [])[:60]
    if step.kind == "python":
        return str(step.target)
    if step.kind == "workflow":
        return f"workflow {step.workflow}"
    route = step.route
    return f"on {route.on} → {route.cases}" if route else ""


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
