"""The ``openai`` runner's reply: one chat completion read whole, or streamed chunk by chunk
(text shown as it grows, usage from the last chunk that has one, a stream cut before its
finish reason refused), and what the runner keeps of it.

A completion read whole (nobody watches the unit live) skips the SDK's object layer: the
request goes out on the SDK client's own HTTP client (the same connection pool, proxies,
byte bound and headers) as a JSON body this module writes, and the reply is read as JSON.
Measured at 32 calls in flight against a loopback server, the SDK's request building,
transforming and response models cost ~0.9 ms of CPU per call over the HTTP client alone
(1.5 vs 0.6 ms), the largest single part of a sweep cell's CPU. Errors stay the SDK's own:
a status over 299 is raised as the exception ``openai`` would raise
(``_make_status_error_from_response``), a timeout as ``APITimeoutError`` and any other
transport failure as ``APIConnectionError`` wrapping it, so every server quirk the runner
handles is handled the same way on both paths. A streamed reply keeps the SDK.
"""

from __future__ import annotations

import json
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..errors import RunnerError
from .textsink import TEXT_EVERY_S

if TYPE_CHECKING:
    from openai import AsyncOpenAI, AsyncStream
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

PutText = Callable[[str], None]
"""Shows the text of a streamed answer so far."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """What the runner keeps of a completion, streamed or not."""

    content: str | None
    refusal: str | None = None
    usage: tuple[int | None, int | None] | None = None
    """(prompt tokens, completion tokens) as the server reported them; None where it did not
    (a field missing or null is unknown, never 0)."""
    model: str | None = None
    completion_id: str | None = None

    @classmethod
    def of(cls, completion: ChatCompletion) -> Reply:
        message = completion.choices[0].message if completion.choices else None
        usage = completion.usage
        return cls(
            content=message.content if message is not None else None,
            refusal=getattr(message, "refusal", None) if message is not None else None,
            usage=usage_of(usage),
            model=completion.model,
            completion_id=completion.id,
        )


async def create_reply(
    client: AsyncOpenAI, kwargs: dict[str, Any], put_text: PutText | None
) -> Reply:
    lean = _lean_of(client) if put_text is None else None
    if lean is not None:
        return await lean.complete(client, kwargs)
    # The overloads (stream or not) collapse to Any under **kwargs.
    create = cast("Callable[..., Awaitable[Any]]", client.chat.completions.create)
    if put_text is None:
        return Reply.of(cast("ChatCompletion", await create(**kwargs)))
    stream = cast(
        "AsyncStream[ChatCompletionChunk]",
        await create(**kwargs, stream=True, stream_options={"include_usage": True}),
    )
    async with stream:
        return await read_stream(stream, put_text)


async def read_stream(stream: AsyncStream[ChatCompletionChunk], put_text: PutText) -> Reply:
    """The reply assembled from a stream's chunks; usage comes with the last one.

    Raises:
        RunnerError: transient, when the stream ended before a chunk gave a finish reason.
    """
    from openai.types.chat import ChatCompletion

    response = stream.response
    if "json" in response.headers.get("content-type", ""):
        # The server ignored ``stream``: its answer is an ordinary completion.
        await response.aread()
        return Reply.of(ChatCompletion.model_validate(response.json()))
    parts: list[str] = []
    refusal: list[str] = []
    usage: tuple[int | None, int | None] | None = None
    model = completion_id = None
    has_content = is_finished = False
    shown_at = float("-inf")
    async for chunk in stream:
        model, completion_id = chunk.model or model, chunk.id or completion_id
        is_finished = is_finished or any(c.finish_reason for c in chunk.choices or ())
        if chunk.usage is not None:
            # The last usage seen wins, never a sum: vLLM's continuous usage and Gemini's
            # compatible endpoint send running totals in every chunk.
            usage = usage_of(chunk.usage) or usage
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        if delta.content is not None:
            has_content = True
            parts.append(delta.content)
            if time.monotonic() - shown_at >= TEXT_EVERY_S / 2:  # joining is not free
                shown_at = time.monotonic()
                put_text("".join(parts))
        if getattr(delta, "refusal", None):
            refusal.append(str(delta.refusal))
    if not is_finished:
        raise RunnerError(
            "the answer was cut off mid-way: the stream ended before the model said it had "
            f"finished ({len(parts)} text chunks read)",
            transient=True,
        )
    text = "".join(parts)
    put_text(text)
    return Reply(
        content=text if has_content else None,
        refusal="".join(refusal) or None,
        usage=usage,
        model=model,
        completion_id=completion_id,
    )


def usage_of(usage: Any) -> tuple[int | None, int | None] | None:
    """(prompt, completion) tokens of a usage object or mapping; None for no usage at all."""
    if usage is None:
        return None
    if isinstance(usage, Mapping):
        counts = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
    else:
        counts = (getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None))
    if counts == (None, None):
        return None
    return (
        None if counts[0] is None else int(counts[0]),
        None if counts[1] is None else int(counts[1]),
    )


_NOT_SENT = frozenset({"timeout", "extra_headers"})
"""``create`` keywords that are no part of the request body."""


class _Lean:
    """One SDK client's HTTP client, completions URL and headers, for :func:`create_reply`'s
    read-whole path."""

    __slots__ = ("__weakref__", "headers", "http", "library", "url")

    def __init__(self, client: AsyncOpenAI, http: Any) -> None:
        self.http = http
        self.library = _library_of(http)
        self.url = str(client.base_url).rstrip("/") + "/chat/completions"
        # The SDK's own headers (user agent, platform), minus the ones it leaves out.
        headers = {k: v for k, v in client.default_headers.items() if isinstance(v, str)}
        headers["Authorization"] = f"Bearer {client.api_key}"
        self.headers = headers

    async def complete(self, client: AsyncOpenAI, kwargs: Mapping[str, Any]) -> Reply:
        import openai

        body = json.dumps({k: v for k, v in kwargs.items() if k not in _NOT_SENT}).encode()
        request = self.http.build_request(
            "POST",
            self.url,
            content=body,
            headers={**self.headers, **kwargs.get("extra_headers", {})},
            timeout=kwargs.get("timeout"),
        )
        try:
            response = await self.http.send(request)
        except self.library.TimeoutException as exc:
            raise openai.APITimeoutError(request=request) from exc
        except Exception as exc:  # what the SDK wraps the same way (a cut body, a refusal)
            raise openai.APIConnectionError(request=request) from exc
        if not response.is_success:
            raise client._make_status_error_from_response(response)
        return _reply_of(json.loads(response.content))


def _library_of(http: Any) -> Any:
    """httpx or httpx2, whichever made ``http`` (the SDK subclasses its client)."""
    for cls in type(http).__mro__:
        root = cls.__module__.split(".", 1)[0]
        if root.startswith("httpx"):
            return sys.modules[root]
    raise TypeError(f"{type(http).__name__} is no httpx client")


_LEAN: weakref.WeakKeyDictionary[Any, _Lean] = weakref.WeakKeyDictionary()


def _lean_of(client: AsyncOpenAI) -> _Lean | None:
    """The read-whole path of ``client``, or None where the SDK's internals it relies on are
    not there (another SDK version): then the SDK's own ``create`` runs."""
    lean = _LEAN.get(client)
    if lean is None:
        http = getattr(client, "_client", None)
        if http is None or not hasattr(client, "_make_status_error_from_response"):
            return None
        try:
            lean = _Lean(client, http)
        except TypeError:  # not an httpx client
            return None
        _LEAN[client] = lean
    return lean


def _reply_of(data: Any) -> Reply:
    """What the runner keeps of a completion's JSON; a shape that has no message reads as a
    reply without text (the runner then says it got none)."""
    if not isinstance(data, Mapping):
        raise RunnerError(
            f"the server's answer is no chat completion (a JSON {type(data).__name__})"
        )
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, Mapping) else None
    if not isinstance(message, Mapping):
        message = {}
    return Reply(
        content=message.get("content"),
        refusal=message.get("refusal"),
        usage=usage_of(data.get("usage")),
        model=data.get("model"),
        completion_id=data.get("id"),
    )
