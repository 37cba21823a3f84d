"""The ``openai`` runner: prompt and judge units against any OpenAI-compatible chat endpoint.

Plan options (``runners: {openai: {...}}``; none of them is a secret):

- ``base_url``: the endpoint, e.g. ``http://localhost:11434/v1`` for Ollama; else
  ``$WF_MAGIC_OPENAI_BASE_URL``, else ``$OPENAI_BASE_URL``, else OpenAI's.
- ``api_key_env``: the NAME of the environment variable holding the key (default
  ``OPENAI_API_KEY``). A local endpoint (``base_url`` set) may go without a key.
- ``model``: the default model (else ``$WF_MAGIC_OPENAI_MODEL``); a step's ``model`` wins.
- ``timeout_s``: the attempt's deadline (default 120); a step's ``timeout`` wins. It binds
  the whole attempt — connect, first byte, the whole body or stream, a JSON-mode retry —
  not each read (``runners/bounded_http.py``).
- ``prices``, ``local``: each attempt's cost (``runners/pricing.py``); without them the drive
  prices OpenAI's own models from genai-prices.
- ``json_mode``: ask for ``response_format=json_object`` when a unit has an output schema
  (default true). A server that rejects it with 400/422 is asked again once without it;
  the model is then remembered as JSON-mode-less for this runner.
- ``max_tokens_param``: ``max_tokens`` (default) or ``max_completion_tokens`` for models
  that refuse the former.
- ``temperature`` (0 to 2), ``top_p`` (0 to 1), ``max_tokens`` (a positive whole number),
  ``seed`` (a whole number), ``stop`` (a string or a list of up to 4), ``system_prompt``: the
  sampling settings (``runners/sampling.py``), sent as the Chat Completions API names them
  (``system_prompt`` as a first system message). A step's ``options:`` override them. They
  are part of each unit's input hash. A request's ``max_tokens`` is the lower of the setting
  and the run budget's offer, sent under ``max_tokens_param``.

The engine does the retrying, so the client's own retries are off: HTTP 408, 409, 425,
429, 5xx, timeouts, connection failures and a body cut mid-way (a reset, a truncated event
stream) are transient ``RunnerError``s, other 4xx permanent ones carrying the server's
message; a body over the output bound (10 MB) is refused while it is read, permanently.
The unit's ``dispatch_id`` goes out as
``Idempotency-Key`` and ``X-Request-ID`` so a server or proxy can dedupe a reclaimed
attempt. A response without ``usage`` (or with a null count) leaves that count None (NULL in
the journal: unknown, never estimated) and its cost null; a run budget's ``max_tokens``
charges such an attempt the tokens it was offered (``drive/attempts.py``).

The calls run as coroutines of ``openai.AsyncOpenAI``: ``arun`` on the caller's loop (the
drive's model loop, ``drive/modelloop.py``), ``run`` on the runner's own event-loop thread
(``AttemptLoop``), which ``close`` ends; one client per loop (``runners/asyncpath.py``).

A request with ``on_text`` (somebody watches the unit live) is streamed (``stream=True``,
always with ``stream_options={"include_usage": True}``; the last usage seen wins, as servers
sending running totals in every chunk need); the callback
gets the text so far at most ten times a second, plus once with the whole text. The attempt
is journaled exactly as a non-streamed one. A server that ignores ``stream`` and answers
plain JSON is read as if nothing was streamed. A stream that ends before any chunk says why
the model stopped (``finish_reason``) was cut off: a transient failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import RunnerError
from ..redact import Redactor, mask_text, mask_url
from .asyncpath import LoopClients, SharedClients, within
from .base import RunnerContext, UnitRequest, UnitResult, check_limits, strip_code_fence
from .bounded_http import AttemptLoop, bounded_hooks, cut_words, is_cut_off, over_bound
from .openai_reply import PutText, Reply, create_reply
from .pricing import PRICE_OPTIONS, PriceTable
from .ratelimits import is_throttle, key_digest, wait_of
from .sampling import SAMPLING_OPTIONS, check_sampling, offered_tokens, sampling_of

if TYPE_CHECKING:
    from openai import AsyncOpenAI


DEFAULT_TIMEOUT_S = 120.0
TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
_MESSAGE_CAP = 500
_SHARED: SharedClients[AsyncOpenAI] = SharedClients(lambda client: client.close())
"""The model loop's clients, shared by runners of the same endpoint, timeout and key."""
_OPTION_NAMES = frozenset(
    {"base_url", "api_key_env", "model", "timeout_s", "json_mode", "max_tokens_param", "limits"}
    | PRICE_OPTIONS
    | set(SAMPLING_OPTIONS)
)


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAIChatOptions:
    """The runner's resolved settings (plan options over environment fallbacks)."""

    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    model: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    prices: PriceTable = field(default_factory=PriceTable)
    json_mode: bool = True
    max_tokens_param: str = "max_tokens"
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """The sampling settings the plan gives (``runners/sampling.py``); a step's ``options:``
    override them."""

    @classmethod
    def parse(
        cls,
        options: Mapping[str, Any],
        environ: Mapping[str, str] | None = None,
        *,
        name: str = "openai",
    ) -> OpenAIChatOptions:
        """Validate ``options`` and fill the gaps from ``environ`` (default ``os.environ``).

        Args:
            options: The plan's ``runners: {name: {...}}`` section.
            environ: Where the fallbacks are read.
            name: The runner's name in the plan, for messages.

        Raises:
            RunnerError: permanent, naming the bad option.
        """
        env = os.environ if environ is None else environ
        where = f"runners.{name}"
        _check_option_names(options, where)
        check_sampling(options, where=where)
        base_url = options.get("base_url") or env.get("WF_MAGIC_OPENAI_BASE_URL")
        model = options.get("model") or env.get("WF_MAGIC_OPENAI_MODEL")
        timeout_s = options.get("timeout_s", DEFAULT_TIMEOUT_S)
        if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or timeout_s <= 0:
            raise _option_error(f"{where}.timeout_s", "a positive number of seconds", timeout_s)
        param = options.get("max_tokens_param", "max_tokens")
        if param not in ("max_tokens", "max_completion_tokens"):
            expected = "max_tokens or max_completion_tokens"
            raise _option_error(f"{where}.max_tokens_param", expected, param)
        json_mode = options.get("json_mode", True)
        if not isinstance(json_mode, bool):
            raise _option_error(f"{where}.json_mode", "true or false", json_mode)
        return cls(
            base_url=_str_option(f"{where}.base_url", base_url or env.get("OPENAI_BASE_URL")),
            api_key_env=_str_option(f"{where}.api_key_env", options.get("api_key_env"))
            or "OPENAI_API_KEY",
            model=_str_option(f"{where}.model", model),
            timeout_s=float(timeout_s),
            prices=PriceTable.parse(options, where=where),
            json_mode=json_mode,
            max_tokens_param=param,
            sampling=sampling_of(options, None),
        )


