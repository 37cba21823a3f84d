"""Sampling settings of model runners: their names, checks, and a step's ``options:`` over them.

``temperature``, ``top_p``, ``max_tokens``, ``seed``, ``stop`` and ``system_prompt`` are
runner options (``runners: {openai: {temperature: 0.2}}``) that a step may override under
``options:``. Which names a step may set depends on its runner's type: ``STEP_OPTIONS`` for
the built-ins, a plugin factory's ``step_options`` attribute (a collection of names) for a
plugin; a runner that declares none takes no ``options:``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from ..errors import RunnerError
from .registry import runner_factory

SAMPLING_OPTIONS: tuple[str, ...] = (
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "stop",
    "system_prompt",
)
"""The sampling settings, as the Chat Completions API names them (``system_prompt`` is sent
as a first system message)."""

STEP_OPTIONS: dict[str, frozenset[str]] = {
    "openai": frozenset(SAMPLING_OPTIONS),
    "pydantic-ai": frozenset(SAMPLING_OPTIONS),
    # The offline stand-ins of those runners take (and ignore) the same names, so a
    # workflow can be tried offline unchanged.
    "scripted": frozenset(SAMPLING_OPTIONS),
    "replay": frozenset(SAMPLING_OPTIONS),
}
"""Built-in runner type → the names a step's ``options:`` may set."""

MAX_STOP = 4
"""Stop sequences a request may carry (the Chat Completions limit)."""
_SEED_BOUND = 2**63


def step_option_names(kind: str) -> frozenset[str]:
    """The ``options:`` names a step on a runner of type ``kind`` may set (empty: none)."""
    if kind in STEP_OPTIONS:
        return STEP_OPTIONS[kind]
    declared: Collection[str] | None = getattr(runner_factory(kind), "step_options", None)
    return frozenset(declared or ())


def check_step_options(options: Mapping[str, Any], *, kind: str, where: str) -> None:
    """A step's ``options:`` for a runner of type ``kind``: known names, checked values.

    Args:
        options: The step's ``options:`` mapping.
        kind: The step runner's type.
        where: The step, for messages (``step 'answer'``).

    Raises:
        RunnerError: permanent, naming the step and the key.
    """
    allowed = step_option_names(kind)
    for key in options:
        if key not in allowed:
            expected = (
                f"expected some of {', '.join(sorted(allowed))}"
                if allowed
                else f"the {kind} runner takes no options: remove the key"
            )
            raise RunnerError(f"{where}: unknown key options.{key} for runner {kind}; {expected}.")
    check_sampling(
        {k: v for k, v in options.items() if k in SAMPLING_OPTIONS}, where=f"{where} options"
    )


def check_sampling(options: Mapping[str, Any], *, where: str) -> None:
    """The values of the sampling settings present in ``options`` (others are not looked at).

    Raises:
        RunnerError: permanent, naming ``where`` and the key, with what was expected and got.
    """
    for key in SAMPLING_OPTIONS:
        if key not in options:
            continue
        problem = _problem(key, options[key])
        if problem is not None:
            raise RunnerError(f"{where}.{key}: expected {problem} (got {_shown(options[key])}).")


def sampling_of(options: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The sampling settings a unit is sent with: the runner's, a step's ``overrides`` over them."""
    merged = {k: options[k] for k in SAMPLING_OPTIONS if k in options}
    merged.update({k: v for k, v in (overrides or {}).items() if k in SAMPLING_OPTIONS})
    return merged


def offered_tokens(setting: Any, budget_offer: int | None) -> int | None:
    """The ``max_tokens`` a request carries: the lower of the setting and the budget's offer."""
    caps = [n for n in (setting, budget_offer) if isinstance(n, int) and not isinstance(n, bool)]
    return min(caps) if caps else None


def _problem(key: str, value: Any) -> str | None:
    """What ``value`` should have been for setting ``key``; None when it is fine."""
    if key in ("temperature", "top_p"):
        high = 2 if key == "temperature" else 1
        if not _is_number(value) or not 0 <= value <= high:
            return f"a finite number from 0 to {high}"
    elif key == "max_tokens":
        if not _is_int(value) or value < 1:
            return "a positive whole number"
    elif key == "seed":
        if not _is_int(value) or not -_SEED_BOUND <= value < _SEED_BOUND:
            return "a whole number (64-bit)"
    elif key == "stop":
        many = isinstance(value, list) and 1 <= len(value) <= MAX_STOP
        if not (_is_stop(value) or (many and all(_is_stop(s) for s in value))):
            return f"a non-empty string or a list of 1 to {MAX_STOP} of them"
    elif key == "system_prompt" and not isinstance(value, str):
        return "a string"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_stop(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"
