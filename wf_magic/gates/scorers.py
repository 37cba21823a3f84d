"""Scorers → a number: equals, contains, regex, json_schema, an llm rubric's reply read strictly,
and a python scorer's return value read (pure functions; the drive journals them)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import clip
from ..hashing import canonical_json
from ..runners.base import strip_code_fence
from ..runners.scripted import MAX_MATCH_DEGREE, QUADRATIC_TEXT_CHARS, match_cost
from ..schemas import import_jsonschema

EXPLANATION_CHARS = 2_000
"""The longest explanation a score keeps (a judge's longer one is clipped)."""


class ScoreError(Exception):
    """A scorer could not produce a number (a failed score unit, never a 0)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreValue:
    """What one score unit measured: a finite number and why."""

    value: float
    explanation: str = ""

    def to_json(self) -> dict[str, Any]:
        """The score unit's journaled output: ``{value, explanation}``."""
        return {"value": self.value, "explanation": self.explanation}


def output_text(output: Any) -> str:
    """The text a text scorer reads: a string output as it is, any other value's JSON."""
    return output if isinstance(output, str) else canonical_json(output)


def _fold(text: str, ignore_case: bool) -> str:
    return text.casefold() if ignore_case else text


def score_equals(output: Any, expected: Any, *, ignore_case: bool = False) -> ScoreValue:
    """1 when ``output`` equals ``expected``, else 0.

    A string ``expected`` is compared with the output's text, both stripped of surrounding
    whitespace (and casefolded with ``ignore_case``); any other value (``5``, ``{answer:
    1}``) is compared as JSON, with a text output read as JSON first, as ``json_schema``
    reads it (one enclosing code fence allowed): a model answers ``5`` as text.
    """
    if isinstance(expected, str):
        got = _fold(output_text(output).strip(), ignore_case)
        hit = got == _fold(expected.strip(), ignore_case)
    else:
        value = output
        if isinstance(output, str):
            try:
                value = json.loads(strip_code_fence(output))
            except (ValueError, RecursionError):
                value = output
        hit = canonical_json(value) == canonical_json(expected)
    shown = clip(repr(output_text(output)), 120)
    return ScoreValue(
        value=1.0 if hit else 0.0,
        explanation="equal" if hit else f"expected {clip(repr(expected), 120)} (got {shown})",
    )


def score_contains(output: Any, needle: str, *, ignore_case: bool = False) -> ScoreValue:
    """1 when the output's text contains ``needle`` (casefolded with ``ignore_case``), else 0."""
    hit = _fold(needle, ignore_case) in _fold(output_text(output), ignore_case)
    word = "contains" if hit else "does not contain"
    return ScoreValue(value=1.0 if hit else 0.0, explanation=f"{word} {clip(repr(needle), 120)}")


def checked_regex(pattern: str) -> tuple[re.Pattern[str], int | None]:
    """``pattern`` compiled, and the longest text it may search (None: any).

    Python's ``re`` backtracks holding the GIL, so no timeout stops a search: a pattern is
    held to the scripted runner's bound (``runners/scripted.py`` ``match_cost``): no
    exponential search, and a quadratic one searches at most ``QUADRATIC_TEXT_CHARS``
    characters (fewer with alternatives).

    Raises:
        ScoreError: the pattern does not compile or could search for too long.
    """
    try:
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ScoreError(f"regex {clip(repr(pattern), 120)} does not compile: {exc}") from None
    try:
        degree, choices = match_cost(compiled, where="regex")
    except ValueError as exc:
        said = str(exc).replace("regex: match ", "regex ", 1)
        raise ScoreError(said.replace("the prompt's length", "the output's length")) from None
    if degree < MAX_MATCH_DEGREE:
        return compiled, None
    return compiled, int(QUADRATIC_TEXT_CHARS / math.sqrt(choices))


def score_regex(output: Any, pattern: str) -> ScoreValue:
    """1 when ``pattern`` is found in the output's text (``re.search``), else 0.

    Raises:
        ScoreError: the pattern (as rendered) does not compile, could search for too long
            (:func:`checked_regex`), or the output is longer than its pattern may search.
    """
    compiled, limit = checked_regex(pattern)
    text = output_text(output)
    if limit is not None and len(text) > limit:
        raise ScoreError(
            f"regex {clip(repr(pattern), 60)} may take time growing as the square of the "
            f"output's length, and the output has {len(text):,} characters (at most {limit:,}); "
            "anchor the pattern with ^ or use fewer repeats"
        )
    found = compiled.search(text)
    if found is None:
        return ScoreValue(value=0.0, explanation=f"no match for /{clip(pattern, 120)}/")
    return ScoreValue(value=1.0, explanation=f"matched {clip(repr(found.group(0)), 120)}")


def score_json_schema(output: Any, schema: Mapping[str, Any]) -> ScoreValue:
    """1 when the output satisfies ``schema``, else 0 with the first error.

    A string output is read as JSON (one enclosing code fence allowed); a string that is no
    JSON scores 0 ("not JSON"), as an output of the wrong shape does.
    """
    value = output
    if isinstance(output, str):
        try:
            value = json.loads(strip_code_fence(output))
        except ValueError:
            return ScoreValue(value=0.0, explanation=f"not JSON: {clip(repr(output), 120)}")
    import_jsonschema()
    import jsonschema

    validator = jsonschema.Draft202012Validator(dict(schema))
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    if not errors:
        return ScoreValue(value=1.0, explanation="valid")
    first = errors[0]
    where = "/".join(str(p) for p in first.path) or "(root)"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return ScoreValue(value=0.0, explanation=f"{where}: {clip(first.message, 200)}{more}")


def rubric_schema(scale: tuple[float, float]) -> dict[str, Any]:
    """The JSON Schema an llm scorer's reply must satisfy: ``{value, explanation}``."""
    lo, hi = scale
    return {
        "type": "object",
        "properties": {
            "value": {"type": "number", "minimum": lo, "maximum": hi},
            "explanation": {"type": "string"},
        },
        "required": ["value", "explanation"],
    }


def rubric_prompt(label: str, rubric: str, scale: tuple[float, float], output: Any) -> str:
    """The prompt an llm scorer receives: the rubric, its scale and the output it rates."""
    lo, hi = (_number_text(x) for x in scale)
    body = output_text(output)
    if len(body) > 8_000:
        body = body[:8_000] + f"… [clipped {len(body) - 8_000} characters]"
    return (
        f'Score the output of step "{label}".\n'
        f"Rubric: {rubric}\n"
        f"Scale: a number from {lo} (worst) to {hi} (best).\n"
        f"Output:\n{body}\n"
        'Answer with JSON only: {"value": <number on the scale>, "explanation": "why"}'
    )


def parse_rubric_reply(reply: Any, scale: tuple[float, float]) -> ScoreValue:
    """Read an llm scorer's reply strictly: ``{value, explanation}`` with the value on its scale.

    Raises:
        ScoreError: the reply is not JSON, not an object, has no finite number ``value`` (a
            bool is no number here), its ``explanation`` is not text, or the value is off scale.
    """
    data = reply
    if isinstance(reply, str):
        try:
            data = json.loads(strip_code_fence(reply))
        except ValueError:
            raise ScoreError(f"judge reply is not JSON: {clip(repr(reply), 120)}") from None
    if not isinstance(data, dict):
        raise ScoreError(f"judge reply is not an object: {clip(repr(reply), 120)}")
    value = data.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
        raise ScoreError(f"judge reply lacks a finite number `value`: {clip(repr(reply), 120)}")
    explanation = data.get("explanation", "")
    if not isinstance(explanation, str):
        raise ScoreError("judge reply's `explanation` is not text")
    lo, hi = scale
    if not lo <= value <= hi:
        raise ScoreError(
            f"judge value {_number_text(value)} is outside the scale "
            f"[{_number_text(lo)}, {_number_text(hi)}]"
        )
    return ScoreValue(value=float(value), explanation=_kept(explanation))


def python_score(returned: Any) -> ScoreValue:
    """Read what a python scorer returned: a number, a bool (1/0) or ``{value, explanation}``.

    Raises:
        ScoreError: anything else, or a number that is not finite.
    """
    explanation = ""
    value = returned
    if isinstance(returned, Mapping):
        if "value" not in returned:
            raise ScoreError("python scorer returned a mapping without `value`")
        value, said = returned["value"], returned.get("explanation", "")
        if not isinstance(said, str):
            raise ScoreError("python scorer's `explanation` is not text")
        explanation = _kept(said)
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        try:  # a numpy scalar (np.int64 of a sum, np.bool_ of a comparison): its Python value
            value = value.item()
        except (TypeError, ValueError):
            pass  # an array of more than one value: refused below
    if isinstance(value, bool):
        return ScoreValue(value=1.0 if value else 0.0, explanation=explanation)
    if not isinstance(value, int | float):
        raise ScoreError(
            "python scorer returned "
            f"{type(value).__name__}; expected a number, a bool or {{value, explanation}}"
        )
    try:
        number = float(value)
    except OverflowError:
        raise ScoreError(
            "python scorer returned an integer too large for a float; expected a finite number"
        ) from None
    if not math.isfinite(number):
        raise ScoreError(f"python scorer returned {number}; expected a finite number")
    return ScoreValue(value=number, explanation=explanation)


def _number_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _kept(text: str) -> str:
    """An explanation as kept: its lines intact, cut to ``EXPLANATION_CHARS``."""
    return text if len(text) <= EXPLANATION_CHARS else text[: EXPLANATION_CHARS - 1] + "…"
