"""The frozen plan: what a run executes, stored as canonical JSON and hashed."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..store.records import StepKind
from .models import BudgetSpec, ExecutionSpec, GateSpec, RetrySpec, RouteSpec

PLAN_VERSION = 1
"""Bumped whenever the plan's JSON shape changes; runs record the version that froze them."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AgentPlan(_Frozen):
    """An agent step's harness settings as frozen (defaults filled in)."""

    harness: str
    """The harness name (``claude``, ``codex``, ``opencode``, ``gemini`` or a registered one)."""
    permission: Literal["read", "edits", "full"] = "edits"
    workdir: str = "."
    """Relative to the workflow file's folder (the driver's cwd for a notebook workflow)."""
    isolation: Literal["none", "worktree"] = "none"
    session: Literal["fresh", "continue"] = "fresh"
    max_turns: int | None = None


class PlanStep(_Frozen):
    """One step as frozen: defaults filled in, runner resolved, targets pinned."""

    id: str
    kind: StepKind
    prompt: str | None = None
    argv: list[str] | None = None
    target: str | None = None
    """Python callable reference (``module:function`` or registered name)."""
    target_hash: str | None = None
    """sha256 of the callable's source at freeze time; a changed function is refused."""
    workflow: str | None = None
    bindings: dict[str, Any] | None = None
    """The authored ``with:`` templates."""
    route: RouteSpec | None = None
    map: str | None = None
    reduce: Literal["collect", "vote"] = "collect"
    runner: str
    """Runner name for prompt units; ``exec``/``python``/``workflow``/``route`` otherwise."""
    model: str | None = None
    timeout_s: float | None = None
    retry: RetrySpec = RetrySpec()
    on_error: Literal["fail", "continue"] = "fail"
    output: dict[str, Any] | None = None
    gate: GateSpec | None = None
    max_loops: int = 1
    """Effective loop cap (exec/workflow targets cannot read feedback: capped at 1)."""
    loops_capped: bool = False
    """True when the authored ``gate.max_loops`` was lowered to 1."""
    cache: bool = True
    """Reuse across runs allowed: the authored ``cache``, else the kind's default (exec: off)."""
    pass_env: list[str] = Field(default_factory=list)
    agent: AgentPlan | None = None
    """An agent step's harness settings (None for other kinds)."""


class Plan(_Frozen):
    """A whole frozen workflow, child workflows embedded."""

    plan_version: int = PLAN_VERSION
    name: str
    description: str = ""
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    budget: BudgetSpec = BudgetSpec()
    execution: ExecutionSpec = ExecutionSpec()
    runner: str = "scripted"
    runners: dict[str, dict[str, Any]] = Field(default_factory=dict)
    steps: list[PlanStep]
    children: dict[str, Plan] = Field(default_factory=dict)

    def step(self, step_id: str) -> PlanStep:
        """The step named ``step_id`` (KeyError if none)."""
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def to_json(self) -> str:
        """The canonical JSON of this plan (sorted keys, compact)."""
        from ..hashing import canonical_json

        return canonical_json(self.model_dump(mode="json"))
