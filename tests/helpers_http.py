"""Loopback HTTP for tests: a real server on 127.0.0.1 in a thread, and a proxy-free env.

Shared by the fake chat server (tests/openai_server.py) and the library's fake site
(tests/test_library.py); stdlib only, apart from pytest's monkeypatch.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def isolate_loopback_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy setting leaks in: requests to 127.0.0.1 go straight to the test's server."""
    for name in PROXY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


class LoopbackHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer on a free port of 127.0.0.1, serving from a background thread
    as soon as it is made, until :meth:`stop`."""

    daemon_threads = False  # server_close() joins them: no thread outlives a test
    block_on_close = True
    request_queue_size = 1024
    """The listen backlog: socketserver's 5 resets connections when 128 calls arrive at once."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, name: str = "loopback") -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.port = int(self.server_address[1])
        """Kept after :meth:`stop`, so a test can still name the (now refused) address."""
        self._thread: threading.Thread | None = threading.Thread(
            target=self.serve_forever, args=(0.02,), name=name
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket (later connections are refused); join the
        serving thread and every handler thread. Idempotent."""
        if self._thread is None:
            return
        self.shutdown()
        self.server_close()
        self._thread.join()
        self._thread = None

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests) leaves a broken pipe behind: expected.
        return None
