"""What a unit hands back — a result or whatever it raised — checked before it is journaled.

Every runner kind finishes through :func:`checked_result` or :func:`unit_failure` (called by
``drive/dispatch.py`` on each finished future), so nothing a unit returns or raises can reach
the journal in a shape a later write or read would choke on: an output that is not valid
UTF-8 text (a lone surrogate), not JSON (bytes, a set, an object), not finite (NaN, inf), too
deep or too big fails its attempt with a one-line reason instead of being journaled
``succeeded`` and breaking every resume after. A ``SystemExit`` or ``KeyboardInterrupt`` a
unit's own code raises is a failed attempt too; it never ends the drive (a real interrupt
is told apart by :mod:`wf_magic.drive.interrupts`).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

from ..errors import RunnerError
from ..runners.base import UnitResult

MAX_OUTPUT_BYTES = 10_000_000
"""The largest output journaled, as JSON text."""
MAX_DEPTH = 200
"""The deepest nesting of lists and dicts in an output (a cycle hits it too)."""
MAX_INT_BITS = 10_000
"""The widest integer in an output (Python refuses to print ints past ~14 000 bits as text)."""
MAX_TOKENS = 2**62
"""The largest token count a result may report (SQLite integers are 64-bit)."""
MAX_REASON_CHARS = 4_000
"""The longest failure reason journaled (an exec failure's stderr tail is 2 000)."""


def checked_result(result: object) -> UnitResult:
    """``result``, once its output and usage fields are known to journal unchanged.

    Raises:
        RunnerError: permanent, naming the first problem (its path inside the output).
    """
    if not isinstance(result, UnitResult):
        raise RunnerError(
            f"the runner returned a {type(result).__name__}, expected a UnitResult; "
            "a runner's run() must return UnitResult(output=...)"
        )
    problem = result_problem(result) or output_problem(result.output)
    if problem is not None:
        raise RunnerError(problem)
    return result


def bounded_json(output: Any) -> str:
    """The JSON text of a checked (and redacted) output.

    Raises:
        RunnerError: the text is over ``MAX_OUTPUT_BYTES``.
    """
    text = json.dumps(output, allow_nan=False)
    if len(text) > MAX_OUTPUT_BYTES:
        raise RunnerError(
            f"output is {len(text)} bytes, over the bound of {MAX_OUTPUT_BYTES} bytes"
        )
    return text


def result_problem(result: UnitResult) -> str | None:
    """Why the usage fields of ``result`` cannot be journaled (None: they can)."""
    for name in ("tokens_in", "tokens_out"):
        value = getattr(result, name)
        if value is None:
            continue  # not reported: unknown, journaled as NULL
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{name} is a {type(value).__name__}, expected a whole number or None"
        if not (math.isfinite(value) and value == int(value) and 0 <= value < MAX_TOKENS):
            return f"{name} is {value!r}, expected a whole number from 0"
    cost = result.cost
    if cost is not None and not _cost_ok(cost):
        return f"cost is {cost!r}, expected a finite number from 0 or None"
    for name in ("model", "session_id"):
        value = getattr(result, name)
        if value is not None and (not isinstance(value, str) or _surrogate_at(value) >= 0):
            return f"{name} is not a valid UTF-8 string"
    return None


def output_problem(value: Any) -> str | None:
    """The first reason ``value`` is not journaled as JSON unchanged (None: it is).

    Walks the value without recursion, so a cycle or a deep nest is reported, not a crash.
    The size is estimated on the way (a lower bound of the JSON text) only to stop early on
    a value far past the bound; the exact size is measured on the JSON text after.
    """
    budget = 4 * MAX_OUTPUT_BYTES
    stack: list[tuple[Any, str, int]] = [(value, "output", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            at = _surrogate_at(item)
            if at >= 0:
                return (
                    f"{path}: a string holds a lone surrogate U+{ord(item[at]):04X} at index "
                    f"{at}, which UTF-8 cannot encode; return valid Unicode text"
                )
            budget -= len(item) + 2
        elif item is None or isinstance(item, bool):
            budget -= 5
        elif isinstance(item, int):
            if item.bit_length() > MAX_INT_BITS:
                return f"{path}: an integer of {item.bit_length()} bits is too wide for JSON"
            budget -= 20
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{path}: {item!r} is not a finite number, which JSON cannot hold"
            budget -= 24
        elif isinstance(item, list | tuple | dict):
            if depth >= MAX_DEPTH:
                return f"{path}: nested deeper than {MAX_DEPTH} levels (a cycle?)"
            problem = _push_children(stack, item, path, depth + 1)
            if problem is not None:
                return problem
            budget -= 2 + len(item)
        else:
            return f"{path}: {_kind(item)} is not JSON; {_hint(item)}"
        if budget < 0:
            return (
                f"output is over {4 * MAX_OUTPUT_BYTES} bytes as JSON, over the bound of "
                f"{MAX_OUTPUT_BYTES} bytes"
            )
    return None


def _push_children(
    stack: list[tuple[Any, str, int]], item: list[Any] | tuple[Any, ...] | dict[Any, Any],
    path: str, depth: int,
) -> str | None:  # fmt: skip
    if isinstance(item, dict):
        for key, child in item.items():
            if not isinstance(key, str):
                return (
                    f"{path}: a dict key of type {type(key).__name__} is not JSON (object keys "
                    "are strings, and a key JSON turned into one would read back changed)"
                )
            at = _surrogate_at(key)
            if at >= 0:
                return f"{path}: a dict key holds a lone surrogate, which UTF-8 cannot encode"
            stack.append((child, f"{path}[{_clip_key(key)}]", depth))
    else:
        stack.extend((child, f"{path}[{i}]", depth) for i, child in enumerate(item))
    return None


def _surrogate_at(text: str) -> int:
    """The index of the first lone surrogate in ``text``, or -1."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return -1


def _clip_key(key: str) -> str:
    shown = repr(key)
    return shown if len(shown) <= 40 else shown[:39] + "…"


def _kind(item: object) -> str:
    return f"a {type(item).__module__}.{type(item).__qualname__}".replace("builtins.", "")


def _hint(item: object) -> str:
    if isinstance(item, bytes | bytearray | memoryview):
        return "decode it to str (or base64 it)"
    if isinstance(item, set | frozenset):
        return "return a list"
    return "return dicts, lists, strings, finite numbers, booleans or None"


def unit_failure(exc: BaseException, *, redact: Callable[[str], str]) -> RunnerError:
    """The failure journaled for a unit that raised ``exc``: a ``RunnerError`` whose message
    is valid UTF-8 text, one line for anything but a runner's own error.

    ``redact`` masks secrets before a long message is clipped, so a clip never leaves the
    prefix of a secret the redactor would have recognised whole.

    A ``BaseException`` that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``,
    ``GeneratorExit``, ...) reached here from the unit's own code: its attempt fails like any
    other error, permanently.
    """
    if isinstance(exc, RunnerError):
        # A runner's own message keeps its lines (an exec failure's stderr tail).
        message = _clipped(redact(safe_text(_text_of(exc))))
        cost_ok = exc.cost is None or _cost_ok(exc.cost)
        if message == exc.message and _int_or_none(exc.tokens_in, exc.tokens_out) and cost_ok:
            return exc
        # A copy keeps what the runner attached beyond the message (a python step's
        # traceback, an agent's facts, a provider's retry-after) and its class.
        failure = copy.copy(exc)
        failure.args = (message,)
        failure.message = message
        failure.tokens_in = _whole(exc.tokens_in)
        failure.tokens_out = _whole(exc.tokens_out)
        failure.cost = exc.cost if cost_ok else None  # a NaN or negative is never charged
        failure.__cause__ = exc
        return failure
    detail = one_line(redact(safe_text(_text_of(exc))))
    if isinstance(exc, Exception):
        failure = RunnerError(f"runner raised {type(exc).__name__}: {detail}")
    else:
        shown = f"{type(exc).__name__}({detail})" if detail else type(exc).__name__
        failure = RunnerError(
            f"the unit's code raised {shown}; a unit's own exit or interrupt fails its "
            "attempt and never ends the drive"
        )
    failure.__cause__ = exc
    return failure


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception's own ``__str__`` fails."""
    if isinstance(exc, SystemExit) and not isinstance(exc.code, str):
        return "" if exc.code is None else repr(exc.code)
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return f"<{type(exc).__name__} whose message cannot be shown>"


def safe_text(text: str) -> str:
    """``text`` as valid UTF-8 text: lone surrogates become ``\\udxxx`` escapes."""
    if _surrogate_at(text) < 0:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def one_line(text: str) -> str:
    """``text`` as valid UTF-8 on one line, clipped to ``MAX_REASON_CHARS`` with a count."""
    return _clipped(" ".join(safe_text(text).split()))


def _clipped(text: str) -> str:
    if len(text) <= MAX_REASON_CHARS:
        return text
    return f"{text[:MAX_REASON_CHARS]}… ({len(text) - MAX_REASON_CHARS} more characters)"


def _int_or_none(*values: object) -> bool:
    return all(
        v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_TOKENS)
        for v in values
    )


def _cost_ok(cost: object) -> bool:
    """Whether ``cost`` is a cost that may be journaled and charged: finite, from 0."""
    return (
        isinstance(cost, int | float)
        and not isinstance(cost, bool)
        and math.isfinite(cost)
        and cost >= 0
    )


def _whole(value: object) -> int | None:
    """A token count a failing runner reported, None when it reported none, or 0 when it is
    not a usable count."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return int(value) if 0 <= value < MAX_TOKENS else 0
    return 0
