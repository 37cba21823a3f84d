"""What a provider's refusal says: is it its rate limiter, and how long does it ask to wait.

A refusal by the provider's limiter — HTTP 429, or 529 (Anthropic's "overloaded") — is not a
failed attempt but a throttle (``RunnerError(throttled=True)``): the drive waits and sends
the same attempt again (drive/endpoints.py). How long to wait is read, first found first, from
``retry-after-ms``, ``Retry-After`` (seconds or an HTTP date), OpenAI's
``x-ratelimit-reset-requests`` / ``-tokens`` (``1s``, ``6m0s``, ``20ms``) and Anthropic's
``anthropic-ratelimit-*-reset`` (an RFC 3339 time). Every value is checked: a number that is
not finite or is negative is ignored, never waited on.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

THROTTLE_STATUS = frozenset({429, 529})
"""Statuses a provider's limiter answers with (429 Too Many Requests, 529 Overloaded)."""
MAX_WAIT_S = 300.0
"""The longest wait a header can ask for that is taken at its word."""
_DURATION = re.compile(
    r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$"
)


def is_throttle(status: int | None) -> bool:
    """Whether a refusal came from the provider's rate limiter (or overload guard)."""
    return status in THROTTLE_STATUS


def wait_of(headers: Any) -> float | None:
    """Seconds the provider asks to wait before the next call, or None when it says nothing."""
    if headers is None:
        return None
    get = headers.get
    waits: list[float] = []
    ms = _number(get("retry-after-ms"))
    if ms is not None:
        return _bounded(ms / 1000.0)
    after = get("retry-after")
    if after:
        seconds = _number(after)
        if seconds is None:
            seconds = _http_date_in(after)
        if seconds is not None:
            return _bounded(seconds)
    for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"):
        seconds = _duration(get(name))
        if seconds is not None:
            waits.append(seconds)
    for name in (
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-input-tokens-reset",
        "anthropic-ratelimit-output-tokens-reset",
    ):
        seconds = _iso_in(get(name))
        if seconds is not None:
            waits.append(seconds)
    return _bounded(max(waits)) if waits else None


def key_digest(key: str | None) -> str:
    """A short digest naming a key in an endpoint's identity (never the key itself)."""
    if not key:
        return "nokey"
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _bounded(seconds: float) -> float | None:
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_WAIT_S)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _duration(value: Any) -> float | None:
    if not value:
        return None
    text = str(value).strip()
    plain = _number(text)
    if plain is not None:
        return plain
    match = _DURATION.match(text)
    if match is None or not any(match.groups()):
        return None
    h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + s + ms / 1000


def _http_date_in(value: str) -> float | None:
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _iso_in(value: Any) -> float | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())
