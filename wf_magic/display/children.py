"""The child runs of a run as an indented tree: workflow, status, spawning step, and what to do
next about a blocked one (the lines ``wf status RUN`` appends)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..store.records import RunRow, StepRow
from ..visible import visible_line

MAX_CHILD_LINES = 50
"""Child runs listed at most; a larger tree ends with a line saying how to list them all."""

_MAP_UNIT = re.compile(r"^(?P<step>.+)\[\d+\]$")


class ChildReader(Protocol):
    """What the tree reads (a ``Store`` is one)."""

    def child_runs(self, parent_run_id: str) -> list[RunRow]: ...

    def steps_of(self, run_id: str) -> list[StepRow]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRun:
    """One child run in the tree, with what a blocked one waits on."""

    row: RunRow
    depth: int
    """1 for a child of the run shown, 2 for a grandchild, ..."""
    waiting_step: str | None = None
    """The step of a blocked run whose gate waits for a decision (approve / reject)."""
    waiting_judge: str | None = None
    """Why that gate waits: ``human``, ``exhausted`` or ``failed`` (a judge that could not
    answer: a re-drive re-judges)."""
    blocked_below: bool = False
    """Whether a blocked run of the tree under this one is what blocks it."""


def child_tree(store: ChildReader, run_id: str, *, limit: int = MAX_CHILD_LINES) -> list[ChildRun]:
    """The runs below ``run_id``, depth first in the order they were published (at most
    ``limit`` + 1, so that a caller can tell there are more)."""
    out: list[ChildRun] = []

    def visit(parent: str, depth: int) -> bool:
        """Append the subtree of ``parent``; returns whether a blocked run is in it."""
        blocked = False
        for row in store.child_runs(parent):
            if len(out) > limit:
                break
            at = len(out)
            out.append(ChildRun(row=row, depth=depth))
            below = visit(row.run_id, depth + 1)
            if row.status == "blocked":
                step, judge = _waiting(store, row.run_id)
                out[at] = ChildRun(
                    row=row,
                    depth=depth,
                    waiting_step=step,
                    waiting_judge=judge,
                    blocked_below=below,
                )
            blocked = blocked or below or row.status == "blocked"
        return blocked

    visit(run_id, 1)
    return out


def _waiting(store: ChildReader, run_id: str) -> tuple[str | None, str | None]:
    from ..gates.verdict import Waiting

    for step in store.steps_of(run_id):
        if step.status != "blocked" or not step.output_json:
            continue
        try:
            waiting = Waiting.from_json(json.loads(step.output_json))
        except (ValueError, KeyError, TypeError):
            continue  # an output edited by hand: the run's own lines say what it is
        if waiting is not None:
            return step.step_id, waiting.judge
    return None, None


def spawning_step(row: RunRow) -> str:
    """The parent's step (and unit, for a map) that published ``row``."""
    unit = row.invocation_key or "?"
    found = _MAP_UNIT.match(unit)
    return f"step {found['step']} (unit {unit})" if found else f"step {unit}"


def next_command(child: ChildRun) -> str | None:
    """The commands that get a blocked child going again (None: nothing to do about it here)."""
    row = child.row
    if row.status != "blocked" or (child.waiting_step is None and child.blocked_below):
        return None
    cid, root = row.run_id, row.root_run_id
    resume = f"wf resume {root} (or wf resume {cid} for the child alone)"
    if child.waiting_step is None or child.waiting_judge == "failed":
        return f"next: {resume}"
    step = child.waiting_step
    return (
        f"next: wf approve {cid} {step} (or wf reject {cid} {step} --feedback TEXT), then {resume}"
    )


def children_lines(tree: Sequence[ChildRun], *, limit: int = MAX_CHILD_LINES) -> list[str]:
    """The tree's text lines under a ``children:`` heading ([] without children)."""
    if not tree:
        return []
    lines = ["  children:"]
    for child in tree[:limit]:
        row, pad = child.row, "  " * (child.depth + 1)
        reason = f" — {row.status_reason}" if row.status_reason else ""
        lines.append(
            visible_line(
                f"{pad}{row.run_id}  {row.workflow}  [{row.status}]  {spawning_step(row)}{reason}"
            )
        )
        command = next_command(child)
        if command:
            lines.append(f"{pad}  {command}")
    if len(tree) > limit:
        lines.append("    … more child runs: `wf list --all` lists every run")
    return lines
