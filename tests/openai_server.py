"""A real OpenAI-compatible chat server on loopback, scripted by tests, and the setup the
openai test modules share (the environment, a runner on the server, a unit request).

Usage::

    with FakeChatServer() as server:
        server.push_reply("hello", prompt_tokens=3, completion_tokens=1)
        server.push(429, {"error": {"message": "slow down"}})
        ...  # point a runner at server.url
        assert server.requests[0].headers["idempotency-key"] == "d-1"

Scripted responses are served in order; when none is left the ``default`` responder
answers (an echo of the prompt unless replaced).

A request with ``"stream": true`` gets its 200 completion as server-sent events: one
``chat.completion.chunk`` per word of the content (``chunk_delay_s`` apart), a final chunk
with ``usage`` and no choices when ``stream_options.include_usage`` asks for it, then
``data: [DONE]``. ``streams = False`` plays a server that ignores ``stream`` and answers JSON.

The helpers at the end isolate the environment and build wf_magic objects pointed at the
server.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.helpers_http import LoopbackHTTPServer, isolate_loopback_env
from wf_magic.runners.base import RunnerContext, UnitRequest
from wf_magic.runners.openai_chat import OpenAIChatRunner

if TYPE_CHECKING:
    import pytest

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: Any
    """The decoded JSON body (or the raw text when it was not JSON)."""

    @property
    def prompt(self) -> str:
        """The content of the last message."""
        return str(self.body["messages"][-1]["content"])


@dataclass(frozen=True)
class ScriptedResponse:
    """What to answer one request with."""

    status: int
    body: Any
    """A JSON value (sent as JSON) or a str (sent as is)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


Responder = Callable[[RecordedRequest], ScriptedResponse]


