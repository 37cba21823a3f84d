"""The opencode adapter: ``opencode run --format json``; the session id on every event.

opencode takes no preset id; ``sessionID`` is on its first line. Tokens and cost are summed
over its ``step_finish`` events (the cost is from the provider model's configured price).
An error is an ``error`` event whose ``statusCode``/``isRetryable`` classify it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import usage
from .claude import _dict, _str
from .harness import AgentCall, Failure, Outcome, Watch, classify_status, classify_text, first_line

_PERMISSIONS = {
    "read": {"edit": "deny", "bash": "deny", "webfetch": "deny"},
    "edits": {"edit": "allow", "bash": "deny"},
    "full": {"edit": "allow", "bash": "allow", "webfetch": "allow"},
}


class OpencodeHarness:
    """opencode (``opencode-ai``)."""

    name = "opencode"
    default_bin = "opencode"
    presets_session = False
    resumes_anywhere = False
    prompt_on_stdin = True

    def argv(self, call: AgentCall) -> list[str]:
        # No message argument: ``opencode run`` reads the message from stdin.
        args = ["run", "--format", "json", "--title", "wf_magic agent"]
        if call.model:
            args += ["--model", call.model]
        if call.resume_id:
            args += ["--session", call.resume_id]
        return args

    def quiet_env(self, call: AgentCall) -> dict[str, str]:
        return {
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_PERMISSION": json.dumps(_PERMISSIONS[call.permission]),
        }

    def watch(self, event: Mapping[str, Any], seen: Watch) -> None:
        seen.session_id = seen.session_id or _str(event.get("sessionID"))
        part = _dict(event.get("part"))
        if event.get("type") == "step_start":
            seen.turns += 1
        elif event.get("type") == "tool_use":
            seen.tools += 1
            seen.last = str(part.get("tool") or "tool")
        elif event.get("type") == "text":
            seen.last = first_line(str(part.get("text") or ""), 80)

    def outcome(
        self,
        events: Sequence[Mapping[str, Any]],
        stdout: str,
        stderr: str,
        code: int,
        call: AgentCall,
    ) -> Outcome:
        out = Outcome()
        texts: list[str] = []
        cost = 0.0
        has_cost = refused = False
        for event in events:
            out.session_id = out.session_id or _str(event.get("sessionID"))
            part = _dict(event.get("part"))
            kind = event.get("type")
            if kind == "step_start":
                texts = []
                out.turns = (out.turns or 0) + 1
            elif kind == "text":
                texts.append(str(part.get("text") or ""))
            elif kind == "step_finish":
                tokens, warned = _dict(part.get("tokens")), out.warnings
                cache = _dict(tokens.get("cache"))
                out.tokens_in += usage.tokens(
                    tokens.get("input"), name="tokens.input", warnings=warned
                ) + usage.tokens(cache.get("read"), name="tokens.cache.read", warnings=warned)
                out.tokens_out += sum(
                    usage.tokens(tokens.get(key), name=f"tokens.{key}", warnings=warned)
                    for key in ("output", "reasoning")
                )
                raw_cost = part.get("cost")
                step_cost = usage.cost(raw_cost, name="part.cost", warnings=warned)
                if step_cost is not None:
                    cost, has_cost = cost + step_cost, True
                elif raw_cost is not None:
                    refused = True  # one bad step makes the attempt's sum unknown
            elif kind == "error":
                out.failure = _failure(_dict(event.get("error")))
        out.text = "".join(texts) if texts else None
        has_cost = has_cost and not refused
        out.cost = cost if has_cost else None
        out.cost_source = "opencode: the provider model's configured price" if has_cost else None
        out.final = dict(events[-1]) if events else None
        if out.failure is None and code != 0:
            text = first_line(stderr) or f"exited with status {code}"
            out.failure = Failure(error_class=classify_text(text), message=text)
        return out


def _failure(error: Mapping[str, Any]) -> Failure:
    data = _dict(error.get("data"))
    message = str(data.get("message") or error.get("name") or "error")
    status = data.get("statusCode")
    error_class = classify_status(status if isinstance(status, int) else None)
    if error_class is None:
        error_class = classify_text(message)
        if data.get("isRetryable") is True and error_class == "failed":
            error_class = "server_error"
    return Failure(error_class=error_class, message=message)
