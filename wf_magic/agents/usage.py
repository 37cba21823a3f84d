"""Numbers an agent CLI reports (tokens, cost), checked before they reach the journal or a budget.

A CLI prints whatever it prints: ``-1``, ``NaN``, ``1e400`` (``inf`` once parsed), ``"12"``,
``true``. Such a value is never journaled or charged as it is: a cost becomes ``None``, and a
token count makes that direction's count unknown (NULL, as a server that reports no usage;
the agent runner sees a :class:`TokenWarning` among the warnings), charged under ``max_tokens``
as unknown usage is (``drive/attempts.py``); the attempt carries a warning naming the value,
so a report can never raise a budget (a negative cost would otherwise give headroom).
"""

from __future__ import annotations

import math
from typing import Any

MAX_TOKENS = 2**53
"""The largest token count believed (a float still counts it exactly)."""
MAX_COST = 1e9
"""The largest cost in dollars believed for one attempt."""


_OUTPUT_WORDS = ("output", "candidates", "thoughts", "reasoning")
"""Words of a usage field that counts the answer's tokens (``usage.output_tokens``,
``tokens.candidates``, ``tokens.reasoning``); every other counts the prompt's."""


class TokenWarning(str):
    """A warning that a reported token count was refused: that direction's count is unknown.

    ``is_output``: the refused field counts the answer's tokens (else the prompt's)."""

    is_output: bool

    @classmethod
    def of(cls, text: str, *, name: str) -> TokenWarning:
        made = cls(text)
        made.is_output = any(word in name.lower() for word in _OUTPUT_WORDS)
        return made


def tokens(value: Any, *, name: str, warnings: list[str]) -> int:
    """``value`` as a token count: a whole number from 0; else 0 for the sum and a
    :class:`TokenWarning` (the runner then journals the attempt's tokens as unknown).
    None (not reported) is 0."""
    if value is None:
        return 0
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value == int(value)
        and 0 <= value <= MAX_TOKENS
    ):
        return int(value)
    warnings.append(
        TokenWarning.of(
            f"the CLI reported {name} = {_shown(value)}, expected a whole number from 0; "
            "that count is journaled as unknown (null)",
            name=name,
        )
    )
    return 0


def cost(value: Any, *, name: str, warnings: list[str]) -> float | None:
    """``value`` as a cost in dollars: a finite number from 0; else None and a warning."""
    if value is None:
        return None
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_COST
    ):
        return float(value)
    warnings.append(
        f"the CLI reported {name} = {_shown(value)}, expected a finite number of dollars "
        "from 0; the attempt's cost is journaled as null"
    )
    return None


def count(value: Any) -> int:
    """A count that is no usage (turns, tool calls): a whole number from 0, else 0."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return max(0, min(int(value), MAX_TOKENS))
    return 0


def _shown(value: Any) -> str:
    """``value`` as a short repr (a hostile report may be long)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"