class OpenAIChatRunner:
    """Runs ``prompt`` and ``judge`` units through ``openai.AsyncOpenAI().chat.completions``.

    Safe to share between worker threads: the client is created once, lazily, under a lock,
    and every call runs on the runner's one event loop.
    """

    ANSWER_OPTIONS: frozenset[str] = frozenset(
        {"model", "base_url", "json_mode", *SAMPLING_OPTIONS}
    )
    """Options that can change an answer (hashed): the endpoint, the model, JSON mode and the
    sampling settings; the key, timeout, prices and the max-tokens parameter name cannot."""

    def __init__(self, options: OpenAIChatOptions, *, name: str = "openai") -> None:
        """Create a runner; no client and no connection until the first unit.

        Args:
            options: The resolved settings.
            name: The runner name the plan uses, for messages.
        """
        self.options = options
        self.name = name
        self._lock = threading.Lock()
        self._clients: LoopClients[AsyncOpenAI] = LoopClients(lambda: self._new_client())
        self._loop = AttemptLoop(name)
        self._redactor = Redactor()
        self._keyed = False
        self._no_json_mode: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for executors such as Dask: ship the settings, never the client or lock;
        # the worker builds its own client on first use.
        state = dict(self.__dict__)
        state.update(_lock=None, _clients=None, _loop=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._clients = LoopClients(lambda: self._new_client())
        self._loop = AttemptLoop(self.name)

    @classmethod
    def from_context(cls, ctx: RunnerContext) -> OpenAIChatRunner:
        """The registry factory: options from the plan's ``runners`` section.

        Raises:
            RunnerError: permanent, when an option is invalid.
        """
        return cls(OpenAIChatOptions.parse(ctx.options, name=ctx.name), name=ctx.name)

    def limit_key(self, model: str | None) -> str:
        """The endpoint a unit of ``model`` calls, as its limiter knows it (no key in it)."""
        key = os.environ.get(self.options.api_key_env, "")
        base = self.options.base_url or "https://api.openai.com/v1"
        return f"openai {mask_url(base)} {model or self.options.model} key:{key_digest(key)}"

    @property
    def endpoint(self) -> str:
        """The base URL in use, for messages (credentials in it are masked)."""
        return self._redactor.redact(mask_url(self.options.base_url or "https://api.openai.com/v1"))

    def run(self, request: UnitRequest) -> UnitResult:
        """Send the unit's prompt as one user message and return the reply.

        Raises:
            RunnerError: transient for rate limits, 5xx, the deadline, connection failures
                and a body cut mid-way; permanent for other 4xx, a body over the output
                bound, a unit this runner cannot run, or a missing key.
        """
        started = time.monotonic()  # the deadline counts from here: importing and connecting too
        model = self._check(request)
        client = self._clients.get(self._loop.running())
        timeout_s = request.timeout_s or self.options.timeout_s
        try:
            reply = self._loop.call(
                lambda put: self._complete(client, request, model, put),
                timeout_s=timeout_s - (time.monotonic() - started),
                on_text=self._shown(request),
            )
        except Exception as exc:
            raise self._translate(exc, request, model) from exc
        return self._result(reply, request, model)

    async def arun(self, request: UnitRequest) -> UnitResult:
        """:meth:`run` as a coroutine on the caller's event loop (the drive's model loop):
        the same request, deadline, streaming, errors and result; no thread is held."""
        started = time.monotonic()
        model = self._check(request)
        client = self._shared_client(asyncio.get_running_loop())
        timeout_s = request.timeout_s or self.options.timeout_s
        try:
            reply = await within(
                lambda put: self._complete(client, request, model, put),
                timeout_s=timeout_s - (time.monotonic() - started),
                on_text=self._shown(request),
            )
        except Exception as exc:
            raise self._translate(exc, request, model) from exc
        return self._result(reply, request, model)

    def close(self) -> None:
        """Close the HTTP clients (one per event loop the runner ran on) and end the
        runner's loop thread (a later unit would open new ones)."""
        self._clients.close_all(lambda client: client.close())
        self._loop.close()

    def _shown(self, request: UnitRequest) -> Callable[[str], None] | None:
        # What is shown live is redacted like what is journaled: the key never reaches a view.
        on_text = request.on_text
        return None if on_text is None else (lambda text: on_text(self._redactor.redact(text)))

    def _check(self, request: UnitRequest) -> str:
        where = f"{self.name} runner: unit {request.unit_id}"
        if request.kind not in ("prompt", "judge"):
            raise RunnerError(f"{where} is a {request.kind} unit; this runner only runs prompts.")
        if request.prompt is None:
            raise RunnerError(f"{where} has no prompt.")
        if request.max_tokens is not None and request.max_tokens <= 0:
            raise RunnerError(f"{where}: the run budget has no tokens left for an answer.")
        model = request.model or self.options.model
        if not model:
            raise RunnerError(
                f"{where} names no model; set `model:` on the step, `runners: {{{self.name}: "
                "{model: ...}}` in the workflow, or WF_MAGIC_OPENAI_MODEL."
            )
        return model

    def _shared_client(self, loop: asyncio.AbstractEventLoop) -> AsyncOpenAI:
        """The client every runner of these settings shares on ``loop`` (the model loop):
        sweep cells reuse its connections. Its key's redactor is this runner's."""
        key = os.environ.get(self.options.api_key_env, "")
        if key and not self._keyed:
            self._redactor, self._keyed = Redactor([key]), True
        settings = (self.options.base_url, self.options.timeout_s, key_digest(key))
        return _SHARED.get(loop, settings, self._new_client)

    def _new_client(self) -> AsyncOpenAI:
        try:
            import openai
        except ImportError as exc:
            raise RunnerError(
                f"The {self.name} runner needs the openai package: pip install 'wf_magic[openai]'."
            ) from exc
        key = os.environ.get(self.options.api_key_env, "")
        if not key and self.options.base_url is None:
            raise RunnerError(
                f"{self.name} runner: environment variable {self.options.api_key_env} is not set; "
                "export your API key there, or set runners.openai.base_url for a local server."
            )
        self._redactor = Redactor([key])
        return openai.AsyncOpenAI(
            api_key=key or "unused",  # local servers (Ollama, vLLM) ignore it
            base_url=self.options.base_url,
            timeout=self.options.timeout_s,
            max_retries=0,
            # Every body is counted while it is read and refused past the output bound.
            http_client=openai.DefaultAsyncHttpxClient(event_hooks=bounded_hooks()),
        )

    async def _complete(
        self, client: AsyncOpenAI, request: UnitRequest, model: str, put_text: PutText | None
    ) -> Reply:
        import openai

        kwargs = self._kwargs(request, model)
        json_mode = self.options.json_mode and model not in self._no_json_mode
        if not (json_mode and _wants_json(request)):
            return await create_reply(client, kwargs, put_text)
        try:
            json_kwargs = {**kwargs, "response_format": {"type": "json_object"}}
            return await create_reply(client, json_kwargs, put_text)
        except (openai.BadRequestError, openai.UnprocessableEntityError):
            pass  # the server may not do JSON mode: the instruction in the prompt must do
        # A fresh key: a server that remembers keys must not answer with the cached 400.
        headers = {**kwargs["extra_headers"], "Idempotency-Key": f"{request.dispatch_id}-nojson"}
        reply = await create_reply(client, {**kwargs, "extra_headers": headers}, put_text)
        self._no_json_mode.add(model)
        return reply

    def _kwargs(self, request: UnitRequest, model: str) -> dict[str, Any]:
        prompt = request.prompt or ""
        if _wants_json(request):
            prompt = f"{prompt}\n\n{_json_instruction(request.output_schema)}"
        settings = sampling_of(self.options.sampling, request.options)
        messages = [{"role": "user", "content": prompt}]
        if "system_prompt" in settings:
            messages.insert(0, {"role": "system", "content": settings["system_prompt"]})
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "timeout": request.timeout_s or self.options.timeout_s,
            "extra_headers": {
                "Idempotency-Key": request.dispatch_id,
                "X-Request-ID": request.dispatch_id,
            },
        }
        kwargs.update(
            {k: settings[k] for k in ("temperature", "top_p", "seed", "stop") if k in settings}
        )
        # The lower of the setting and the budget's offer: both are ceilings.
        max_tokens = offered_tokens(settings.get("max_tokens"), request.max_tokens)
        if max_tokens is not None:
            kwargs[self.options.max_tokens_param] = max_tokens
        return kwargs

    def _result(self, reply: Reply, request: UnitRequest, model: str) -> UnitResult:
        # What the server did not report stays unknown (None) and costs null.
        tokens_in, tokens_out = reply.usage or (None, None)
        is_reported = tokens_in is not None and tokens_out is not None
        content = reply.content
        if content is None:
            refusal = reply.refusal
            raise RunnerError(
                self._redactor.redact(
                    f"{self.name} runner: unit {request.unit_id} got no text from model {model}"
                    + (f" (refusal: {_clip(refusal)})" if refusal else "")
                    + "."
                ),
                tokens_in=tokens_in,
                tokens_out=tokens_out,
            )
        output = _parse_json(content) if _wants_json(request) else content
        # A server may echo the key back; the engine's redactor only knows keys whose
        # variable name looks secret, this one knows the key itself.
        output = self._redactor.redact_value(output)
        found = self.options.prices.price(model, reply.model)
        return UnitResult(
            output=output,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            model=model,
            cost=found[0].cost(tokens_in or 0, tokens_out or 0) if found and is_reported else None,
            price_source=f"runners.{self.name}.{found[1]}" if found and is_reported else None,
            session_id=reply.completion_id or None,
            # genai-prices prices OpenAI's own models; another server only by its URL.
            provider=mask_url(self.options.base_url) if self.options.base_url else "openai",
        )

    def _translate(self, exc: Exception, request: UnitRequest, model: str) -> RunnerError:
        import openai

        where = f"{self.name} runner: unit {request.unit_id} (model {model} at {self.endpoint})"
        too_big = over_bound(exc)
        if too_big is not None:
            return RunnerError(self._redactor.redact(f"{where}: {too_big}."))
        if isinstance(exc, openai.APITimeoutError | TimeoutError):
            timeout_s = request.timeout_s or self.options.timeout_s
            message, transient = f"{where} timed out after {timeout_s:g}s.", True
        elif isinstance(exc, RunnerError):
            message, transient = f"{where}: {exc}.", exc.transient
        elif is_cut_off(exc):
            message, transient = f"{where}: {cut_words(exc, cap=_MESSAGE_CAP)}.", True
        elif not isinstance(exc, openai.OpenAIError):
            message, transient = f"{where} failed: {type(exc).__name__}: {_clip(str(exc))}", False
        elif isinstance(exc, openai.APIConnectionError):
            cause = f" ({_clip(str(exc.__cause__))})" if exc.__cause__ else ""
            message, transient = f"{where} could not connect{cause}; is the server up?", True
        elif isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            transient = status in TRANSIENT_STATUS or status >= 500
            message = f"{where} got HTTP {status}: {_server_message(exc)}{_retry_after(exc)}"
            if is_throttle(status):  # the provider's limiter: waited for, sent again
                return RunnerError(
                    self._redactor.redact(message),
                    throttled=True,
                    retry_after_s=wait_of(exc.response.headers),
                )
        else:
            message, transient = f"{where} failed: {_clip(str(exc))}", False
        return RunnerError(
            self._redactor.redact(message), transient=transient, retry_after_s=_retry_after_s(exc)
        )


