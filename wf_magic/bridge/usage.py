"""What one relayed model call used: its model and tokens, read from the wire as it streams by.

Four wire dialects are read, told apart by the request path: Anthropic Messages
(``/messages``), OpenAI Responses (``/responses``), Chat Completions (``/chat/completions``)
and Gemini (``:generateContent`` / ``:streamGenerateContent``). A streamed answer's
``data:`` lines and a plain JSON body go through the same :meth:`CallUsage.fold`; the latest
value of a count wins (Anthropic's ``message_delta`` repeats the output count so far).
``tokens_in`` counts every input token, the cache reads and writes included.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

Dialect = Literal["anthropic", "responses", "chat", "gemini", "other"]
PROVIDERS: dict[str, str] = {
    "anthropic": "anthropic",
    "responses": "openai",
    "chat": "openai",
    "gemini": "google",
}
"""The genai-prices provider id of each dialect."""
MAX_LINE_BYTES = 1_048_576
"""The longest SSE line read for usage (longer: relayed, not parsed)."""


def dialect_of(path: str) -> Dialect:
    """The wire dialect of a request to ``path`` (its query string ignored)."""
    path = path.split("?", 1)[0]
    if path.endswith("/messages"):
        return "anthropic"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith(":generateContent") or path.endswith(":streamGenerateContent"):
        return "gemini"
    return "other"


def _count(value: Any) -> int | None:
    """A token count as the wire gave it; None for anything that is not a finite count ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


@dataclass(slots=True)
class CallUsage:
    """The usage of one call, folded from its JSON objects as they pass."""

    dialect: Dialect
    model: str | None = None
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    seen: bool = False
    """Whether any usage was read (a call without usage is journaled with zero tokens)."""
    _pending: bytes = b""

    @property
    def tokens_in(self) -> int:
        """Every input token (Anthropic reports the cached ones beside ``input_tokens``)."""
        if self.dialect == "anthropic":
            return self.input + self.cache_read + self.cache_write
        return self.input

    def feed(self, chunk: bytes) -> None:
        """Read the complete ``data:`` lines of a streamed answer's next ``chunk``."""
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_LINE_BYTES:
            self._pending = b""  # a line past the bound is relayed, never parsed
        for line in lines:
            if line.startswith(b"data:"):
                self._parse(line[5:])

    def finish(self, body: bytes | None = None) -> None:
        """Read the last unterminated line, or a whole non-streamed JSON ``body``."""
        if body is not None:
            self._parse(body)
            return
        if self._pending.startswith(b"data:"):
            self._parse(self._pending[5:])
        self._pending = b""

    def _parse(self, raw: bytes) -> None:
        raw = raw.strip()
        if not raw.startswith(b"{") or len(raw) > MAX_LINE_BYTES:
            return
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            return
        if isinstance(value, dict):
            self.fold(value)

    def fold(self, obj: dict[str, Any]) -> None:
        """Fold one JSON object of the answer into the counts."""
        kind = obj.get("type")
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            obj = obj["message"]
        elif isinstance(kind, str) and kind.startswith("response.") and "response" in obj:
            inner = obj.get("response")
            obj = inner if isinstance(inner, dict) else {}
        model = obj.get("model") or obj.get("modelVersion")
        if isinstance(model, str) and model:
            self.model = model[:200]
        used = obj.get("usage") if "usage" in obj else obj.get("usageMetadata")
        if isinstance(used, dict):
            self._counts(used)

    def _counts(self, used: dict[str, Any]) -> None:
        def detail(key: str, sub: str) -> Any:
            inner = used.get(key)
            return inner.get(sub) if isinstance(inner, dict) else None

        if self.dialect == "gemini":
            outs = [
                _count(used.get("candidatesTokenCount")),
                _count(used.get("thoughtsTokenCount")),
            ]
            pairs: dict[str, Any] = {
                "input": used.get("promptTokenCount"),
                "cache_read": used.get("cachedContentTokenCount"),
                "output": sum(o for o in outs if o) if any(o is not None for o in outs) else None,
            }
        elif self.dialect == "chat":
            pairs = {
                "input": used.get("prompt_tokens"),
                "output": used.get("completion_tokens"),
                "cache_read": detail("prompt_tokens_details", "cached_tokens"),
            }
        else:
            pairs = {
                "input": used.get("input_tokens"),
                "output": used.get("output_tokens"),
                "cache_read": used.get("cache_read_input_tokens")
                if self.dialect == "anthropic"
                else detail("input_tokens_details", "cached_tokens"),
                "cache_write": used.get("cache_creation_input_tokens"),
            }
        for name, raw in pairs.items():
            value = _count(raw)
            if value is not None:
                setattr(self, name, value)
                self.seen = True
