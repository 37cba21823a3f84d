"""A fake Claude Code that calls its model: ``claude -p --output-format stream-json`` in shape,
each turn a streamed Anthropic Messages call to ``$ANTHROPIC_BASE_URL/v1/messages``.

It runs the agent loop as the real one does: the model's ``Write`` tool call writes the file
and the result goes back in the next call; an ``end_turn`` answer ends it with a ``result``
line. The request carries the system line ``Working directory: <cwd>`` the loopback fake
backend (tests/agent_backends.py) reads, the tools ``Write`` and ``Bash`` (a ``[[tools
A,B]]`` directive in the prompt offers those instead) and, as a canary for redaction, the
API key in ``metadata.user_id``. An HTTP error ends it with Claude's error result line.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any


def _opt(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _call(body: dict[str, Any]) -> tuple[int, list[dict[str, Any]], str]:
    """POST one streamed Messages call; its status, SSE events and raw error text."""
    base = os.environ.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com").rstrip("/")
    request = urllib.request.Request(
        base + "/v1/messages?beta=true",
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "x-api-key": os.environ.get("ANTHROPIC_API_KEY", ""),
            "anthropic-version": "2023-06-01",
        },
        method="POST",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=60) as response:
            raw = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        return exc.code, [], exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, [], f"Connection error ({exc})"
    events = [
        json.loads(line[5:])
        for line in raw.splitlines()
        if line.startswith("data:") and line[5:].strip()
    ]
    return status, events, ""


def main() -> int:
    args = sys.argv[1:]
    if args == ["--version"]:
        print("2.1.197 (Claude Code) [api fake]")
        return 0
    prompt = sys.stdin.read()
    session = _opt(args, "--resume") or _opt(args, "--session-id") or str(uuid.uuid4())
    model = _opt(args, "--model") or "claude-sonnet-4-5"
    _emit({"type": "system", "subtype": "init", "session_id": session, "model": model})
    chosen = re.search(r"\[\[tools ([^\]]*)\]\]", prompt)
    names = chosen.group(1).split(",") if chosen else ["Write", "Bash"]
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in names if n]
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    used = {"input_tokens": 0, "output_tokens": 0}
    for turn in range(1, 11):
        body = {
            "model": model,
            "max_tokens": 1024,
            "stream": True,
            "system": f"Working directory: {os.getcwd()}",
            "tools": tools,
            "messages": messages,
            "metadata": {"user_id": os.environ.get("ANTHROPIC_API_KEY", "")},
        }
        status, events, error = _call(body)
        if status != 200:
            _emit(
                {
                    "type": "result",
                    "subtype": "success",
                    "is_error": True,
                    "result": f"API Error: {status} {error[:200]}",
                    "api_error_status": status or None,
                    "session_id": session,
                    "num_turns": turn,
                }
            )
            return 1
        blocks: list[dict[str, Any]] = []
        stop = None
        for event in events:
            kind = event.get("type")
            if kind == "message_start":
                used["input_tokens"] += event["message"]["usage"].get("input_tokens", 0)
            elif kind == "content_block_start":
                blocks.append(dict(event["content_block"], partial=""))
            elif kind == "content_block_delta":
                delta = event["delta"]
                if delta.get("type") == "text_delta":
                    blocks[-1]["text"] = blocks[-1].get("text", "") + delta["text"]
                else:
                    blocks[-1]["partial"] += delta.get("partial_json", "")
            elif kind == "message_delta":
                stop = event["delta"].get("stop_reason")
                used["output_tokens"] += event["usage"].get("output_tokens", 0)
        tool = next((b for b in blocks if b.get("type") == "tool_use"), None)
        if stop == "tool_use" and tool is not None:
            given = json.loads(tool["partial"] or "{}")
            Path(given["file_path"]).write_text(given["content"])
            _emit(
                {
                    "type": "assistant",
                    "message": {"content": [{"type": "tool_use", "name": tool["name"]}]},
                }
            )
            use = {"type": "tool_use", "id": tool["id"], "name": tool["name"], "input": given}
            messages += [
                {"role": "assistant", "content": [use]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": tool["id"], "content": "ok"}
                    ],
                },
            ]
            continue
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        _emit({"type": "assistant", "message": {"content": [{"type": "text", "text": text}]}})
        _emit(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": text,
                "session_id": session,
                "num_turns": turn,
                "usage": used,
                "permission_denials": [],
            }
        )
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
