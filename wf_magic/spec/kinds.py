"""The step kinds, one table: how a unit's input is built, whether it is charged, cached, reads
gate feedback, where it runs, and how it reads in a plan view.

A new kind is one :class:`KindSpec` entry in :data:`KINDS` plus its runner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..hashing import hash_value
from ..store.records import StepKind
from ..templates import evaluate, render_text
from .plan import Plan, PlanStep

UnitInput = tuple[dict[str, Any], dict[str, Any]]
"""(fields of the unit request, the resolved input that is hashed) of one unit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitSource:
    """What a kind's input builder sees for one unit."""

    plan: Plan
    step: PlanStep
    context: Mapping[str, Any]
    """The template context (params, steps, item, index, gate)."""
    item: Any
    index: int | None
    feedback_block: str | None
    """The "Gate feedback" block to append to a prompt that does not place it itself."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KindSpec:
    """How one step kind behaves."""

    name: StepKind
    fixed_runner: str | None
    """The runner every step of the kind uses (None: ``runner:`` or the workflow's)."""
    charged: bool
    """Whether its units count against the budget (a child's own units are charged instead)."""
    cacheable: bool
    """Whether its results may be reused across runs (when the step's ``cache`` allows)."""
    cached_by_default: bool
    """The step's ``cache`` when the author did not write one (frozen into the plan)."""
    reads_feedback: bool
    """Whether a re-executed loop can change its input (else ``max_loops`` is capped to 1)."""
    runs_inline: bool
    """Runs in the driver thread (route decisions, child drives), not on an executor."""
    build: Callable[[UnitSource], UnitInput]
    """The unit's request fields and resolved input (raises TemplateError)."""
    describe: Callable[[PlanStep], str]
    """A one-line target for plan views."""


def _prompt(src: UnitSource) -> UnitInput:
    prompt = render_text(src.step.prompt or "", src.context)
    if src.feedback_block:
        prompt += src.feedback_block
    return {"prompt": prompt}, {"prompt": prompt, "output": src.step.output}


def _exec(src: UnitSource) -> UnitInput:
    argv = tuple(src.step.argv or ())
    return {"argv": argv}, {"argv": list(argv), "pass_env": src.step.pass_env}


def _agent(src: UnitSource) -> UnitInput:
    """An agent unit: the rendered prompt (feedback block appended) and the harness settings.

    The session id is never part of the input: it is an outcome, journaled with the attempt.
    """
    step, agent = src.step, src.step.agent
    if agent is None:  # pragma: no cover - frozen with the kind
        raise ValueError(f"step {step.id} is an agent step without agent settings")
    prompt = render_text(step.prompt or "", src.context)
    if src.feedback_block:
        prompt += src.feedback_block
    settings = agent.model_dump(mode="json")
    fields = {
        "prompt": prompt,
        "agent": {**settings, "pass_env": list(step.pass_env), "feedback": src.feedback_block},
    }
    return fields, {
        "prompt": prompt,
        "output": step.output,
        "pass_env": step.pass_env,
        # Whether calls are bridged changes how they are watched, not what the agent does.
        **{k: v for k, v in settings.items() if k != "bridge"},
    }


def _python(src: UnitSource) -> UnitInput:
    kwargs = bindings(src.step, src.context, src.item, src.index)
    step = src.step
    return {"target": step.target, "kwargs": kwargs}, {
        "target": step.target,
        "target_hash": step.target_hash,
        "kwargs": kwargs,
    }


def _workflow(src: UnitSource) -> UnitInput:
    kwargs = bindings(src.step, src.context, None, None)
    child = src.plan.children[src.step.workflow or ""]
    return {"target": src.step.workflow, "kwargs": kwargs}, {
        "target": src.step.workflow,
        "child_plan_hash": hash_value(child.model_dump(mode="json")),
        "kwargs": kwargs,
    }


def _route(src: UnitSource) -> UnitInput:
    value = render_text(src.step.route.on if src.step.route else "", src.context).strip()
    return {"kwargs": {"value": value}}, {"value": value}


def _describe_prompt(step: PlanStep) -> str:
    lines = (step.prompt or "").strip().splitlines()
    return lines[0][:60] if lines else ""


def _describe_route(step: PlanStep) -> str:
    route = step.route
    return f"on {route.on} → {route.cases}" if route else ""


KINDS: dict[str, KindSpec] = {
    "prompt": KindSpec(
        name="prompt",
        fixed_runner=None,
        charged=True,
        cacheable=True,
        cached_by_default=True,
        reads_feedback=True,
        runs_inline=False,
        build=_prompt,
        describe=_describe_prompt,
    ),
    "exec": KindSpec(
        name="exec",
        fixed_runner="exec",
        charged=True,
        cacheable=True,
        cached_by_default=False,  # side effects: a reuse would skip them (DESIGN.md §9)
        reads_feedback=False,
        runs_inline=False,
        build=_exec,
        describe=lambda step: " ".join(step.argv or [])[:60],
    ),
    "agent": KindSpec(
        name="agent",
        fixed_runner=None,  # the harness's own runner, named by ``agent:``
        charged=True,
        cacheable=True,
        cached_by_default=False,  # its edits are side effects: a reuse would skip them
        reads_feedback=True,
        runs_inline=False,
        build=_agent,
        describe=lambda step: (
            _describe_prompt(step)
            + (" · worktree" if step.agent and step.agent.isolation == "worktree" else "")
        ),
    ),
    "python": KindSpec(
        name="python",
        fixed_runner="python",
        charged=True,
        cacheable=True,
        cached_by_default=True,
        reads_feedback=True,
        runs_inline=False,
        build=_python,
        describe=lambda step: str(step.target),
    ),
    "workflow": KindSpec(
        name="workflow",
        fixed_runner="workflow",
        charged=False,
        cacheable=True,
        cached_by_default=True,
        reads_feedback=False,
        runs_inline=True,
        build=_workflow,
        describe=lambda step: f"workflow {step.workflow}",
    ),
    "route": KindSpec(
        name="route",
        fixed_runner="route",
        charged=False,
        cacheable=False,
        cached_by_default=False,
        reads_feedback=True,
        runs_inline=True,
        build=_route,
        describe=_describe_route,
    ),
}
"""Every step kind by name."""


def bindings(step: PlanStep, ctx: Mapping[str, Any], item: Any, idx: int | None) -> dict[str, Any]:
    """A python/workflow step's ``with:`` bindings evaluated (``{item}`` in a bare map)."""
    if step.bindings is None:
        return {} if idx is None else {"item": item}
    return {k: _eval_deep(v, ctx) for k, v in step.bindings.items()}


def _eval_deep(value: Any, ctx: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return evaluate(value, ctx)
    if isinstance(value, dict):
        return {k: _eval_deep(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [_eval_deep(v, ctx) for v in value]
    return value
