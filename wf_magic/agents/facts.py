"""The facts journaled beside an agent attempt (harness, version, session, turns, denials,
worktree, changed files, the CLI's final JSON capped and redacted), and the unit's output."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ..redact import Redactor
from .harness import AgentCall, Outcome, Watch

FINAL_JSON_CAP = 16_384
"""Characters of the CLI's final JSON kept in the journal (longer: clipped, marked)."""


def attempt_facts(
    *,
    harness: str,
    version: str | None,
    call: AgentCall,
    outcome: Outcome,
    watch: Watch,
    exit_code: int | None,
    error_class: str | None,
    worktree: Mapping[str, Any] | None,
    reclaimed: bool,
    redactor: Redactor,
) -> dict[str, Any]:
    """One attempt's facts as a JSON-ready dict (secret values masked)."""
    final = None
    if outcome.final is not None:
        text = json.dumps(outcome.final, sort_keys=True, default=str)
        if len(text) > FINAL_JSON_CAP:
            text = text[:FINAL_JSON_CAP] + f"… [clipped at {FINAL_JSON_CAP} of {len(text)} chars]"
        final = redactor.redact(text)
    facts: dict[str, Any] = {
        "harness": harness,
        "version": version,
        "session_id": outcome.session_id or watch.session_id or call.session_id or call.resume_id,
        "resumed_session": call.resume_id,
        "reclaimed": reclaimed,
        "exit_code": exit_code,
        "error_class": error_class,
        "turns": outcome.turns if outcome.turns is not None else (watch.turns or None),
        "tool_uses": watch.tools,
        "permission": call.permission,
        "permission_denials": [_denial(d) for d in outcome.denials],
        "cost_source": outcome.cost_source,
        "workdir": call.cwd,
        "worktree": dict(worktree) if worktree else None,
        "final_json": final,
    }
    redacted: dict[str, Any] = redactor.redact_value(facts)
    return redacted


def _denial(denial: Any) -> Any:
    """A permission denial without the tool's full input (a file's whole content)."""
    if not isinstance(denial, Mapping):
        return str(denial)[:200]
    tool_input = denial.get("tool_input")
    tool_input = tool_input if isinstance(tool_input, Mapping) else {}
    target = tool_input.get("file_path") or tool_input.get("command") or tool_input.get("path")
    return {"tool_name": denial.get("tool_name"), "target": str(target)[:300] if target else None}


def unit_output(
    outcome: Outcome, schema: Mapping[str, Any] | None, unfence: Callable[[str], str]
) -> Any:
    """The unit's output: the native structured output, else JSON parsed from the final text
    when ``output:`` is set (the raw text when it does not parse: the schema check reports it),
    else the final text."""
    if schema is None:
        return outcome.text or ""
    if outcome.structured is not None:
        return outcome.structured
    text = unfence(outcome.text or "")
    try:
        return json.loads(text)
    except ValueError:
        return outcome.text or ""
