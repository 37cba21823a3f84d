"""Model servers that misbehave (issue 31, items 6-9), for each model runner that can meet
them: ``openai``, ``pydantic-ai`` (its ``openai:`` provider) and ``llm`` (an
OpenAI-compatible model from ``extra-openai-models.yaml``), all against the real loopback
server of tests/hostile_server.py, driven by the engine and read back from the journal.

Deadlines are asserted from the outside, by the wall clock, with a stated margin; the
memory bound of a huge answer is measured on a child process by the kernel (``wait4``'s
``ru_maxrss``); no test leaves a thread behind.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import llm
import openai
import pydantic_ai.direct
import pytest

from tests.helpers_http import isolate_loopback_env
from tests.hostile_server import REPLY, HostileChatServer, completion, stream_events
from wf_magic import Engine
from wf_magic.bus import Event
from wf_magic.store.records import AttemptRow

KEY_ENV = "WF_TEST_HOSTILE_KEY"
RUNNERS = ("openai", "pydantic-ai", "llm")
ABANDONING = (
    "openai",
    "pydantic-ai",
    # llm's plugin owns its HTTP client: a call abandoned at its deadline closes its socket
    # only when the garbage collector finalizes the plugin's stream (docs/runners.md).
    pytest.param(
        "llm",
        marks=[
            pytest.mark.filterwarnings("ignore::ResourceWarning"),
            pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
        ],
    ),
)
TIMEOUT_S = 1.0
MARGIN_S = 0.75
"""How far past its deadline an attempt may end: the cancellation, the journal write."""
BOUND = "over the output bound of 10,000,000 bytes"
MEMORY_BOUND_MIB = 64
"""A huge answer may raise a driver's peak RSS by at most this over a small answer's: the
10 MB bound, the bytes that count towards it and the SDK's parse of what was kept."""
SDKS = (llm, openai, pydantic_ai.direct)
"""Imported before any clock starts: an import's seconds are not the server's."""
PROVIDER_ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "WF_MAGIC_OPENAI_BASE_URL", "LLM_MODEL")


def hostile_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROVIDER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(KEY_ENV, "hostile-test-key")
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "llm-home"))
    isolate_loopback_env(monkeypatch)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hostile_env(tmp_path, monkeypatch)


def write_llm_home(tmp_path: Path, url: str) -> Path:
    """llm's config folder with the model ``hostile``: ``m1`` at ``url``."""
    home = tmp_path / "llm-home"
    home.mkdir(exist_ok=True)
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: hostile\n  model_name: m1\n  api_base: '{url}'\n  api_key_name: hostile\n",
        encoding="utf-8",
    )
    (home / "keys.json").write_text(json.dumps({"hostile": "hostile-test-key"}))
    return home


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HostileChatServer]:
    with HostileChatServer() as running:
        write_llm_home(tmp_path, running.url)
        yield running


def workflow(runner: str, url: str, *, step: str = "") -> str:
    """One prompt step on ``runner`` pointed at the hostile server."""
    options = {
        "openai": f"{{base_url: '{url}', api_key_env: {KEY_ENV}, model: m1}}",
        "pydantic-ai": f"{{model: 'openai-chat:m1', base_url: '{url}', api_key_env: {KEY_ENV}}}",
        "llm": "{model: hostile}",
    }[runner]
    return (
        f"name: hostile\nrunner: {runner}\nrunners:\n  {runner}: {options}\n"
        "steps:\n  - id: a\n    prompt: Outline tides.\n"
        + "".join(f"    {line}\n" for line in step.splitlines())
    )


def attempts(engine: Engine, run_id: str) -> list[AttemptRow]:
    return [a for a in engine.attempts(run_id) if a.phase == "work"]


def ours() -> set[threading.Thread]:
    """Live threads that are not the test server's."""
    return {
        t
        for t in threading.enumerate()
        if t.name != "hostile-chat-server" and "process_request" not in t.name
    }


