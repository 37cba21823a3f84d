"""Freeze a workflow source into a Plan: validate, check templates statically, pin targets."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any, cast

from pydantic import ValidationError

from ..errors import DefinitionError, clip
from ..hashing import sha256_text
from ..library import child_source
from ..redact import is_secret_key
from ..runners import functions
from ..store.records import StepKind
from ..templates import TemplateError, references
from .kinds import KINDS
from .models import ENV_NAME_PATTERN, ID_PATTERN, StepSpec, WorkflowSpec
from .plan import Plan, PlanStep
from .yamlload import Path, dotted, line_of, load_with_lines

MAX_SOURCE_BYTES = 1_000_000
MAX_PLAN_BYTES = 5_000_000
MAX_CHILD_DEPTH = 8
MAX_PROBLEM_CHARS = 600
"""A message's problem text is clipped here, whatever the values it echoes."""
_TARGET_PATTERN = re.compile(
    r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?::[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)?$"
)
SCHEMA_KEYWORDS = {
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "additionalProperties",
    "description",
    "title",
    "default",
    "const",
    "pattern",
    "uniqueItems",
    "minProperties",
    "maxProperties",
}
_JINJA_GLOBALS = {
    "range",
    "dict",
    "lipsum",
    "cycler",
    "joiner",
    "namespace",
    "true",
    "false",
    "none",
}


@dataclass(frozen=True, slots=True)
class Workflow:
    """A loaded workflow: its source, and the plan it freezes into."""

    name: str
    source: str
    source_hash: str
    source_path: str | None
    plan: Plan
    plan_json: str
    plan_hash: str


