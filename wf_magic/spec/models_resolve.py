"""The one way a ``model:`` becomes a model id, for every step kind and gate: an alias resolved
for the field's runner at freeze time, or a params template rendered when a run starts.

A ``model:`` with ``{{``/``{%`` is a template over ``params`` only: it is checked at freeze
time (no ``steps``, ``item``, ``index``, ``gate`` or ``output``; declared, non-secret params)
and rendered by :func:`workflow_for_params` once the run's params are known, so the plan a run
stores (and hashes) holds the rendered id: one plan per params. A rendered value is itself
looked up as an alias (``--param model=fast``). Anything else is an alias or an exact id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError, clip
from ..hashing import sha256_text
from ..redact import is_secret_key
from ..sealing import SEAL_PREFIX
from ..templates import GLOBAL_NAMES, TemplateError, references, render_text
from .literals import is_templated
from .params import resolve_params
from .plan import Plan, PlanStep
from .workflow import Workflow

DEFAULT_RUNNER = "default"
"""The runner key of an alias entry that serves every runner not named in it."""
MAX_MODEL_CHARS = 200


class AliasError(ValueError):
    """An alias cannot serve the runner asking for it (the caller names the field)."""


def model_id_problem(text: str) -> str | None:
    """Why ``text`` cannot be a model id (None when it can)."""
    if not text.strip():
        return "expected a model id or alias (got an empty string)"
    if "\n" in text or "\r" in text or text != text.strip():
        return f"expected a model id on one line without surrounding spaces (got {text!r:.80})"
    if len(text) > MAX_MODEL_CHARS:
        return f"expected a model id of at most {MAX_MODEL_CHARS} characters (got {len(text)})"
    if is_templated(text):
        return f"expected a model id, not a template (got {text!r:.80})"
    return None


def lookup(
    table: Mapping[str, Mapping[str, str]], name: str, *, runner: str, runner_type: str
) -> str | None:
    """The model id alias ``name`` gives ``runner`` (None: ``name`` is no alias, an exact id).

    Raises:
        AliasError: the alias names no model for this runner and has no ``default``.
    """
    entry = table.get(name)
    if entry is None:
        return None
    for key in (runner, runner_type, DEFAULT_RUNNER):
        if key in entry:
            return entry[key]
    raise AliasError(
        f"model alias {name!r} names no model for runner {runner!r} (it names: "
        f"{', '.join(sorted(entry))}); add `{runner}: MODEL` or `default: MODEL` to the alias"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPick:
    """A frozen ``model:``: the id, the alias it came through, the template it came from."""

    id: str | None
    """The model id (None: no model given, or a template not rendered yet)."""
    alias: str | None = None
    template: str | None = None


class ModelFieldError(ValueError):
    """A ``model:`` is unusable as written; the caller names the field and its line."""


def runner_type(runners: Mapping[str, Mapping[str, Any]], runner: str) -> str:
    """The registered runner type behind runner name ``runner`` (``runners.<name>.type``)."""
    return str((runners.get(runner) or {}).get("type", runner))


def freeze_model(
    written: str | None,
    *,
    runner: str,
    runners: Mapping[str, Mapping[str, Any]],
    aliases: Mapping[str, Mapping[str, str]],
    params: Mapping[str, Any],
) -> ModelPick:
    """The model a ``model:`` field freezes to, for units run by ``runner``.

    Args:
        written: the field as authored (None: not given).
        runner: the runner name the field's units go to.
        runners: the workflow's ``runners:`` (to find a runner name's type).
        aliases: the merged alias table (``spec/aliases.py``).
        params: the declared param schemas (a template may read only these).

    Raises:
        ModelFieldError: a template reads more than params, or a secret or undeclared param;
            an alias names no model for ``runner``; an empty or multi-line id.
    """
    if written is None:
        return ModelPick(id=None)
    if is_templated(written):
        _check_template(written, params)
        return ModelPick(id=None, template=written)
    problem = model_id_problem(written)
    if problem:
        raise ModelFieldError(problem)
    try:
        return _pick(written, runner=runner, runners=runners, aliases=aliases)
    except AliasError as exc:
        raise ModelFieldError(str(exc)) from None


def _pick(
    name: str,
    *,
    runner: str,
    runners: Mapping[str, Mapping[str, Any]],
    aliases: Mapping[str, Mapping[str, str]],
    template: str | None = None,
) -> ModelPick:
    found = lookup(aliases, name, runner=runner, runner_type=runner_type(runners, runner))
    if found is None:
        return ModelPick(id=name, template=template)
    return ModelPick(id=found, alias=name, template=template)


def _check_template(text: str, params: Mapping[str, Any]) -> None:
    try:
        refs = references(text)
    except TemplateError as exc:
        raise ModelFieldError(str(exc)) from None
    beyond = sorted(refs.names - {"params"} - GLOBAL_NAMES)
    if beyond:
        raise ModelFieldError(
            "a `model:` template is rendered once, when the run starts, from params only; "
            f"it cannot read {', '.join(beyond)} (one model per step: split the step, or "
            "route between steps with different models)"
        )
    if refs.params_dynamic:
        raise ModelFieldError(
            "a `model:` template must name each param it reads (`params.NAME`), so freeze "
            "can check that none is secret"
        )
    for name in sorted(refs.params):
        if name not in params:
            raise ModelFieldError(
                f"template refers to undeclared param {name!r}; declare it under params: "
                f"(declared: {sorted(params) or 'none'})"
            )
        if is_secret_key(name):
            raise ModelFieldError(
                f"a `model:` template cannot read the secret param {name!r}: the model id is "
                "stored in the plan and the journal, and a secret never is"
            )


def render_model(
    template: str,
    params: Mapping[str, Any],
    *,
    runner: str,
    runners: Mapping[str, Mapping[str, Any]],
    aliases: Mapping[str, Mapping[str, str]],
    where: str,
) -> ModelPick:
    """The model a ``model:`` template gives these (sealed) params; ``where`` names the field.

    Raises:
        UsageError: the render fails, reads a secret, or gives no usable model id or alias.
    """
    try:
        text = render_text(template, {"params": dict(params)}).strip()
    except TemplateError as exc:
        raise UsageError(f"{where}: rendering {template!r} from the params failed: {exc}") from None
    if SEAL_PREFIX in text:
        raise UsageError(
            f"{where}: {template!r} renders a secret param's value; a model id is stored in "
            "the plan and the journal, so it cannot come from a secret"
        )
    problem = model_id_problem(text)
    if problem:
        raise UsageError(
            f"{where}: {template!r} rendered to an unusable model: {problem}; "
            "pass a model id or alias in the param"
        )
    try:
        return _pick(text, runner=runner, runners=runners, aliases=aliases, template=template)
    except AliasError as exc:
        raise UsageError(f"{where}: {clip(str(exc), 300)}") from None


def is_pending(plan: Plan) -> bool:
    """Whether a ``model:`` of ``plan``'s own steps awaits the run's params."""
    for step in plan.steps:
        if step.model_template is not None and step.model is None:
            return True
        gate = step.gate
        if gate is not None and gate.model_template is not None and gate.model is None:
            return True
        if any(sc.model_template is not None and sc.model is None for sc in step.score):
            return True
    return False


def _has_templates(plan: Plan) -> bool:
    return any(
        step.model_template is not None
        or (step.gate is not None and step.gate.model_template is not None)
        or any(sc.model_template is not None for sc in step.score)
        for step in plan.steps
    )


def plan_for_params(plan: Plan, params: Mapping[str, Any]) -> Plan:
    """``plan`` with its templated models rendered (the same object when none awaits params).

    The alias table the plan carried for rendering is dropped: the rendered plan records
    what each step uses. Child plans keep theirs (their params come from their parent's run).

    Raises:
        UsageError: see :func:`render_model`.
    """
    if not is_pending(plan):
        if _has_templates(plan):
            raise UsageError(
                f"workflow {plan.name!r} was already rendered for some params (a preview); "
                "start the workflow as loaded, so its models render from this start's params"
            )
        return plan
    steps = [_step_for_params(plan, step, params) for step in plan.steps]
    return plan.model_copy(update={"steps": steps, "aliases": {}})


def _step_for_params(plan: Plan, step: PlanStep, params: Mapping[str, Any]) -> PlanStep:
    update: dict[str, Any] = {}
    common = {"runners": plan.runners, "aliases": plan.aliases}
    if step.model_template is not None and step.model is None:
        pick = render_model(
            step.model_template,
            params,
            runner=step.runner,
            where=f"steps.{step.id}.model",
            **common,
        )
        update.update(model=pick.id, model_alias=pick.alias)
    gate = step.gate
    if gate is not None and gate.model_template is not None and gate.model is None:
        pick = render_model(
            gate.model_template,
            params,
            runner=judge_runner(step.kind, step.runner, gate.runner, plan.runner),
            where=f"steps.{step.id}.gate.model",
            **common,
        )
        update["gate"] = gate.model_copy(update={"model": pick.id, "model_alias": pick.alias})
    if any(sc.model_template is not None and sc.model is None for sc in step.score):
        scores = []
        for score in step.score:
            if score.model_template is not None and score.model is None:
                pick = render_model(
                    score.model_template,
                    params,
                    runner=score.runner or plan.runner,
                    where=f"steps.{step.id}.score.{score.name}.model",
                    **common,
                )
                score = score.model_copy(update={"model": pick.id, "model_alias": pick.alias})
            scores.append(score)
        update["score"] = scores
    return step.model_copy(update=update) if update else step


def judge_runner(kind: str, step_runner: str, gate_runner: str | None, default: str) -> str:
    """The runner of a step's llm judge (the rule of ``drive/judging.py:_judge_runner``).

    Its model is frozen from ``gate.model`` alone, for this runner: a prompt step's judge
    falls back to the step's model at run time, any other kind's to the runner's option.
    """
    return gate_runner or (step_runner if kind == "prompt" else default)


def workflow_for_params(wf: Workflow, params: Mapping[str, Any]) -> Workflow:
    """``wf`` as a run with ``params`` freezes it: its plan, plan JSON and hash per params.

    Raises:
        UsageError: see :func:`render_model`.
    """
    plan = plan_for_params(wf.plan, params)
    if plan is wf.plan:
        return wf
    plan_json = plan.to_json()
    return dataclasses.replace(wf, plan=plan, plan_json=plan_json, plan_hash=sha256_text(plan_json))


def preview_workflow(
    wf: Workflow, params: Mapping[str, Any] | None, *, from_strings: bool = False
) -> Workflow:
    """``wf`` as a start with ``params`` would freeze it, writing nothing (dry runs, checks).

    Templated models are rendered when the params resolve; without params given, a workflow
    whose params do not resolve (a required one) is shown as frozen, its templates pending.
    Secret values are never rendered: a template reading one is refused, as at a start.

    Raises:
        UsageError: given params are invalid, or render an unusable model.
    """
    if not is_pending(wf.plan):
        return wf  # nothing waits for params: a dry run reads no param at all
    try:
        resolved = resolve_params(wf.plan, params, from_strings=from_strings)
    except UsageError:
        if params:
            raise
        return wf
    masked = {k: SEAL_PREFIX if is_secret_key(k) else v for k, v in resolved.items()}
    return workflow_for_params(wf, masked)