def completion_body(
    content: str | None,
    *,
    model: str = "fake-model",
    prompt_tokens: int | None = 7,
    completion_tokens: int | None = 3,
    completion_id: str = "chatcmpl-fake",
) -> dict[str, Any]:
    """A chat.completion JSON body; ``prompt_tokens=None`` leaves ``usage`` out."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }
    if prompt_tokens is not None:
        completion_tokens = completion_tokens or 0
        body["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
    return body


def echo(request: RecordedRequest) -> ScriptedResponse:
    """The default responder: ``echo: <prompt>``, one token per word."""
    prompt = request.prompt
    content = f"echo: {prompt}"
    return ScriptedResponse(
        200,
        completion_body(
            content,
            model=str(request.body.get("model", "fake-model")),
            prompt_tokens=len(prompt.split()),
            completion_tokens=len(content.split()),
        ),
    )


class FakeChatServer:
    """A ThreadingHTTPServer on 127.0.0.1 speaking ``POST /v1/chat/completions``."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.default: Responder = echo
        self.streams = True
        """Honour ``"stream": true`` (False: answer plain JSON, like a server that cannot)."""
        self.chunk_delay_s = 0.0
        """Pause before each streamed chunk (chunks arriving over time)."""
        self.running_usage = False
        """Send running usage totals in every content chunk (vLLM's continuous usage, Gemini's
        compatible endpoint), besides the final usage chunk."""
        self._script: deque[ScriptedResponse] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: LoopbackHTTPServer | None = None

    @property
    def url(self) -> str:
        """The base URL to give a client (``http://127.0.0.1:PORT/v1``)."""
        if self._httpd is None:
            raise RuntimeError("FakeChatServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def push(
        self,
        status: int,
        body: Any,
        *,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """Queue the answer to the next unanswered request."""
        with self._lock:
            self._script.append(ScriptedResponse(status, body, dict(headers or {}), delay_s))

    def push_reply(self, content: str | None, **fields: Any) -> None:
        """Queue a 200 completion with ``content`` (``fields`` go to :func:`completion_body`)."""
        self.push(200, completion_body(content, **fields))

    def start(self) -> FakeChatServer:
        """Bind a free port and serve in a background thread."""
        self._httpd = LoopbackHTTPServer(_handler_for(self), name="fake-chat-server")
        return self

    def stop(self) -> None:
        """Stop serving, wake delayed handlers, close the socket and join every thread."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.stop()
        self._httpd = None

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _answer(self, request: RecordedRequest) -> ScriptedResponse:
        with self._lock:
            self.requests.append(request)
            scripted = self._script.popleft() if self._script else None
        if request.path != CHAT_PATH:
            return ScriptedResponse(404, {"error": {"message": f"no route {request.path}"}})
        return scripted if scripted is not None else self.default(request)


def _handler_for(server: FakeChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode("utf-8")
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw
            headers = {k.lower(): v for k, v in self.headers.items()}
            response = server._answer(RecordedRequest("POST", self.path, headers, body))
            if response.delay_s and server._stopping.wait(response.delay_s):
                return
            if _wants_stream(body) and server.streams and _is_completion(response):
                self._send_stream(response.body, body)
            else:
                self._send(response)

        def _send_stream(self, completion: dict[str, Any], request: dict[str, Any]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()  # HTTP/1.0: the body ends when the connection closes
            for chunk in stream_chunks(completion, request, running=server.running_usage):
                if server.chunk_delay_s and server._stopping.wait(server.chunk_delay_s):
                    return
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _send(self, response: ScriptedResponse) -> None:
            is_text = isinstance(response.body, str)
            payload = (response.body if is_text else json.dumps(response.body)).encode("utf-8")
            self.send_response(response.status)
            self.send_header("Content-Type", "text/plain" if is_text else "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return None

    return Handler


def stream_chunks(
    completion: dict[str, Any], request: Mapping[str, Any], *, running: bool = False
) -> list[dict[str, Any]]:
    """A chat.completion body as the ``chat.completion.chunk`` objects a streaming server
    sends: a role chunk, one chunk per word of the content, a finish chunk, then (when the
    request asked for it) a usage chunk with no choices. ``running``: every word's chunk
    also carries the usage so far (the completion tokens split evenly over the words)."""
    base = {
        "id": completion.get("id", "chatcmpl-fake"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 1_700_000_000),
        "model": completion.get("model", "fake-model"),
    }
    message = completion["choices"][0]["message"] if completion.get("choices") else {}
    content = message.get("content") or ""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    pieces = re.findall(r"\s*\S+\s*", content)
    usage = completion.get("usage")
    for number, piece in enumerate(pieces, start=1):
        chunks.append(chunk({"content": piece}))
        if running and usage is not None:
            done = usage["completion_tokens"] * number // len(pieces)
            so_far = {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": done}
            chunks[-1]["usage"] = {**so_far, "total_tokens": usage["prompt_tokens"] + done}
    chunks.append(chunk({}, "stop"))
    options = request.get("stream_options") or {}
    if options.get("include_usage") and completion.get("usage") is not None:
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return chunks


def _wants_stream(body: Any) -> bool:
    return isinstance(body, dict) and body.get("stream") is True


def _is_completion(response: ScriptedResponse) -> bool:
    body = response.body
    return (
        response.status == 200
        and isinstance(body, dict)
        and body.get("object") == "chat.completion"
    )


# -- setup shared by the openai test modules ----------------------------------------------------
OPENAI_ENV = (
    "OPENAI_BASE_URL",
    "WF_MAGIC_OPENAI_BASE_URL",
    "WF_MAGIC_OPENAI_MODEL",
    "OPENAI_API_KEY",
)


def isolate_openai_env(monkeypatch: pytest.MonkeyPatch, key_env: str, key: str) -> None:
    """``key`` in ``key_env``; no OpenAI endpoint, model, key or proxy setting leaks in."""
    monkeypatch.setenv(key_env, key)
    for name in OPENAI_ENV:
        monkeypatch.delenv(name, raising=False)
    isolate_loopback_env(monkeypatch)


def chat_runner(options: Mapping[str, Any], state_dir: str | Path) -> OpenAIChatRunner:
    """An openai runner made as a workflow ``wf`` would make it from ``runners.openai``."""
    context = RunnerContext(
        name="openai", options=dict(options), state_dir=str(state_dir), workflow="wf"
    )
    return OpenAIChatRunner.from_context(context)


def unit_request(**fields: Any) -> UnitRequest:
    """A first-attempt prompt unit of run ``r-1``; ``fields`` give (or replace) the rest."""
    return UnitRequest(**{"run_id": "r-1", "attempt": 1, "kind": "prompt", **fields})
