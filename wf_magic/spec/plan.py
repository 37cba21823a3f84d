"""The frozen plan: what a run executes, stored as canonical JSON and hashed."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from ..store.records import StepKind
from .models import BudgetSpec, ExecutionSpec, GateSpec, RetrySpec, RouteSpec, ScoreSpec
from .versions import OLDEST_PLAN_VERSION, PLAN_VERSION

__all__ = ["OLDEST_PLAN_VERSION", "PLAN_VERSION", "Plan", "PlanGate", "PlanScore", "PlanStep"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


_OMITTED_WHEN_UNSET: dict[str, Any] = {
    "model_alias": None,
    "model_template": None,
    "aliases": {},
    "agent": None,
    "charged": None,
    "per_item": False,
    "score": [],
    "options": None,
    "target_hash": None,
    "ignore_case": False,
    "runner": None,
    "model": None,
    "rubric": None,
    "scale": None,
    "equals": None,
    "contains": None,
    "regex": None,
    "json_schema": None,
    "judge": None,
    "python": None,
}
"""Fields added after plan_version 1 shipped, with their unset value: left out of the JSON
while unset, so a plan that does not use them keeps the hash it had before they existed
(``charged: false`` is kept: it differs from unset; ``per_item: false`` is the unset value)."""
_FALSE_IS_UNSET = frozenset({"per_item", "ignore_case"})
_SCORE_ONLY = frozenset(
    {"target_hash", "ignore_case", "rubric", "scale", "equals", "contains", "regex"}
    | {"json_schema", "judge", "python", "runner", "model"}
)
"""Keys left out only inside a score (a step's ``runner``, ``model`` or ``python`` stay)."""
_BUDGET_UNSET: dict[str, Any] = {"charge_judges": False}
"""The same for the budget's fields added since."""


def _omit_unset(data: Any, *, score: bool = False) -> Any:
    if isinstance(data, dict):
        for key in _OMITTED_WHEN_UNSET.keys() & data.keys():
            if key in _SCORE_ONLY and not score:
                continue
            if data[key] == _OMITTED_WHEN_UNSET[key] and (
                data[key] is not False or key in _FALSE_IS_UNSET
            ):
                del data[key]
        budget = data.get("budget")
        if isinstance(budget, dict):
            for key in _BUDGET_UNSET.keys() & budget.keys():
                if budget[key] is _BUDGET_UNSET[key]:
                    del budget[key]
    return data


class PlanGate(GateSpec):
    """A gate as frozen: its judge's ``model`` resolved (alias or params template)."""

    model_alias: str | None = None
    """The alias the judge's ``model:`` named, when it named one (``model`` holds the id)."""
    model_template: str | None = None
    """The authored ``model:`` template, when it was one (rendered from params at run start)."""

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _omit_unset(handler(self))


class PlanScore(ScoreSpec):
    """A score as frozen: an ``llm`` judge's runner and model resolved, a python target pinned.

    Only the fields a score sets are kept in the plan's JSON (the rest read as unset)."""

    runner: str | None = None
    """The runner of an ``llm`` judge, resolved by the gate rule (None for other scorers)."""
    model_alias: str | None = None
    """The alias the judge's ``model:`` named, when it named one (``model`` holds the id)."""
    model_template: str | None = None
    """The authored ``model:`` template, when it was one (rendered from params at run start)."""
    target_hash: str | None = None
    """sha256 of a python scorer's source at freeze time: its input hash holds the current
    source's hash, so an edited scorer is re-paid (and only it)."""

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _omit_unset(handler(self), score=True)


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
    bridge: bool | None = None
    """The step's ``bridge:`` (None: the harness's ``runners:`` setting decides)."""


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
    """The model id sent to the runner: an alias resolved, a params template rendered."""
    model_alias: str | None = None
    """The alias the step's ``model:`` named, when it named one (``model`` holds the id)."""
    model_template: str | None = None
    """The authored ``model:`` template, when it was one; ``model`` is None until the run's
    params render it (``spec/models_resolve.py``), so a run's stored plan holds the id."""
    timeout_s: float | None = None
    retry: RetrySpec = RetrySpec()
    on_error: Literal["fail", "continue"] = "fail"
    output: dict[str, Any] | None = None
    gate: PlanGate | None = None
    max_loops: int = 1
    """Effective loop cap (exec/workflow targets cannot read feedback: capped at 1)."""
    loops_capped: bool = False
    """True when the authored ``gate.max_loops`` was lowered to 1."""
    cache: bool = True
    """Reuse across runs allowed: the authored ``cache``, else the kind's default (exec: off)."""
    pass_env: list[str] = Field(default_factory=list)
    agent: AgentPlan | None = None
    """An agent step's harness settings (None for other kinds)."""
    score: list[PlanScore] = Field(default_factory=list)
    """The step's scores as frozen, in authored order (left out of the JSON when none)."""
    options: dict[str, Any] | None = None
    """The step's sampling settings over its runner's (left out of the JSON when unset)."""

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _omit_unset(handler(self))


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
    aliases: dict[str, dict[str, str]] = Field(default_factory=dict)
    """The model alias table (alias → runner → id), kept only while a step's ``model:``
    template awaits params: a rendered value may name an alias."""
    steps: list[PlanStep]
    children: dict[str, Plan] = Field(default_factory=dict)

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _omit_unset(handler(self))

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
