"""The Codex CLI adapter: ``codex exec --json``; thread id from the first line, cumulative usage.

Codex takes no preset session id: its ``thread.started`` line names the thread, and the
runner journals it at once. On a resumed thread ``turn.completed.usage`` counts the whole
thread, so the runner journals the difference to the previous attempt's totals. ``error``
lines are not fatal (``Reconnecting... n/5``); ``turn.failed`` is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import usage
from .claude import _dict, _str
from .harness import AgentCall, Failure, Outcome, Watch, classify_text, first_line

_SANDBOX = {"read": "read-only", "edits": "workspace-write"}
_QUIET_CONFIG = """\
check_for_update_on_startup = false
[analytics]
enabled = false
[feedback]
enabled = false
[otel]
exporter = "none"
"""


class CodexHarness:
    """OpenAI Codex CLI (``@openai/codex``)."""

    name = "codex"
    default_bin = "codex"
    presets_session = False
    resumes_anywhere = True
    prompt_on_stdin = True

    def argv(self, call: AgentCall) -> list[str]:
        # ``exec resume`` takes no --sandbox: the mode goes in as a config override there.
        resuming = call.resume_id is not None
        args = ["exec", "resume"] if resuming else ["exec"]
        args += ["--json", "--skip-git-repo-check"]
        if call.permission == "full":
            args.append("--dangerously-bypass-approvals-and-sandbox")
        elif resuming:
            args += ["-c", f'sandbox_mode="{_SANDBOX[call.permission]}"']
        else:
            args += ["--sandbox", _SANDBOX[call.permission]]
        if call.model:
            args += ["--model", call.model]
        if call.output_schema is not None:
            schema = Path(call.scratch) / "output_schema.json"
            schema.write_text(json.dumps(call.output_schema, sort_keys=True))
            args += ["--output-schema", str(schema)]
        if resuming:
            args.append(str(call.resume_id))
        return [*args, "-"]  # the prompt: read from stdin

    def quiet_env(self, call: AgentCall) -> dict[str, str]:
        codex_home = Path(call.home) / ".codex"
        config = codex_home / "config.toml"
        if not config.exists():
            codex_home.mkdir(mode=0o700, parents=True, exist_ok=True)
            config.write_text(_QUIET_CONFIG)
            os.chmod(config, 0o600)
        return {"CODEX_HOME": str(codex_home)}

    def watch(self, event: Mapping[str, Any], seen: Watch) -> None:
        kind = event.get("type")
        if kind == "thread.started":
            seen.session_id = seen.session_id or _str(event.get("thread_id"))
        elif kind == "turn.started":
            seen.turns += 1
        elif kind == "item.started":
            item = _dict(event.get("item"))
            if item.get("type") in ("command_execution", "file_change", "mcp_tool_call"):
                seen.tools += 1
                seen.last = str(item.get("command") or item.get("type"))[:80]
        elif kind == "item.completed":
            item = _dict(event.get("item"))
            if item.get("type") == "agent_message":
                seen.last = first_line(str(item.get("text") or ""), 80)

    def outcome(
        self,
        events: Sequence[Mapping[str, Any]],
        stdout: str,
        stderr: str,
        code: int,
        call: AgentCall,
    ) -> Outcome:
        out = Outcome(usage_cumulative=True)
        turns = 0
        for event in events:
            kind = event.get("type")
            item = _dict(event.get("item"))
            if kind == "thread.started":
                out.session_id = _str(event.get("thread_id"))
            elif kind == "item.completed" and item.get("type") == "agent_message":
                out.text = str(item.get("text") or "")
            elif kind == "turn.completed":
                turns += 1
                used, warned = _dict(event.get("usage")), out.warnings
                out.tokens_in = usage.tokens(
                    used.get("input_tokens"), name="usage.input_tokens", warnings=warned
                )
                out.tokens_out = sum(
                    usage.tokens(used.get(key), name=f"usage.{key}", warnings=warned)
                    for key in ("output_tokens", "reasoning_output_tokens")
                )
            elif kind == "turn.failed":
                message = str(_dict(event.get("error")).get("message") or "turn failed")
                out.failure = Failure(error_class=classify_text(message), message=message)
        out.turns = turns or None
        out.final = dict(events[-1]) if events else None
        if out.failure is None and code != 0:
            text = first_line(_plain(stderr)) or f"exited with status {code}"
            out.failure = Failure(error_class=classify_text(text), message=text)
        return out


def _plain(stderr: str) -> str:
    """stderr without Codex's always-there notice about reading stdin."""
    return "\n".join(
        line for line in stderr.splitlines() if "Reading additional input from stdin" not in line
    )
