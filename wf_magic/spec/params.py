"""Run params: fill defaults, coerce command-line strings, validate against the param schemas."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import UsageError, clip, clip_list, text_problem
from ..redact import Redactor, is_secret_key, secret_strings
from ..schemas import import_jsonschema
from .plan import Plan

_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?P<frac>\.[0-9]+)?(?P<exp>[eE][+-]?[0-9]+)?")
"""A JSON number (RFC 8259 §6): no ``+``, no leading zeros, no ``1_000``, ``nan`` or ``inf``."""
_EXACT_INT = 2**53
"""Floats up to this magnitude are exact integers when integral."""
SWEEP_PARAM = "sweep"
"""The reserved run param a sweep's cell carries when its sweep repeats (``repeat > 1``):
``{"repeat": n}``. Templates read it as ``sweep.repeat``; it is part of every unit's input
hash, so repeats are fresh calls, not reuses. A plain run has none (``sweep.repeat`` is 0)."""


def normalise(value: Any) -> Any:
    """``value`` with integral floats as ints, deeply (``3.0`` → ``3``).

    JSON has one number type, so ``3`` and ``3.0`` are one param: normalised before a run's
    scope and params hash are taken, both land in the same scope and render ``3`` in a prompt.
    Floats too large to be exact integers are left alone.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_INT:
        return int(value)
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


def _number(text: str) -> int | float:
    """A JSON number read from ``text``: integral text stays an int, any other is normalised."""
    match = _JSON_NUMBER.fullmatch(text.strip())
    if match is None:
        raise ValueError(text)
    if match["frac"] is None and match["exp"] is None:
        return int(match[0])
    value = float(match[0])
    if not math.isfinite(value):
        raise ValueError(text)
    return normalise(value)  # type: ignore[no-any-return]


def coerce(schema: Mapping[str, Any], text: str) -> Any:
    """Turn a ``--param k=v`` string into the param's declared type.

    Numbers follow JSON's rules: ``3`` is the int 3 (as a YAML default of 3 is), ``3.0`` and
    ``3e0`` are normalised to it, ``3.5`` is a float; ``1_000``, ``0x10`` or ``nan`` are refused.

    Raises:
        UsageError: ``text`` is not a value of the declared type.
    """
    kind = schema.get("type")
    try:
        if kind == "integer":
            value = _number(text)
            if not isinstance(value, int):
                raise ValueError(text)
            return value
        if kind == "number":
            return _number(text)
        if kind == "boolean":
            if text.lower() in ("true", "false"):
                return text.lower() == "true"
            raise ValueError(text)
        if kind in ("array", "object"):
            return json.loads(text)
    except ValueError:
        article = "an" if str(kind)[:1] in "aeiou" else "a"
        raise UsageError(f"expected {article} {kind} (got {clip(repr(text), 200)})") from None
    return text


def resolve_params(
    plan: Plan, given: Mapping[str, Any] | None, *, from_strings: bool = False
) -> dict[str, Any]:
    """Params after defaults, validated.

    Raises:
        UsageError: an undeclared param, a missing required one, or a value of the wrong type.
    """
    given = dict(given or {})
    sweep = given.pop(SWEEP_PARAM, None) if SWEEP_PARAM not in plan.params else None
    if sweep is not None and not _is_sweep_value(sweep):
        raise UsageError(
            f"param {SWEEP_PARAM}: expected {{'repeat': <int ≥ 0>}} (got {sweep!r}); it is "
            "reserved for sweep cells"
        )
    unknown = sorted(set(given) - set(plan.params))
    if unknown:
        declared = clip_list(sorted(plan.params)) if plan.params else "none"
        raise UsageError(
            f"workflow {plan.name!r} declares no param {clip_list(unknown)}; declared: {declared}"
        )
    out: dict[str, Any] = {}
    for name, schema in plan.params.items():
        if name in given:
            value = given[name]
            if from_strings and isinstance(value, str):
                value = coerce_param(schema, value, name=name)
        elif "default" in schema:
            value = schema["default"]
        else:
            raise UsageError(
                f"param {name!r} of workflow {plan.name!r} is required; pass --param {name}=VALUE"
            )
        out[name] = check_param(schema, value, name=name)
    if sweep is not None:
        out[SWEEP_PARAM] = {"repeat": sweep["repeat"]}
    return out


def _text_problem(value: Any) -> str | None:
    """Why a string in ``value`` (at any depth) cannot be stored as UTF-8, or None."""
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, dict):
        items: list[Any] = [*value, *value.values()]
    elif isinstance(value, list):
        items = value
    else:
        return None
    return next((p for p in map(_text_problem, items) if p is not None), None)


def _is_sweep_value(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"repeat"}
        and isinstance(value["repeat"], int)
        and not isinstance(value["repeat"], bool)
        and value["repeat"] >= 0
    )


def coerce_param(schema: Mapping[str, Any], text: str, *, name: str) -> Any:
    """:func:`coerce` for the param ``name``; a secret param's value is never echoed.

    Raises:
        UsageError: ``text`` is not a value of the declared type.
    """
    try:
        return coerce(schema, text)
    except UsageError as exc:
        hidden = _unechoed(name, text)
        if hidden is None:  # the text may still quote a secret (`{"gh_token": ...}`)
            raise UsageError(f"param {name}: {Redactor().redact(str(exc))}") from None
        raise UsageError(
            f"param {name}: expected type {schema.get('type')} (got {hidden})"
        ) from None


def check_param(schema: Mapping[str, Any], value: Any, *, name: str) -> Any:
    """``value`` checked against the param ``name``'s schema, normalised (``3.0`` → ``3``).

    Raises:
        UsageError: ``param NAME: …`` — text a prompt cannot hold, a value that is no JSON
            (NaN, inf), or one the schema refuses; a secret param's value is never echoed.
    """
    problem = _text_problem(value)
    if problem is not None:
        raise UsageError(f"param {name}: {problem}")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        got = _unechoed(name, value) or clip(_without_secrets(repr(value), value), 200)
        raise UsageError(
            f"param {name}: expected a JSON value with finite numbers (got {got})"
        ) from None
    value = normalise(value)
    problem = _schema_problem(value, schema)
    if problem is not None:
        hidden = _unechoed(name, value)
        if hidden is not None:  # a schema message quotes the value: say less
            problem = f"does not match its schema {_schema_text(schema)} (got {hidden})"
        raise UsageError(f"param {name}: {clip(_without_secrets(problem, value), 600)}")
    return value


def _unechoed(name: str, value: Any) -> str | None:
    """What an error says instead of a secret param's value (None: not secret, echo it)."""
    if not is_secret_key(name):
        return None
    size = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
    return f"a secret value ({size}), not shown"


def _without_secrets(text: str, value: Any) -> str:
    """``text`` (a message about ``value``) with the secrets inside ``value`` masked: the
    values under secret-looking keys at any depth (``{"conf": {"gh_token": ...}}``), however
    short, where the message quotes them, and credential shapes."""
    leaves = sorted({s for s in secret_strings(value) if s}, key=len, reverse=True)
    for leaf in leaves:
        text = text.replace(repr(leaf), "'***'")
    return Redactor(leaves).redact(text)


def _schema_text(schema: Mapping[str, Any]) -> str:
    """The schema without its default (a secret param has none worth showing)."""
    return json.dumps({k: v for k, v in schema.items() if k != "default"}, sort_keys=True)


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
    import_jsonschema()
    import jsonschema

    try:
        jsonschema.validate(value, dict(schema))
    except jsonschema.ValidationError as exc:
        return str(exc.message)
    return None
