"""Judges (llm / expr / schema) → Verdict: the artifact summary, prompt, reply parsing, checks."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..hashing import canonical_json
from ..runners.base import strip_code_fence
from ..schemas import import_jsonschema
from ..templates import TemplateError, evaluate_expression, render_text
from .verdict import Verdict, VerdictError

SUMMARY_CLIP = 4000


def artifact_summary(artifact: Any, *, unit_count: int, clip: int = SUMMARY_CLIP) -> str:
    """One line with the unit count, then the artifact's canonical JSON, clipped."""
    body = canonical_json(artifact)
    if len(body) > clip:
        body = body[:clip] + f"… [clipped {len(body) - clip} characters]"
    return f"{unit_count} unit{'s' if unit_count != 1 else ''}\n{body}"


def render_criteria(criteria: Sequence[str], context: Mapping[str, Any]) -> list[str]:
    """Render the criteria templates (raises TemplateError)."""
    return [render_text(c, context) for c in criteria]


def judge_prompt(step_id: str, criteria: Sequence[str], summary: str) -> str:
    """The prompt an ``llm`` judge receives."""
    crit = "\n".join(f"- {c}" for c in criteria) or "- the artifact fulfils the step's request"
    return (
        f'Judge the artifact of step "{step_id}" against every criterion.\n'
        f"Criteria:\n{crit}\n"
        f"Artifact ({summary.splitlines()[0]}):\n{summary.split(chr(10), 1)[1]}\n"
        'Answer with JSON only: {"complete": true|false, "feedback": "what to fix", '
        '"missing": ["criterion not met", ...]}'
    )


def parse_verdict(output: Any) -> Verdict:
    """Read a judge's reply (JSON text or object) as a verdict.

    Raises:
        VerdictError: the reply is not ``{complete: bool, feedback?: str, missing?: [str]}``.
    """
    data = output
    if isinstance(output, str):
        text = strip_code_fence(output)
        try:
            data = json.loads(text)
        except ValueError:
            raise VerdictError(f"judge reply is not JSON: {output[:120]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("complete"), bool):
        raise VerdictError(f"judge reply lacks a boolean `complete`: {str(output)[:120]!r}")
    missing = data.get("missing") or []
    if not isinstance(missing, list):
        raise VerdictError("judge reply's `missing` is not a list")
    return Verdict(
        complete=data["complete"],
        feedback=str(data.get("feedback") or ""),
        missing=tuple(str(m) for m in missing),
        judge="llm",
    )


def expr_verdict(
    check: str, *, output: Any, params: Mapping[str, Any], criteria: Sequence[str]
) -> Verdict:
    """Evaluate an ``expr`` gate (raises VerdictError when the expression fails)."""
    try:
        ok = evaluate_expression(check, {"output": output, "params": params})
    except TemplateError as exc:
        raise VerdictError(f"gate check `{check}` failed: {exc}") from exc
    if ok:
        return Verdict(complete=True, judge="expr")
    feedback = "; ".join(criteria) or f"check `{check}` was false"
    return Verdict(complete=False, feedback=feedback, missing=tuple(criteria), judge="expr")


def schema_errors(
    schema: Mapping[str, Any], outputs: Sequence[Any], *, unit_ids: Sequence[str]
) -> list[str]:
    """Validation errors of each unit output against the step's output schema."""
    import_jsonschema()  # lazy, and without the format checker that takes seconds
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors: list[str] = []
    for unit_id, value in zip(unit_ids, outputs, strict=True):
        for err in sorted(validator.iter_errors(value), key=lambda e: list(e.path)):
            where = "/".join(str(p) for p in err.path) or "(root)"
            errors.append(f"{unit_id}: {where}: {err.message}")
    return errors


def schema_requirement(schema: Mapping[str, Any], *, clip: int = 600) -> str:
    """What a JSON Schema asks for, in words a model can act on (clipped to ``clip`` chars).

    ``{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}``
    reads "an object with n (integer, required)".
    """
    text = _requirement(schema, depth=0)
    return text if len(text) <= clip else text[: clip - 1] + "…"


def _requirement(schema: Any, *, depth: int) -> str:
    if not isinstance(schema, Mapping):
        return "any JSON value"
    if "enum" in schema:
        return "one of " + json.dumps(schema["enum"])
    if "const" in schema:
        return "exactly " + json.dumps(schema["const"])
    kind = schema.get("type")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        if not props:
            keys = ", ".join(sorted(required))
            return f"an object with keys {keys}" if keys else "an object"
        if depth >= 2:
            return "an object"
        parts = []
        for name, sub in props.items():
            flag = ", required" if name in required else ""
            parts.append(f"{name} ({_requirement(sub, depth=depth + 1)}{flag})")
        return "an object with " + ", ".join(parts)
    if kind == "array":
        items = schema.get("items")
        return "an array" + (f" of {_requirement(items, depth=depth + 1)}" if items else "")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    return str(kind) if kind else "any JSON value"
