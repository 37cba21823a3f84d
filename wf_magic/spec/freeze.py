"""Freeze a workflow source into a Plan: resolve children, pin python targets, build the steps.

The static checks it runs on each source live in checks.py; reading the source in source.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path as FsPath
from typing import Any, cast

from ..errors import DefinitionError, clip
from ..hashing import sha256_text
from ..library import child_source
from ..runners import functions
from ..store.records import StepKind
from .aliases import AliasTable, base_table, parse_table
from .checks import (
    check_bindings,
    check_gate,
    check_params,
    check_routes,
    check_runners,
    check_schema,
    check_scores,
    check_step_templates,
    check_target,
    validate,
)
from .kinds import KINDS
from .literals import check_literals
from .models import (
    AGENT_TIMEOUT_S,
    ENV_NAME_PATTERN,
    ID_PATTERN,
    MODEL_CALL_RETRY,
    GateSpec,
    ScoreSpec,
    StepSpec,
    WorkflowSpec,
)
from .models_resolve import ModelFieldError, ModelPick, freeze_model, judge_runner
from .plan import AgentPlan, Plan, PlanGate, PlanScore, PlanStep
from .source import Source, read_source, split_documents
from .workflow import Workflow
from .yamlload import Path

MAX_PLAN_BYTES = 5_000_000
MAX_CHILD_DEPTH = 8


def load_workflow(
    source: str | FsPath,
    *,
    library: Mapping[str, str] | None = None,
    namespace: Mapping[str, Any] | None = None,
    source_name: str | None = None,
    aliases_home: FsPath | None = None,
) -> Workflow:
    """Load and freeze a workflow from YAML text or a file path.

    Args:
        source: YAML text, or a path to a ``.yaml``/``.yml`` file.
        library: child workflow sources by name (e.g. cells defined earlier in a notebook).
        namespace: where bare ``python:`` names are looked up (e.g. the notebook's namespace).
        source_name: how messages name the source (default: the file name or ``<workflow>``).
        aliases_home: the folder of the user's ``models.yaml`` (default: the state dir,
            ``$WF_MAGIC_HOME`` or ``./.wf_magic``); ``models.yaml`` beside a workflow file
            and the workflow's ``models:`` win over it (``spec/aliases.py``).

    Raises:
        DefinitionError: the source is invalid (message names the line and the field).
    """
    path: FsPath | None = None
    if isinstance(source, FsPath) or (
        isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml"))
    ):
        path = FsPath(source)
        text = read_source(path)
        source_name = source_name or str(path)
    else:
        text = str(source)
    if aliases_home is None:
        from ..store.db import default_state_dir

        aliases_home = default_state_dir()
    aliases = base_table(home=aliases_home, beside=path.parent if path else None, exclude=path)
    freezer = _Freezer(
        library=dict(library or {}),
        namespace=namespace,
        search_dir=path.parent if path else None,
        aliases=aliases,
    )
    plan = freezer.freeze(text, source_name or "<workflow>", depth=0)
    plan_json = plan.to_json()
    if len(plan_json) > MAX_PLAN_BYTES:
        raise DefinitionError(
            f"the frozen plan is larger than {MAX_PLAN_BYTES} bytes",
            field="(plan)",
            source_name=source_name,
        )
    return Workflow(
        name=plan.name,
        source=text,
        source_hash=sha256_text(text),
        source_path=str(path.resolve()) if path else None,
        plan=plan,
        plan_json=plan_json,
        plan_hash=sha256_text(plan_json),
    )


class _Freezer:
    def __init__(
        self,
        *,
        library: dict[str, str],
        namespace: Mapping[str, Any] | None,
        search_dir: FsPath | None,
        aliases: AliasTable,
    ):
        self.aliases = aliases
        """The alias table of the files (state dir, then beside the workflow)."""
        self.library = library
        self.namespace = namespace
        self.search_dir = search_dir
        self.origins: dict[str, str] = {}
        """Child name → the source it was written in (its lines are that source's lines)."""
        self.stack: list[str] = []

    def freeze(self, text: str, name: str, *, depth: int, child: str | None = None) -> Plan:
        first, docs = split_documents(text, name)
        src = Source(first, name, child=child)
        check_literals(src.data, src)
        spec = validate(src)
        for child_name, child_text in docs.items():
            if child_name not in self.library:
                self.library[child_name] = child_text
                self.origins[child_name] = name
        if spec.name in self.stack:
            raise src.error(
                f"child workflows form a cycle: {' -> '.join([*self.stack, spec.name])}", ("name",)
            )
        self.stack.append(spec.name)
        try:
            return self._plan(spec, src, depth)
        finally:
            self.stack.pop()

    def _plan(self, spec: WorkflowSpec, src: Source, depth: int) -> Plan:
        check_params(spec, src)
        check_runners(spec, src)
        aliases = {**self.aliases, **parse_table(spec.models, src, ("models",))}
        seen: dict[str, int] = {}
        steps: list[PlanStep] = []
        children: dict[str, Plan] = {}
        for i, step in enumerate(spec.steps):
            at: Path = ("steps", i)
            if step.id in seen:
                raise src.error(
                    f"duplicate step id {step.id!r} (first at steps[{seen[step.id]}])", (*at, "id")
                )
            check_step_templates(spec, step, i, src, earlier=seen.keys())
            seen[step.id] = i
            if step.workflow is not None and step.workflow not in children:
                children[step.workflow] = self._child(step.workflow, src, (*at, "workflow"), depth)
            if step.workflow is not None:
                check_bindings(step, children[step.workflow], src, at)
            steps.append(self._step(spec, step, i, src, aliases))
        check_routes(spec, src)
        pending = any(
            s.model_template
            or (s.gate and s.gate.model_template)
            or any(sc.model_template for sc in s.score)
            for s in steps
        )
        return Plan(
            name=spec.name,
            description=spec.description,
            params=spec.params,
            budget=spec.budget,
            execution=spec.execution,
            runner=spec.runner,
            runners=spec.runners,
            aliases=aliases if pending else {},
            steps=steps,
            children=children,
        )

    def _step(
        self, spec: WorkflowSpec, step: StepSpec, i: int, src: Source, aliases: AliasTable
    ) -> PlanStep:
        at: Path = ("steps", i)
        kind = cast(StepKind, step.kind)
        runner = KINDS[kind].fixed_runner or step.agent or step.runner or spec.runner
        model = _model(spec, step.model, runner, aliases, src, (*at, "model"))
        target_hash = None
        if step.python is not None:
            target_hash = self._pin(step.python, src, (*at, "python"))
        for name in step.pass_env:
            if not re.match(ENV_NAME_PATTERN, name) or name.startswith("WF_"):
                raise src.error(
                    f"expected an environment variable name not starting with WF_ (got {name!r})",
                    (*at, "pass_env"),
                )
        if step.output is not None:
            check_schema(step.output, src, (*at, "output"))
        check_gate(step, src, at)
        check_scores(step, src, at)
        gate = _gate(spec, step, runner, aliases, src, at)
        scores = [
            self._score(spec, step, score, runner, aliases, src, (*at, "score", j))
            for j, score in enumerate(step.score)
        ]
        max_loops = gate.max_loops if gate else 1
        capped = not KINDS[kind].reads_feedback and max_loops > 1
        return PlanStep(
            id=step.id,
            kind=kind,
            prompt=step.prompt,
            argv=step.exec,
            target=step.python,
            target_hash=target_hash,
            workflow=step.workflow,
            bindings=step.with_,
            route=step.route,
            map=step.map,
            reduce=step.reduce,
            runner=runner,
            model=model.id,
            model_alias=model.alias,
            model_template=model.template,
            timeout_s=AGENT_TIMEOUT_S if step.timeout is None and step.agent else step.timeout,
            retry=(
                MODEL_CALL_RETRY
                if kind == "prompt" and "retry" not in step.model_fields_set
                else step.retry
            ),
            on_error=step.on_error,
            output=step.output,
            gate=gate,
            max_loops=1 if capped else max_loops,
            loops_capped=capped,
            cache=KINDS[kind].cached_by_default if step.cache is None else step.cache,
            pass_env=step.pass_env,
            agent=_agent_plan(step, src, at),
            score=scores,
            options=_step_options(spec, step, runner, src, at),
        )

    def _pin(self, target: str, src: Source, at: Path) -> str:
        """The source hash of python target ``target`` (it must resolve and import)."""
        check_target(target, src, at)
        try:
            return functions.target_hash(
                target,
                self.namespace,
                search_dir=str(self.search_dir.resolve()) if self.search_dir else None,
            )
        except functions.TargetError as exc:
            raise src.error(str(exc), at) from exc
        # Importing the author's module may raise anything, sys.exit() and a stray
        # KeyboardInterrupt included: neither may end `wf check` or `wf run` silently.
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            said = clip(str(exc), 200)
            raise src.error(
                f"importing python target {target!r} failed: "
                f"{type(exc).__name__}{': ' + said if said else ''}",
                at,
            ) from None

    def _score(
        self,
        spec: WorkflowSpec,
        step: StepSpec,
        score: ScoreSpec,
        runner: str,
        aliases: AliasTable,
        src: Source,
        at: Path,
    ) -> PlanScore:
        """A score as frozen: a python scorer pinned, an llm judge's runner and model resolved
        by the gate rule (``judge_runner``)."""
        fields = score.model_dump(exclude_unset=True, exclude_none=True)
        if score.python is not None:
            return PlanScore(**fields, target_hash=self._pin(score.python, src, (*at, "python")))
        if score.judge is None:
            return PlanScore(**fields)
        judge = judge_runner(step.kind, runner, score.runner, spec.runner)
        model = _model(spec, score.model, judge, aliases, src, (*at, "model"))
        return PlanScore(
            **{**fields, "runner": judge, "model": model.id, "scale": score.scale or (0.0, 1.0)},
            model_alias=model.alias,
            model_template=model.template,
        )

    def _child(self, name: str, src: Source, at: Path, depth: int) -> Plan:
        if not re.match(ID_PATTERN, name) or len(name) > 64:
            raise src.error(
                f"expected a child workflow name matching {ID_PATTERN} (got {clip(repr(name))}); "
                "children are named, not paths: put NAME.yaml beside this file or define "
                "it as a further YAML document",
                at,
            )
        if depth + 1 > MAX_CHILD_DEPTH:
            raise src.error(f"child workflows nest deeper than {MAX_CHILD_DEPTH}", at)
        if name in self.stack:
            cycle = " -> ".join([*self.stack, name])
            raise src.error(
                f"child workflows form a cycle ({cycle}); a workflow cannot call "
                "itself, directly or through its children",
                at,
            )
        text = self.library.get(name)
        if text is None and self.search_dir is not None:
            text = _child_file(self.search_dir, name, src, at)
        if text is None and (found := child_source(name)) is not None:
            text, self.origins[name] = found.text, found.origin  # errors name the URL or file
        if text is None:
            raise src.error(
                f"unknown child workflow {name!r}: define it in the same file (a further YAML "
                f"document), in an earlier %%workflow cell, as {name}.yaml beside this file, "
                "or in the workflow library (docs/library.md)",
                at,
            )
        return self.freeze(
            text, self.origins.get(name, f"workflow {name}"), depth=depth + 1, child=name
        )


def _model(
    spec: WorkflowSpec, written: str | None, runner: str, aliases: AliasTable, src: Source, at: Path
) -> ModelPick:
    """A ``model:`` field frozen for ``runner`` (the one path every kind's model takes)."""
    try:
        return freeze_model(
            written, runner=runner, runners=spec.runners, aliases=aliases, params=spec.params
        )
    except ModelFieldError as exc:
        raise src.error(str(exc), at) from None


def _gate(
    spec: WorkflowSpec, step: StepSpec, runner: str, aliases: AliasTable, src: Source, at: Path
) -> PlanGate | None:
    """The step's gate with its judge's model frozen."""
    gate: GateSpec | None = step.gate
    if gate is None:
        return None
    judge = judge_runner(step.kind, runner, gate.runner, spec.runner)
    model = _model(spec, gate.model, judge, aliases, src, (*at, "gate", "model"))
    return PlanGate(
        **{**gate.model_dump(), "model": model.id},
        model_alias=model.alias,
        model_template=model.template,
    )


def _step_options(
    spec: WorkflowSpec, step: StepSpec, runner: str, src: Source, at: Path
) -> dict[str, Any] | None:
    """A step's ``options:`` checked one key at a time against its runner's type."""
    from ..errors import RunnerError
    from ..runners.sampling import check_step_options

    if not step.options:
        return None
    kind = str((spec.runners.get(runner) or {}).get("type", runner))
    for key, value in step.options.items():
        try:
            check_step_options({key: value}, kind=kind, where=f"step {step.id!r}")
        except RunnerError as exc:
            raise src.error(str(exc), (*at, "options", key)) from None
    return dict(step.options)


def _agent_plan(step: StepSpec, src: Source, at: Path) -> AgentPlan | None:
    """An agent step's frozen harness settings; the harness must be known and the workdir a
    relative folder that stays inside the workflow's folder."""
    if step.agent is None:
        return None
    from ..agents.registry import known_harnesses

    known = known_harnesses()
    if step.agent not in known:
        raise src.error(
            f"unknown agent harness {step.agent!r}; known harnesses: {', '.join(known)} "
            "(register one with wf_magic.register_harness)",
            (*at, "agent"),
        )
    workdir = step.workdir or "."
    parts = FsPath(workdir).parts
    if FsPath(workdir).is_absolute() or ".." in parts or workdir.startswith("~"):
        raise src.error(
            f"expected a relative folder inside the workflow's folder (got {workdir!r}); "
            "write a path like . or src/pkg",
            (*at, "workdir"),
        )
    return AgentPlan(
        harness=step.agent,
        permission=step.permission or "edits",
        workdir=workdir,
        isolation=step.isolation or "none",
        session=step.session or "fresh",
        max_turns=step.max_turns,
        bridge=step.bridge,
    )


def _child_file(folder: FsPath, name: str, src: Source, at: Path) -> str | None:
    """The text of child ``name`` from the workflow's folder, never from outside it."""
    root = folder.resolve()
    for candidate in (
        folder / f"{name}.yaml",
        folder / f"{name}.yml",
        folder / "workflows" / f"{name}.yaml",
    ):
        if not os.path.lexists(candidate):
            continue  # anything else there (a FIFO, a directory) is refused by name below
        if not os.path.realpath(candidate).startswith(str(root) + os.sep):
            raise src.error(
                f"child workflow file {candidate} links outside the workflow's folder; "
                "copy the child into the folder",
                at,
            )
        try:
            return read_source(candidate)
        except DefinitionError as exc:
            raise src.error(f"child workflow {name!r}: {exc}", at) from None
    return None