def _wants_json(request: UnitRequest) -> bool:
    return request.output_schema is not None or request.kind == "judge"


def _json_instruction(schema: Mapping[str, Any] | None) -> str:
    if schema is None:
        return "Answer with a single JSON object and nothing else."
    return (
        "Answer with a single JSON value matching this JSON Schema, and nothing else "
        "(no prose, no code fences):\n" + json.dumps(schema, sort_keys=True)
    )


def _parse_json(content: str) -> Any:
    """The reply decoded as JSON, else the raw text (the engine validates the output)."""
    text = strip_code_fence(content)
    try:
        return json.loads(text)
    except ValueError:
        return content


def _server_message(exc: Any) -> str:
    body = exc.body
    if isinstance(body, Mapping) and isinstance(body.get("message"), str):
        return _clip(body["message"])
    if isinstance(body, str) and body.strip():
        return _clip(body.strip())
    return _clip(str(exc.message))


def _retry_after(exc: Any) -> str:
    value = exc.response.headers.get("retry-after")
    return f" (retry after {_clip(value, 40)}s)" if value else ""


def _retry_after_s(exc: Any) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: the step's own backoff applies


def _clip(text: str, cap: int = _MESSAGE_CAP) -> str:
    """``text`` (an exception's or a server's words) for a message: its credentials (a URL's
    key, its password) masked before it is cut, so no cut leaves a piece of one."""
    text = mask_text(text)
    return text if len(text) <= cap else text[: cap - 1] + "…"


def _check_option_names(options: Mapping[str, Any], where: str) -> None:
    if "api_key" in options:
        # Say nothing of the value: it is the secret.
        raise RunnerError(
            f"{where}.api_key would store a secret in the plan; put the key in an environment "
            "variable and name it with api_key_env (default OPENAI_API_KEY)."
        )
    unknown = sorted(set(options) - _OPTION_NAMES)
    if unknown:
        raise RunnerError(
            f"{where}: unknown option(s) {', '.join(map(str, unknown))}; expected some of "
            f"{', '.join(sorted(_OPTION_NAMES))}."
        )
    if "limits" in options:
        check_limits(options["limits"], where)


def _str_option(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _option_error(name, "a string", value)
    return value or None


def _option_error(name: str, expected: str, got: Any) -> RunnerError:
    return RunnerError(f"{name}: expected {expected} (got {got!r}).")
