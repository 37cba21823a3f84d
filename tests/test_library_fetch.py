"""The library's fetch under hostile servers (issue 31, items 6 and 7, library part).

Each server is real: a socket on 127.0.0.1 in a thread, answering by hand so it can drip
one byte at a time, stall before its headers, stream for ever or announce 400 MiB. The
library's fetch bound is a total deadline (connect, headers, every redirect and the whole
body), asserted here as wall time measured from outside the call; a body is refused at the
size limit while it is read, which a child process's peak memory shows.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers_http import isolate_loopback_env
from wf_magic.library import FetchError, Library
from wf_magic.library_index import MAX_DOCUMENT_BYTES

Behaviour = Callable[[socket.socket, threading.Event], None]
DEADLINE_S = 1.5
SLACK_S = 1.0
"""What the cut may take past the deadline on a loaded machine (the watchdog, the unwind)."""


class HostileServer:
    """A loopback TCP server whose every connection runs ``behaviour`` in its own thread."""

    def __init__(self, behaviour: Behaviour, *, tls: ssl.SSLContext | None = None) -> None:
        self.behaviour = behaviour
        self.tls = tls
        self.stopping = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.sent = 0
        self.accepted = threading.Thread(target=self._accept, name="hostile-accept")
        self.accepted.start()

    def url(self, path: str = "/index.json", *, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        self.listener.settimeout(0.05)
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            worker = threading.Thread(target=self._serve, args=(conn,), name="hostile-conn")
            self.threads.append(worker)
            worker.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                if self.tls is None:
                    self._answer(conn)
                else:
                    with self.tls.wrap_socket(conn, server_side=True) as tls:
                        self._answer(tls)
            except OSError:
                pass  # the client gave up: what the tests want

    def _answer(self, conn: socket.socket) -> None:
        _read_request(conn)
        self.behaviour(conn, self.stopping)

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        self.accepted.join()
        for worker in self.threads:
            worker.join()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _drip(conn: socket.socket, stopping: threading.Event, data: bytes, every_s: float) -> None:
    for i in range(len(data)):
        if stopping.wait(every_s):
            return
        conn.sendall(data[i : i + 1])


def drip_body(conn: socket.socket, stopping: threading.Event) -> None:
    """Headers at once, then the body one byte a second (each read well under any timeout)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    _drip(conn, stopping, b"w" * 1000, 1.0)


def drip_fast_body(conn: socket.socket, stopping: threading.Event) -> None:
    """A byte every 0.2 s: a per-read timeout never fires, only a total deadline can."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    _drip(conn, stopping, b"w" * 1000, 0.2)


def drip_headers(conn: socket.socket, stopping: threading.Event) -> None:
    """The status line and headers, one byte every 0.2 s, never finished."""
    _drip(conn, stopping, b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000, 0.2)


def never_answer(conn: socket.socket, stopping: threading.Event) -> None:
    """The request is read; nothing ever comes back."""
    stopping.wait(30)


def drip_close_delimited(conn: socket.socket, stopping: threading.Event) -> None:
    """No Content-Length (the body ends when the connection does): a cut looks complete."""
    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nworkflows: {}\n")
    _drip(conn, stopping, b"#" * 1000, 0.2)


def endless_chunked(conn: socket.socket, stopping: threading.Event) -> None:
    """A chunked body that never ends, as fast as the client reads."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
    while not stopping.is_set():
        conn.sendall(chunk)


def endless_close_delimited(conn: socket.socket, stopping: threading.Event) -> None:
    """No length, no chunks: bytes until the connection closes, which it never does."""
    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
    block = b"y" * 65536
    while not stopping.is_set():
        conn.sendall(block)


def announces_400_mib(conn: socket.socket, stopping: threading.Event) -> None:
    """A Content-Length of 400 MiB, then the bytes as fast as they are read."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (400 * 2**20))
    block = b"z" * 65536
    while not stopping.is_set():
        conn.sendall(block)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WF_MAGIC_PATH", "WF_MAGIC_INDEX", "WF_MAGIC_LIBRARY_TTL"):
        monkeypatch.delenv(name, raising=False)
    isolate_loopback_env(monkeypatch)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], HostileServer]]:
    servers: list[HostileServer] = []

    def start(behaviour: Behaviour) -> HostileServer:
        servers.append(HostileServer(behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def _find(index: str, state_dir: Path, *, timeout_s: float = DEADLINE_S) -> tuple[str, float]:
    """Look ``review`` up through ``index``: the one-line error and the wall time taken."""
    started = time.monotonic()
    with (
        Library(folders=[], index=index, state_dir=state_dir, timeout_s=timeout_s) as library,
        pytest.raises(FetchError) as caught,
    ):
        library.find("review")
    return str(caught.value), time.monotonic() - started


@pytest.mark.parametrize(
    "behaviour",
    [drip_body, drip_fast_body, drip_headers, never_answer, drip_close_delimited],
    ids=lambda b: b.__name__,
)
def test_a_server_that_drips_or_stalls_is_cut_at_the_total_deadline(
    serve: Callable[[Behaviour], HostileServer], tmp_path: Path, behaviour: Behaviour
) -> None:
    server = serve(behaviour)
    message, took = _find(server.url(), tmp_path / "state")
    assert DEADLINE_S - 0.05 <= took < DEADLINE_S + SLACK_S, took
    assert "\n" not in message
    assert f"Cannot fetch the workflow index {server.url()} (looking up 'review'): " in message
    assert f"timed out after {DEADLINE_S:g} s (connect, headers and body together)" in message
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]  # no watchdog


def test_the_deadline_spans_redirects(
    serve: Callable[[Behaviour], HostileServer], tmp_path: Path
) -> None:
    # Each hop answers in time for a per-hop timeout; together they outlast the deadline.
    target = serve(drip_fast_body)

    def slow_redirect(conn: socket.socket, stopping: threading.Event) -> None:
        stopping.wait(0.9)
        location = target.url().encode()
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % location)

    hop = serve(slow_redirect)
    message, took = _find(hop.url(), tmp_path / "state")
    assert DEADLINE_S - 0.05 <= took < DEADLINE_S + SLACK_S, took
    assert "timed out after 1.5 s" in message


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        (endless_chunked, f"larger than {MAX_DOCUMENT_BYTES} bytes;"),
        (endless_close_delimited, f"larger than {MAX_DOCUMENT_BYTES} bytes;"),
        (announces_400_mib, f"larger than {MAX_DOCUMENT_BYTES} bytes (it announces 419430400)"),
    ],
    ids=["endless chunked", "endless close-delimited", "announces 400 MiB"],
)
def test_a_body_past_the_bound_is_refused_while_it_is_read(
    serve: Callable[[Behaviour], HostileServer], tmp_path: Path, behaviour: Behaviour, reason: str
) -> None:
    server = serve(behaviour)
    message, took = _find(server.url(), tmp_path / "state", timeout_s=30)
    assert reason in message, message
    assert "\n" not in message
    assert took < 10  # refused at the bound, not at the deadline


PEAK_PROBE = textwrap.dedent(
    """
    import resource, sys
    from wf_magic.library import FetchError, Library
    if sys.argv[1] != "-":
        try:
            with Library(folders=[], index=sys.argv[1], state_dir=sys.argv[2]) as library:
                library.find("review")
        except FetchError as exc:
            print(exc)
    print("peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """
)


