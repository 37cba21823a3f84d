"""The Claude Code adapter: ``claude -p`` with streamed JSON, a preset session id, traps named.

Traps it turns into failures: exit 0 with ``permission_denials`` when edits were asked for
(``permission_denied``), and ``subtype: error_max_turns`` (``max_turns``). An API error is an
``is_error`` result whose ``api_error_status`` says transient or permanent; its ``subtype``
still reads ``success``. Its ``total_cost_usd`` is the CLI's own estimate from its price
table, labelled so in the journal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import usage
from .harness import AgentCall, Failure, Outcome, Watch, classify_status, classify_text, first_line

_MODES = {"read": "default", "edits": "acceptEdits", "full": "bypassPermissions"}
COST_SOURCE = "estimate: Claude Code's own price table"


class ClaudeHarness:
    """Claude Code (``@anthropic-ai/claude-code``)."""

    name = "claude"
    default_bin = "claude"
    presets_session = True
    resumes_anywhere = False
    prompt_on_stdin = True

    def argv(self, call: AgentCall) -> list[str]:
        # ``-p`` without a prompt reads it from stdin: never an option, never in argv.
        args = ["-p", "--output-format", "stream-json", "--verbose"]
        args += ["--permission-mode", _MODES[call.permission]]
        if call.model:
            args += ["--model", call.model]
        if call.max_turns is not None:
            args += ["--max-turns", str(call.max_turns)]
        if call.resume_id:
            args += ["--resume", call.resume_id]
        elif call.session_id:
            args += ["--session-id", call.session_id]
        if call.output_schema is not None:
            args += ["--json-schema", json.dumps(call.output_schema, sort_keys=True)]
        if call.max_cost is not None:
            args += ["--max-budget-usd", f"{max(call.max_cost, 0.0):.6f}"]
        return args

    def quiet_env(self, call: AgentCall) -> dict[str, str]:
        return {
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",  # wf_magic's `retry:` does the retrying
        }

    def watch(self, event: Mapping[str, Any], seen: Watch) -> None:
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "init":
            seen.session_id = seen.session_id or _str(event.get("session_id"))
        elif kind == "assistant":
            seen.turns += 1
            for block in _list(_dict(event.get("message")).get("content")):
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    seen.tools += 1
                    seen.last = f"{block.get('name')}"
                elif isinstance(block, dict) and block.get("type") == "text":
                    seen.last = first_line(str(block.get("text") or ""), 80)

    def outcome(
        self,
        events: Sequence[Mapping[str, Any]],
        stdout: str,
        stderr: str,
        code: int,
        call: AgentCall,
    ) -> Outcome:
        result = next((e for e in reversed(events) if e.get("type") == "result"), None)
        if result is None:
            text = first_line(stderr) or first_line(stdout) or f"exited with status {code}"
            return Outcome(failure=Failure(error_class=classify_text(text), message=text))
        used = _dict(result.get("usage"))
        warned: list[str] = []
        tokens_in = sum(
            usage.tokens(used.get(key), name=f"usage.{key}", warnings=warned)
            for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        cost = usage.cost(result.get("total_cost_usd"), name="total_cost_usd", warnings=warned)
        denials = result.get("permission_denials")
        out = Outcome(
            text=_str(result.get("result")),
            structured=result.get("structured_output"),
            session_id=_str(result.get("session_id")),
            tokens_in=tokens_in,
            tokens_out=usage.tokens(
                used.get("output_tokens"), name="usage.output_tokens", warnings=warned
            ),
            cost=cost,
            cost_source=COST_SOURCE if cost is not None else None,
            turns=_int(result.get("num_turns")) or None,
            denials=list(denials) if isinstance(denials, list) else [],
            final=dict(result),
            warnings=warned,
        )
        out.failure = _failure(result, out, call)
        return out


def _failure(result: Mapping[str, Any], out: Outcome, call: AgentCall) -> Failure | None:
    subtype = str(result.get("subtype") or "")
    if subtype == "error_max_turns":
        errors = "; ".join(map(str, _list(result.get("errors")))) or "reached the maximum turns"
        return Failure(error_class="max_turns", message=errors)
    if result.get("is_error") or subtype.startswith("error"):
        message = out.text or "; ".join(map(str, _list(result.get("errors")))) or subtype
        status = result.get("api_error_status")
        error_class = classify_status(status if isinstance(status, int) else None)
        return Failure(error_class=error_class or classify_text(message), message=message)
    if out.denials and call.permission != "read":
        tools = sorted({str(d.get("tool_name")) for d in out.denials if isinstance(d, dict)})
        return Failure(
            error_class="permission_denied",
            message=f"exited 0 but denied {len(out.denials)} tool call(s) ({', '.join(tools)}) "
            f"although permission: {call.permission} was asked for",
        )
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int:
    return usage.count(value)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> Mapping[str, Any]:
    """``value`` when the CLI printed an object there, else an empty one."""
    return value if isinstance(value, Mapping) else {}