@pytest.fixture(scope="module", autouse=True)
def warm_sdks(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each runner once, streamed and not, against a well-behaved server: an SDK's first
    call builds its models (seconds of CPU no deadline can interrupt), and a clock started
    here measures the server, not that."""
    state = tmp_path_factory.mktemp("warm")
    with pytest.MonkeyPatch.context() as monkeypatch:
        hostile_env(state, monkeypatch)
        with HostileChatServer("no_usage") as running:
            home = write_llm_home(state, running.url)
            monkeypatch.setenv("LLM_USER_PATH", str(home))
            for i, runner in enumerate(RUNNERS):
                for watched in (False, True):
                    status, reason, *_ = drive(
                        state / f"s{i}{watched}", workflow(runner, running.url), watched=watched
                    )
                    assert status == "completed", reason


def left_behind(before: set[threading.Thread], *, within_s: float = 5.0) -> list[str]:
    """The names of threads started since ``before`` still alive after ``within_s``."""
    give_up_at = time.monotonic() + within_s
    while True:
        extra = sorted(t.name for t in ours() - before if t.is_alive())
        if not extra or time.monotonic() > give_up_at:
            return extra
        time.sleep(0.05)


def drive(
    state: Path, src: str, *, watched: bool = False
) -> tuple[str, str | None, list[AttemptRow], float]:
    """Run ``src`` in a fresh engine: (status, reason, work attempts, wall seconds)."""
    engine = Engine(state)
    try:
        started = time.monotonic()
        run = engine.start(src)
        events: list[Event] = []
        unsubscribe = engine.subscribe(events.append) if watched else None
        try:
            done = engine.drive(run.run_id)
        finally:
            if unsubscribe is not None:
                unsubscribe()
        wall = time.monotonic() - started
        return done.status, done.reason, attempts(engine, run.run_id), wall
    finally:
        engine.close()


# -- 6: a deadline for the whole attempt --------------------------------------------------------
@pytest.mark.parametrize("runner", ABANDONING)
@pytest.mark.parametrize(("mode", "watched"), [("drip", False), ("drip", True), ("endless", True)])
def test_a_dripping_or_endless_answer_is_cut_at_the_step_timeout(
    server: HostileChatServer, tmp_path: Path, runner: str, mode: str, watched: bool
) -> None:
    server.mode = mode
    # Fast enough that llm's streamed reader reaches its next chunk soon after the deadline,
    # slow enough that the whole answer would take several deadlines.
    server.drip_s = 0.004
    before = ours()
    step = f"timeout: {TIMEOUT_S:g}\nretry: {{max_attempts: 2, backoff_s: 0}}"
    status, reason, rows, wall = drive(
        tmp_path / "s", workflow(runner, server.url, step=step), watched=watched
    )

    assert status == "failed"
    assert [(a.attempt, a.status, a.transient) for a in rows] == [
        (1, "failed", 1),
        (2, "failed", 1),
    ]
    for a in rows:
        assert f"timed out after {TIMEOUT_S:g}s" in (a.failure or "")
        assert a.finished_at is not None
        assert TIMEOUT_S - 0.05 <= a.finished_at - a.started_at <= TIMEOUT_S + MARGIN_S
    assert wall <= 2 * (TIMEOUT_S + MARGIN_S) + 1.0, wall
    assert server.requests == 2
    assert left_behind(before) == []
    if runner != "llm":  # llm's plugin owns its connection: see docs/runners.md
        assert eventually(lambda: len(server.disconnects) == 2)


def eventually(check: Callable[[], bool], *, within_s: float = 2.0) -> bool:
    give_up_at = time.monotonic() + within_s
    while not check():
        if time.monotonic() > give_up_at:
            return False
        time.sleep(0.02)
    return True


# -- 7: bodies bounded while they are read ------------------------------------------------------
@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("sized", [True, False])
def test_a_huge_answer_is_refused_at_the_output_bound_once(
    server: HostileChatServer, tmp_path: Path, runner: str, sized: bool
) -> None:
    server.mode, server.sized = "huge", sized
    before = ours()
    step = "retry: {max_attempts: 3, backoff_s: 0}"
    status, reason, rows, wall = drive(tmp_path / "s", workflow(runner, server.url, step=step))

    assert status == "failed"
    assert [(a.status, a.transient) for a in rows] == [("failed", 0)]  # permanent: not retried
    failure = rows[0].failure or ""
    assert BOUND in failure and "\n" not in failure
    assert wall < 20, wall  # 400 MiB were never read
    assert left_behind(before) == []


@pytest.mark.parametrize("runner", RUNNERS)
def test_an_endless_fast_stream_stops_at_the_output_bound(
    server: HostileChatServer, tmp_path: Path, runner: str
) -> None:
    # Big chunks: an SDK that re-joins the text at every chunk (pydantic-ai, llm) does work
    # quadratic in the number of chunks; ten of them reach the bound.
    server.mode, server.chunk_delay_s, server.chunk_chars = "endless", 0.0, 1_000_000
    status, reason, rows, _wall = drive(
        tmp_path / "s", workflow(runner, server.url, step="timeout: 60"), watched=True
    )
    assert status == "failed"
    assert [(a.status, a.transient) for a in rows] == [("failed", 0)]
    assert BOUND in (rows[0].failure or "")


CHILD = """
import json, sys
from wf_magic import Engine
engine = Engine(sys.argv[1])
run = engine.run(sys.argv[2])
print(json.dumps([run.status, run.reason]), flush=True)
engine.close()
"""


def peak_rss_mib(state: Path, src: str) -> tuple[float, str, str | None]:
    """The peak RSS (MiB, as the kernel counted it) of a child process running ``src``, and
    the run's status and reason."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(state), src],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ.copy(),
    )
    _pid, _status, usage = os.wait4(child.pid, 0)
    out, err = child.communicate()
    assert child.returncode == 0, err.decode()
    status, reason = json.loads(out.decode().strip().splitlines()[-1])
    return usage.ru_maxrss / 1024, status, reason  # Linux: ru_maxrss is in kilobytes


