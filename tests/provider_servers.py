"""Loopback fakes of two providers' own wire APIs, for the pydantic-ai runner's tests.

- :class:`FakeAnthropic`: the Messages API (``POST /v1/messages``), JSON or SSE when the
  request says ``"stream": true``, errors as Anthropic sends them.
- :class:`FakeGemini`: ``POST /v1beta/models/MODEL:generateContent`` and
  ``:streamGenerateContent?alt=sse``, errors as Google sends them.

Each answers in order from what a test pushed (a :class:`Reply` or an error), then echoes the
prompt. Requests are recorded (path, lower-cased headers, decoded body).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.helpers_http import LoopbackHTTPServer


@dataclass(frozen=True)
class Recorded:
    """One request the fake received."""

    path: str
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class Reply:
    """A successful answer: text, or a tool call's input (``tool``), and its usage."""

    text: str = ""
    tokens_in: int = 10
    tokens_out: int = 5
    cache_read: int = 0
    cache_write: int = 0
    tool: dict[str, Any] | None = None
    """Answer with a tool call of the request's first tool, with this input."""
    stop: str | None = None
    """Anthropic's ``stop_reason`` (default: ``end_turn``, or ``tool_use`` for a tool call)."""


@dataclass(frozen=True)
class Failure:
    """An error answer."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class _FakeProvider:
    """The scripted queue, the recording and the server thread both fakes share."""

    name = "fake-provider"

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.chunk_delay_s = 0.0
        """Pause before each streamed frame (text arriving over time)."""
        self._script: deque[Reply | Failure] = deque()
        self._lock = threading.Lock()
        self._httpd: LoopbackHTTPServer | None = None

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError(f"{self.name} is not started")
        return f"http://127.0.0.1:{self._httpd.port}"

    def push(self, answer: Reply | Failure) -> None:
        with self._lock:
            self._script.append(answer)

    def __enter__(self) -> _FakeProvider:
        self._httpd = LoopbackHTTPServer(_handler_for(self), name=self.name)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._httpd is not None:
            self._httpd.stop()

    def next_answer(self, request: Recorded) -> Reply | Failure:
        with self._lock:
            self.requests.append(request)
            if self._script:
                return self._script.popleft()
        return Reply(text=f"echo: {self.prompt_of(request.body)}")

    # provider specifics ----------------------------------------------------------------------
    def prompt_of(self, body: Any) -> str:
        raise NotImplementedError

    def is_stream(self, path: str, body: Any) -> bool:
        raise NotImplementedError

    def body_of(self, reply: Reply, request: Recorded) -> dict[str, Any]:
        raise NotImplementedError

    def events_of(self, reply: Reply, request: Recorded) -> list[str]:
        """The SSE frames (``event: …\\ndata: …``) of a streamed reply."""
        raise NotImplementedError


def _handler_for(fake: _FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw
            headers = {k.lower(): v for k, v in self.headers.items()}
            request = Recorded(self.path, headers, body)
            answer = fake.next_answer(request)
            if isinstance(answer, Failure):
                self._send(answer.status, answer.body, answer.headers)
            elif fake.is_stream(self.path, body):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
                for frame in fake.events_of(answer, request):
                    time.sleep(fake.chunk_delay_s)
                    self.wfile.write(f"{frame}\n\n".encode())
                    self.wfile.flush()
            else:
                self._send(200, fake.body_of(answer, request), {})

        def _send(self, status: int, body: Any, headers: dict[str, str]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return None

    return Handler


def _words(text: str) -> list[str]:
    return re.findall(r"\s*\S+\s*", text) or [text]


class FakeAnthropic(_FakeProvider):
    """Anthropic's Messages API."""

    name = "fake-anthropic"

    def prompt_of(self, body: Any) -> str:
        content = body["messages"][-1]["content"]
        if isinstance(content, list):
            return "".join(part.get("text", "") for part in content)
        return str(content)

    def is_stream(self, path: str, body: Any) -> bool:
        return isinstance(body, dict) and body.get("stream") is True

    def _usage(self, reply: Reply) -> dict[str, int]:
        # Anthropic's input_tokens excludes the cache reads and writes it reports beside it.
        return {
            "input_tokens": reply.tokens_in - reply.cache_read - reply.cache_write,
            "output_tokens": reply.tokens_out,
            "cache_read_input_tokens": reply.cache_read,
            "cache_creation_input_tokens": reply.cache_write,
        }

    def _content(self, reply: Reply, request: Recorded) -> list[dict[str, Any]]:
        if reply.tool is not None:
            tool = request.body["tools"][0]["name"]
            return [{"type": "tool_use", "id": "toolu_1", "name": tool, "input": reply.tool}]
        return [{"type": "text", "text": reply.text}]

    def body_of(self, reply: Reply, request: Recorded) -> dict[str, Any]:
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": request.body.get("model", "claude"),
            "content": self._content(reply, request),
            "stop_reason": reply.stop or ("tool_use" if reply.tool is not None else "end_turn"),
            "stop_sequence": None,
            "usage": self._usage(reply),
        }

    def events_of(self, reply: Reply, request: Recorded) -> list[str]:
        def event(kind: str, data: dict[str, Any]) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}"

        start_usage = {**self._usage(reply), "output_tokens": 1}
        message = {**self.body_of(reply, request), "content": [], "usage": start_usage}
        frames = [event("message_start", {"message": message})]
        if reply.tool is not None:
            block = {**self._content(reply, request)[0], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(reply.tool)}]
        else:
            block = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _words(reply.text)]
        frames.append(event("content_block_start", {"index": 0, "content_block": block}))
        frames += [event("content_block_delta", {"index": 0, "delta": d}) for d in deltas]
        frames.append(event("content_block_stop", {"index": 0}))
        stop = reply.stop or ("tool_use" if reply.tool is not None else "end_turn")
        frames.append(
            event(
                "message_delta",
                {
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": reply.tokens_out},
                },
            )
        )
        frames.append(event("message_stop", {}))
        return frames


