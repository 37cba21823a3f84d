"""A real OpenAI-compatible chat server on loopback that misbehaves on purpose (issue 31,
items 6-9): it drips, streams for ever, cuts its body, sends a huge one, or reports no usage.

Every model runner speaks this API (the ``openai`` runner, pydantic-ai's ``openai:``
provider, llm's OpenAI-compatible models), so one server covers the three. A request asking
``"stream": true`` is answered as server-sent events, any other as one JSON body. The mode
is set by the test (``server.mode = "drip"``) and holds for every request:

- ``drip``: a well-formed answer, one byte every ``drip_s`` seconds.
- ``endless``: chunks for ever (``chunk_delay_s`` apart), never a finish or ``[DONE]``; a
  non-streamed request gets an endless JSON string.
- ``cut``: half of the answer, then the connection is closed (a Content-Length the body
  never reaches; a stream that stops before its finish chunk).
- ``huge``: a 400 MiB answer generated as it is sent (never held in memory); ``sized``
  says whether a Content-Length announces it.
- ``no_usage``: a good answer without ``usage``.

``disconnects`` records, per request, when the server found the client gone (a write
failed), so a test can tell the runner closed its connection.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.helpers_http import LoopbackHTTPServer

HUGE_BYTES = 400 * 1024 * 1024
REPLY = "tides follow the moon"
_BLOCK = 64 * 1024


def completion(content: str, *, usage: bool = True) -> dict[str, Any]:
    """A chat.completion body."""
    body: dict[str, Any] = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "m1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    return body


def chunk_event(text: str | None, *, finish: str | None = None) -> bytes:
    """One ``chat.completion.chunk`` as a server-sent event."""
    delta = {} if text is None else {"content": text}
    chunk = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "m1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


def stream_events(content: str, *, usage: bool = True) -> list[bytes]:
    """A whole, well-formed stream of ``content``, word by word."""
    events = [chunk_event(f" {w}" if i else w) for i, w in enumerate(content.split(" "))]
    events.append(chunk_event(None, finish="stop"))
    if usage:
        chunk = {
            "id": "chatcmpl-hostile",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "m1",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
        }
        events.append(f"data: {json.dumps(chunk)}\n\n".encode())
    return [*events, b"data: [DONE]\n\n"]


class HostileChatServer:
    """The server; ``with HostileChatServer("drip") as server: ... server.url``."""

    def __init__(self, mode: str = "no_usage") -> None:
        self.mode = mode
        self.drip_s = 0.05
        self.chunk_delay_s = 0.01
        self.chunk_chars = 4000
        """The text in each chunk of an endless stream."""
        self.sized = True
        self.requests = 0
        self.disconnects: list[float] = []
        """``time.monotonic()`` of each request whose client went away mid-answer."""
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._http: LoopbackHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._http is not None, "the server is not running"
        return f"http://127.0.0.1:{self._http.port}/v1"

    def __enter__(self) -> HostileChatServer:
        self._http = LoopbackHTTPServer(_handler_for(self), name="hostile-chat-server")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop answering (every dripping or endless answer ends) and join the threads."""
        self.stopping.set()
        if self._http is not None:
            self._http.stop()

    def gone(self) -> None:
        with self._lock:
            self.disconnects.append(time.monotonic())


def _handler_for(server: HostileChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            with server._lock:
                server.requests += 1
            is_stream = bool(body.get("stream"))
            answer = getattr(self, f"_{server.mode}")
            try:
                answer(is_stream)
            except (BrokenPipeError, ConnectionResetError):
                server.gone()

        def _head(self, content_type: str, length: int | None = None) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            if length is not None:
                self.send_header("Content-Length", str(length))
            self.end_headers()  # HTTP/1.0: without a length the body ends when we close

        def _write(self, data: bytes, *, pause_s: float = 0.0) -> None:
            if pause_s and server.stopping.wait(pause_s):
                raise BrokenPipeError("the test stopped the server")
            self.wfile.write(data)
            self.wfile.flush()

        def _no_usage(self, is_stream: bool) -> None:
            if is_stream:
                self._head("text/event-stream")
                for event in stream_events(REPLY, usage=False):
                    self._write(event)
                return
            payload = json.dumps(completion(REPLY, usage=False)).encode()
            self._head("application/json", len(payload))
            self._write(payload)

        def _drip(self, is_stream: bool) -> None:
            if is_stream:
                self._head("text/event-stream")
                payload = b"".join(stream_events(REPLY))
            else:
                payload = json.dumps(completion(REPLY)).encode()
                self._head("application/json", len(payload))
            for i in range(len(payload)):
                self._write(payload[i : i + 1], pause_s=server.drip_s)

        def _endless(self, is_stream: bool) -> None:
            if is_stream:
                self._head("text/event-stream")
                while True:
                    self._write(chunk_event("m" * server.chunk_chars), pause_s=server.chunk_delay_s)
            self._head("application/json")
            self._write(b'{"id": "chatcmpl-hostile", "choices": [{"message": {"content": "')
            while True:
                self._write(b"more " * 200, pause_s=server.chunk_delay_s)

        def _cut(self, is_stream: bool) -> None:
            if is_stream:
                self._head("text/event-stream")
                for event in stream_events(REPLY)[:3]:  # two words, no finish, no [DONE]
                    self._write(event)
                return
            payload = json.dumps(completion(REPLY)).encode()
            self._head("application/json", len(payload))
            self._write(payload[: len(payload) // 2])  # then the connection closes

        def _huge(self, is_stream: bool) -> None:
            head = b'{"id": "chatcmpl-hostile", "object": "chat.completion", "model": "m1", '
            head += b'"choices": [{"index": 0, "message": {"role": "assistant", "content": "'
            tail = b'"}, "finish_reason": "stop"}]}'
            block = b"x" * _BLOCK
            size = HUGE_BYTES
            if is_stream:
                self._head("text/event-stream")
                event = chunk_event("x" * 4000)
                for _ in range(size // len(event)):
                    self._write(event)
                return
            self._head("application/json", size if server.sized else None)
            self._write(head)
            left = size - len(head) - len(tail)
            while left > 0:
                self._write(block[: min(left, _BLOCK)])
                left -= _BLOCK
            self._write(tail)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return None

    return Handler