@pytest.mark.parametrize("runner", RUNNERS)
def test_peak_memory_of_a_huge_answer_stays_near_the_bound(
    server: HostileChatServer, tmp_path: Path, runner: str
) -> None:
    server.mode = "no_usage"
    small, status, _reason = peak_rss_mib(tmp_path / "small", workflow(runner, server.url))
    assert status == "completed"
    server.mode, server.sized = "huge", False  # no length announced: every byte is counted
    huge, status, reason = peak_rss_mib(tmp_path / "huge", workflow(runner, server.url))
    assert (status, BOUND in (reason or "")) == ("failed", True), reason
    # Holding the answer would add 400 MiB; the bound allows the 10 MB kept and its parse.
    assert huge - small < MEMORY_BOUND_MIB, (small, huge)


# -- 8: a body cut mid-way is transient ---------------------------------------------------------
@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("watched", [False, True])
def test_a_body_cut_midway_is_transient_and_retried(
    server: HostileChatServer, tmp_path: Path, runner: str, watched: bool
) -> None:
    server.mode = "cut"
    step = "retry: {max_attempts: 2, backoff_s: 0}"
    status, reason, rows, _wall = drive(
        tmp_path / "s", workflow(runner, server.url, step=step), watched=watched
    )
    assert status == "failed"
    assert [(a.status, a.transient) for a in rows] == [("failed", 1), ("failed", 1)]
    assert "runner raised" not in (reason or "")
    assert server.requests == 2


def test_a_cut_body_then_a_good_one_completes(server: HostileChatServer, tmp_path: Path) -> None:
    server.mode = "cut"
    step = "retry: {max_attempts: 2, backoff_s: 0}"
    engine = Engine(tmp_path / "s")
    try:
        run = engine.start(workflow("openai", server.url, step=step))
        # The first request is cut; the retry finds the server well again.
        original = server.mode

        def heal(event: Event) -> None:
            if event.kind == "unit_finished" or "failed" in event.kind:
                server.mode = "no_usage"

        unsubscribe = engine.subscribe(heal)
        try:
            done = engine.drive(run.run_id)
        finally:
            unsubscribe()
        assert original == "cut"
        assert done.status == "completed", done.reason
        assert done.output("a") == REPLY
        assert [(a.status, a.transient) for a in attempts(engine, run.run_id)] == [
            ("failed", 1),
            ("succeeded", None),
        ]
    finally:
        engine.close()


