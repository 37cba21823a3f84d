"""The harness adapter protocol: what one coding-agent CLI is asked, and what its output means.

An adapter knows one CLI: its argv (prompt, model, permission, turns, session), the quiet
environment that keeps it from updating, phoning home or asking questions, how to read the
session id and progress from its streamed lines, and how to turn its final output into an
:class:`Outcome`, failures classified transient or permanent from the error's shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..errors import RunnerError

Permission = Literal["read", "edits", "full"]
ErrorClass = Literal[
    "auth",
    "rate_limited",
    "overloaded",
    "server_error",
    "network",
    "timeout",
    "bad_flag",
    "unknown_session",
    "session_in_use",
    "max_turns",
    "permission_denied",
    "refused",
    "stopped",
    "budget",
    "replay",
    "failed",
]
"""Why an agent attempt failed:

- ``auth``: the backend refused the credentials (401/403): permanent.
- ``rate_limited``: 429: transient.
- ``overloaded``: 529 or an "overloaded" error: transient.
- ``server_error``: another 5xx: transient.
- ``network``: the backend could not be reached: transient.
- ``timeout``: the step timeout killed the process group: transient.
- ``bad_flag``: the CLI rejected its arguments: permanent.
- ``unknown_session``: the session to resume does not exist: permanent.
- ``session_in_use``: the preset session id is taken: permanent.
- ``max_turns``: the agent used up ``max_turns`` (Claude ``error_max_turns``): permanent.
- ``permission_denied``: edits were asked for but the CLI denied its tool calls: permanent.
- ``refused``: the CLI refused the permission mode (e.g. a bypass as root): permanent.
- ``stopped``: a Stop or an interrupt ended its process group: transient.
- ``budget``: the bridge refused a model call at a run budget ceiling: permanent, and the
  run stops with its ``Budget exceeded …`` line.
- ``replay``: a replayed attempt asked for a call its recording does not have: permanent.
- ``failed``: anything else: permanent.
"""
MAX_DEPTH = 128
"""The deepest nesting of a CLI's JSON that is read (deeper: skipped as not JSON)."""
TRANSIENT: frozenset[str] = frozenset(
    {"rate_limited", "overloaded", "server_error", "network", "timeout", "stopped"}
)


def classify_status(status: int | None) -> ErrorClass | None:
    """The error class of an HTTP status a CLI reported (None: not an HTTP error)."""
    if status is None:
        return None
    if status in (401, 403):
        return "auth"
    if status == 429:
        return "rate_limited"
    if status == 529:
        return "overloaded"
    if 500 <= status < 600:
        return "server_error"
    return "failed"


_TEXT_CLASSES: tuple[tuple[re.Pattern[str], ErrorClass], ...] = (
    (re.compile(r"(?i)\b(401|403)\b|unauthori[sz]ed|authenticat|invalid api key"), "auth"),
    (re.compile(r"(?i)\b529\b|overloaded"), "overloaded"),
    (re.compile(r"(?i)\b429\b|rate.?limit|too many requests"), "rate_limited"),
    (
        re.compile(r"(?i)\b5\d\d\b|high demand|server.side issue|internal server error"),
        "server_error",
    ),
    (
        re.compile(r"(?i)econnrefused|connection (error|refused|reset)|timed? ?out|unreachable"),
        "network",
    ),
    (
        re.compile(r"(?i)no conversation found|no rollout found|no previous sessions"),
        "unknown_session",
    ),
    (re.compile(r"(?i)already in use|already exists"), "session_in_use"),
    (re.compile(r"(?i)root/sudo privileges"), "refused"),
    (re.compile(r"(?i)unknown option|unexpected argument|unrecognized|invalid value"), "bad_flag"),
)


def classify_text(text: str) -> ErrorClass:
    """The error class a CLI's error message reads as (``failed`` when none matches)."""
    for pattern, error_class in _TEXT_CLASSES:
        if pattern.search(text):
            return error_class
    return "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCall:
    """What one launch of a harness is asked to do."""

    prompt: str
    model: str | None
    permission: Permission
    max_turns: int | None
    cwd: str
    home: str
    """The HOME the CLI sees (the run's isolated one, or the user's)."""
    scratch: str
    """A folder of this dispatch for files the CLI is given (a schema file)."""
    session_id: str | None = None
    """A session id to start the session with (harnesses that accept a preset id)."""
    resume_id: str | None = None
    """The session to resume (a continued loop or a reclaimed attempt)."""
    output_schema: Mapping[str, Any] | None = None
    max_cost: float | None = None
    """The run's remaining cost allowance, for a harness that accepts a spend cap."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """An agent attempt's failure as the CLI reported it."""

    error_class: ErrorClass
    message: str

    @property
    def transient(self) -> bool:
        """Whether a retry may succeed."""
        return self.error_class in TRANSIENT


