"""Static checks of a workflow spec against its source: models, params, runners, templates, routes.

Each check raises the source's ``DefinitionError`` naming the line and field of the first
problem; none of them builds anything (freeze.py builds the plan).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

from pydantic import ValidationError

from ..errors import clip
from ..redact import MIN_SECRET_LEN, Redactor, is_secret_key, secret_strings
from ..schemas import import_jsonschema
from ..sealing import env_name
from ..templates import GLOBAL_NAMES, TemplateError, references, unknown_callables
from .literals import is_templated
from .models import StepSpec, WorkflowSpec
from .plan import Plan
from .source import Source
from .yamlload import Path

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
_JINJA_GLOBALS = GLOBAL_NAMES


def check_target(target: str, src: Source, at: Path) -> None:
    """A ``python:`` target must read ``module:function`` or a registered name."""
    if not _TARGET_PATTERN.match(target):
        raise src.error(
            "expected module:function (e.g. `helpers:summarize`) or a registered function "
            f"name (got {clip(repr(target))})",
            at,
        )


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


def validate(src: Source) -> WorkflowSpec:
    """The source validated into the authoring models; the first problem names its line."""
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


def check_params(spec: WorkflowSpec, src: Source) -> None:
    """Param names are identifiers, schemas supported, and defaults match their schemas."""
    for name, schema in spec.params.items():
        at: Path = ("params", name)
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise src.error(f"expected a param name like `topic` (got {name!r})", at)
        check_schema(schema, src, at)
        secret_at = secret_default(name, schema)
        if secret_at is not None:
            env = f", or the environment variable {env_name(name)}" if is_secret_key(name) else ""
            raise src.error(
                "a secret default would be frozen into the plan, in the clear; remove it and "
                f"pass the value when the run starts (`--param {name}=VALUE`, params= in "
                f"Python{env})",
                (*at, *secret_at),
            )
        if "default" in schema:
            import_jsonschema()  # only a schema that must be checked pays its import
            import jsonschema

            try:
                jsonschema.validate(schema["default"], schema)
            except jsonschema.ValidationError as exc:
                raise src.error(
                    f"default does not match the param schema: {exc.message}", (*at, "default")
                ) from None


def secret_default(name: str, schema: Any) -> Path | None:
    """Where ``schema`` (of the param ``name``) holds a secret default; None when it holds none.

    A default is secret when it sits under a secret-looking name (the param's own, or a
    property's: ``conf.properties.gh_token.default``) and holds a string or a number, when it
    holds one under a secret-looking key (``default: {gh_token: ...}``), or when a string in
    it has a credential's shape (``Bearer ...``, ``sk-...``). Values shorter than
    ``MIN_SECRET_LEN`` are placeholders (``none``, ``""``), as the redactor treats them, and
    ``false`` and ``null`` hold nothing to hide.
    """
    if not isinstance(schema, dict):
        return None
    if "default" in schema:
        default = schema["default"]
        strings = secret_strings(default, secret=is_secret_key(name))
        hidden = [s for s in strings if len(s) >= MIN_SECRET_LEN]
        shaped = [s for s in secret_strings(default, secret=True) if Redactor().redact(s) != s]
        if hidden or shaped:
            return ("default",)
    for key, sub in (schema.get("properties") or {}).items():
        found = secret_default(str(key), sub)
        if found is not None:
            return ("properties", key, *found)
    for key in ("items", "additionalProperties"):
        found = secret_default(name, schema.get(key))
        if found is not None:
            return (key, *found)
    return None


def check_schema(schema: dict[str, Any], src: Source, at: Path) -> None:
    """A JSON Schema uses only the supported keywords and is itself valid."""
    import_jsonschema()  # lazy, and without the format checker that takes seconds
    import jsonschema

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


def check_gate(step: StepSpec, src: Source, at: Path) -> None:
    """A ``per_item`` gate judges the items of a map: the step must have ``map:``."""
    if step.gate is not None and step.gate.per_item and step.map is None:
        raise src.error(
            f"`per_item: true` judges each item of a map step; step {step.id} has no `map:`",
            (*at, "gate", "per_item"),
        )


def check_scores(step: StepSpec, src: Source, at: Path) -> None:
    """A score's regex compiles (when it is no template) and its JSON Schema is valid."""
    for j, score in enumerate(step.score):
        where: Path = (*at, "score", j)
        if score.regex is not None and not is_templated(score.regex):
            from ..runners.scripted import match_cost  # the bound every searched regex keeps

            try:
                match_cost(re.compile(score.regex), where="regex")
            except (re.error, RecursionError, OverflowError) as exc:
                raise src.error(f"invalid regex: {exc}", (*where, "regex")) from None
            except ValueError as exc:
                said = str(exc).replace("regex: match ", "regex ", 1)
                said = said.replace("the prompt's length", "the output's length")
                raise src.error(said, (*where, "regex")) from None
        if score.json_schema is not None:
            import_jsonschema()
            import jsonschema

            try:
                jsonschema.Draft202012Validator.check_schema(score.json_schema)
            except jsonschema.SchemaError as exc:
                raise src.error(f"invalid schema: {exc.message}", (*where, "json_schema")) from None


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


def check_runners(spec: WorkflowSpec, src: Source) -> None:
    """Runner types are known, hold no secret values, build; every runner named exists."""
    from ..agents.registry import known_harnesses
    from ..runners.registry import known_runners

    known = set(known_runners()) | set(known_harnesses())
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
        for j, score in enumerate(step.score):
            if score.runner:
                refs.append((score.runner, ("steps", i, "score", j, "runner")))
    for name, at in refs:
        if name not in usable:
            raise src.error(
                f"unknown runner {clip(repr(name))}; known runners: {sorted(usable)}", at
            )


def _try_runner(workflow: str, name: str, kind: str, options: dict[str, Any], src: Source) -> None:
    """Build the runner once so bad options (unknown keys, bad regexes) fail at freeze time.

    Factories are lazy (no client, no connection until the first unit), so this is cheap.
    """
    from ..agents.registry import harness_runner_factory
    from ..runners.base import RunnerContext
    from ..runners.registry import runner_factory

    factory = runner_factory(kind) or harness_runner_factory(kind)
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
    for j, score in enumerate(step.score):
        for key in ("equals", "contains", "regex", "rubric"):
            value = getattr(score, key)
            if isinstance(value, str):
                out.append((value, ("score", j, key), False))
    return out


def _strings(value: Any, path: Path = ()) -> list[tuple[str, Path]]:
    if isinstance(value, str):
        return [(value, path)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _strings(v, (*path, k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _strings(v, (*path, i))]
    return []


def _scope(step: StepSpec, rel: Path) -> set[str]:
    """The names a template field of ``step`` may use: what it is rendered with.

    A gate judges the whole artifact once, so its criteria see ``params`` and earlier
    ``steps`` but no map ``item``/``index`` and no ``gate`` (that is the re-executed unit's);
    its ``check`` sees ``output`` and ``params`` only (a verdict's cache key holds nothing else).
    """
    if rel[0] == "gate":
        names = {"output", "params"} if rel[1] == "check" else {"params", "steps"}
        return names | _JINJA_GLOBALS
    if rel[0] == "score":
        # A score measures one output: the step's, or one map item's (its item and index).
        names = {"params", "steps", "sweep"} | ({"item", "index"} if step.map else set())
        return names | _JINJA_GLOBALS
    allowed = {"params", "steps", "gate", "sweep"} | _JINJA_GLOBALS  # sweep.repeat in a cell
    if step.map is not None and rel[0] != "map":
        allowed |= {"item", "index"}
    return allowed


def check_step_templates(
    spec: WorkflowSpec, step: StepSpec, i: int, src: Source, *, earlier: Collection[str]
) -> None:
    """A step's templates parse and name only what is in scope: params, earlier steps' outputs."""
    for text, rel, bare in _templates_of(step):
        at: Path = ("steps", i, *rel)
        try:
            refs = references(text, expression=bare)
        except TemplateError as exc:
            raise src.error(str(exc), at) from None
        unknown_calls = unknown_callables(refs)
        if unknown_calls:
            raise src.error(
                f"template uses unknown {', '.join(unknown_calls)}; templates have Jinja's "
                "built-in filters and tests, plus the `json` filter",
                at,
            )
        allowed = _scope(step, rel)
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


def check_bindings(step: StepSpec, child: Plan, src: Source, at: Path) -> None:
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


def check_routes(spec: WorkflowSpec, src: Source) -> None:
    """Route targets are step ids after their router (a route never goes back)."""
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