def _peak_kib(index: str, state_dir: Path) -> tuple[int, str]:
    """A child process's peak resident memory (KiB) after looking ``review`` up, and its output."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK_PROBE, index, str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    lines = done.stdout.strip().splitlines()
    return int(lines[-1].split()[1]), "\n".join(lines[:-1])


@pytest.mark.parametrize("behaviour", [endless_close_delimited, announces_400_mib])
def test_peak_memory_stays_near_the_bound_whatever_the_server_sends(
    serve: Callable[[Behaviour], HostileServer], tmp_path: Path, behaviour: Behaviour
) -> None:
    server = serve(behaviour)
    baseline, _ = _peak_kib("-", tmp_path / "idle")
    peak, shown = _peak_kib(server.url(), tmp_path / "state")
    assert f"larger than {MAX_DOCUMENT_BYTES} bytes" in shown
    # The bound (1 MB) plus a read chunk, SQLite's cache and slack: far from 400 MiB.
    assert peak - baseline < 24 * 1024, (baseline, peak)


def test_a_prompt_server_is_unaffected(
    tmp_path: Path, serve: Callable[[Behaviour], HostileServer]
) -> None:
    body = b'{"workflows": {}}'

    def prompt(conn: socket.socket, stopping: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    server = serve(prompt)
    with Library(folders=[], index=server.url(), state_dir=tmp_path / "s", timeout_s=5) as lib:
        started = time.monotonic()
        assert lib.find_optional("review") is None
        assert time.monotonic() - started < 2


# -- https --------------------------------------------------------------------------------------
@pytest.fixture
def tls_server_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ssl.SSLContext:
    """A self-signed certificate for 127.0.0.1, trusted by the fetch through $SSL_CERT_FILE."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_an_https_index_is_fetched_through_the_watched_tls_socket(
    tmp_path: Path, tls_server_context: ssl.SSLContext
) -> None:
    body = b'{"workflows": {}}'

    def prompt(conn: socket.socket, stopping: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    server = HostileServer(prompt, tls=tls_server_context)
    try:
        index = server.url(scheme="https")
        with Library(folders=[], index=index, state_dir=tmp_path / "s", timeout_s=5) as lib:
            assert lib.find_optional("review") is None  # fetched, verified, parsed: no entry
    finally:
        server.stop()


def test_an_https_server_that_drips_its_body_is_cut_at_the_deadline(
    tmp_path: Path, tls_server_context: ssl.SSLContext
) -> None:
    server = HostileServer(drip_fast_body, tls=tls_server_context)
    try:
        message, took = _find(server.url(scheme="https"), tmp_path / "state")
    finally:
        server.stop()
    assert DEADLINE_S - 0.05 <= took < DEADLINE_S + SLACK_S, took
    assert "timed out after 1.5 s" in message


def test_a_tls_handshake_that_never_comes_is_cut_at_the_deadline(
    serve: Callable[[Behaviour], HostileServer], tmp_path: Path
) -> None:
    server = serve(never_answer)  # accepts the connection, never says ServerHello
    message, took = _find(server.url(scheme="https"), tmp_path / "state")
    assert DEADLINE_S - 0.05 <= took < DEADLINE_S + SLACK_S, took
    assert "timed out after 1.5 s" in message


@pytest.mark.parametrize(
    ("ttl_s", "timeout_s"),
    [
        (-1.0, 10.0),
        (float("nan"), 10.0),
        (1.0, 0.0),
        (1.0, -2.0),
        (1.0, float("nan")),
        (1.0, float("inf")),
    ],
)
def test_a_deadline_or_ttl_that_is_no_duration_is_refused(ttl_s: float, timeout_s: float) -> None:
    from wf_magic.errors import UsageError

    with pytest.raises(UsageError, match=r"expected ttl_s >= 0 and a finite timeout_s > 0 \(got "):
        Library(folders=[], ttl_s=ttl_s, timeout_s=timeout_s)
