"""The runner protocol: one small method turning a UnitRequest into a UnitResult (DESIGN.md §6)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ..errors import RunnerError

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


def strip_code_fence(text: str) -> str:
    """``text`` without one enclosing Markdown code fence (```json, ```JSON, ```), stripped."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    return fenced.group(1).strip() if fenced else stripped


UnitKind = Literal["prompt", "exec", "python", "judge", "agent"]
"""What a unit asks for:

- ``prompt``: an LLM/agent call with ``request.prompt``.
- ``exec``: a subprocess with ``request.argv``.
- ``python``: a callable ``request.target`` with ``request.kwargs``.
- ``judge``: a gate judge call (an LLM prompt that must answer a verdict).
- ``agent``: a coding-agent CLI run on ``request.prompt`` with ``request.agent``'s settings.
"""


LIMIT_KEYS = ("rpm", "tpm", "concurrency")


def check_limits(value: Any, where: str) -> None:
    """A runner's ``limits:`` option: model (or ``*``) → ``{rpm, tpm, concurrency}``.

    Raises:
        RunnerError: naming the model and key, with what was expected and got.
    """
    if not isinstance(value, Mapping):
        raise RunnerError(f"{where}.limits: expected a mapping of model → limits (got {value!r}).")
    for model, entry in value.items():
        at = f"{where}.limits.{model}"
        if not isinstance(entry, Mapping):
            raise RunnerError(
                f"{at}: expected a mapping of {', '.join(LIMIT_KEYS)} (got {entry!r})."
            )
        unknown = sorted(map(str, set(entry) - set(LIMIT_KEYS)))
        if unknown:
            raise RunnerError(
                f"{at}: unknown key(s) {', '.join(unknown)}; "
                f"expected some of {', '.join(LIMIT_KEYS)}."
            )
        for key, number in entry.items():
            whole = key != "concurrency" or isinstance(number, int)
            if (
                isinstance(number, bool)
                or not isinstance(number, int | float)
                or not math.isfinite(number)
                or number <= 0
                or not whole
            ):
                kind = "a positive whole number" if key == "concurrency" else "a positive number"
                raise RunnerError(f"{at}.{key}: expected {kind} (got {number!r}).")


def check_option_shapes(
    options: Mapping[str, Any],
    where: str,
    *,
    names: frozenset[str],
    strings: tuple[str, ...],
    mappings: tuple[str, ...],
    default_timeout_s: float,
) -> None:
    """A runner's options at freeze: known names only, the right shapes, a positive timeout.

    Raises:
        RunnerError: naming ``where`` and the option, with what was expected and got.
    """
    unknown = sorted(map(str, set(options) - names - {"limits"}))
    if unknown:
        raise RunnerError(
            f"{where}: unknown option(s) {', '.join(unknown)}; expected some of "
            f"{', '.join(sorted(names))}."
        )
    for key in strings:
        if key in options and not isinstance(options[key], str):
            raise RunnerError(f"{where}.{key}: expected a string (got {options[key]!r}).")
    for key in mappings:
        if key in options and not isinstance(options[key], Mapping):
            raise RunnerError(f"{where}.{key}: expected a mapping (got {options[key]!r}).")
    if "limits" in options:
        check_limits(options["limits"], where)
    timeout_s = options.get("timeout_s", default_timeout_s)
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise RunnerError(f"{where}.timeout_s: expected a positive number (got {timeout_s!r}).")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitRequest:
    """Everything a runner needs to run one attempt of one unit."""

    run_id: str
    step_id: str
    unit_id: str
    dispatch_id: str
    """Fresh per attempt, kept when a running attempt is reclaimed: an idempotency key."""
    input_hash: str = ""
    """sha256 of the canonical resolved input (what replay and caches key on)."""
    attempt: int
    kind: UnitKind
    prompt: str | None = None
    argv: tuple[str, ...] | None = None
    target: str | None = None
    kwargs: Mapping[str, Any] | None = None
    target_hash: str | None = None
    """Source hash of a python target frozen in the plan; a changed function is refused."""
    model: str | None = None
    output_schema: Mapping[str, Any] | None = None
    """JSON Schema the output must satisfy; runners that can should ask for JSON."""
    timeout_s: float | None = None
    item: Any = None
    index: int | None = None
    max_tokens: int | None = None
    """Tokens left in the run budget (None: unlimited); a runner should cap its output."""
    options: Mapping[str, Any] | None = None
    """The step's ``options:`` (sampling settings over the runner's own, ``runners/sampling.py``);
    None when the step sets none."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment for exec and agent units (minimal env + pass_env + WF_* names)."""
    agent: Mapping[str, Any] | None = None
    """An agent unit's settings: harness, permission, workdir, isolation, session, max_turns,
    pass_env, the feedback block, and (``resume``) the session a continued loop resumes."""
    on_text: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    """Set when somebody watches the unit live: a runner that can stream calls it with the
    text so far (at most ~10 times a second); one that cannot ignores it. Not part of the
    unit's identity: never hashed, compared or journaled."""
    redact: Callable[[Any], Any] | None = field(default=None, compare=False, repr=False)
    """The run's redaction of a text or JSON value (its secret params, credential shapes),
    given to agent units: the agent runner masks what the CLI wrote in the run's isolated HOME
    (its session transcripts) with it when the attempt ends. Never hashed or journaled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitResult:
    """A runner's answer for one attempt."""

    output: Any
    tokens_in: int | None = 0
    """Input tokens, cache reads and writes included; None when the server reported no count
    (journaled as NULL: unknown, never 0 and never estimated)."""
    tokens_out: int | None = 0
    """Output tokens; None when the server reported no count."""
    model: str | None = None
    cost: float | None = None
    """Dollars, when the runner knows; else the drive prices the usage (runners/pricing.py)."""
    session_id: str | None = None
    cache_read_tokens: int = 0
    """Of ``tokens_in``, those read from the provider's prompt cache (priced at their rate)."""
    cache_write_tokens: int = 0
    """Of ``tokens_in``, those written to the provider's prompt cache."""
    provider: str | None = None
    """Who served ``model``, as genai-prices names providers (``anthropic``, ``google``, …) or
    the API's base URL; ``offline`` for answers no provider served (never priced)."""
    price_source: str | None = None
    """Where ``cost`` came from when the runner set it (default ``runner``)."""
    tokens_estimated: bool = False
    """The counts are an estimate (a plugin's guess): never priced. The built-in runners
    report an unknown count as None instead."""
    facts: Mapping[str, Any] | None = None
    """Facts about how the result came about (an agent's harness, version, turns, worktree…),
    journaled beside the attempt."""


@runtime_checkable
class Runner(Protocol):
    """A thing that runs units. ``close`` releases held resources (clients, pools)."""

    def run(self, request: UnitRequest) -> UnitResult:
        """Run one attempt; raise ``RunnerError(transient=...)`` on failure."""
        ...

    def close(self) -> None:
        """Release resources; called once on every exit path of a drive."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerContext:
    """What a runner factory is given when a drive first needs the runner."""

    name: str
    """The name the plan uses for this runner (``runners:`` key or built-in name)."""
    options: Mapping[str, Any]
    """The frozen ``runners: {name: {...}}`` section of the plan (no secret values)."""
    state_dir: str
    """The state dir (the replay runner reads the journal there)."""
    workflow: str
    namespace: Mapping[str, Any] | None = None
    """Where bare python target names are looked up (the notebook's namespace)."""
    source_dir: str | None = None
    """Folder of the run's workflow file (python targets may import modules from it)."""
    journal: str | None = None
    """Where the journal is, when it is not ``state_dir``'s ``state.db``: the
    ``postgresql://`` URL of the state (the replay runner reads recordings there)."""


class BaseRunner:
    """Convenience base: a runner with nothing to close.

    A runner that calls a rate-limited provider may also define ``limit_key(model) -> str``:
    the endpoint a unit of ``model`` calls (base URL, model, a digest of the key — never the
    key). Units with the same key share one adaptive limiter (drive/limiter.py), and a call
    the runner reports refused (``RunnerError(throttled=True)``) is sent again in its attempt.
    """

    def run(self, request: UnitRequest) -> UnitResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        return None
