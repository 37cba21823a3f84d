"""An agent attempt's model calls, as the bridge journaled them, as child ``chat`` spans."""

from __future__ import annotations

import math
import re

from ..redact import Redactor
from ..store.calls import CallRow
from ..store.records import AttemptRow
from .records import AttrValue, SpanRecord, attempt_span_id, call_span_id

WIRE_PROVIDERS = {"claude": "anthropic", "codex": "openai", "gemini": "gcp.gemini"}
"""A bridged harness → ``gen_ai.provider.name`` of the wire API its calls speak (the
Anthropic Messages, OpenAI Responses and Gemini APIs: bridge/wiring.py)."""
_HTTP = re.compile(r"^HTTP (\d{3})\b")
_OWN = re.compile(
    r"(upstream unreachable|upstream stream cut) \(([A-Z][A-Za-z0-9_]*)\)"
    r"|answer over the output bound of [\d,]+ bytes; cut"
)
"""The bridge's own error lines (bridge/server.py), which quote nothing of an answer."""


def call_span(
    call: CallRow, attempt: AttemptRow, *, trace_id: int, provider: str, redactor: Redactor
) -> SpanRecord:
    """The ``chat`` span of one journaled call, under its attempt's ``invoke_agent`` span.

    Its times are the call's own (``started_at``, plus ``latency_s``). Only counts, the model
    and a failure's kind are sent: never a header, a request or an answer body (a failed
    call's journaled error quotes the answer's first line; its span says ``HTTP 529``).
    """
    model = call.model or attempt.model or attempt.runner
    attrs: dict[str, AttrValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        # tokens_in counts every input token, cache reads and writes included (bridge/usage.py)
        "gen_ai.usage.input_tokens": call.tokens_in,
        "gen_ai.usage.output_tokens": call.tokens_out,
        "wf_magic.run.id": call.run_id,
        "wf_magic.step.id": call.step_id,
        "wf_magic.unit.id": call.unit_id,
        "wf_magic.dispatch.id": call.dispatch_id,
        "wf_magic.attempt": call.attempt,
        "wf_magic.call": call.call,
        "wf_magic.call.status": call.status,
    }
    if call.model and call.status == "ok":  # the bridge keeps the model the answer named
        attrs["gen_ai.response.model"] = call.model
    # A wire that reports no cache is journaled as 0: only a count seen is sent.
    if call.cache_read:
        attrs["gen_ai.usage.cache_read.input_tokens"] = call.cache_read
    if call.cache_write:
        attrs["gen_ai.usage.cache_creation.input_tokens"] = call.cache_write
    if call.cost is not None:
        attrs["wf_magic.cost.usd"] = call.cost
    error = None
    if call.status != "ok":
        kind, error = call_error(call, redactor)
        attrs["error.type"] = kind
    start = call.started_at
    took = call.latency_s if math.isfinite(call.latency_s) and call.latency_s > 0 else 0.0
    return SpanRecord(
        name=f"chat {model}",
        trace_id=trace_id,
        span_id=call_span_id(call.dispatch_id, call.call),
        parent_id=attempt_span_id(call.dispatch_id),
        kind="client",
        start_s=start,
        end_s=start + took,
        attributes=attrs,
        error=error,
    )


def call_error(call: CallRow, redactor: Redactor) -> tuple[str, str]:
    """A failed call's ``error.type`` and the span's status text, never the answer's body.

    ``budget_exceeded`` for a call the bridge refused (its text: wf_magic's budget line); the
    HTTP status code for an answer that was an error (text ``HTTP <code>``, the quoted body
    left out); the exception class of an upstream that was unreachable or cut off (the
    bridge's own line). Anything else is ``_OTHER`` with the text ``error``.
    """
    text = call.error or ""
    if call.status == "refused":
        return "budget_exceeded", redactor.redact(text or "refused by the bridge")
    found = _HTTP.match(text)
    if found:
        return found.group(1), f"HTTP {found.group(1)}"
    found = _OWN.fullmatch(text)
    if found:
        return found.group(2) or "_OTHER", text
    return "_OTHER", "error"
