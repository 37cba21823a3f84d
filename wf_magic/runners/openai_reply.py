"""The ``openai`` runner's reply: one chat completion read whole, or streamed chunk by chunk
(text shown as it grows, usage from the last chunk that has one, a stream cut before its
finish reason refused), and what the runner keeps of it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
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
    """(prompt, completion) tokens of a usage object; None for no usage at all."""
    if usage is None:
        return None
    counts = (getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None))
    if counts == (None, None):
        return None
    return (
        None if counts[0] is None else int(counts[0]),
        None if counts[1] is None else int(counts[1]),
    )
