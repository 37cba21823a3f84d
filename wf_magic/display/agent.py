"""The facts of an agent attempt as text and HTML: harness, session, turns, denials, worktree."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any


def agent_lines(facts: Mapping[str, Any], cost: float | None = None) -> list[str]:
    """One agent attempt's facts, a line each (``wf show``, the unit drill-down)."""
    version = facts.get("version") or "version unknown"
    lines = [f"harness    {facts.get('harness')} ({version})"]
    session = facts.get("session_id") or "none"
    if facts.get("resumed_session"):
        session += " (resumed)"
    if facts.get("reclaimed"):
        session += ", reclaimed after a driver crash"
    lines.append(f"session    {session}")
    exit_code = facts.get("exit_code")
    outcome = "killed" if exit_code is None else f"exit {exit_code}"
    if facts.get("error_class"):
        outcome += f", error class {facts['error_class']}"
    lines.append(f"outcome    {outcome}")
    turns = facts.get("turns")
    lines.append(
        f"turns      {turns if turns is not None else '?'}, "
        f"{facts.get('tool_uses') or 0} tool use(s), permission {facts.get('permission')}"
    )
    bridge = facts.get("bridge")
    replay = facts.get("replay")
    if isinstance(bridge, Mapping):
        lines.extend(_bridge_lines(bridge, is_replayed=isinstance(replay, Mapping)))
    elif cost is not None and facts.get("cost_source"):
        lines.append(f"cost       ${cost:.6f} ({facts['cost_source']})")
    if isinstance(replay, Mapping):
        lines.append(
            f"replayed   {replay.get('served')} of {replay.get('recorded')} recorded call(s) "
            f"from {replay.get('source')}: nothing was paid; the CLI's report is the recording's"
        )
    denials = facts.get("permission_denials") or []
    if denials:
        named = ", ".join(
            f"{d.get('tool_name')} {d.get('target') or ''}".strip()
            if isinstance(d, Mapping)
            else str(d)
            for d in denials
        )
        lines.append(f"denied     {len(denials)}: {named}")
    lines.append(f"workdir    {facts.get('workdir')}")
    tree = facts.get("worktree")
    if tree:
        state = "kept" if tree.get("kept") else "removed (clean)"
        lines.append(f"worktree   {tree.get('path')} — {state}")
        files = tree.get("changed_files") or []
        if files:
            lines.append(f"changed    {', '.join(files[:20])}{' …' if len(files) > 20 else ''}")
        stat = str(tree.get("diff_stat") or "").strip()
        lines.extend(f"           {line.strip()}" for line in stat.splitlines()[-1:])
    return lines


def _money(value: Any) -> str:
    return f"${value:.6f}" if isinstance(value, int | float) else "cost unknown"


def _bridge_lines(bridge: Mapping[str, Any], *, is_replayed: bool) -> list[str]:
    """The bridge's sums over the attempt's calls, the CLI's own report beside them, and a
    flag when the two disagree (tokens differ, or costs differ by more than 1%).

    A replayed attempt is never flagged: its calls were answered from a recording at zero
    tokens and cost by design, while the CLI still reports the recorded usage, so the two
    differ without either being wrong (its ``replayed`` line says why)."""
    cli = bridge.get("cli_report") or {}
    calls = (
        f"calls      {bridge.get('calls')} through the bridge: {bridge.get('tokens_in')} in / "
        f"{bridge.get('tokens_out')} out, {_money(bridge.get('cost'))}"
    )
    source = f" ({cli['cost_source']})" if cli.get("cost_source") else ""
    reported = (
        f"cli report {cli.get('tokens_in')} in / {cli.get('tokens_out')} out, "
        f"{_money(cli.get('cost'))}{source}"
    )
    lines = [calls, reported]
    tokens_differ = (cli.get("tokens_in"), cli.get("tokens_out")) != (
        bridge.get("tokens_in"),
        bridge.get("tokens_out"),
    )
    ours, theirs = bridge.get("cost"), cli.get("cost")
    costs_differ = (
        isinstance(ours, int | float)
        and isinstance(theirs, int | float)
        and abs(ours - theirs) > 0.01 * max(abs(ours), abs(theirs))
    )
    if (tokens_differ or costs_differ) and not is_replayed:
        what = " and ".join(w for w, d in (("tokens", tokens_differ), ("cost", costs_differ)) if d)
        lines.append(f"DISAGREE   the CLI's report and its calls differ in {what}; the calls count")
    return lines


def agent_html(facts: Mapping[str, Any], cost: float | None = None) -> str:
    """:func:`agent_lines` in a collapsible block."""
    text = "\n".join(agent_lines(facts, cost))
    return (
        "<details class='wf-agent' open><summary>agent</summary>"
        f"<pre style='white-space:pre-wrap'>{html.escape(text, quote=False)}</pre></details>"
    )
