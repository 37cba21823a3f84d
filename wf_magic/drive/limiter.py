"""One adaptive limiter per model endpoint, shared by every drive of the process.

An endpoint is what a provider rate-limits: the runner, its base URL, the model and the
identity of the key (a digest, never the key). Every run, sweep cell and map unit of the
process that calls the same endpoint shares one :class:`Limiter`, so a 429 seen by one cell
slows all of them — the provider's limit is one limit, whoever spends it.

The limiter does three things, as Inspect AI's adaptive connections and promptfoo's scheduler
do:

- **AIMD concurrency.** Calls in flight start at the configured maximum (the drive's
  concurrency). A rate-limit signal cuts the limit in half (at most once per cool-down, so a
  storm of 429s from 128 calls in flight is one cut, not seven); every ``limit / 2`` calls
  that succeed raise it by one, back up to the maximum.
- **One pause per ``Retry-After``.** A refusal that says how long to wait pauses every call to
  the endpoint until then: calls in flight that come back refused wait for the same moment,
  not each for a wait of its own.
- **Pacing** (optional, from ``runners: {name: {limits: {model: {rpm, tpm}}}}``): calls are
  spaced so that a known requests-per-minute or tokens-per-minute limit is never reached,
  and the provider never has to refuse.

Nothing here blocks: :meth:`Limiter.try_acquire` answers at once, with how long to wait when
the answer is no; the drive schedules the unit for then and keeps driving the others.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

COOLDOWN_S = 1.0
"""The shortest time between two multiplicative cuts of one endpoint's limit."""
DEFAULT_PAUSE_S = 1.0
"""The pause after a refusal that gives no ``Retry-After`` (and no reset header)."""
MAX_PAUSE_S = 300.0
"""The longest pause one refusal can impose (a bogus hour must not park every drive)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pacing:
    """Known provider limits for one model: requests and tokens per minute."""

    rpm: float | None = None
    tpm: float | None = None


UNLIMITED = 1024
"""The ceiling of an endpoint without a configured ``concurrency``: the drive's own limits
(threads, a sweep's slots) bound it until the provider refuses a call."""


def ceiling_of(options: Mapping[str, Any], model: str | None) -> int:
    """The ``concurrency`` of a runner's ``limits:`` for ``model`` (``*`` matches every
    model), else :data:`UNLIMITED`."""
    limits = options.get("limits")
    if isinstance(limits, Mapping):
        entry = limits.get(model or "") or limits.get("*")
        if isinstance(entry, Mapping) and isinstance(entry.get("concurrency"), int):
            return max(1, int(entry["concurrency"]))
    return UNLIMITED


def pacing_of(options: Mapping[str, Any], model: str | None) -> Pacing:
    """The ``limits:`` of a runner's options for ``model`` (``*`` matches every model)."""
    limits = options.get("limits")
    if not isinstance(limits, Mapping):
        return Pacing()
    entry = limits.get(model or "") if model is not None else None
    if not isinstance(entry, Mapping):
        entry = limits.get("*")
    if not isinstance(entry, Mapping):
        return Pacing()
    return Pacing(rpm=_positive(entry.get("rpm")), tpm=_positive(entry.get("tpm")))


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class LimiterState:
    """One endpoint's limiter as ``engine.limits()`` shows it."""

    endpoint: str
    limit: int
    """Calls allowed in flight now (cut on refusals, regrown on successes)."""
    max_limit: int
    in_flight: int
    calls: int
    """Calls started through the limiter (a re-sent refused call counts again)."""
    throttles: int
    """Refusals by the provider (429, 529, overloaded)."""
    waited_s: float
    """Seconds of pause the refusals imposed on the endpoint, in all."""
    waiting_s: float
    """Seconds until the current pause ends (0 when none)."""
    rpm: float | None
    tpm: float | None


class Limiter:
    """The adaptive concurrency, pause and pacing of one endpoint (thread-safe)."""

    def __init__(
        self,
        endpoint: str,
        *,
        max_limit: int,
        pacing: Pacing | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self._clock = clock
        self._lock = threading.Lock()
        self._max = max(1, max_limit)
        self._limit = float(self._max)
        self._in_flight = 0
        self._calls = 0
        self._throttles = 0
        self._waited_s = 0.0
        self._paused_until = 0.0
        self._last_cut = -math.inf
        self._grown = 0
        self._pacing = pacing or Pacing()
        self._next_call = 0.0
        self._tokens = self._pacing.tpm / 60.0 if self._pacing.tpm else 0.0
        self._tokens_at = clock()

    def widen(self, max_limit: int, pacing: Pacing | None = None) -> None:
        """A drive with more concurrency (or known limits) joins: raise the ceiling to it."""
        with self._lock:
            if max_limit > self._max:
                self._limit += max_limit - self._max
                self._max = max_limit
            if pacing is not None and (pacing.rpm or pacing.tpm):
                self._pacing = pacing

    def try_acquire(self) -> float:
        """Take a call slot: 0.0 when taken, else the seconds to wait before asking again."""
        with self._lock:
            now = self._clock()
            if now < self._paused_until:
                return self._paused_until - now
            if self._in_flight >= int(self._limit):
                return 0.01  # a slot frees when a call in flight returns
            wait = self._pace_wait(now)
            if wait > 0:
                return wait
            self._in_flight += 1
            self._calls += 1
            if self._pacing.rpm:
                self._next_call = max(self._next_call, now) + 60.0 / self._pacing.rpm
            return 0.0

    def _pace_wait(self, now: float) -> float:
        wait = max(0.0, self._next_call - now) if self._pacing.rpm else 0.0
        if self._pacing.tpm:
            per_s = self._pacing.tpm / 60.0
            self._tokens = min(per_s, self._tokens + (now - self._tokens_at) * per_s)
            self._tokens_at = now
            if self._tokens < 0:
                wait = max(wait, -self._tokens / per_s)
        return wait

    def cancel(self) -> None:
        """Give back a slot taken by :meth:`try_acquire` whose call was never sent."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._calls = max(0, self._calls - 1)

    def release(self, *, ok: bool, tokens: int = 0) -> None:
        """A call taken by :meth:`try_acquire` returned (``ok``: it was not refused)."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            if self._pacing.tpm and tokens > 0:
                self._tokens -= tokens
            if ok and self._limit < self._max:
                self._grown += 1
                if self._grown >= max(1, int(self._limit) // 2):
                    self._grown = 0
                    self._limit = min(float(self._max), self._limit + 1.0)

    def throttle(self, retry_after_s: float | None) -> float:
        """The provider refused a call: pause the endpoint, cut its limit; the seconds to wait.

        The pause is shared: a refusal that lands while one is in force waits for the later of
        the two ends, so every call in flight honours one ``Retry-After``.
        """
        with self._lock:
            now = self._clock()
            self._throttles += 1
            pause = DEFAULT_PAUSE_S if retry_after_s is None else retry_after_s
            pause = min(max(0.0, pause), MAX_PAUSE_S)
            until = now + pause
            if until > self._paused_until:
                self._waited_s += until - max(now, self._paused_until)
                self._paused_until = until
            if now - self._last_cut >= max(COOLDOWN_S, pause):
                self._last_cut = now
                self._limit = max(1.0, math.floor(min(self._limit, self._in_flight + 1) / 2))
                self._grown = 0
            return max(0.0, self._paused_until - now)

    def state(self) -> LimiterState:
        with self._lock:
            now = self._clock()
            return LimiterState(
                endpoint=self.endpoint,
                limit=int(self._limit),
                max_limit=self._max,
                in_flight=self._in_flight,
                calls=self._calls,
                throttles=self._throttles,
                waited_s=round(self._waited_s, 3),
                waiting_s=round(max(0.0, self._paused_until - now), 3),
                rpm=self._pacing.rpm,
                tpm=self._pacing.tpm,
            )


class Limiters:
    """The process's limiters by endpoint (one registry: :data:`LIMITERS`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_endpoint: dict[str, Limiter] = {}

    def get(self, endpoint: str, *, max_limit: int, pacing: Pacing | None = None) -> Limiter:
        """The endpoint's limiter, made on first use; a later caller may widen its ceiling."""
        with self._lock:
            limiter = self._by_endpoint.get(endpoint)
            if limiter is None:
                limiter = Limiter(endpoint, max_limit=max_limit, pacing=pacing)
                self._by_endpoint[endpoint] = limiter
                return limiter
        limiter.widen(max_limit, pacing)
        return limiter

    def states(self) -> list[LimiterState]:
        with self._lock:
            limiters = list(self._by_endpoint.values())
        return [limiter.state() for limiter in limiters]

    def clear(self) -> None:
        """Forget every endpoint (tests; a long-lived kernel that wants fresh limits)."""
        with self._lock:
            self._by_endpoint.clear()


LIMITERS = Limiters()
"""Every limiter of this process: runs, sweep cells and map units share them."""


LIMIT_COLUMNS = (
    "endpoint",
    "limit",
    "max_limit",
    "in_flight",
    "calls",
    "throttles",
    "waited_s",
    "waiting_s",
    "rpm",
    "tpm",
)


def limits_frame(states: list[LimiterState]) -> pd.DataFrame:
    """``engine.limits()``: one row per endpoint, in :data:`LIMIT_COLUMNS` order."""
    import pandas as pd

    rows = [{name: getattr(state, name) for name in LIMIT_COLUMNS} for state in states]
    frame = pd.DataFrame(rows, columns=list(LIMIT_COLUMNS))
    return frame.astype(
        {
            "limit": "int64",
            "max_limit": "int64",
            "in_flight": "int64",
            "calls": "int64",
            "throttles": "int64",
            "waited_s": "float64",
            "waiting_s": "float64",
            "rpm": "float64",
            "tpm": "float64",
        }
    )


def summary(states: list[LimiterState]) -> str:
    """One line for live views: ``in flight 24/32 · throttled 3 · waiting 0.8 s``."""
    if not states:
        return ""
    in_flight = sum(s.in_flight for s in states)
    limit = sum(s.limit for s in states)
    throttles = sum(s.throttles for s in states)
    waiting = max(s.waiting_s for s in states)
    return f"in flight {in_flight}/{limit} · throttled {throttles} · waiting {waiting:.1f} s"
