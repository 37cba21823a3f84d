"""The value parsers the ``wf`` command and the ``%workflow`` magic share: ``k=v`` params
(:func:`parse_params`), counts (:func:`count_at_least`), durations (:func:`duration_s`) and
the first argument that is not valid UTF-8 (:func:`argv_problem`).

It imports only the stdlib and ``wf_magic.errors``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from .errors import UsageError, clip, text_problem


def parse_params(pairs: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` → ``{"k": "v"}``: whitespace around the key is dropped, the value is kept
    verbatim (a string param may start or end with spaces); a later pair wins.

    Raises:
        UsageError: a pair has no ``=`` or an empty key.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param expects k=v (got {clip(repr(pair))})")
        problem = text_problem(key) or text_problem(value)
        if problem is not None:
            raise UsageError(f"--param {clip(_shown(key.strip()), 60)}: {problem}")
        out[key.strip()] = value
    return out


def _shown(arg: str) -> str:
    """``arg`` as typed: its undecodable bytes as ``\\xff``, quoted."""
    try:
        raw = arg.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return ascii(arg)
    return "'" + raw.decode("utf-8", "backslashreplace") + "'"


def argv_problem(argv: Sequence[str]) -> str | None:
    """The first command-line argument that is not valid UTF-8, named with its problem."""
    for number, arg in enumerate(argv, start=1):
        problem = text_problem(arg)
        if problem is not None:
            return f"argument {number} ({clip(_shown(arg), 80)}) is {problem}"
    return None


def count_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (``--max-steps``, ``--limit``, ...)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer (got {text!r})") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low} (got {value})")
        return value

    return parse


def duration_s(text: str) -> float:
    """Seconds in a duration such as ``30d``, ``12h``, ``45m``, ``90s`` or ``3600``.

    Raises:
        argparse.ArgumentTypeError: not a duration, or a negative one.
    """
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration like 30d, 12h, 45m or 90s (got {text!r})"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a duration >= 0 (got {text!r})")
    return value
