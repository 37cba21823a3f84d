"""Fetch one http(s) document for the workflow library under a total deadline and a byte bound.

The deadline covers the whole fetch: the connection, the TLS handshake, the request, the
headers, every redirect and the whole body. A per-read socket timeout alone would let a
server that sends one byte a second hold the library for ever, so each socket the fetch
opens is handed to a watchdog that shuts it down when the deadline passes; whatever
``http.client`` is blocked in then returns, and the fetch reports ``timed out``. The body is
read in chunks and refused once it passes the limit (or when its ``Content-Length``
announces more), so a huge answer is never held in memory. Name resolution (DNS) is the one
step a shutdown cannot cut short; it is bounded by the resolver's own timeout.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from .errors import clip
from .redact import mask_url

if TYPE_CHECKING:
    import http.client
    import urllib.request

_CHUNK = 64 * 1024


class Unreachable(Exception):
    """A fetch failed; ``reason`` says how, in a few words."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Deadline:
    """When a fetch must be over, and the sockets to shut down then."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.expired = False

    def remaining(self) -> float:
        """Seconds left (each socket operation's timeout: none may outlast the deadline).

        Raises:
            TimeoutError: none are left.
        """
        left = self._at - time.monotonic()
        if left <= 0 or self.expired:
            raise TimeoutError("the fetch deadline passed")
        return left

    def watch(self, sock: socket.socket) -> socket.socket:
        """Shut ``sock`` down when the deadline passes (now, if it has)."""
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)
        return sock

    def expire(self) -> None:
        """The deadline passed: shut every watched socket down (a blocked read returns)."""
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def done(self) -> None:
        """The fetch is over: forget its sockets (they are closed, their numbers reusable)."""
        with self._lock:
            self._sockets.clear()


def _shut(sock: socket.socket) -> None:
    # socket.socket's own shutdown, not SSLSocket's: that one also drops its SSL object,
    # which the thread blocked in a read is using.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # closed already, or detached (the plain socket a TLS one was made from)


def fetch(url: str, *, timeout_s: float, limit: int) -> bytes:
    """The body at ``url``, fetched within ``timeout_s`` seconds in all, at most ``limit`` bytes.

    Raises:
        Unreachable: the fetch failed, timed out, was redirected off http(s), or the body
            is larger than ``limit`` bytes, or shorter than its ``Content-Length``. The reason
            shows no credentials.
    """
    # urllib pulls in http.client, email and ssl: imported on the first fetch, not with the
    # freezer that imports the library.
    import http.client
    import urllib.error
    import urllib.request

    deadline = _Deadline(timeout_s)
    watchdog = threading.Timer(timeout_s, deadline.expire)
    watchdog.daemon = True
    watchdog.start()
    timed_out = f"timed out after {timeout_s:g} s (connect, headers and body together)"
    try:
        opener = _opener(deadline)
        request = urllib.request.Request(url, headers={"User-Agent": "wf_magic-library"})
        with opener.open(request, timeout=deadline.remaining()) as response:
            data = _body(response, limit=limit, deadline=deadline)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise Unreachable(f"HTTP {exc.code} {exc.reason}") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:  # dropped, malformed, cut
        if deadline.expired or isinstance(exc, TimeoutError) or _timed_out(exc):
            raise Unreachable(timed_out) from None
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise Unreachable(_reason(reason)) from None
    finally:
        watchdog.cancel()
        watchdog.join()
        deadline.done()
    if deadline.expired:  # a body read to a shut-down socket's end looks complete: it is not
        raise Unreachable(timed_out)
    return data


def _body(response: http.client.HTTPResponse, *, limit: int, deadline: _Deadline) -> bytes:
    """The response's body, read in chunks and refused past ``limit`` bytes."""
    promised = (response.headers.get("Content-Length") or "").strip()
    if promised.isdigit() and int(promised) > limit:
        raise Unreachable(f"larger than {limit} bytes (it announces {promised})")
    data = bytearray()
    while chunk := response.read(min(_CHUNK, limit + 1 - len(data))):
        data += chunk
        if len(data) > limit:
            raise Unreachable(f"larger than {limit} bytes")
        if deadline.expired:
            break
    if promised.isdigit() and int(promised) != len(data) and not deadline.expired:
        # http.client returns a body cut short by a closed connection without complaint
        raise Unreachable(f"the connection closed after {len(data)} of {promised} bytes")
    return bytes(data)


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """An opener whose connections obey ``deadline`` and whose redirects stay on http(s)."""
    import http.client
    import urllib.error
    import urllib.request

    def watched(address: Any, timeout: Any = None, source_address: Any = None) -> socket.socket:
        sock = socket.create_connection(address, deadline.remaining(), source_address)
        return deadline.watch(sock)

    class Http(http.client.HTTPConnection):
        def connect(self) -> None:
            self._create_connection = watched
            self.timeout = deadline.remaining()
            super().connect()

    class Https(http.client.HTTPSConnection):
        def connect(self) -> None:
            # HTTPSConnection.connect, with the handshake after the TLS socket is watched.
            self._create_connection = watched
            self.timeout = deadline.remaining()
            http.client.HTTPConnection.connect(self)
            host = self._tunnel_host or self.host  # type: ignore[attr-defined]
            context = self._context  # type: ignore[attr-defined]
            tls = context.wrap_socket(
                self.sock, server_hostname=host, do_handshake_on_connect=False
            )
            self.sock = deadline.watch(tls)
            tls.do_handshake()

    class HttpHandler(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Http, req)

    class HttpsHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Https, req)

    class HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
        """Redirects only to http(s): an index cannot send the library to ftp: or file:."""

        def redirect_request(
            self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
        ) -> urllib.request.Request | None:
            from .library_index import is_url

            if not is_url(newurl):
                fp.close()  # urllib closes the redirect's response only when it follows
                shown = clip(mask_url(newurl), 80)
                raise urllib.error.URLError(f"refused a redirect to {shown}")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    return urllib.request.build_opener(HttpHandler(), HttpsHandler(), HttpOnlyRedirects())


def _timed_out(exc: BaseException) -> bool:
    """Whether urllib wrapped a socket timeout (``URLError(reason=TimeoutError)``)."""
    return isinstance(getattr(exc, "reason", None), TimeoutError)


def _reason(error: object) -> str:
    """A fetch failure in a few words (``connection refused``, …), without credentials."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return clip(mask_url(str(error)) or type(error).__name__, 160)
