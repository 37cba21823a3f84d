"""Model calls over HTTP under a total deadline and a byte bound, for the model runners.

A step's ``timeout:`` is a deadline for the whole attempt — connecting, the first byte, the
whole body or stream, and any second request the attempt makes — not a limit on each read.
The ``openai`` and ``pydantic-ai`` runners run their calls as coroutines on an
:class:`AttemptLoop` (one private event-loop thread per runner), each under
``asyncio.timeout``: at the deadline the call is cancelled wherever it is, its connection is
closed, and the attempt fails as a transient timeout. A server that drips one byte a second or
streams for ever is cut there; nothing of the call keeps running.

Every response body is read through :func:`bounded_client`'s hooks, which count its bytes as
they arrive and stop at :data:`MAX_BODY_BYTES` (the output bound): a 400 MiB answer or an
endless stream fails the attempt with :class:`BodyOverBound` (permanent, one line) having
held at most the bound. Compression is declined (``Accept-Encoding: identity``) so the bytes
counted are the bytes kept.

A body cut mid-way (a reset, a truncated event stream, httpx's ``RemoteProtocolError``) is a
transient failure: :func:`is_cut_off` tells it apart wherever an SDK wrapped it.

The ``llm`` runner cannot give llm's plugins a client; its calls run in a thread abandoned
at the deadline (``runners/function.py``), and a streamed one stops reading at its next chunk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..errors import RunnerError
from ..redact import mask_text
from .textsink import TextSink

if TYPE_CHECKING:
    import httpx

T = TypeVar("T")

MAX_BODY_BYTES = 10_000_000
"""The most bytes of one response body read (equal to the drive's output bound,
``drive.outcomes.MAX_OUTPUT_BYTES``, which runners sit below)."""
GRACE_S = 5.0
"""How long past its deadline a unit's thread waits for a cancelled call to wind up."""
_CUT_OFF_NAMES = ("RemoteProtocolError", "ReadError", "IncompleteRead", "ChunkedEncodingError")


class BodyOverBound(RunnerError):
    """A response body passed :data:`MAX_BODY_BYTES` while it was read (permanent)."""

    def __init__(self, *, size: int | None = None) -> None:
        said = f"{size:,} bytes long" if size is not None else f"over {MAX_BODY_BYTES:,} bytes"
        super().__init__(
            f"the server's answer is {said}, over the output bound of {MAX_BODY_BYTES:,} "
            "bytes; it was refused without being kept (ask for a shorter answer)"
        )


REPLIED = "wf_magic.replied"
"""The request extension :func:`bounded_hooks` sets once the reply's status line arrived."""


def bounded_hooks(cap: int = MAX_BODY_BYTES) -> dict[str, list[Callable[[Any], Any]]]:
    """``event_hooks`` for an ``httpx.AsyncClient``: identity encoding asked for, every
    response body read through a counter that stops at ``cap`` bytes, and each request whose
    reply began marked (:func:`cut_words` tells a connection lost before the reply from a
    body cut mid-way)."""

    async def on_request(request: httpx.Request) -> None:
        request.headers["Accept-Encoding"] = "identity"

    async def on_response(response: httpx.Response) -> None:
        response.request.extensions[REPLIED] = True  # the status line and headers arrived
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > cap:
            await response.aclose()
            raise BodyOverBound(size=int(length))
        response.stream = _bounded_stream(response.stream, cap, response)

    return {"request": [on_request], "response": [on_response]}


def bounded_client(**kwargs: Any) -> Any:
    """An ``AsyncClient`` of httpx2 (what the provider SDKs now take), else of httpx, with
    :func:`bounded_hooks`; ``kwargs`` as that library takes them."""
    import importlib

    try:
        library: Any = importlib.import_module("httpx2")
    except ImportError:
        library = importlib.import_module("httpx")
    return library.AsyncClient(event_hooks=bounded_hooks(), **kwargs)


def _bounded_stream(inner: Any, cap: int, response: Any) -> Any:
    import importlib

    # httpx, or httpx2 (which the openai SDK has moved to): the stream's base class must be
    # the one of the library that made the response.
    library = importlib.import_module(type(response).__module__.split(".", 1)[0])

    class BoundedStream(library.AsyncByteStream):  # type: ignore[misc,name-defined]
        """The body's chunks, refused past ``cap`` bytes in all."""

        async def __aiter__(self) -> AsyncIterator[bytes]:
            seen = 0
            async for chunk in inner:
                seen += len(chunk)
                if seen > cap:
                    raise BodyOverBound()
                yield chunk

        async def aclose(self) -> None:
            await inner.aclose()

    return BoundedStream()


def over_bound(exc: BaseException) -> BodyOverBound | None:
    """The :class:`BodyOverBound` behind ``exc`` (an SDK may have wrapped it), if any."""
    return next((e for e in _chain(exc) if isinstance(e, BodyOverBound)), None)