def anthropic_error(status: int, kind: str, message: str) -> Failure:
    """An error as Anthropic sends it."""
    return Failure(status, {"type": "error", "error": {"type": kind, "message": message}})


class FakeGemini(_FakeProvider):
    """Google's Gemini API (generativelanguage v1beta)."""

    name = "fake-gemini"

    def prompt_of(self, body: Any) -> str:
        parts = body["contents"][-1]["parts"]
        return "".join(part.get("text", "") for part in parts)

    def is_stream(self, path: str, body: Any) -> bool:
        return ":streamGenerateContent" in path

    def _usage(self, reply: Reply) -> dict[str, int]:
        usage = {
            "promptTokenCount": reply.tokens_in,
            "candidatesTokenCount": reply.tokens_out,
            "totalTokenCount": reply.tokens_in + reply.tokens_out,
        }
        if reply.cache_read:
            usage["cachedContentTokenCount"] = reply.cache_read
        return usage

    def _chunk(self, text: str, reply: Reply, request: Recorded, *, last: bool) -> dict[str, Any]:
        model = re.search(r"models/([^:]+):", request.path)
        candidate: dict[str, Any] = {
            "content": {"role": "model", "parts": [{"text": text}]},
            "index": 0,
        }
        if last:
            candidate["finishReason"] = "STOP"
        return {
            "candidates": [candidate],
            "usageMetadata": self._usage(reply),
            "modelVersion": model.group(1) if model else "gemini",
            "responseId": "resp-fake",
        }

    def body_of(self, reply: Reply, request: Recorded) -> dict[str, Any]:
        text = json.dumps(reply.tool) if reply.tool is not None else reply.text
        return self._chunk(text, reply, request, last=True)

    def events_of(self, reply: Reply, request: Recorded) -> list[str]:
        text = json.dumps(reply.tool) if reply.tool is not None else reply.text
        pieces = _words(text)
        # Gemini sends running usage totals with every chunk.
        return [
            f"data: {json.dumps(self._chunk(p, reply, request, last=i == len(pieces) - 1))}"
            for i, p in enumerate(pieces)
        ]


def gemini_error(status: int, state: str, message: str) -> Failure:
    """An error as Google sends it."""
    return Failure(status, {"error": {"code": status, "message": message, "status": state}})
