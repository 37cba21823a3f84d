"""Run params: fill defaults, coerce command-line strings, validate against the param schemas."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import UsageError
from .plan import Plan


def coerce(schema: Mapping[str, Any], text: str) -> Any:
    """Turn a ``--param k=v`` string into the param's declared type."""
    kind = schema.get("type")
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        if kind == "boolean":
            if text.lower() in ("true", "false"):
                return text.lower() == "true"
            raise ValueError(text)
        if kind in ("array", "object"):
            return json.loads(text)
    except ValueError:
        article = "an" if str(kind)[:1] in "aeiou" else "a"
        raise UsageError(f"expected {article} {kind} (got {text!r})") from None
    return text


def resolve_params(
    plan: Plan, given: Mapping[str, Any] | None, *, from_strings: bool = False
) -> dict[str, Any]:
    """Params after defaults, validated.

    Raises:
        UsageError: an undeclared param, a missing required one, or a value of the wrong type.
    """
    given = dict(given or {})
    unknown = sorted(set(given) - set(plan.params))
    if unknown:
        raise UsageError(
            f"workflow {plan.name!r} declares no param {', '.join(map(repr, unknown))}; "
            f"declared: {sorted(plan.params) or 'none'}"
        )
    out: dict[str, Any] = {}
    for name, schema in plan.params.items():
        if name in given:
            value = given[name]
            if from_strings and isinstance(value, str):
                try:
                    value = coerce(schema, value)
                except UsageError as exc:
                    raise UsageError(f"param {name}: {exc}") from None
        elif "default" in schema:
            value = schema["default"]
        else:
            raise UsageError(
                f"param {name!r} of workflow {plan.name!r} is required; pass --param {name}=VALUE"
            )
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise UsageError(
                f"param {name}: expected a JSON value with finite numbers (got {value!r})"
            ) from None
        problem = _schema_problem(value, schema)
        if problem is not None:
            raise UsageError(f"param {name}: {problem}")
        out[name] = value
    return out


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: (
        not isinstance(v, bool)
        and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
_PLAIN_KEYWORDS = frozenset({"type", "default", "description", "title"})
"""Keywords that constrain nothing beyond a JSON type (or nothing at all)."""


def _schema_problem(value: Any, schema: Mapping[str, Any]) -> str | None:
    """Why ``value`` breaks ``schema``, or None.

    A schema of a plain JSON type is checked here; only a schema with real constraints
    (``minimum``, ``enum``, ``properties``, ...) imports jsonschema, whose import costs
    seconds in a venv with JupyterLab's extras (``rfc3987_syntax`` builds grammars).
    """
    kind = schema.get("type")
    if set(schema) <= _PLAIN_KEYWORDS and (kind is None or _JSON_TYPES.get(str(kind))):
        if kind is None or _JSON_TYPES[str(kind)](value):
            return None
        return f"{value!r} is not of type {kind!r}"  # jsonschema's own wording
    import jsonschema

    try:
        jsonschema.validate(value, dict(schema))
    except jsonschema.ValidationError as exc:
        return str(exc.message)
    return None