def is_cut_off(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is a connection or body cut mid-way: transient."""
    for link in _chain(exc):
        if isinstance(link, ConnectionResetError | ConnectionAbortedError | EOFError):
            return True
        if any(name in type(link).__name__ for name in _CUT_OFF_NAMES):
            return True
    return False


def had_reply(exc: BaseException) -> bool:
    """Whether the reply had begun (its status line arrived, :func:`bounded_hooks` marked
    it) to the request that ``exc``, or an error it wraps, failed."""
    for link in _chain(exc):
        try:
            request = getattr(link, "request", None)  # httpx's raises when it has none
        except RuntimeError:
            continue
        if getattr(request, "extensions", {}).get(REPLIED):
            return True
    return False


def cut_words(exc: BaseException, *, cap: int = 500) -> str:
    """What a cut connection did, with its innermost cause: ``the answer was cut off mid-way
    (Connection reset by peer)`` or ``the server closed the connection before replying
    (…)``. Both are transient; the words tell a user where it broke."""
    said = ""
    for link in _chain(exc):
        text = link.strerror if isinstance(link, OSError) and link.strerror else str(link)
        said = text or said
    cause = mask_text(said).rstrip(".") or type(exc).__name__
    if len(cause) > cap:
        cause = cause[: cap - 1] + "…"
    what = (
        "the answer was cut off mid-way"
        if had_reply(exc)
        else "the server closed the connection before replying"
    )
    return f"{what} ({cause})"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(seen) < 20 and link not in seen:
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen


class AttemptLoop:
    """A private event loop on its own daemon thread, started on first use; calls from any
    unit thread run on it under a total deadline. ``close`` ends the thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def call(
        self,
        make: Callable[[Callable[[str], None] | None], Awaitable[T]],
        *,
        timeout_s: float,
        on_text: Callable[[str], None] | None = None,
    ) -> T:
        """``await make(put_text)`` on the loop, cancelled ``timeout_s`` after now.

        ``put_text`` (None unless ``on_text`` is set) takes the streamed text so far; it
        reaches ``on_text`` from the calling thread, throttled by a :class:`TextSink`, and the
        last text put is passed on once more as the final one.

        Raises:
            TimeoutError: the deadline passed (the call was cancelled).
            Exception: whatever the call raised.
        """
        texts: queue.SimpleQueue[str | None] = queue.SimpleQueue()  # None: the call ended
        sink = None if on_text is None else TextSink(on_text)

        async def bounded() -> T:
            async with asyncio.timeout(max(0.0, timeout_s)):
                return await make(texts.put if sink is not None else None)

        future = asyncio.run_coroutine_threadsafe(bounded(), self._running())
        future.add_done_callback(lambda _done: texts.put(None))
        give_up_at = time.monotonic() + max(0.0, timeout_s) + GRACE_S
        latest: str | None = None
        try:
            while True:
                try:
                    text = texts.get(timeout=max(0.0, give_up_at - time.monotonic()))
                except queue.Empty:
                    raise TimeoutError(
                        f"the call did not wind up {GRACE_S:g}s past its deadline"
                    ) from None
                if text is None:
                    break
                latest = text
                if sink is not None and sink.is_due:
                    sink.offer(latest)
            result = future.result()
            latest = _latest(texts, latest)
            if sink is not None and latest is not None:
                sink.offer(latest, final=True)
            return result
        finally:
            future.cancel()  # a no-op once done; else (an interrupt) the call stops too

    def run(self, coro: Awaitable[T], *, timeout_s: float = GRACE_S) -> T:
        """``coro`` awaited on the loop (housekeeping such as closing a client)."""
        future = asyncio.run_coroutine_threadsafe(_awaited(coro), self._running())
        return future.result(timeout=timeout_s)

    def close(self, before: Callable[[], Awaitable[None]] | None = None) -> None:
        """Await ``before()`` on the loop (closing clients), then stop and join the thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return

        async def wind_up() -> None:
            try:
                if before is not None:
                    await before()
            finally:
                await loop.shutdown_default_executor()  # resolver threads, if any

        try:
            asyncio.run_coroutine_threadsafe(wind_up(), loop).result(timeout=GRACE_S)
        except Exception:  # noqa: S110 - closing must not fail a drive's exit
            pass
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=GRACE_S)
            if not thread.is_alive():
                loop.close()

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; its future (cancelling it cancels the coroutine).

        Whatever ``coro`` raises reaches the future, a ``KeyboardInterrupt`` or
        ``SystemExit`` too (as from a worker thread): asyncio would re-raise those out of the
        loop, which would end the loop's thread and every call on it.
        """
        outer: concurrent.futures.Future[T] = concurrent.futures.Future()
        inner = asyncio.run_coroutine_threadsafe(_caught(coro), self.running())

        def settle(done: concurrent.futures.Future[tuple[bool, Any]]) -> None:
            if done.cancelled():
                outer.cancel()
                return
            error = done.exception()
            ok, value = (False, error) if error is not None else done.result()
            if not outer.set_running_or_notify_cancel():
                return  # cancelled meanwhile: nobody waits for it
            if ok:
                outer.set_result(cast(T, value))
            else:
                outer.set_exception(cast(BaseException, value))

        def forward_cancel(done: concurrent.futures.Future[T]) -> None:
            if done.cancelled():
                inner.cancel()

        outer.add_done_callback(forward_cancel)
        inner.add_done_callback(settle)
        return outer

    def running(self) -> asyncio.AbstractEventLoop:
        """The loop, its thread started on first use (again in a forked child process)."""
        return self._running()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's loop thread is not here
                self._loop, self._thread, self._pid = None, None, os.getpid()
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name=f"{self.name}-runner-loop", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop


async def _awaited(coro: Awaitable[T]) -> T:
    return await coro


async def _caught(coro: Awaitable[T]) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, what it raised)``: nothing but a cancellation escapes."""
    try:
        return True, await coro
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's future
        return False, exc


def _latest(texts: queue.SimpleQueue[str | None], latest: str | None) -> str | None:
    """The last text put so far (``latest`` when none came since)."""
    while True:
        try:
            latest = texts.get_nowait() or latest
        except queue.Empty:
            return latest
