"""Text, HTML and Mermaid views of a frozen plan (dry runs, `wf run --dry-run`, plan cells)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..spec.plan import Plan, PlanStep


def _target(step: PlanStep) -> str:
    from ..spec.kinds import KINDS  # plan views have the plan models loaded already

    return KINDS[step.kind].describe(step)


def model_text(model: str | None, *, alias: str | None, template: str | None) -> str:
    """How a frozen ``model:`` reads in a plan view: the id, and the alias or template behind it."""
    if model is None:
        return f"{template} (rendered from params at run start)" if template else ""
    why = [f"alias {alias}"] if alias else []
    if template:
        why.insert(0, f"from {template}")
    return model + (f" ({', '.join(why)})" if why else "")


def plan_rows(plan: Plan) -> list[dict[str, str]]:
    """One dict per step: id, kind, runner, target, map, model, gate (capped loops noted)."""
    rows = []
    for step in plan.steps:
        gate = ""
        if step.gate is not None:
            gate = f"{step.gate.judge}, max_loops {step.max_loops}"
            judge_model = model_text(
                step.gate.model, alias=step.gate.model_alias, template=step.gate.model_template
            )
            if judge_model:
                gate += f", model {judge_model}"
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
                "model": model_text(
                    step.model, alias=step.model_alias, template=step.model_template
                ),
                "gate": gate,
            }
        )
    return rows


def plan_text(plan: Plan, *, plan_hash: str | None = None) -> str:
    """A plain-text plan view (dry runs, ``wf run --dry-run``)."""
    lines = [f"Plan {plan.name}" + (f"  hash {plan_hash[:16]}" if plan_hash else "")]
    for row in plan_rows(plan):
        extra = "".join(f"  {k}: {row[k]}" for k in ("map", "model", "gate") if row[k])
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
            for k in ("id", "kind", "runner", "target", "map", "model", "gate")
        )
        + "</tr>"
        for r in plan_rows(plan)
    )
    hash_line = f" <code>{html.escape(plan_hash[:16])}</code>" if plan_hash else ""
    return (
        f"<div><b>Plan {html.escape(plan.name)}</b>{hash_line}</div><table><thead><tr>"
        "<th>step</th><th>kind</th><th>runner</th><th>target</th><th>map</th><th>model</th>"
        "<th>gate</th>"
        f"</tr></thead><tbody>{body}</tbody></table>"
        f"<pre class='mermaid'>{html.escape(plan_mermaid(plan))}</pre>"
    )
