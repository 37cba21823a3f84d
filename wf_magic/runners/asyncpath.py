"""What a runner's ``arun`` shares: one client per event loop, and a call under a deadline.

A runner's ``async def arun(request) -> UnitResult`` is awaited on whatever loop the caller
runs: the drive's model loop (``drive/modelloop.py``), a user's own loop, or the runner's
private :class:`~wf_magic.runners.bounded_http.AttemptLoop` behind its blocking ``run``. An
async HTTP client belongs to the loop it first ran on, so :class:`LoopClients` keeps one per
loop and closes each on its own loop. :func:`within` is ``AttemptLoop.call`` for a caller
that is already on a loop: the call under a total deadline, its streamed text throttled to
``on_text`` by a :class:`TextSink` and passed on once more, whole, at the end.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from .bounded_http import GRACE_S
from .textsink import TextSink

C = TypeVar("C")
T = TypeVar("T")
PutText = Callable[[str], None]


class LoopClients(Generic[C]):
    """One client per event loop, made by ``make`` on the first call from that loop."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._clients: dict[asyncio.AbstractEventLoop, C] = {}

    def get(self, loop: asyncio.AbstractEventLoop) -> C:
        """The client of ``loop`` (made now if it has none; ``make``'s errors propagate)."""
        with self._lock:
            client = self._clients.get(loop)
            if client is None:
                client = self._clients[loop] = self._make()
            return client

    def all(self) -> list[C]:
        """The clients made so far (and not yet closed)."""
        with self._lock:
            return list(self._clients.values())

    def take(self, loop: asyncio.AbstractEventLoop | None) -> C | None:
        """Forget ``loop``'s client and return it (None: it had none)."""
        with self._lock:
            return None if loop is None else self._clients.pop(loop, None)

    def close_all(self, close: Callable[[C], Awaitable[None]]) -> None:
        """Close every client on its own loop; a loop that is gone takes its client with it.

        Never raises: closing must not fail a drive's exit.
        """
        with self._lock:
            clients, self._clients = self._clients, {}
        for loop, client in clients.items():
            if loop.is_closed() or not loop.is_running():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:  # closing from the loop itself: it cannot wait on itself
                loop.create_task(_quietly(close(client)))
                continue
            try:
                asyncio.run_coroutine_threadsafe(_quietly(close(client)), loop).result(GRACE_S)
            except Exception:  # noqa: S110 - a loop that does not answer keeps its client
                pass


class SharedClients(Generic[C]):
    """Clients shared by every runner on a loop, one per settings (endpoint, timeout, key
    digest): a sweep's cells, each with a runner of its own, reuse one client and its open
    connections instead of each making a client, a TLS context and new connections.

    At most ``most`` are kept; one pushed out is closed on its loop ``grace_s`` later (a call
    still using it has that long to end). Clients of a closed loop are forgotten.
    """

    def __init__(
        self,
        close: Callable[[C], Awaitable[None]],
        *,
        most: int = 32,
        grace_s: float = 600.0,
    ) -> None:
        self._close = close
        self._most = most
        self._grace_s = grace_s
        self._lock = threading.Lock()
        self._clients: dict[tuple[asyncio.AbstractEventLoop, Hashable], C] = {}

    def get(self, loop: asyncio.AbstractEventLoop, settings: Hashable, make: Callable[[], C]) -> C:
        """The client of ``settings`` on ``loop`` (made by ``make`` now if there is none;
        ``make``'s errors propagate). Called on ``loop`` itself."""
        key = (loop, settings)
        with self._lock:
            client = self._clients.pop(key, None)
            if client is not None:
                self._clients[key] = client  # the most recently used last
                return client
        made = make()
        with self._lock:
            client = self._clients.setdefault(key, made)
            stale = [k for k in self._clients if k[0].is_closed()]
            for k in stale:
                del self._clients[k]
            while len(self._clients) > self._most:
                old_key = next(iter(self._clients))
                old = self._clients.pop(old_key)
                if not old_key[0].is_closed():  # its loop may be another thread's
                    old_key[0].call_soon_threadsafe(
                        old_key[0].call_later, self._grace_s, self._closing, old
                    )
        if client is not made:  # another call made one first
            loop.create_task(_quietly(self._close(made)))
        return client

    def _closing(self, client: C) -> None:
        asyncio.ensure_future(_quietly(self._close(client)))


async def within(
    make: Callable[[PutText | None], Awaitable[T]],
    *,
    timeout_s: float,
    on_text: Callable[[str], None] | None = None,
) -> T:
    """``await make(put_text)`` cancelled ``timeout_s`` after now (``TimeoutError``).

    ``put_text`` (None unless ``on_text`` is set) takes the streamed text so far; it reaches
    ``on_text`` at most every ``TEXT_EVERY_S`` seconds and once more, whole, at the end.
    """
    sink = None if on_text is None else TextSink(on_text)
    latest: list[str] = []

    def put(text: str) -> None:
        latest[:] = [text]
        if sink is not None and sink.is_due:
            sink.offer(text)

    async with asyncio.timeout(max(0.0, timeout_s)):
        result = await make(put if sink is not None else None)
    if sink is not None and latest:
        sink.offer(latest[0], final=True)
    return result


async def _quietly(call: Awaitable[None]) -> None:
    try:
        await call
    except Exception:  # noqa: S110 - closing must not fail a drive's exit
        pass