class _Source:
    """One parsed source document and its line map, for error messages."""

    def __init__(self, text: str, name: str | None, *, child: str | None = None):
        # surrogatepass: a lone surrogate is reported by the YAML reader, with its line
        if len(text.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
            raise DefinitionError(
                f"source is larger than {MAX_SOURCE_BYTES} bytes",
                field="(source)",
                source_name=name,
            )
        self.text = text
        self.name = name
        self.child = child
        self.data, self.lines = load_with_lines(text, source_name=name)

    def error(self, problem: str, path: Path) -> DefinitionError:
        if self.child is not None:
            problem = f"in child workflow {self.child!r}: {problem}"
        return DefinitionError(
            clip(problem, MAX_PROBLEM_CHARS),
            field=clip(dotted(path), 120) or "(top level)",
            line=line_of(self.lines, path),
            source_name=self.name,
        )


def load_workflow(
    source: str | FsPath,
    *,
    library: Mapping[str, str] | None = None,
    namespace: Mapping[str, Any] | None = None,
    source_name: str | None = None,
) -> Workflow:
    """Load and freeze a workflow from YAML text or a file path.

    Args:
        source: YAML text, or a path to a ``.yaml``/``.yml`` file.
        library: child workflow sources by name (e.g. cells defined earlier in a notebook).
        namespace: where bare ``python:`` names are looked up (e.g. the notebook's namespace).
        source_name: how messages name the source (default: the file name or ``<workflow>``).

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
    freezer = _Freezer(
        library=dict(library or {}), namespace=namespace, search_dir=path.parent if path else None
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


def read_source(path: FsPath) -> str:
    """The text of a workflow file.

    Raises:
        DefinitionError: the file cannot be read, or is not UTF-8 (naming the line).
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DefinitionError(
            f"cannot read workflow file: {exc.strerror}", field="(file)", source_name=str(path)
        ) from exc
    if len(data) > MAX_SOURCE_BYTES:
        raise DefinitionError(
            f"source is larger than {MAX_SOURCE_BYTES} bytes", field="(file)", source_name=str(path)
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DefinitionError(
            f"not UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8",
            field="(file)",
            line=data.count(b"\n", 0, exc.start) + 1,
            source_name=str(path),
        ) from None


class _Freezer:
    def __init__(
        self,
        *,
        library: dict[str, str],
        namespace: Mapping[str, Any] | None,
        search_dir: FsPath | None,
    ):
        self.library = library
        self.namespace = namespace
        self.search_dir = search_dir
        self.origins: dict[str, str] = {}
        """Child name → the source it was written in (its lines are that source's lines)."""
        self.stack: list[str] = []

    def freeze(self, text: str, name: str, *, depth: int, child: str | None = None) -> Plan:
        first, docs = _split_documents(text, name)
        src = _Source(first, name, child=child)
        spec = _validate(src)
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

    def _plan(self, spec: WorkflowSpec, src: _Source, depth: int) -> Plan:
        _check_params(spec, src)
        _check_runners(spec, src)
        seen: dict[str, int] = {}
        steps: list[PlanStep] = []
        children: dict[str, Plan] = {}
        for i, step in enumerate(spec.steps):
            at: Path = ("steps", i)
            if step.id in seen:
                raise src.error(
                    f"duplicate step id {step.id!r} (first at steps[{seen[step.id]}])", (*at, "id")
                )
            _check_step_templates(spec, step, i, src, earlier=seen.keys())
            seen[step.id] = i
            if step.workflow is not None and step.workflow not in children:
                children[step.workflow] = self._child(step.workflow, src, (*at, "workflow"), depth)
            if step.workflow is not None:
                _check_bindings(step, children[step.workflow], src, at)
            steps.append(self._step(spec, step, i, src))
        _check_routes(spec, src)
        return Plan(
            name=spec.name,
            description=spec.description,
            params=spec.params,
            budget=spec.budget,
            execution=spec.execution,
            runner=spec.runner,
            runners=spec.runners,
            steps=steps,
            children=children,
        )

    def _step(self, spec: WorkflowSpec, step: StepSpec, i: int, src: _Source) -> PlanStep:
        at: Path = ("steps", i)
        kind = cast(StepKind, step.kind)
        runner = KINDS[kind].fixed_runner or step.runner or spec.runner
        target_hash = None
        if step.python is not None:
            _check_target(step.python, src, (*at, "python"))
            try:
                target_hash = functions.target_hash(
                    step.python,
                    self.namespace,
                    search_dir=str(self.search_dir.resolve()) if self.search_dir else None,
                )
            except functions.TargetError as exc:
                raise src.error(str(exc), (*at, "python")) from exc
            except Exception as exc:  # importing the author's module may raise anything
                raise src.error(
                    f"importing python target {step.python!r} failed: "
                    f"{type(exc).__name__}: {clip(str(exc), 200)}",
                    (*at, "python"),
                ) from None
        for name in step.pass_env:
            if not re.match(ENV_NAME_PATTERN, name) or name.startswith("WF_"):
                raise src.error(
                    f"expected an environment variable name not starting with WF_ (got {name!r})",
                    (*at, "pass_env"),
                )
        if step.output is not None:
            _check_schema(step.output, src, (*at, "output"))
        gate = step.gate
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
            model=step.model,
            timeout_s=step.timeout,
            retry=step.retry,
            on_error=step.on_error,
            output=step.output,
            gate=gate,
            max_loops=1 if capped else max_loops,
            loops_capped=capped,
            cache=KINDS[kind].cached_by_default if step.cache is None else step.cache,
            pass_env=step.pass_env,
        )

    def _child(self, name: str, src: _Source, at: Path, depth: int) -> Plan:
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


def _child_file(folder: FsPath, name: str, src: _Source, at: Path) -> str | None:
    """The text of child ``name`` from the workflow's folder, never from outside it."""
    root = folder.resolve()
    for candidate in (
        folder / f"{name}.yaml",
        folder / f"{name}.yml",
        folder / "workflows" / f"{name}.yaml",
    ):
        if not candidate.is_file():
            continue
        if not candidate.resolve().is_relative_to(root):
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


def _check_target(target: str, src: _Source, at: Path) -> None:
    if not _TARGET_PATTERN.match(target):
        raise src.error(
            "expected module:function (e.g. `helpers:summarize`) or a registered function "
            f"name (got {clip(repr(target))})",
            at,
        )


def _split_documents(text: str, name: str) -> tuple[str, dict[str, str]]:
    """Split off further YAML documents; each defines a child workflow by its ``name``."""
    seps = [m.start() for m in re.finditer(r"(?m)^---[ \t]*$", text)]
    if seps and not text[: seps[0]].strip():
        seps = seps[1:]  # a leading '---' opens the first document
    if not seps:
        return text, {}
    bounds = [*seps, len(text)]
    out: dict[str, str] = {}
    for start, end in zip(bounds, bounds[1:], strict=False):
        # Pad with the newlines before the document so its errors name the source's own lines.
        part = "\n" * text.count("\n", 0, start) + text[start:end]
        data, _ = load_with_lines(part, source_name=name)
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            out[data["name"]] = part
    return text[: seps[0]], out


def _got(err: dict[str, Any]) -> str:
    return clip(repr(err["input"]))


_MESSAGES: dict[str, Callable[[dict[str, Any]], str]] = {
    "greater_than_equal": lambda e: f"must be >= {e['ctx']['ge']} (got {_got(e)})",
    "greater_than": lambda e: f"must be > {e['ctx']['gt']} (got {_got(e)})",
    "less_than_equal": lambda e: f"must be <= {e['ctx']['le']} (got {_got(e)})",
    "missing": lambda e: "is required",
    "extra_forbidden": lambda e: "unknown key; check its spelling against the format reference",
    "string_pattern_mismatch": lambda e: (
        f"expected a name matching {e['ctx']['pattern']} (got {_got(e)})"
    ),
    "literal_error": lambda e: f"expected {e['ctx']['expected']} (got {_got(e)})",
    "too_short": lambda e: f"must have at least {e['ctx']['min_length']} item(s)",
    "too_long": lambda e: f"must have at most {e['ctx']['max_length']} item(s)",
}


def _validate(src: _Source) -> WorkflowSpec:
    data = src.data
    if not isinstance(data, dict):
        raise src.error(f"expected a mapping with name and steps (got {type(data).__name__})", ())
    try:
        return WorkflowSpec.model_validate(data)
    except ValidationError as exc:
        err: dict[str, Any] = dict(exc.errors()[0])
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        make = _MESSAGES.get(err["type"])
        msg = make(err) if make else err["msg"].removeprefix("Value error, ")
        more = len(exc.errors()) - 1
        if more:
            msg += f" (+{more} more problem{'s' if more > 1 else ''})"
        raise src.error(msg, loc) from None


def _check_params(spec: WorkflowSpec, src: _Source) -> None:
    for name, schema in spec.params.items():
        at: Path = ("params", name)
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise src.error(f"expected a param name like `topic` (got {name!r})", at)
        _check_schema(schema, src, at)
        if "default" in schema:
            import jsonschema  # only a schema that must be checked pays its ~1 s import

            try:
                jsonschema.validate(schema["default"], schema)
            except jsonschema.ValidationError as exc:
                raise src.error(
                    f"default does not match the param schema: {exc.message}", (*at, "default")
                ) from None


def _check_schema(schema: dict[str, Any], src: _Source, at: Path) -> None:
    import jsonschema  # lazy: its import costs ~1 s with some extras installed

    unknown = _unknown_keywords(schema)
    if unknown:
        raise src.error(
            f"unsupported JSON Schema keyword(s) {sorted(unknown)}; supported: "
            "type, properties, required, items, enum, minimum/maximum, min/maxLength, "
            "min/maxItems, pattern, const",
            at,
        )
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise src.error(f"invalid schema: {exc.message}", at) from None


def _unknown_keywords(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    out = set(schema) - SCHEMA_KEYWORDS
    for key in ("properties",):
        for sub in (schema.get(key) or {}).values():
            out |= _unknown_keywords(sub)
    for key in ("items", "additionalProperties"):
        out |= _unknown_keywords(schema.get(key))
    return out


def _check_runners(spec: WorkflowSpec, src: _Source) -> None:
    from ..runners.registry import known_runners

    known = set(known_runners())
    for name, options in spec.runners.items():
        kind = options.get("type", name)
        if kind not in known:
            raise src.error(
                f"unknown runner type {clip(repr(kind))}; known runners: {sorted(known)}",
                ("runners", name),
            )
        for key, value in options.items():
            secret_name = is_secret_key(key) and not key.endswith("_env")
            if secret_name or (isinstance(value, str) and re.search(r"(?i)(^sk-|bearer\s)", value)):
                raise src.error(
                    "looks like a secret value; put it in an environment variable "
                    "and name the variable instead (e.g. api_key_env)",
                    ("runners", name, key),
                )
        _try_runner(spec.name, name, kind, options, src)
    usable = known | set(spec.runners)
    refs: list[tuple[str, Path]] = [(spec.runner, ("runner",))]
    for i, step in enumerate(spec.steps):
        if step.runner:
            refs.append((step.runner, ("steps", i, "runner")))
        if step.gate and step.gate.runner:
            refs.append((step.gate.runner, ("steps", i, "gate", "runner")))
    for name, at in refs:
        if name not in usable:
            raise src.error(
                f"unknown runner {clip(repr(name))}; known runners: {sorted(usable)}", at
            )


def _try_runner(workflow: str, name: str, kind: str, options: dict[str, Any], src: _Source) -> None:
    """Build the runner once so bad options (unknown keys, bad regexes) fail at freeze time.

    Factories are lazy (no client, no connection until the first unit), so this is cheap.
    """
    from ..runners.base import RunnerContext
    from ..runners.registry import runner_factory

    factory = runner_factory(kind)
    if factory is None:
        return
    context = RunnerContext(
        name=name,
        options={k: v for k, v in options.items() if k != "type"},
        state_dir="",
        workflow=workflow,
    )
    try:
        factory(context).close()
    except Exception as exc:  # a plugin may raise anything; it is the author's error here
        raise src.error(f"runner options rejected: {exc}", ("runners", name)) from None


def _templates_of(step: StepSpec) -> list[tuple[str, Path, bool]]:
    """(template, path, is_bare_expression) for every template field of a step."""
    out: list[tuple[str, Path, bool]] = []
    if step.prompt is not None:
        out.append((step.prompt, ("prompt",), False))
    if step.map is not None:
        out.append((step.map, ("map",), False))
    if step.route is not None:
        out.append((step.route.on, ("route", "on"), False))
    for key, value in (step.with_ or {}).items():
        out.extend((t, ("with", key, *p), False) for t, p in _strings(value))
    if step.gate is not None:
        out.extend((c, ("gate", "criteria", j), False) for j, c in enumerate(step.gate.criteria))
        if step.gate.check:
            out.append((step.gate.check, ("gate", "check"), True))
    return out


def _strings(value: Any, path: Path = ()) -> list[tuple[str, Path]]:
    if isinstance(value, str):
        return [(value, path)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _strings(v, (*path, k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _strings(v, (*path, i))]
    return []


def _check_step_templates(
    spec: WorkflowSpec, step: StepSpec, i: int, src: _Source, *, earlier: Collection[str]
) -> None:
    for text, rel, bare in _templates_of(step):
        at: Path = ("steps", i, *rel)
        try:
            refs = references(text, expression=bare)
        except TemplateError as exc:
            raise src.error(str(exc), at) from None
        allowed = {"params", "steps", "gate"} | _JINJA_GLOBALS
        if step.map is not None and rel[0] != "map":
            allowed |= {"item", "index"}
        if rel[0] == "gate" and rel[1] == "check":
            allowed |= {"output"}
        unknown = refs.names - allowed
        if unknown:
            raise src.error(
                f"template names unknown variable(s) {sorted(unknown)}; in scope: "
                f"{sorted(allowed - _JINJA_GLOBALS)}",
                at,
            )
        for ref, field in sorted(refs.step_fields):
            if field != "output":
                raise src.error(
                    f"template names steps.{ref}.{field}; a step exposes only `steps.{ref}.output`",
                    at,
                )
        for ref in sorted(refs.steps):
            if ref == step.id:
                raise src.error(
                    f"template refers to its own step {ref!r}; use `output` in a gate "
                    "check or an earlier step",
                    at,
                )
            if ref not in earlier:
                later = any(s.id == ref for s in spec.steps)
                why = "a later step" if later else "an unknown step"
                raise src.error(
                    f"template refers to {why} {ref!r}; only earlier steps' outputs "
                    f"are in scope (earlier: {sorted(earlier) or 'none'})",
                    at,
                )
        for ref in sorted(refs.params):
            if ref not in spec.params:
                raise src.error(
                    f"template refers to undeclared param {ref!r}; declare it under "
                    f"params: (declared: {sorted(spec.params) or 'none'})",
                    at,
                )


def _check_bindings(step: StepSpec, child: Plan, src: _Source, at: Path) -> None:
    """A child's ``with:`` must bind declared params and every param without a default."""
    given = set(step.with_ or {})
    unknown = sorted(given - set(child.params))
    if unknown:
        raise src.error(
            f"child workflow {child.name!r} declares no param(s) {unknown}; "
            f"declared: {sorted(child.params) or 'none'}",
            (*at, "with"),
        )
    missing = sorted(n for n, s in child.params.items() if "default" not in s and n not in given)
    if missing:
        raise src.error(
            f"child workflow {child.name!r} needs param(s) {missing}; bind them under with:",
            (*at, "with" if step.with_ else "workflow"),
        )


def _check_routes(spec: WorkflowSpec, src: _Source) -> None:
    index = {s.id: i for i, s in enumerate(spec.steps)}
    for i, step in enumerate(spec.steps):
        if step.route is None:
            continue
        for case, target in step.route.cases.items():
            at: Path = ("steps", i, "route", "cases", case)
            if target not in index:
                raise src.error(f"route target {target!r} is not a step id", at)
            if index[target] <= i:
                raise src.error(
                    f"route target {target!r} must come after the router {step.id!r}", at
                )
