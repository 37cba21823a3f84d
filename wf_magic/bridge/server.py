"""The per-attempt loopback endpoint: 127.0.0.1, a random port, a secret path; each request
relayed to the upstream as it streams, each finished call handed to ``on_call``.

All bridges share one event-loop thread (started on first use). The CLI's headers, its
credentials among them, go upstream untouched and are never kept: a :class:`CallRecord`
holds counts, the model, the status and a clipped error line only. A request whose path does
not start with the attempt's secret is answered 404 and never forwarded. Bodies are bounded
both ways (:data:`MAX_REQUEST_BYTES`, ``runners.bounded_http.MAX_BODY_BYTES``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..runners.bounded_http import MAX_BODY_BYTES
from ..runners.ratelimits import is_throttle, wait_of
from .tape import Capture, Replay, play
from .usage import PROVIDERS, CallUsage, dialect_of

if TYPE_CHECKING:
    import httpx

MAX_HEAD_BYTES = 65_536
"""The longest request line plus headers read (longer: 431)."""
MAX_REQUEST_BYTES = 32 * 1_048_576
"""The largest request body relayed (an agent's whole conversation; larger: 413)."""
CLOSE_S = 5.0
MAX_THROTTLED = 20
"""How many refusals (429, 529) of one call the bridge waits out before relaying one."""
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """One finished model call as the bridge saw it (no header, no body)."""

    model: str | None
    status: str
    """- ``ok``: a 2xx/3xx answer relayed whole.
    - ``error``: an HTTP error, a cut stream, an unreachable upstream.
    - ``refused``: the budget gate refused it; it never went upstream."""
    http_status: int | None
    tokens_in: int
    tokens_out: int
    cache_read: int
    cache_write: int
    latency_s: float
    started_at: float
    """Epoch seconds when the request arrived."""
    error: str | None
    provider: str | None
    """The genai-prices provider id of its wire dialect (None: not a known dialect)."""
    capture: Capture | None = field(default=None, repr=False, compare=False)
    """What it sent and got back (``bridge/tape.py``): journaled redacted, never logged."""
    replayed: bool = False
    """Answered from a recording (no upstream, nothing paid)."""


OnCall = Callable[[CallRecord], None]
GATE_WAIT_S = 0.02
"""How often a call the gate holds back asks again (the bridges' loop is never blocked)."""


class Gate(Protocol):
    """The budget each model call asks before it is forwarded (``bridge/attempt.py``)."""

    def enter(self) -> str | bool:
        """True: forward it; False: hold it and ask again (calls in flight may spend what is
        left); a message: refuse it."""
        ...

    def leave(self) -> None:
        """A call :meth:`enter` let through ended (``on_call`` has seen it, if it finished)."""
        ...


class Limits(Protocol):
    """The endpoint limiter the bridge's upstream calls share with the runners' calls."""

    def acquire(self) -> float:
        """Take a call slot: 0.0 when taken, else the seconds to wait before asking again."""
        ...

    def release(self, *, ok: bool, tokens: int = 0) -> None:
        """The call returned (``ok``: the provider did not refuse it)."""
        ...

    def throttled(self, retry_after_s: float | None, cause: str) -> float:
        """The provider refused it: pause the endpoint, journal a ``throttled`` event (a
        blocking write: called off the loop); the seconds to wait."""
        ...


class Bridge:
    """One attempt's endpoint; :attr:`url` is the base URL the CLI is given."""

    def __init__(
        self,
        *,
        upstream: str,
        on_call: OnCall,
        model: str | None = None,
        gate: Gate | None = None,
        limits: Limits | None = None,
        replay: Replay | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.replay = replay
        """When set, calls are answered from this recording and never forwarded."""
        self.limits = limits
        self.on_call = on_call
        self.model = model
        self.gate = gate
        self.refusal: str | None = None
        """The first refusal of the gate (the attempt fails with it)."""
        self.secret = secrets.token_urlsafe(24)
        self.port = 0
        self.records: list[CallRecord] = []
        self._server: asyncio.Server | None = None
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/SECRET``: the CLI appends its API path to it."""
        return f"http://127.0.0.1:{self.port}/{self.secret}"

    @classmethod
    def open(
        cls,
        *,
        upstream: str,
        on_call: OnCall,
        model: str | None = None,
        gate: Gate | None = None,
        limits: Limits | None = None,
        replay: Replay | None = None,
    ) -> Bridge:
        """A bridge listening on 127.0.0.1 (a random port), relaying to ``upstream``.

        Raises:
            OSError: the port could not be bound.
        """
        bridge = cls(
            upstream=upstream,
            on_call=on_call,
            model=model,
            gate=gate,
            limits=limits,
            replay=replay,
        )
        asyncio.run_coroutine_threadsafe(bridge._start(), _LOOP.running()).result(CLOSE_S)
        return bridge

    def close(self) -> None:
        """Close the port and end the calls in flight (the attempt ended)."""
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), _LOOP.running()).result(CLOSE_S)
        except (TimeoutError, RuntimeError):
            pass  # the loop is gone or stuck: the daemon thread dies with the process

    async def _start(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=30.0, read=600.0, write=60.0, pool=30.0),
            follow_redirects=False,
        )
        self._server = await asyncio.start_server(
            self._serve, host="127.0.0.1", port=0, limit=MAX_HEAD_BYTES
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_S)
        if self._server is not None:
            await self._server.wait_closed()
        if self._client is not None:
            await self._client.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the CLI went away mid-request
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60.0)
        except (asyncio.LimitOverrunError, ValueError):
            await _plain(writer, 431, "request headers too large")
            return
        except TimeoutError:
            return
        method, target, headers = _parse_head(head)
        rest = self._rest(target)
        if rest is None or method is None:
            await _plain(writer, 404, "not found")
            return
        body = await _read_body(reader, headers)
        if body is None:
            await _plain(writer, 413, f"request body over {MAX_REQUEST_BYTES} bytes or malformed")
            return
        await self._relay(writer, method, rest, headers, body)

    def _rest(self, target: str) -> str | None:
        """The path after the secret (with the query), or None without the right secret."""
        if not target.startswith("/"):
            return None
        first, _, tail = target[1:].partition("/")
        first, query_mark, query = first.partition("?")
        if not hmac.compare_digest(first.encode(), self.secret.encode()):
            return None
        return "/" + tail + (query_mark + query if query_mark else "")

    async def _relay(
        self,
        writer: asyncio.StreamWriter,
        method: str,
        rest: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        started, clock = time.time(), time.monotonic()
        usage = CallUsage(dialect=dialect_of(rest))
        _request_model(usage, body)
        capture = Capture(method=method, path=rest, request=body)
        gated = self.gate is not None and method == "POST"
        refusal = await self._admit() if gated else None
        if refusal is not None:
            self.refusal = self.refusal or refusal
            await _refuse(writer, usage.dialect, refusal)
            self._record(
                usage,
                400,
                refusal,
                started,
                time.monotonic() - clock,
                refused=True,
                capture=capture,
            )
            await asyncio.get_running_loop().run_in_executor(None, self.on_call, self.records[-1])
            return
        try:
            await self._forward(writer, method, rest, headers, body, usage, capture, started, clock)
        finally:
            if gated and self.gate is not None:
                self.gate.leave()

    async def _admit(self) -> str | None:
        """Ask the gate until it lets the call through (None) or refuses it (its message)."""
        assert self.gate is not None  # asked only with one
        while True:
            said = self.gate.enter()
            if isinstance(said, str):
                return said
            if said:
                return None
            await asyncio.sleep(GATE_WAIT_S)

    async def _forward(
        self,
        writer: asyncio.StreamWriter,
        method: str,
        rest: str,
        headers: list[tuple[str, str]],
        body: bytes,
        usage: CallUsage,
        capture: Capture,
        started: float,
        clock: float,
    ) -> None:
        """Relay one call upstream (or answer it from the recording) and hand it to
        ``on_call``."""
        import httpx

        assert self._client is not None  # started before the port was open
        if self.replay is not None:
            await self._replayed(writer, method, usage, capture, started, clock)
            return
        sent = [(k, v) for k, v in headers if k.lower() not in _HOP]
        sent.append(("accept-encoding", "identity"))
        status, error, relayed = None, None, False
        request = self._client.build_request(
            method, self.upstream + rest, headers=sent, content=body
        )
        try:
            response = await self._send(request)
        except httpx.HTTPError as exc:
            error = f"upstream unreachable ({type(exc).__name__})"
            await _plain(writer, 502, error)
        else:
            try:
                status = response.status_code
                error, relayed = await _stream_back(writer, response, usage, capture)
            finally:
                await response.aclose()
                if self.limits is not None:
                    self.limits.release(ok=True, tokens=usage.tokens_in + usage.output)
        if method == "POST":  # else a probe (HEAD, GET), not a model call
            self._record(usage, status, error, started, time.monotonic() - clock, capture=capture)
            # Journaled before the CLI reads the answer's end (so the budget gate of its
            # next call counts this one); blocking writes never run on the loop.
            await asyncio.get_running_loop().run_in_executor(None, self.on_call, self.records[-1])
        if relayed:
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def _replayed(
        self,
        writer: asyncio.StreamWriter,
        method: str,
        usage: CallUsage,
        capture: Capture,
        started: float,
        clock: float,
    ) -> None:
        """Answer a call from the recording (a probe: 404, as no provider serves one)."""
        assert self.replay is not None  # called in replay mode only
        if method != "POST":
            await _plain(writer, 404, "not found (replay)")
            return
        recorded = self.replay.next(path=capture.path, model=usage.model, request=capture.request)
        failure = self.replay.failure
        if recorded is None or failure is not None or recorded.body.response is None:
            message = failure or f"call {self.replay.served} of the recording got no answer"
            self.replay.failure = message
            await _refuse(writer, usage.dialect, message)
            self._record(usage, None, message, started, time.monotonic() - clock, replayed=True)
        else:
            status = await play(writer, recorded.body, capture, usage, folders=self.replay.folders)
            error = None if status < 400 else f"HTTP {status} (replayed)"
            self._record(
                usage,
                status,
                error,
                started,
                time.monotonic() - clock,
                replayed=True,
                capture=capture,
            )
        await asyncio.get_running_loop().run_in_executor(None, self.on_call, self.records[-1])
        if recorded is not None and failure is None and recorded.body.response is not None:
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the endpoint's limiter: a refusal (429, 529) is waited
        out in the bridge and sent again — the CLI never sees it — up to
        :data:`MAX_THROTTLED` times; the limiter's slot is held by the returned response."""
        assert self._client is not None  # started before the port was open
        limits, loop = self.limits, asyncio.get_running_loop()
        if limits is None:
            return await self._client.send(request, stream=True)
        refusals = 0
        while True:
            wait_s = limits.acquire()
            while wait_s > 0:
                await asyncio.sleep(min(wait_s, 1.0))
                wait_s = limits.acquire()
            try:
                response = await self._client.send(request, stream=True)
            except BaseException:
                limits.release(ok=True)
                raise
            if not is_throttle(response.status_code) or refusals >= MAX_THROTTLED:
                return response
            refusals += 1
            after = wait_of(response.headers)
            await response.aclose()
            limits.release(ok=False)
            cause = f"HTTP {response.status_code} from {self.upstream} (refusal {refusals})"
            wait_s = await loop.run_in_executor(None, limits.throttled, after, cause)
            await asyncio.sleep(wait_s)

    def _record(
        self,
        usage: CallUsage,
        status: int | None,
        error: str | None,
        started: float,
        took: float,
        *,
        refused: bool = False,
        replayed: bool = False,
        capture: Capture | None = None,
    ) -> None:
        ok = status is not None and status < 400 and error is None
        paid = 0 if replayed else 1  # a replayed call's tokens were paid when it was recorded
        self.records.append(
            CallRecord(
                model=usage.model or self.model,
                status="refused" if refused else "ok" if ok else "error",
                http_status=status,
                tokens_in=usage.tokens_in * paid,
                tokens_out=usage.output * paid,
                cache_read=usage.cache_read * paid,
                cache_write=usage.cache_write * paid,
                latency_s=round(took, 6),
                started_at=started,
                error=None if ok else (error or f"HTTP {status}")[:300],
                provider=PROVIDERS.get(usage.dialect),
                capture=capture,
                replayed=replayed,
            )
        )


async def _stream_back(
    writer: asyncio.StreamWriter, response: httpx.Response, usage: CallUsage, capture: Capture
) -> tuple[str | None, bool]:
    """Relay ``response`` chunk by chunk (chunked encoding, the closing chunk left to the
    caller), keeping it in ``capture``; the error line, if any, and whether the whole answer
    was relayed."""
    head = [f"HTTP/1.1 {response.status_code} {response.reason_phrase or 'OK'}"]
    head += [f"{k}: {v}" for k, v in response.headers.multi_items() if k.lower() not in _HOP]
    head += ["transfer-encoding: chunked", "connection: close", "", ""]
    writer.write("\r\n".join(head).encode("latin-1", errors="replace"))
    streamed = "event-stream" in response.headers.get("content-type", "")
    capture.status = response.status_code
    capture.content_type = response.headers.get("content-type")
    kept, size = bytearray(), 0
    try:
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return f"answer over the output bound of {MAX_BODY_BYTES:,} bytes; cut", False
            writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            await writer.drain()
            capture.keep(chunk)
            if streamed:
                usage.feed(chunk)
            else:
                kept += chunk
    except Exception as exc:  # noqa: BLE001 - a cut upstream is this call's error
        return f"upstream stream cut ({type(exc).__name__})", False
    usage.finish(None if streamed else bytes(kept))
    if response.status_code >= 400:
        return f"HTTP {response.status_code}: {_first_line(bytes(kept))}", True
    return None, True


def _first_line(body: bytes) -> str:
    text = body[:400].decode("utf-8", errors="replace").strip()
    return text.splitlines()[0][:240] if text else ""


def _request_model(usage: CallUsage, body: bytes) -> None:
    """The model the request named (an answer that names none keeps it)."""
    if len(body) > MAX_REQUEST_BYTES or not body.lstrip().startswith(b"{"):
        return
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return
    if isinstance(value, dict) and isinstance(value.get("model"), str):
        usage.model = value["model"][:200]


def _parse_head(head: bytes) -> tuple[str | None, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None, "", []
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon and name.strip():
            headers.append((name.strip(), value.strip()))
    return parts[0], parts[1], headers


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes | None:
    """The request body (Content-Length or chunked), None past the bound or malformed."""
    found = {k.lower(): v for k, v in headers}
    if "chunked" in found.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                return None
            if size == 0:
                await reader.readuntil(b"\r\n")
                return bytes(out)
            if len(out) + size > MAX_REQUEST_BYTES:
                return None
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    try:
        length = int(found.get("content-length", "0"))
    except ValueError:
        return None
    if length < 0 or length > MAX_REQUEST_BYTES:
        return None
    return await reader.readexactly(length) if length else b""


async def _refuse(writer: asyncio.StreamWriter, dialect: str, message: str) -> None:
    """A provider-shaped 400 the CLI reports and stops on (no CLI retries a 400)."""
    shaped: dict[str, Any]
    if dialect == "anthropic":
        shaped = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    elif dialect == "gemini":
        shaped = {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
    else:
        shaped = {"error": {"message": message, "type": "invalid_request_error", "code": "budget"}}
    body = json.dumps(shaped).encode()
    writer.write(
        f"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )
    try:
        await writer.drain()
    except ConnectionError:
        pass


async def _plain(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = json.dumps({"type": "error", "error": {"type": "bridge", "message": message}}).encode()
    writer.write(
        f"HTTP/1.1 {status} Error\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )
    try:
        await writer.drain()
    except ConnectionError:
        pass


class _Loop:
    """The one event-loop thread every bridge runs on (a daemon, started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="wf-bridge", daemon=True).start()
                self._loop = loop
            return self._loop


_LOOP = _Loop()