# -- 8b: a reset before the reply is not a cut answer --------------------------------------------
class ResettingServer:
    """A loopback server that reads each request whole, sends ``sent`` (nothing: it resets
    before replying; a status line, headers and half a body: mid-answer), then resets the
    connection (``SO_LINGER`` 0: an RST), or with ``is_orderly`` closes it (a FIN)."""

    def __init__(self, sent: bytes, *, is_orderly: bool = False) -> None:
        self.sent = sent
        self.is_orderly = is_orderly
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.05)  # accept() wakes to see stop(): a close alone does not
        self._stopping = threading.Event()
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}/v1"
        self._thread = threading.Thread(target=self._serve, name="hostile-chat-server")
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            conn.settimeout(5.0)
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(65536) or b"\r\n\r\n"
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                body = head.split(b"\r\n\r\n", 1)[1]
                while length and len(body) < int(length[1]):
                    body += conn.recv(65536) or b" " * int(length[1])
                if self.sent:
                    conn.sendall(self.sent)
                    time.sleep(0.2)  # the client reads the head before the reset arrives
                if not self.is_orderly:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._socket.close()


def half_an_answer(is_stream: bool) -> bytes:
    """A 200's status line and headers, then half of its body (of a JSON answer, or of an
    event stream's events)."""
    if is_stream:
        body = b"".join(stream_events(REPLY))
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    else:
        body = json.dumps(completion(REPLY)).encode()
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
    return head.encode() + body[: len(body) // 2]


@pytest.mark.parametrize(
    ("mid_answer", "is_orderly", "said"),
    [
        (
            False,
            False,
            "the server closed the connection before replying (Connection reset by peer)",
        ),
        (
            False,
            True,
            "the server closed the connection before replying (Server disconnected without "
            "sending a response)",
        ),
        (True, False, "the answer was cut off mid-way (Connection reset by peer)"),
    ],
)
@pytest.mark.parametrize("watched", [False, True])
def test_a_reset_before_the_reply_is_named_apart_from_a_reset_mid_answer(
    tmp_path: Path, mid_answer: bool, is_orderly: bool, said: str, watched: bool
) -> None:
    """All are transient; only a connection lost after the reply began cut an answer off."""
    sent = half_an_answer(watched) if mid_answer else b""
    server = ResettingServer(sent, is_orderly=is_orderly)
    try:
        step = "retry: {max_attempts: 2, backoff_s: 0}"
        status, reason, rows, _wall = drive(
            tmp_path / "s", workflow("openai", server.url, step=step), watched=watched
        )
    finally:
        server.stop()
    assert status == "failed"
    assert [(a.status, a.transient) for a in rows] == [("failed", 1), ("failed", 1)]
    assert (
        reason
        == f"step a: unit a failed: openai runner: unit a (model m1 at {server.url}): {said}."
    )


@pytest.mark.parametrize(
    ("mid_answer", "said"),
    [
        (False, "the server closed the connection before replying (Connection reset by peer)"),
        (True, "the answer was cut off mid-way (Connection reset by peer)"),
    ],
)
def test_pydantic_ai_names_a_reset_before_the_reply_apart_from_one_mid_answer(
    tmp_path: Path, mid_answer: bool, said: str
) -> None:
    """The reply mark is set by the bounded hooks every bounded client has, not by one runner."""
    sent = half_an_answer(False) if mid_answer else b""
    server = ResettingServer(sent, is_orderly=False)
    try:
        status, reason, rows, _wall = drive(
            tmp_path / "s", workflow("pydantic-ai", server.url, step="retry: {max_attempts: 1}")
        )
    finally:
        server.stop()
    assert status == "failed"
    assert [(a.status, a.transient) for a in rows] == [("failed", 1)]
    assert reason is not None and reason.startswith("step a: unit a failed: pydantic-ai runner")
    assert reason.endswith(f": {said}."), reason
