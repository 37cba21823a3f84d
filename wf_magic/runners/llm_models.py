"""The ``llm`` runner: a unit through any model simonw/llm knows (its plugins, keys and aliases).

Plan options (``runners: {llm: {...}}``; none of them is a secret):

- ``model``: an llm model id or alias (``llm models`` lists them); a step's ``model:`` wins;
  else llm's default model.
- ``system``: a system prompt; ``options``: the model's own options (``temperature``, …).
- ``api_key_env``: the NAME of a variable holding the key (else llm's stored keys and the
  model's own variable); ``timeout_s``; ``prices``; ``local``.

Usage comes from the response (llm's ``response.usage()``); a count a model does not report
is None (NULL in the journal, never estimated) and the cost null. With an ``output:`` schema a
model that supports schemas gets it as llm's ``schema=``; another gets the schema as an
instruction in the prompt. A model that can stream is always streamed, so its answer is read
chunk by chunk: past the output bound (10 MB) it is refused (permanent), and a watched unit
shows the text so far.

Deadline: llm gives no way to hand its plugins an HTTP client, so a step's ``timeout:`` is
kept by running the call in a daemon thread the unit stops waiting for at the deadline (a
transient timeout, ``runners/function.py``). What is guaranteed: the attempt ends at its
deadline, and a streamed call stops reading at its next chunk after it (its thread then
ends). What is not: a plugin that does not stream, or whose server sends nothing more, keeps
its thread (and its connection) until the plugin's own timeout or the server gives up; a
non-streamed answer is held whole by the plugin before wf_magic sees it.

Errors: llm has no error taxonomy of its own beyond ``NeedsKeyException`` and
``UnknownModelError`` (permanent). An exception that carries an HTTP status (the openai
SDK's, which llm's OpenAI-compatible models raise, and most SDKs') is classified by it like
the other runners; timeouts and connection failures by their class names; anything else a
plugin raises is permanent, since nothing says it is worth retrying. Plugins' own SDK
retries stay on (llm gives no way to turn them off).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import json
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import RunnerError
from ..redact import mask_text
from .base import (
    RunnerContext,
    UnitRequest,
    UnitResult,
    check_option_shapes,
    strip_code_fence,
)
from .bounded_http import MAX_BODY_BYTES, BodyOverBound, is_cut_off
from .function import call_with_timeout
from .pricing import PRICE_OPTIONS, PriceTable
from .ratelimits import is_throttle, wait_of
from .textsink import TextSink

if TYPE_CHECKING:
    import llm

DEFAULT_TIMEOUT_S = 120.0
TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
_OPTION_NAMES = frozenset(
    {"model", "system", "options", "api_key_env", "timeout_s"} | PRICE_OPTIONS
)
_TRANSIENT_NAMES = ("Timeout", "TimedOut", "Connection", "Connect", "RateLimit", "Overloaded")
_MESSAGE_CAP = 500
SYNC_THREADS = 256
"""Worker threads for the calls of models without an async version (``arun``)."""


class LLMRunner:
    """Runs ``prompt`` and ``judge`` units through ``llm.get_model(...).prompt(...)``."""

    ANSWER_OPTIONS: frozenset[str] = frozenset({"model", "system", "options"})
    """What the model is and is asked with: hashed. Keys, timeouts and prices are not."""

    def __init__(self, options: Mapping[str, Any], *, name: str = "llm") -> None:
        self.name = name
        self.options = dict(options)
        self._lock = threading.Lock()
        self._models: dict[str | None, llm.Model] = {}
        self._async_models: dict[str | None, llm.AsyncModel | None] = {}
        self._threads: ThreadPoolExecutor | None = None

    @classmethod
    def from_context(cls, ctx: RunnerContext) -> LLMRunner:
        """The registry factory.

        Raises:
            RunnerError: permanent, naming the bad option.
        """
        _check_options(ctx.options, f"runners.{ctx.name}")
        return cls(ctx.options, name=ctx.name)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_lock=None, _models={}, _async_models={}, _threads=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def limit_key(self, model: str | None) -> str:
        """The endpoint a unit of ``model`` calls, as its limiter knows it: llm's plugins own
        their base URLs and keys, so the model id stands for the endpoint."""
        return f"llm {model or self.options.get('model') or ''}"

    def run(self, request: UnitRequest) -> UnitResult:
        """One prompt; past the timeout the call is abandoned (transient).

        Raises:
            RunnerError: see the module docstring for the classification.
        """
        where = f"{self.name} runner: unit {request.unit_id}"
        if request.kind not in ("prompt", "judge") or request.prompt is None:
            raise RunnerError(f"{where} is a {request.kind} unit; this runner only runs prompts.")
        model = self._model(request.model or self.options.get("model"), where)
        where = f"{where} (model {model.model_id})"
        timeout_s = float(request.timeout_s or self.options.get("timeout_s", DEFAULT_TIMEOUT_S))
        stop = threading.Event()
        try:
            return call_with_timeout(
                lambda: self._prompt(model, request, where, stop), timeout_s, what=f"{where} call"
            )
        except BodyOverBound as exc:
            raise RunnerError(f"{where}: {exc}.") from exc
        except RunnerError as exc:
            if "timed out after" in str(exc):
                raise
            raise RunnerError(f"{where}: {exc}.", transient=exc.transient) from exc
        except Exception as exc:
            raise _translate(exc, where) from exc
        finally:
            stop.set()  # an abandoned streamed call stops reading at its next chunk

    async def arun(self, request: UnitRequest) -> UnitResult:
        """:meth:`run` as a coroutine: through the model's async version (llm's
        ``get_async_model``) where its plugin has one, cancelled at the deadline; else ``run``
        on one of the runner's own worker threads.

        Raises:
            RunnerError: as :meth:`run` classifies it.
        """
        where = f"{self.name} runner: unit {request.unit_id}"
        if request.kind not in ("prompt", "judge") or request.prompt is None:
            raise RunnerError(f"{where} is a {request.kind} unit; this runner only runs prompts.")
        name = request.model or self.options.get("model")
        model = self._model(name, where)  # its errors, and the name shown, as run() gives them
        amodel = self._async_model(name)
        if amodel is None:
            return await asyncio.wrap_future(self._pool().submit(self.run, request))
        where = f"{where} (model {model.model_id})"
        timeout_s = float(request.timeout_s or self.options.get("timeout_s", DEFAULT_TIMEOUT_S))
        try:
            async with asyncio.timeout(timeout_s):
                return await self._aprompt(amodel, request)
        except TimeoutError as exc:
            raise RunnerError(
                f"{where} call timed out after {timeout_s:g}s; the call was cancelled",
                transient=True,
            ) from exc
        except BodyOverBound as exc:
            raise RunnerError(f"{where}: {exc}.") from exc
        except RunnerError as exc:
            raise RunnerError(f"{where}: {exc}.", transient=exc.transient) from exc
        except Exception as exc:
            raise _translate(exc, where) from exc

    def close(self) -> None:
        """Forget the resolved models (llm keeps no connection of ours) and end the worker
        threads of sync-only models (a call still running is abandoned, not waited for)."""
        with self._lock:
            self._models, self._async_models = {}, {}
            threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(
                    max_workers=SYNC_THREADS, thread_name_prefix=f"wf-{self.name}"
                )
            return self._threads

    def _async_model(self, name: str | None) -> llm.AsyncModel | None:
        """The async version of model ``name``, None when its plugin has none."""
        import llm

        with self._lock:
            if name not in self._async_models:
                try:
                    self._async_models[name] = llm.get_async_model(name)
                except llm.UnknownModelError:
                    self._async_models[name] = None
            return self._async_models[name]

    async def _aprompt(self, model: llm.AsyncModel, request: UnitRequest) -> UnitResult:
        schema = _schema_of(request)
        prompt, kwargs = self._arguments(model, request, schema)
        response = model.prompt(prompt, stream=bool(model.can_stream), **kwargs)
        sink = None if request.on_text is None else TextSink(request.on_text)
        text = await _aread(response, sink)
        if _is_cut_stream(response):
            raise RunnerError(
                "the answer was cut off mid-way: the stream ended before the model said it "
                "had finished",
                transient=True,
            )
        return self._result(text, schema, await response.usage(), model, response)

    def _model(self, name: str | None, where: str) -> llm.Model:
        with self._lock:
            if name not in self._models:
                try:
                    import llm
                except ImportError as exc:
                    raise RunnerError(
                        f"The {self.name} runner needs llm: pip install 'wf_magic[llm]'."
                    ) from exc
                try:
                    self._models[name] = llm.get_model(name)
                except llm.UnknownModelError as exc:
                    raise RunnerError(
                        f"{where}: llm knows no model {name!r}; `llm models` lists them "
                        "(install the plugin that provides it)."
                    ) from exc
            return self._models[name]

    def _prompt(
        self, model: llm.Model, request: UnitRequest, where: str, stop: threading.Event
    ) -> UnitResult:
        schema = _schema_of(request)
        prompt, kwargs = self._arguments(model, request, schema)
        response = model.prompt(prompt, stream=bool(model.can_stream), **kwargs)
        text = _read(response, None if request.on_text is None else TextSink(request.on_text), stop)
        if _is_cut_stream(response):
            raise RunnerError(
                "the answer was cut off mid-way: the stream ended before the model said it "
                "had finished",
                transient=True,
            )
        return self._result(text, schema, response.usage(), model, response)

    def _arguments(
        self, model: Any, request: UnitRequest, schema: dict[str, Any] | None
    ) -> tuple[str, dict[str, Any]]:
        """The prompt and the keyword arguments of ``model.prompt`` for ``request``."""
        prompt = request.prompt or ""
        kwargs: dict[str, Any] = {"options": dict(self.options.get("options") or {})}
        if request.max_tokens is not None and "max_tokens" in _option_fields(model):
            kwargs["options"]["max_tokens"] = request.max_tokens  # the run budget's offer
        if self.options.get("system"):
            kwargs["system"] = str(self.options["system"])
        if schema is not None and model.supports_schema:
            kwargs["schema"] = schema
        elif schema is not None:
            prompt += (
                "\n\nAnswer with a single JSON value matching this JSON Schema, and nothing "
                "else:\n" + json.dumps(schema, sort_keys=True)
            )
        key_env = self.options.get("api_key_env")
        if key_env:
            kwargs["key"] = os.environ.get(key_env) or None
        return prompt, kwargs

    @staticmethod
    def _result(
        text: str, schema: dict[str, Any] | None, usage: Any, model: Any, response: Any
    ) -> UnitResult:
        # A count the model did not report stays unknown (None, NULL in the journal).
        tokens_in = None if usage.input is None else int(usage.input)
        tokens_out = None if usage.output is None else int(usage.output)
        return UnitResult(
            output=_parse_json(text) if schema is not None else text,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            model=model.model_id,
            session_id=getattr(response, "id", None),
        )


def _read(response: Any, sink: TextSink | None, stop: threading.Event) -> str:
    """The response's text, read chunk by chunk and refused past :data:`MAX_BODY_BYTES`.

    Raises:
        BodyOverBound: the text passed the bound.
        RunnerError: transient, when ``stop`` was set (the unit gave up on the call).
    """
    text = _Gathered(sink)
    chunks = iter(response)
    try:
        for chunk in chunks:
            if stop.is_set():
                raise RunnerError("the call was abandoned at its deadline", transient=True)
            text.add(chunk)
    except BaseException:
        # Cut short: close the plugin's generators now. The openai SDK's sync stream then
        # sits in a reference cycle whose finalizer closes the HTTP response, so collect it
        # here rather than leave the socket open until some later collection.
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
        gc.collect()
        raise
    return text.whole()


async def _aread(response: Any, sink: TextSink | None) -> str:
    """:func:`_read` for an async response (cancelled at the deadline by the caller)."""
    text = _Gathered(sink)
    try:
        async for chunk in response:
            text.add(chunk)
    except BaseException:
        await _close_abandoned(response)
        raise
    return text.whole()


class _Gathered:
    """A response's text chunk by chunk: refused past :data:`MAX_BODY_BYTES`, handed to
    ``sink`` when it is due and once more, whole, at the end."""

    def __init__(self, sink: TextSink | None) -> None:
        self.sink = sink
        self.parts: list[str] = []
        self.size = 0

    def add(self, chunk: str) -> None:
        """Keep ``chunk``; raises ``BodyOverBound`` once the text passes the bound."""
        self.parts.append(chunk)
        self.size += len(chunk.encode("utf-8", "surrogatepass"))
        if self.size > MAX_BODY_BYTES:
            raise BodyOverBound()
        if self.sink is not None and self.sink.is_due:
            self.sink.offer("".join(self.parts))

    def whole(self) -> str:
        """The text, offered to the sink whole."""
        text = "".join(self.parts)
        if self.sink is not None:
            self.sink.offer(text, final=True)
        return text


async def _close_abandoned(response: Any) -> None:
    """Close what an async response cut short (the bound, the deadline) holds open.

    llm's public stream has no close: its plugin's generator (``_generator``) is closed, and
    the clients and streams that generator held (llm's OpenAI plugin makes an
    ``AsyncOpenAI`` per call and never closes it) are closed on this loop. Without that the
    socket stays open and unread until the process ends, and a server writing a long answer
    blocks on it.
    """
    generator = getattr(response, "_generator", None)
    frame = getattr(generator, "ag_frame", None)
    held = list(frame.f_locals.values()) if frame is not None else []
    aclose = getattr(generator, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
    for value in held:
        close = getattr(value, "close", None)
        if close is None or not type(value).__module__.startswith(("openai", "httpx")):
            continue
        with contextlib.suppress(Exception):
            closing = close()
            if inspect.isawaitable(closing):
                await closing
    gc.collect()


def _is_cut_stream(response: Any) -> bool:
    """Whether llm's OpenAI-compatible models' stream ended without a finish reason (other
    plugins say nothing of it: their streams are taken as whole)."""
    summary = getattr(response, "response_json", None)
    return (
        isinstance(summary, Mapping)
        and summary.get("object") == "chat.completion.chunk"
        and not summary.get("finish_reason")
    )


def _option_fields(model: Any) -> frozenset[str]:
    """The option names ``model`` takes (llm models declare a pydantic ``Options`` class)."""
    fields = getattr(getattr(model, "Options", None), "model_fields", None) or {}
    return frozenset(fields)


def _check_options(options: Mapping[str, Any], where: str) -> None:
    check_option_shapes(
        options,
        where,
        names=_OPTION_NAMES,
        strings=("model", "system", "api_key_env"),
        mappings=("options",),
        default_timeout_s=DEFAULT_TIMEOUT_S,
    )
    PriceTable.parse(options, where=where)


def _schema_of(request: UnitRequest) -> dict[str, Any] | None:
    if request.output_schema is not None:
        return dict(request.output_schema)
    if request.kind == "judge":
        from .pydanticai import VERDICT_SCHEMA

        return VERDICT_SCHEMA
    return None


def _parse_json(text: str) -> Any:
    try:
        return json.loads(strip_code_fence(text))
    except ValueError:
        return text  # the engine's schema check feeds the mismatch back


def _translate(exc: Exception, where: str) -> RunnerError:
    """What can be told from an exception llm or a plugin raised (see the module docstring)."""
    import llm

    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, llm.NeedsKeyException):
        transient, message = False, f"{where} has no key: {_clip(str(exc))}"
    elif isinstance(status, int) and is_throttle(status):  # the provider's limiter
        headers = getattr(getattr(exc, "response", None), "headers", None)
        message = f"{where} got HTTP {status}: {_server_message(exc)}"
        return RunnerError(
            message.rstrip(".") + ".", throttled=True, retry_after_s=wait_of(headers)
        )
    elif isinstance(status, int):
        transient = status in TRANSIENT_STATUS or status >= 500
        message = f"{where} got HTTP {status}: {_server_message(exc)}"
    elif is_cut_off(exc):
        transient = True
        message = (
            f"{where}: the answer was cut off mid-way ({type(exc).__name__}: {_clip(str(exc))})"
        )
    elif any(part in type(exc).__name__ for part in _TRANSIENT_NAMES):
        transient, message = True, f"{where} failed: {type(exc).__name__}: {_clip(str(exc))}"
    else:
        transient, message = False, f"{where} failed: {type(exc).__name__}: {_clip(str(exc))}"
    return RunnerError(message.rstrip(".") + ".", transient=transient)


def _server_message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return _clip(error["message"])
        if isinstance(body.get("message"), str):
            return _clip(body["message"])
    return _clip(str(getattr(exc, "message", exc)))


def _clip(text: str, cap: int = _MESSAGE_CAP) -> str:
    """``text`` (an exception's or a server's words) for a message: its credentials (a URL's
    key, its password) masked before it is cut, so no cut leaves a piece of one."""
    text = mask_text(text)
    return text if len(text) <= cap else text[: cap - 1] + "…"
