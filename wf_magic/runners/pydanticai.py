"""The ``pydantic-ai`` runner: one model call per unit through pydantic-ai's direct request API.

Plan options (``runners: {pydantic-ai: {...}}``; none of them is a secret):

- ``model``: pydantic-ai's ``provider:model`` name (``anthropic:claude-sonnet-4-5``,
  ``google:gemini-2.5-flash``, ``bedrock:…``, ``mistral:…``, ``groq:…``, ``openai:…``); a
  step's ``model:`` wins.
- ``base_url``: the provider's endpoint (else the SDK's own variable, ``ANTHROPIC_BASE_URL``…).
- ``api_key_env``: the NAME of the variable holding the key (else the SDK's default).
- ``system_prompt``, ``temperature``, ``top_p``, ``seed``, ``max_tokens``, ``stop`` (sent as
  ``stop_sequences``), ``settings`` (more pydantic-ai ``ModelSettings``): what the model is
  asked with. A step's ``options:`` override the first six (``runners/sampling.py``); a
  request's ``max_tokens`` is the lower of the setting and the run budget's offer.
- ``timeout_s`` (default 120; a step's ``timeout:`` wins), ``prices``, ``local``. It is the
  attempt's deadline: connect, first byte and the whole body or stream, not each read.

No agent loop: a unit is one request. A step's ``output:`` schema (and a judge's verdict)
is asked for the provider's native way: a JSON-schema response format where the model's
profile supports one, else a forced output tool. A watched unit is streamed. Usage counts
cache reads and writes in ``tokens_in`` and prices them at their own rates. The SDKs' own
retries are off: the engine retries transient errors (408, 409, 425, 429, 5xx, 529,
timeouts, connection failures, a body cut mid-way, honouring ``retry_after``); others are
permanent. Each provider SDK gets an HTTP client of ours (``runners/bounded_http.py``) that
refuses a body past the output bound (10 MB) while reading it; the calls run on the runner's
own event-loop thread under the attempt's deadline (``run``), or on the caller's loop
(``arun``: the drive's model loop), with one set of SDK clients per loop.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import RunnerError
from ..redact import mask_text, mask_url
from .asyncpath import LoopClients, within
from .base import (
    RunnerContext,
    UnitRequest,
    UnitResult,
    check_option_shapes,
    strip_code_fence,
)
from .bounded_http import (
    AttemptLoop,
    bounded_client,
    bounded_hooks,
    cut_words,
    is_cut_off,
    over_bound,
)
from .pricing import PRICE_OPTIONS, PriceTable, attempt_cost
from .ratelimits import is_throttle, key_digest, wait_of
from .sampling import SAMPLING_OPTIONS, check_sampling, offered_tokens, sampling_of
from .textsink import TEXT_EVERY_S

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelResponse
    from pydantic_ai.models import Model

DEFAULT_TIMEOUT_S = 120.0
TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "complete": {"type": "boolean"},
        "feedback": {"type": "string"},
        "missing": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["complete", "feedback", "missing"],
}
_SETTING_OPTIONS = ("temperature", "top_p", "seed")
_OPTION_NAMES = frozenset(
    {"model", "base_url", "api_key_env", "system_prompt", "settings", "timeout_s"}
    | set(SAMPLING_OPTIONS)
    | PRICE_OPTIONS
)
_GENAI_PROVIDERS = {"google-gla": "google", "google-vertex": "google", "bedrock": "aws"}
"""pydantic-ai provider names → genai-prices provider ids, where they differ."""
_NO_SDK_RETRIES = {
    "anthropic": ("anthropic", "AsyncAnthropic"),
    "groq": ("groq", "AsyncGroq"),
    "openai": ("openai", "AsyncOpenAI"),
}
"""Providers whose SDK client is built here with ``max_retries=0`` (the engine retries)."""
_MESSAGE_CAP = 500


class PydanticAIRunner:
    """Runs ``prompt`` and ``judge`` units through ``pydantic_ai.direct.model_request``.

    The calls run on one private event loop thread (a notebook's running loop is never
    touched), each under its attempt's deadline; units on several worker threads share it.
    """

    ANSWER_OPTIONS: frozenset[str] = frozenset({"model", "base_url", "settings", *SAMPLING_OPTIONS})
    """What the model is asked and where: hashed. The key's variable, the timeout and prices
    are not."""

    def __init__(self, options: Mapping[str, Any], *, name: str = "pydantic-ai") -> None:
        self.name = name
        self.options = dict(options)
        self.prices = PriceTable.parse(options, where=f"runners.{name}")
        self._lock = threading.Lock()
        self._kits: LoopClients[_Kit] = LoopClients(_Kit)
        self._loop = AttemptLoop(name)

    @classmethod
    def from_context(cls, ctx: RunnerContext) -> PydanticAIRunner:
        """The registry factory.

        Raises:
            RunnerError: permanent, naming the bad option.
        """
        _check_options(ctx.options, f"runners.{ctx.name}")
        return cls(ctx.options, name=ctx.name)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_lock=None, _kits=None, _loop=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._kits = LoopClients(_Kit)
        self._loop = AttemptLoop(self.name)

    def limit_key(self, model: str | None) -> str:
        """The endpoint a unit of ``model`` calls, as its limiter knows it (no key in it)."""
        name = model or self.options.get("model") or ""
        key_env, base_url = self.options.get("api_key_env"), self.options.get("base_url")
        key = os.environ.get(key_env, "") if isinstance(key_env, str) else ""
        where = mask_url(base_url) if isinstance(base_url, str) else str(name).split(":")[0]
        return f"pydantic-ai {where} {name} key:{key_digest(key) if key_env else 'default'}"

    def run(self, request: UnitRequest) -> UnitResult:
        """One model request for the unit.

        Raises:
            RunnerError: transient for rate limits, overload, 5xx, timeouts, connection
                failures; permanent for other refusals, a content filter or a bad setup.
        """
        started = time.monotonic()  # the deadline counts from here: importing and connecting too
        name = self._model_name(request)
        model = self._model(name, self._loop.running())
        # Imported here, not on the loop: an import there would hold the loop past deadlines.
        import pydantic_ai.direct  # noqa: F401

        timeout_s = float(request.timeout_s or self.options.get("timeout_s", DEFAULT_TIMEOUT_S))
        try:
            response = self._loop.call(
                lambda put: self._request(model, request, put, timeout_s),
                timeout_s=timeout_s - (time.monotonic() - started),
                on_text=request.on_text,
            )
        except Exception as exc:
            self._raise_failure(exc, request, name, timeout_s)
        return self._result(response, request, name)

    async def arun(self, request: UnitRequest) -> UnitResult:
        """:meth:`run` as a coroutine on the caller's event loop (the drive's model loop):
        the same request, deadline, streaming, errors and result; no thread is held."""
        started = time.monotonic()
        name = self._model_name(request)
        model = self._model(name, asyncio.get_running_loop())
        import pydantic_ai.direct  # noqa: F401  # once per process; the loop waits that once

        timeout_s = float(request.timeout_s or self.options.get("timeout_s", DEFAULT_TIMEOUT_S))
        try:
            response = await within(
                lambda put: self._request(model, request, put, timeout_s),
                timeout_s=timeout_s - (time.monotonic() - started),
                on_text=request.on_text,
            )
        except Exception as exc:
            self._raise_failure(exc, request, name, timeout_s)
        return self._result(response, request, name)

    def _raise_failure(
        self, exc: Exception, request: UnitRequest, name: str, timeout_s: float
    ) -> NoReturn:
        """Raise the ``RunnerError`` a failed call becomes (``exc`` itself when unknown)."""
        failure = _failure(exc, self._where(request, name), timeout_s)
        if failure is exc:
            raise exc
        raise failure from exc

    def close(self) -> None:
        """Close the HTTP clients (each on the loop it ran on) and stop the runner's event
        loop thread (a later unit starts anew)."""
        self._kits.close_all(_Kit.aclose)
        self._loop.close()

    # -- the call --------------------------------------------------------------------------------
    def _model_name(self, request: UnitRequest) -> str:
        where = f"{self.name} runner: unit {request.unit_id}"
        if request.kind not in ("prompt", "judge") or request.prompt is None:
            raise RunnerError(f"{where} is a {request.kind} unit; this runner only runs prompts.")
        if request.max_tokens is not None and request.max_tokens <= 0:
            raise RunnerError(f"{where}: the run budget has no tokens left for an answer.")
        name = request.model or self.options.get("model")
        if not isinstance(name, str) or ":" not in name:
            raise RunnerError(
                f"{where} needs a model named provider:model (got {name!r}), e.g. "
                f"anthropic:claude-sonnet-4-5; set `model:` on the step or in runners.{self.name}."
            )
        return name

    def _model(self, name: str, loop: asyncio.AbstractEventLoop) -> Model:
        """The model ``name`` for calls on ``loop`` (its SDK clients belong to that loop)."""
        kit = self._kits.get(loop)
        with self._lock:
            if name not in kit.models:
                try:
                    from pydantic_ai.models import infer_model
                except ImportError as exc:
                    raise RunnerError(
                        f"The {self.name} runner needs pydantic-ai: "
                        "pip install 'wf_magic[pydantic-ai]'."
                    ) from exc
                try:
                    kit.models[name] = infer_model(
                        name, provider_factory=lambda provider: self._provider(provider, kit)
                    )
                except Exception as exc:  # a missing key, an unknown provider, an SDK missing
                    raise RunnerError(
                        f"{self.name} runner cannot make model {name}: {_clip(str(exc))}"
                    ) from exc
            return kit.models[name]

    def _provider(self, provider: str, kit: _Kit) -> Any:
        import importlib
        import inspect

        from pydantic_ai.providers import infer_provider, infer_provider_class

        key_env, base_url = self.options.get("api_key_env"), self.options.get("base_url")
        key = os.environ.get(key_env) if key_env else None
        cls = infer_provider_class(provider)
        if cls.__name__ == "OpenAIProvider":
            provider = "openai"  # openai-chat, openai-responses: the same SDK client
        if provider in _NO_SDK_RETRIES:
            module_name, client = _NO_SDK_RETRIES[provider]
            module = importlib.import_module(module_name)
            # The SDK's own client class (httpx or httpx2, whichever it is built on).
            http = module.DefaultAsyncHttpxClient(event_hooks=bounded_hooks())
            kit.https.append(http)
            made = getattr(module, client)(
                api_key=key, base_url=base_url, max_retries=0, http_client=http
            )
            return cls(**{f"{module_name}_client": made})
        accepted = inspect.signature(cls.__init__).parameters
        kwargs = {
            k: v for k, v in (("api_key", key), ("base_url", base_url)) if v and k in accepted
        }
        if "http_client" not in accepted:
            return cls(**kwargs) if kwargs else infer_provider(provider)
        kwargs["http_client"] = bounded_client(timeout=DEFAULT_TIMEOUT_S * 5)  # the deadline binds
        kit.https.append(kwargs["http_client"])
        return cls(**kwargs)

    async def _request(
        self,
        model: Model,
        request: UnitRequest,
        put_text: Callable[[str], None] | None,
        timeout_s: float,
    ) -> ModelResponse:
        from pydantic_ai.direct import model_request, model_request_stream

        messages = self._messages(request)
        settings = self._settings(request, timeout_s)
        params = _parameters(model, _schema_of(request))
        if put_text is None:
            return await model_request(
                model, messages, model_settings=settings, model_request_parameters=params
            )
        async with model_request_stream(
            model, messages, model_settings=settings, model_request_parameters=params
        ) as stream:
            shown_at = float("-inf")
            async for _event in stream:
                if time.monotonic() - shown_at >= TEXT_EVERY_S / 2:  # rendering is not free
                    shown_at = time.monotonic()
                    put_text(_text_of(stream.get()))
            response = stream.get()
            put_text(_text_of(response))
        if not (response.provider_details or {}).get("finish_reason"):
            # Every provider's last event says why the model stopped (pydantic-ai keeps the
            # raw reason; its own finish_reason defaults to "stop"): without it the stream
            # was cut off mid-way.
            raise RunnerError(
                "the answer was cut off mid-way: the stream ended before the model said it "
                "had finished",
                transient=True,
            )
        return response

    def _messages(self, request: UnitRequest) -> list[Any]:
        from pydantic_ai.messages import ModelRequest, SystemPromptPart, UserPromptPart

        parts: list[Any] = []
        system = sampling_of(self.options, request.options).get("system_prompt")
        if system:
            parts.append(SystemPromptPart(content=str(system)))
        parts.append(UserPromptPart(content=request.prompt or ""))
        return [ModelRequest(parts=parts)]

    def _settings(self, request: UnitRequest, timeout_s: float) -> Any:
        settings: dict[str, Any] = dict(self.options.get("settings") or {})
        sampling = sampling_of(self.options, request.options)
        settings.update({k: sampling[k] for k in _SETTING_OPTIONS if k in sampling})
        if "stop" in sampling:
            stop = sampling["stop"]
            settings["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        settings["timeout"] = timeout_s
        # The lower of the setting and the budget's offer: both are ceilings.
        max_tokens = offered_tokens(
            sampling.get("max_tokens", settings.get("max_tokens")), request.max_tokens
        )
        if max_tokens is not None:
            settings["max_tokens"] = max_tokens
        return settings

    # -- the answer ------------------------------------------------------------------------------
    def _result(self, response: ModelResponse, request: UnitRequest, name: str) -> UnitResult:
        where = self._where(request, name)
        if response.finish_reason == "content_filter":
            raise RunnerError(f"{where} was stopped by the provider's content filter.")
        schema = _schema_of(request)
        output = _output_of(response, schema)
        usage = response.usage
        tokens_in, tokens_out = int(usage.input_tokens or 0), int(usage.output_tokens or 0)
        cache_read, cache_write = int(usage.cache_read_tokens), int(usage.cache_write_tokens)
        provider_name = response.provider_name or name.split(":", 1)[0]
        bare = response.model_name or name.split(":", 1)[1]
        cost, source = attempt_cost(
            runner=self.name,
            options=self.options,
            model=name,
            also=(bare,),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cache_read=cache_read,
            cache_write=cache_write,
            provider=_GENAI_PROVIDERS.get(provider_name, provider_name),
            catalogue_model=bare,
        )
        return UnitResult(
            output=output,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
            model=name,
            cost=cost,
            price_source=source,
            session_id=response.provider_response_id,
            provider=provider_name,
        )

    def _where(self, request: UnitRequest, name: str) -> str:
        return f"{self.name} runner: unit {request.unit_id} (model {name})"


@dataclass(slots=True)
class _Kit:
    """The models made for one event loop and the HTTP clients they hold."""

    models: dict[str, Model] = field(default_factory=dict)
    https: list[Any] = field(default_factory=list)

    async def aclose(self) -> None:
        for client in self.https:
            await client.aclose()


def _failure(exc: Exception, where: str, timeout_s: float) -> BaseException:
    """The ``RunnerError`` a failed call becomes (the exception itself when it is unknown)."""
    from pydantic_ai.exceptions import AgentRunError, UserError

    too_big = over_bound(exc)
    if too_big is not None:
        return RunnerError(f"{where}: {too_big}.")
    if isinstance(exc, RunnerError):
        return RunnerError(f"{where}: {exc}.", transient=exc.transient)
    if isinstance(exc, TimeoutError):
        return RunnerError(f"{where} timed out after {timeout_s:g}s.", transient=True)
    if isinstance(exc, AgentRunError | UserError) and not is_cut_off(exc):
        return _translate(exc, where)
    if is_cut_off(exc):
        message = f"{where}: {cut_words(exc)}."
        return RunnerError(message, transient=True)
    return exc


def _check_options(options: Mapping[str, Any], where: str) -> None:
    if "api_key" in options:
        raise RunnerError(
            f"{where}.api_key would store a secret in the plan; put the key in an environment "
            "variable and name it with api_key_env."
        )
    check_option_shapes(
        options,
        where,
        names=_OPTION_NAMES,
        strings=("model", "base_url", "api_key_env", "system_prompt"),
        mappings=("settings",),
        default_timeout_s=DEFAULT_TIMEOUT_S,
    )
    check_sampling(options, where=where)
    PriceTable.parse(options, where=where)


def _schema_of(request: UnitRequest) -> dict[str, Any] | None:
    if request.output_schema is not None:
        return dict(request.output_schema)
    return VERDICT_SCHEMA if request.kind == "judge" else None


def _is_object(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "object"


def _parameters(model: Model, schema: dict[str, Any] | None) -> Any:
    """Request parameters asking for ``schema`` natively (or by an output tool)."""
    from pydantic_ai.models import ModelRequestParameters

    if schema is None:
        return ModelRequestParameters()
    # Providers take objects only: anything else travels wrapped as {"response": …}.
    wrapped = schema if _is_object(schema) else _wrap(schema)
    profile = model.profile
    if profile.get("supports_json_schema_output"):
        from pydantic_ai.output import OutputObjectDefinition

        return ModelRequestParameters(
            output_mode="native",
            output_object=OutputObjectDefinition(json_schema=wrapped, name="output"),
            allow_text_output=False,
        )
    from pydantic_ai.tools import ToolDefinition

    tool = ToolDefinition(
        name="final_result",
        parameters_json_schema=wrapped,
        description="The answer.",
        kind="output",
    )
    return ModelRequestParameters(output_mode="tool", output_tools=[tool], allow_text_output=False)


def _wrap(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"response": dict(schema)}, "required": ["response"]}


def _output_of(response: ModelResponse, schema: Mapping[str, Any] | None) -> Any:
    from pydantic_ai.messages import ToolCallPart

    if schema is None:
        return _text_of(response)
    calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
    if calls:
        value: Any = calls[0].args_as_dict()
    else:
        import json

        text = strip_code_fence(_text_of(response))
        try:
            value = json.loads(text)
        except ValueError:
            return _text_of(response)  # the engine's schema check feeds the mismatch back
    if not _is_object(schema) and isinstance(value, dict) and set(value) == {"response"}:
        return value["response"]
    return value


def _text_of(response: ModelResponse) -> str:
    from pydantic_ai.messages import TextPart

    return "".join(p.content for p in response.parts if isinstance(p, TextPart))


def _translate(exc: Exception, where: str) -> RunnerError:
    """A pydantic-ai error as a transient or permanent ``RunnerError`` with the provider's word."""
    from pydantic_ai import exceptions as pe

    retry_after = getattr(exc, "retry_after", None)
    status = getattr(exc, "status_code", None)
    if isinstance(exc, pe.ContentFilterError):
        return RunnerError(f"{where} was stopped by the provider's content filter.")
    if isinstance(status, int) and is_throttle(status):  # the provider's limiter
        asked = wait_of(getattr(getattr(exc, "response", None), "headers", None))
        if asked is None and isinstance(retry_after, int | float) and math.isfinite(retry_after):
            asked = max(0.0, float(retry_after))
        message = f"{where} got HTTP {status}: {_provider_message(exc)}".rstrip(".") + "."
        return RunnerError(message, throttled=True, retry_after_s=asked)
    if isinstance(status, int):
        transient = status in TRANSIENT_STATUS or status >= 500
        message = f"{where} got HTTP {status}: {_provider_message(exc)}"
    elif isinstance(exc, pe.ModelTimeoutError | pe.ModelRequestTimeout):
        transient, message = True, f"{where} timed out."
    elif isinstance(exc, pe.ModelConnectionError):
        transient, message = True, f"{where} could not connect ({_clip(str(exc))}); is it up?"
    elif isinstance(exc, pe.ModelRateLimitError | pe.ModelUnavailableError | pe.ModelServerError):
        transient, message = True, f"{where} failed: {_provider_message(exc)}"
    else:
        transient, message = False, f"{where} failed: {_clip(str(exc))}"
    if retry_after is not None and transient:
        message += f" (retry after {retry_after:g}s)"
    if not message.endswith("."):
        message += "."
    after = float(retry_after) if isinstance(retry_after, int | float) else None
    if after is not None and not math.isfinite(after):
        after = None
    return RunnerError(message, transient=transient, retry_after_s=after)


def _provider_message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return _clip(error["message"])
    if isinstance(body, str) and body.strip():
        return _clip(body.strip())
    return _clip(str(getattr(exc, "message", exc)))


def _clip(text: str, cap: int = _MESSAGE_CAP) -> str:
    """``text`` (an exception's or a server's words) for a message: its credentials (a URL's
    key, its password) masked before it is cut, so no cut leaves a piece of one."""
    text = mask_text(text)
    return text if len(text) <= cap else text[: cap - 1] + "…"
