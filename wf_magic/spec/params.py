"""Run params: fill defaults, coerce command-line strings, validate against the param schemas."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
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
    import jsonschema  # lazy: its import costs ~1 s with some extras installed

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
        try:
            jsonschema.validate(value, dict(schema))
        except jsonschema.ValidationError as exc:
            raise UsageError(f"param {name}: {exc.message}") from None
        out[name] = value
    return out
