"""The Gemini CLI adapter: ``gemini -p -o json``; a preset session id; errors as JSON on stderr.

Its exit code is no guide (an HTTP 401 exits 145): the error object on stderr carries the
status in ``error.code``. Headless it needs an auth method in its settings and a trusted
folder, both given here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import usage
from .claude import _dict, _int, _str
from .harness import (
    AgentCall,
    Failure,
    Outcome,
    Watch,
    classify_status,
    classify_text,
    first_line,
    parse_lines,
)

_MODES = {"read": "default", "edits": "auto_edit", "full": "yolo"}
_SETTINGS = {
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "security": {"auth": {"selectedType": "gemini-api-key"}},
}


class GeminiHarness:
    """Gemini CLI (``@google/gemini-cli``)."""

    name = "gemini"
    default_bin = "gemini"
    presets_session = True
    resumes_anywhere = False
    prompt_on_stdin = True

    def argv(self, call: AgentCall) -> list[str]:
        # No ``-p``: with stdin not a terminal Gemini CLI runs headless on what stdin says.
        args = ["-o", "json", "--approval-mode", _MODES[call.permission]]
        if call.model:
            args += ["--model", call.model]
        if call.resume_id:
            args += ["--resume", call.resume_id]
        elif call.session_id:
            args += ["--session-id", call.session_id]
        return args

    def quiet_env(self, call: AgentCall) -> dict[str, str]:
        settings = Path(call.home) / ".gemini" / "settings.json"
        if not settings.exists():
            settings.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            settings.write_text(json.dumps(_SETTINGS, indent=2))
            os.chmod(settings, 0o600)
        return {"GEMINI_CLI_TRUST_WORKSPACE": "true"}

    def watch(self, event: Mapping[str, Any], seen: Watch) -> None:
        seen.session_id = seen.session_id or _str(event.get("session_id"))

    def outcome(
        self,
        events: Sequence[Mapping[str, Any]],
        stdout: str,
        stderr: str,
        code: int,
        call: AgentCall,
    ) -> Outcome:
        result = next((e for e in reversed(events) if "response" in e or "stats" in e), None)
        errors = [e for e in parse_lines(stderr) if isinstance(e.get("error"), dict)]
        out = Outcome()
        if result is not None:
            out.text = _str(result.get("response"))
            out.session_id = _str(result.get("session_id"))
            stats, warned = _dict(result.get("stats")), out.warnings
            for model in _dict(stats.get("models")).values():
                tokens = _dict(_dict(model).get("tokens"))
                out.tokens_in += usage.tokens(
                    tokens.get("prompt"), name="tokens.prompt", warnings=warned
                )
                out.tokens_out += sum(
                    usage.tokens(tokens.get(key), name=f"tokens.{key}", warnings=warned)
                    for key in ("candidates", "thoughts")
                )
            tools = _dict(stats.get("tools"))
            out.turns = _int(tools.get("totalCalls")) + 1 if tools else None
            out.final = dict(result)
        if errors:
            error = errors[-1]["error"]
            out.session_id = out.session_id or _str(errors[-1].get("session_id"))
            message = str(error.get("message") or "error")
            status = error.get("code")
            error_class = classify_status(
                status if isinstance(status, int) and status >= 100 else None
            )
            out.failure = Failure(
                error_class=error_class or classify_text(message), message=message
            )
            out.final = out.final or dict(errors[-1])
        elif code != 0:
            text = first_line(_plain(stderr)) or f"exited with status {code}"
            error_class = "max_turns" if code == 53 else classify_text(text)
            out.failure = Failure(error_class=error_class, message=text)
        return out


_NOTICES = ("Warning: 256-color support", "Ripgrep is not available")


def _plain(stderr: str) -> str:
    """stderr without the notices Gemini CLI always prints."""
    return "\n".join(line for line in stderr.splitlines() if not line.startswith(_NOTICES))