@dataclass(slots=True, kw_only=True)
class Outcome:
    """What a finished launch produced, normalized across harnesses."""

    text: str | None = None
    """The agent's final answer."""
    structured: Any = None
    """A native structured output (when the harness produced one for ``output:``)."""
    session_id: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    usage_cumulative: bool = False
    """The usage counts the whole session so far (Codex on a resumed thread)."""
    cost: float | None = None
    cost_source: str | None = None
    """Where ``cost`` comes from (e.g. Claude's client-side estimate)."""
    turns: int | None = None
    denials: list[Any] = field(default_factory=list)
    failure: Failure | None = None
    final: Any = None
    """The CLI's final JSON (its result object, or its last event)."""
    warnings: list[str] = field(default_factory=list)
    """Reported numbers refused (negative, non-finite, not numbers): journaled as warnings."""


@dataclass(slots=True)
class Watch:
    """What the streamed lines told so far: the session id and a progress line."""

    session_id: str | None = None
    turns: int = 0
    tools: int = 0
    last: str = ""

    def progress(self) -> str:
        """A one-line summary for the run view and ``wf run``'s progress line."""
        parts = [f"turn {self.turns}" if self.turns else "starting"]
        if self.tools:
            parts.append(f"{self.tools} tool use{'s' if self.tools != 1 else ''}")
        if self.last:
            parts.append(self.last[:80])
        return " · ".join(parts)


class Harness(Protocol):
    """One coding-agent CLI (see ``agents/claude.py`` for a complete one)."""

    name: str
    default_bin: str
    presets_session: bool
    """Whether a new session can be given its id (``--session-id``)."""
    resumes_anywhere: bool
    """Whether a session resumes from any folder (else only from the one it started in)."""
    prompt_on_stdin: bool
    """Whether ``argv`` leaves the prompt out and the CLI reads it from stdin (the runner writes
    it there): a prompt is then never parsed as an option nor seen in another process's
    ``/proc/PID/cmdline``. A harness without it must put ``--`` before the prompt."""

    def argv(self, call: AgentCall) -> list[str]:
        """The arguments after the binary (and the ``runners:`` args)."""
        ...

    def quiet_env(self, call: AgentCall) -> dict[str, str]:
        """Variables that keep it quiet (no updates, telemetry, prompts, own retries); may write
        settings files under ``call.home``. ``pass_env`` names win over these."""
        ...

    def watch(self, event: Mapping[str, Any], seen: Watch) -> None:
        """Fold one streamed JSON line into ``seen`` (session id, turns, tool uses)."""
        ...

    def outcome(
        self,
        events: Sequence[Mapping[str, Any]],
        stdout: str,
        stderr: str,
        code: int,
        call: AgentCall,
    ) -> Outcome:
        """The normalized outcome of a finished launch (``events``: stdout's JSON lines)."""
        ...


class AgentError(RunnerError):
    """A failed agent attempt, carrying the facts to journal beside it."""

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        facts: Mapping[str, Any] | None = None,
        tokens_in: int | None = 0,
        tokens_out: int | None = 0,
        executed: bool = True,
        cost: float | None = None,
        price_source: str | None = None,
        budget_stop: str | None = None,
    ):
        super().__init__(
            message,
            transient=transient,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            executed=executed,
            cost=cost,
            price_source=price_source,
        )
        self.facts = dict(facts or {})
        self.budget_stop = budget_stop
        """The ``Budget exceeded …`` line when the bridge stopped the agent at a ceiling."""


def depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts deeper than ``limit`` (without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def parse_lines(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects of ``stdout``: one per line (JSONL), or pretty-printed over several
    lines (Gemini's ``-o json``, its error object on stderr); other text is skipped."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    position = 0
    while position < len(stdout):
        end = stdout.find("\n", position)
        end = len(stdout) if end < 0 else end
        start = position + (len(stdout[position:end]) - len(stdout[position:end].lstrip()))
        if stdout.startswith("{", start):
            try:
                value, stop = decoder.raw_decode(stdout, start)
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                value, stop = None, end
            if isinstance(value, dict) and not depth_over(value, MAX_DEPTH):
                out.append(value)
            position = max(stop, end if value is None else stop)
            continue
        position = end + 1
    return out


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, clipped."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""
