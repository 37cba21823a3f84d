"""Loopback fake model backends for the real agent CLIs: Anthropic Messages, OpenAI
Responses and Chat Completions (opencode), streamed (SSE), and Gemini generateContent, on
127.0.0.1.

What they answer comes from the request: ``FIXED`` when the conversation carries a gate
feedback block, else ``TRIED``; a ``[[write NAME]]`` directive in the first user message
makes the first reply a tool call that writes ``NAME`` in the agent's folder. ``script``
queues HTTP errors (401, 529) and delays for the next requests.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.helpers_http import LoopbackHTTPServer

USAGE_IN, USAGE_OUT = 120, 8


@dataclass
class Step:
    """One scripted answer for the next request: an HTTP error, or a delay first."""

    status: int | None = None
    delay_s: float = 0.0


@dataclass
class Backend:
    """The recorded requests and the script of a fake backend."""

    script: deque[Step] = field(default_factory=deque)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: LoopbackHTTPServer | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set by :meth:`stop`: a delayed answer still waiting gives up (stop joins it)."""

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    def next_step(self) -> Step:
        with self.lock:
            return self.script.popleft() if self.script else Step()

    def stop(self) -> None:
        self.stopping.set()
        if self.server is not None:
            self.server.stop()


def _texts(value: Any) -> str:
    """All text inside a request body's messages/input (for directive and feedback search)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_texts(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(
            _texts(v) for k, v in value.items() if k in ("content", "text", "input", "output")
        )
    return ""


def _answer(conversation: str) -> str:
    return "FIXED" if "Gate feedback" in conversation else "TRIED"


def _sse(handler: BaseHTTPRequestHandler, events: list[tuple[str, dict[str, Any]]]) -> None:
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.send_header("cache-control", "no-cache")
    handler.end_headers()
    for name, data in events:
        handler.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        handler.wfile.flush()


def _error(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(raw)))
    handler.end_headers()
    handler.wfile.write(raw)


# -- Anthropic Messages ------------------------------------------------------------------


def _anthropic_events(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    messages = body.get("messages") or []
    conversation = _texts(messages)
    has_result = "tool_result" in json.dumps(messages)
    system = _texts(body.get("system") or "") + json.dumps(body.get("system") or "")
    cwd = re.search(r"[Ww]orking directory: ([^\s\\\"]+)", system)
    write = re.search(r"\[\[write (\S+)\]\]", conversation)
    model = body.get("model") or "claude-sonnet-4-5"
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": USAGE_IN, "output_tokens": 1},
        },
    }
    if write and cwd and not has_result:
        path = f"{cwd.group(1)}/{write.group(1)}"
        block = {"type": "tool_use", "id": "toolu_fake1", "name": "Write", "input": {}}
        delta = {
            "type": "input_json_delta",
            "partial_json": json.dumps({"file_path": path, "content": "written by the agent\n"}),
        }
        stop = "tool_use"
    else:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": _answer(conversation)}
        stop = "end_turn"
    return [
        ("message_start", start),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": USAGE_OUT},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


_ANTHROPIC_ERRORS = {
    401: {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
    },
    529: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
}

# -- OpenAI Responses --------------------------------------------------------------------


def _responses_events(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    items = body.get("input") or []
    conversation = _texts(items)
    has_output = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)
    write = re.search(r"\[\[write (\S+)\]\]", conversation)
    usage = {
        "input_tokens": USAGE_IN,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": USAGE_OUT,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": USAGE_IN + USAGE_OUT,
    }
    if write and not has_output:
        tool = next(
            (t for t in body.get("tools") or [] if t.get("name") in ("exec_command", "shell")), None
        )
        props = ((tool or {}).get("parameters") or {}).get("properties") or {}
        arg = "cmd" if "cmd" in props else "command"
        command = f"printf 'written by the agent\\n' > {write.group(1)}"
        value: Any = (
            command if (props.get(arg) or {}).get("type") == "string" else ["bash", "-lc", command]
        )
        item = {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "status": "completed",
            "name": (tool or {}).get("name", "exec_command"),
            "arguments": json.dumps({arg: value}),
        }
    else:
        text = _answer(conversation)
        item = {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    response = {
        "id": "resp_fake",
        "object": "response",
        "status": "completed",
        "model": body.get("model"),
        "output": [item],
        "usage": usage,
    }
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "response.created",
            {
                "type": "response.created",
                "response": {**response, "status": "in_progress", "output": []},
            },
        ),
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        ),
    ]
    if item["type"] == "message":
        events.append(
            (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": item["content"][0]["text"],
                },
            )
        )
    events += [
        (
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ),
        ("response.completed", {"type": "response.completed", "response": response}),
    ]
    return events


# -- OpenAI Chat Completions (opencode) -------------------------------------------------


def _chat_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages") or []
    conversation = _texts(messages)
    model = body.get("model") or "fake-model"
    head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}
    cwd = re.search(r"[Ww]orking directory: ([^\s\\\"]+)", json.dumps(messages))
    write = re.search(r"\[\[write (\S+)\]\]", conversation)
    has_result = any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
    if write and cwd and not has_result:  # opencode's ``write`` tool, by absolute path
        arguments = {
            "filePath": f"{cwd.group(1)}/{write.group(1)}",
            "content": "written by the agent\n",
        }
        call = {
            "index": 0,
            "id": "call_fake1",
            "type": "function",
            "function": {"name": "write", "arguments": json.dumps(arguments)},
        }
        delta: dict[str, Any] = {"role": "assistant", "tool_calls": [call]}
        finish = "tool_calls"
    else:
        delta, finish = {"role": "assistant", "content": _answer(conversation)}, "stop"
    return [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {
            **head,
            "choices": [],
            "usage": {
                "prompt_tokens": USAGE_IN,
                "completion_tokens": USAGE_OUT,
                "total_tokens": USAGE_IN + USAGE_OUT,
            },
        },
    ]


def _sse_data(handler: BaseHTTPRequestHandler, chunks: list[dict[str, Any]]) -> None:
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.end_headers()
    for chunk in chunks:
        handler.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
    handler.wfile.write(b"data: [DONE]\n\n")
    handler.wfile.flush()


# -- Gemini generateContent -------------------------------------------------------------


def _gemini_reply(body: dict[str, Any]) -> dict[str, Any]:
    conversation = _texts([p for c in body.get("contents") or [] for p in c.get("parts") or []])
    wants_json = "responseJsonSchema" in json.dumps(body.get("generationConfig") or {})
    text = (
        json.dumps({"reasoning": "simple", "model_choice": "flash"})
        if wants_json
        else _answer(conversation)
    )
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": text}]},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": USAGE_IN,
            "candidatesTokenCount": USAGE_OUT,
            "totalTokenCount": USAGE_IN + USAGE_OUT,
        },
    }


def start_backend() -> Backend:
    """A fake backend serving both APIs (``/v1/messages`` and ``/v1/responses``)."""
    backend = Backend()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            _error(self, 404, {"error": {"message": "not here"}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {}
            with backend.lock:
                backend.requests.append(
                    {
                        "path": self.path,
                        "body": body,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                    }
                )
            step = backend.next_step()
            if step.delay_s and backend.stopping.wait(step.delay_s):
                return  # the test is over: no answer (the client gave up long ago)
            anthropic = self.path.startswith("/v1/messages")
            if step.status is not None:
                body_err = _ANTHROPIC_ERRORS.get(step.status) if anthropic else None
                if "generateContent" in self.path:
                    body_err = {
                        "error": {
                            "code": step.status,
                            "message": f"fake backend: injected HTTP {step.status}",
                            "status": "UNAUTHENTICATED" if step.status == 401 else "UNAVAILABLE",
                        }
                    }
                _error(
                    self,
                    step.status,
                    body_err
                    or {"error": {"message": f"fake backend: injected HTTP {step.status}"}},
                )
                return
            if anthropic:
                _sse(self, _anthropic_events(body))
            elif self.path.startswith("/v1/responses"):
                _sse(self, _responses_events(body))
            elif self.path.startswith("/v1/chat/completions"):
                _sse_data(self, _chat_chunks(body))
            elif ":streamGenerateContent" in self.path:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                self.wfile.write(f"data: {json.dumps(_gemini_reply(body))}\r\n\r\n".encode())
                self.wfile.flush()
            elif ":generateContent" in self.path:
                raw_reply = json.dumps(_gemini_reply(body)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw_reply)))
                self.end_headers()
                self.wfile.write(raw_reply)
            else:
                _error(self, 404, {"error": {"message": f"no route {self.path}"}})
            self.close_connection = True

    backend.server = LoopbackHTTPServer(Handler, name="agent-backend")
    return backend


def opencode_config(*, base_url: str, api_key: str) -> dict[str, Any]:
    """An opencode config whose one provider (``fake``, OpenAI-compatible) is at ``base_url``,
    its model ``fake-model`` priced 3 / 15 dollars per million tokens in and out."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": "fake/fake-model",
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake loopback",
                "options": {"baseURL": base_url, "apiKey": api_key},
                "models": {
                    "fake-model": {
                        "name": "Fake model",
                        "cost": {"input": 3, "output": 15},
                        "limit": {"context": 100000, "output": 4096},
                    }
                },
            }
        },
    }
