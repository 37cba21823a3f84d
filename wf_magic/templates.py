"""The Jinja sandbox: StrictUndefined templates, native expression values, static references."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, nodes
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment

_WHOLE_EXPR = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}).)*)\}\}\s*$", re.S)


def _finalize(value: Any) -> Any:
    # Structured values interpolated into text read as JSON, not Python reprs.
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    if value is None:
        return ""
    return value


class TemplateError(Exception):
    """A template failed to parse or render; the caller adds run/step context."""


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with mapping keys winning over attributes: ``params.items`` is the param."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)


_env = _Sandbox(
    undefined=StrictUndefined,
    finalize=_finalize,
    autoescape=False,
    keep_trailing_newline=True,
)
_env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True)


@functools.lru_cache(maxsize=4096)
def _template(source: str) -> Any:
    return _env.from_string(source)


@functools.lru_cache(maxsize=4096)
def _expression(expr: str) -> Any:
    return _env.compile_expression(expr, undefined_to_none=False)


def whole_expression(source: str) -> str | None:
    """The inner expression when ``source`` is exactly one ``{{ ... }}``, else None."""
    match = _WHOLE_EXPR.match(source)
    return match.group("expr") if match else None


def render_text(source: str, context: Mapping[str, Any]) -> str:
    """Render ``source`` as text.

    Raises:
        TemplateError: an undefined name, a sandbox violation or any render error.
    """
    try:
        return str(_template(source).render(context))
    except (UndefinedError, SecurityError, TemplateSyntaxError, TypeError, ValueError) as exc:
        raise TemplateError(str(exc)) from exc


def evaluate(source: str, context: Mapping[str, Any]) -> Any:
    """Evaluate ``source`` to a native value when it is one ``{{ expr }}``, else render text."""
    expr = whole_expression(source)
    if expr is None:
        return render_text(source, context)
    return evaluate_expression(expr, context)


def evaluate_expression(expr: str, context: Mapping[str, Any]) -> Any:
    """Evaluate a bare Jinja expression (no braces) to a native value."""
    try:
        value = _expression(expr)(**context)
    except (
        UndefinedError,
        SecurityError,
        TemplateSyntaxError,
        TypeError,
        ValueError,
        ArithmeticError,
        LookupError,
    ) as exc:
        raise TemplateError(str(exc)) from exc
    if hasattr(value, "_undefined_name"):
        raise TemplateError(f"{value._undefined_name!r} is undefined")
    return value


@dataclass(frozen=True, slots=True)
class References:
    """What a template names: top-level names, ``steps.X`` ids and ``params.X`` names."""

    names: frozenset[str]
    steps: frozenset[str]
    params: frozenset[str]
    step_fields: frozenset[tuple[str, str]] = frozenset()
    """``(step id, field)`` for every ``steps.<id>.<field>`` (only ``output`` exists)."""


def references(source: str, *, expression: bool = False) -> References:
    """Parse ``source`` (a template, or a bare expression) and list what it refers to.

    Raises:
        TemplateError: the source is not valid Jinja.
    """
    text = "{{ " + source + " }}" if expression else source
    try:
        ast = _env.parse(text)
    except TemplateSyntaxError as exc:
        raise TemplateError(
            f"invalid template: {exc.message} (template line {exc.lineno})"
        ) from exc
    assigned = {n.name for n in ast.find_all(nodes.Name) if n.ctx in ("store", "param")}
    names = {n.name for n in ast.find_all(nodes.Name) if n.ctx == "load"} - assigned
    steps: set[str] = set()
    params: set[str] = set()
    fields: set[tuple[str, str]] = set()
    for node in ast.find_all((nodes.Getattr, nodes.Getitem)):
        if not isinstance(node, (nodes.Getattr, nodes.Getitem)):
            continue
        base = node.node
        if isinstance(base, nodes.Name) and base.name in ("steps", "params"):
            key = _attr_key(node)
            if key is not None:
                (steps if base.name == "steps" else params).add(key)
        inner = base.node if isinstance(base, (nodes.Getattr, nodes.Getitem)) else None
        if isinstance(inner, nodes.Name) and inner.name == "steps":
            step_id, field = _attr_key(base), _attr_key(node)  # type: ignore[arg-type]
            if step_id is not None and field is not None:
                fields.add((step_id, field))
    return References(frozenset(names), frozenset(steps), frozenset(params), frozenset(fields))


def _attr_key(node: nodes.Getattr | nodes.Getitem) -> str | None:
    if isinstance(node, nodes.Getattr):
        return str(node.attr)
    if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
        return node.arg.value
    return None
