"""Streamed text for a watched unit: the text so far, throttled, to ``UnitRequest.on_text``."""

from __future__ import annotations

import time
from collections.abc import Callable

TEXT_EVERY_S = 0.1
"""The streamed text reaches ``UnitRequest.on_text`` at most this often (plus a final call)."""


class TextSink:
    """Hands the streamed text so far to a callback, at most every :data:`TEXT_EVERY_S`
    seconds, and once more with the whole text; a failing callback never fails the unit."""

    def __init__(self, callback: Callable[[str], None]) -> None:
        self.callback = callback
        self.calls = 0
        self._last_at = float("-inf")
        self._sent: str | None = None

    @property
    def is_due(self) -> bool:
        """Whether a text offered now would be passed on (joining it can wait otherwise)."""
        return time.monotonic() - self._last_at >= TEXT_EVERY_S

    def offer(self, text: str, *, final: bool = False) -> None:
        if text == self._sent or not (final or self.is_due):
            return
        self._last_at, self._sent = time.monotonic(), text
        self.calls += 1
        try:
            self.callback(text)
        except Exception:  # noqa: S110 - a view's bug must not fail the model call
            pass
