"""The value parsers the ``wf`` command, the ``%workflow`` magics and numeric environment
variables share: ``k=v`` params (:func:`parse_params`), counts (:func:`count_at_least`),
numbers (:func:`number_in`), durations (:func:`duration_s`) and the first argument that is not
valid UTF-8 (:func:`argv_problem`).

A number is written in ASCII digits with no surrounding space, is finite, and lies in the
option's range: ``nan``, ``inf``, ``1e999``, ``' 5 '``, ``'٥'`` and ``''`` are refused with a
message naming the range, which argparse prefixes with the option's name (``argument --idle:
...``) and :func:`env_number` with the variable's. It imports only the stdlib and
``wf_magic.errors``, so the store may read its environment variables with it too.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping, Sequence

from .errors import COUNT_MAX, UsageError, clip, text_problem


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
            return f"argument {number} ({_named(argv, number, arg)}) is {problem}"
    return None


def _named(argv: Sequence[str], number: int, arg: str) -> str:
    """How an undecodable argument is named without showing a value it may carry (a secret
    ``--param api_key=…``, ``--feedback``): ``'api_key=…'``, ``the value of --feedback``; a
    word of its own (a file, a run id) as it is."""
    name, equals, _ = arg.partition("=")
    if equals and name and text_problem(name) is None:
        return clip(_shown(name), 60)[:-1] + "=…'"
    before = argv[number - 2] if number > 1 else ""
    if before.startswith("-") and text_problem(before) is None:
        return f"the value of {clip(before, 40)}"
    return clip(_shown(arg), 80)


INT64_MAX = COUNT_MAX
"""The largest count any option takes: what an SQLite or PostgreSQL integer column holds."""
SECONDS_MAX = 100 * 365.25 * 86400
"""The longest duration any option takes (100 years): past it, clocks and timeouts overflow."""

_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)


def _integer(text: str, low: int, high: int) -> int:
    """``text`` as an integer in ``[low, high]``, or ArgumentTypeError saying why not."""
    if not _INTEGER.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"expected an integer from {low} to {high} in ASCII digits (got {clip(repr(text), 40)})"
        )
    # Too many digits is out of range before int() is asked (its own limit is 4300 digits).
    value = int(text) if len(text.lstrip("-")) <= 20 else None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"expected an integer from {low} to {high} (got {clip(text, 40)})"
        )
    return value


def count_at_least(low: int, high: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]`` (``--max-steps``, ``--since``, ...)."""

    def parse(text: str) -> int:
        return _integer(text, low, high)

    return parse


def _decimal(text: str, low: float, high: float, *, low_open: bool) -> float:
    """``text`` as a finite number in the range, or ArgumentTypeError saying why not."""
    if math.isinf(high):
        want = f"a finite number {'>' if low_open else '>='} {low:g}"
    else:
        want = f"a finite number in {'(' if low_open else '['}{low:g}, {high:g}]"
    value = float(text) if _DECIMAL.fullmatch(text) else None
    in_range = value is not None and math.isfinite(value) and low <= value <= high
    if value is None or not in_range or (low_open and value == low):
        raise argparse.ArgumentTypeError(f"expected {want} (got {clip(repr(text), 40)})")
    return value


def number_in(
    low: float, high: float = float("inf"), *, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite decimal number in ``[low, high]`` (``(low, high]`` when
    ``low_open``), such as ``--max-cost`` or ``--idle``; ``1e999`` is infinite, so refused."""

    def parse(text: str) -> float:
        return _decimal(text, low, high, low_open=low_open)

    return parse


_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def duration_s(text: str) -> float:
    """Seconds in a duration such as ``30d``, ``12h``, ``45m`` or ``90s``: finite, at least 0,
    at most :data:`SECONDS_MAX`. A number needs its unit (``wf gc --older-than 30`` could mean
    30 days as well as 30 seconds, and deletes runs), bar ``0``.

    Raises:
        argparse.ArgumentTypeError: not a duration, one without a unit, or one out of range.
    """
    number, unit = (text[:-1], text[-1]) if text and text[-1] in _UNITS else (text, "")
    if not unit and _DECIMAL.fullmatch(number) and float(number) != 0:
        raise argparse.ArgumentTypeError(
            f"expected a duration with its unit, like 30d, 12h, 45m or 90s "
            f"(got {clip(repr(text), 40)}: days or seconds?)"
        )
    value = float(number) * _UNITS.get(unit, 1.0) if _DECIMAL.fullmatch(number) else None
    if value is None or not 0 <= value <= SECONDS_MAX:
        raise argparse.ArgumentTypeError(
            "expected a duration like 30d, 12h, 45m or 90s, from 0 to 100 years "
            f"(got {clip(repr(text), 40)})"
        )
    return value


def env_number(
    name: str,
    default: float,
    parse: Callable[[str], float],
    *,
    environ: Mapping[str, str],
) -> float:
    """The number the environment variable ``name`` holds, parsed by ``parse`` (one of this
    module's types); ``default`` when it is unset or blank.

    Raises:
        UsageError: the variable holds something ``parse`` refuses, named with the variable.
    """
    raw = environ.get(name, "")
    if not raw.strip():
        return default
    try:
        return parse(raw)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"${name}: {exc}") from None
