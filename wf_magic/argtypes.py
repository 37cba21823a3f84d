"""argparse value types shared by the ``wf`` command and the ``%workflow`` magics."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def count_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (``--max-steps``, ``--max-concurrency``)."""

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
