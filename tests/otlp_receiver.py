"""A real OTLP/HTTP traces receiver for the tests: POST /v1/traces on 127.0.0.1, the protobuf
body decoded with ``opentelemetry-proto`` (the wire format a collector reads).

Like a trace backend it keeps one span per (trace id, span id), the last received; it also
counts every span it received (``received``) and keeps each request's raw body and headers,
so a test can look for a secret in exactly what went over the wire. It can be stopped and
started again on the same port (a collector that went away and came back).
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 32 * 1024 * 1024


@dataclass
class Received:
    """One span as the receiver decoded it."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int
    status_message: str
    resource: dict[str, Any]
    scope: str


@dataclass
class OtlpReceiver:
    """The receiver; :meth:`start` binds it (again) on its port."""

    port: int = 0
    spans: dict[tuple[str, str], Received] = field(default_factory=dict)
    received: list[tuple[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    delay_s: float = 0.0
    """Wait this long before answering (a slow collector)."""
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                if self.path != "/v1/traces" or not 0 < length <= MAX_BODY:
                    self.send_error(404 if self.path != "/v1/traces" else 400)
                    return
                body = self.rfile.read(length)
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if receiver.delay_s:
                    threading.Event().wait(receiver.delay_s)
                receiver._take(body, dict(self.headers.items()))
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceResponse,
                )

                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return None

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                return None

        self._server = Server(("127.0.0.1", self.port), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="otlp-receiver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering: later connections are refused until :meth:`start`."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        assert self._thread is not None
        self._thread.join()
        self._server = self._thread = None

    def _take(self, body: bytes, headers: dict[str, str]) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self._lock:
            self.bodies.append(body)
            self.headers.append({k.lower(): v for k, v in headers.items()})
            for rs in request.resource_spans:
                resource = _attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        got = Received(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex() or None,
                            name=s.name,
                            kind=int(s.kind),
                            start_ns=int(s.start_time_unix_nano),
                            end_ns=int(s.end_time_unix_nano),
                            attributes=_attrs(s.attributes),
                            events=[(e.name, _attrs(e.attributes)) for e in s.events],
                            status_code=int(s.status.code),
                            status_message=s.status.message,
                            resource=resource,
                            scope=ss.scope.name,
                        )
                        key = (got.trace_id, got.span_id)
                        self.received.append(key)
                        self.spans[key] = got

    def of_trace(self, trace_id: str) -> list[Received]:
        with self._lock:
            return [s for s in self.spans.values() if s.trace_id == trace_id]

    def wire(self) -> bytes:
        """Every byte received: bodies and header values."""
        with self._lock:
            heads = b"".join(v.encode() for h in self.headers for v in h.values())
            return b"".join(self.bodies) + heads


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if which == "kvlist_value":
        return _attrs(v.kvlist_value.values)
    return getattr(v, which) if which else None
