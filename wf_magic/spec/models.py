"""Authoring models: the YAML format reference, validated strictly (unknown keys are errors)."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ID_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
STEP_ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
KIND_KEYS = ("prompt", "exec", "python", "workflow", "route", "agent")
AGENT_KEYS = ("permission", "workdir", "isolation", "session", "max_turns", "bridge")
"""Keys read only by ``agent:`` steps."""
AGENT_TIMEOUT_S = 1800.0
"""An agent step's ``timeout`` when none is written (30 minutes)."""
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class RetrySpec(_Strict):
    """Re-dispatch a unit after a transient runner error."""

    max_attempts: int = Field(1, ge=1, le=100)
    """Attempts in all, the first included (1 = no retry)."""
    backoff_s: float = Field(0.0, ge=0, le=3600)
    """Seconds to wait before the second attempt; doubles for each further attempt (each
    wait jittered up to a quarter longer, so units that failed together do not retry together)."""


MODEL_CALL_RETRY = RetrySpec(max_attempts=3, backoff_s=1.0)
"""A prompt step's ``retry`` when it names none: model calls fail transiently (a 5xx, a body
cut mid-way, a timeout) often enough that a sweep must not fail its cells on the first one.
Refusals by a provider's rate limiter are not retries at all (drive/endpoints.py).
``retry: {max_attempts: 1}`` opts out."""


class GateSpec(_Strict):
    """A completion gate judging the step's artifact."""

    criteria: list[str] = Field(default_factory=list)
    """Templated criteria: the judge's checklist, and the feedback of an ``expr`` rejection."""
    judge: Literal["llm", "expr", "human"] = "llm"
    """- ``llm``: a runner call answering ``{complete, feedback, missing[]}``.
    - ``expr``: ``check`` (a Jinja boolean over ``output`` and ``params``), free.
    - ``human``: the run blocks until someone approves or rejects."""
    check: str | None = None
    """The Jinja expression of an ``expr`` judge (no braces)."""
    max_loops: int = Field(1, ge=1, le=50)
    """Executions of the step in all; after this many rejections the run stops."""
    runner: str | None = None
    """Runner of an ``llm`` judge (default: a prompt step's runner; for any other kind the
    workflow's ``runner``)."""
    model: str | None = None
    """Model of an ``llm`` judge; an id, alias or params template. Default: a prompt step's
    model; for any other kind none, so the judge runner's own ``model`` option applies (an
    agent's model is no model for the workflow's runner)."""
    charged: bool | None = None
    """Charge an ``llm`` judge's calls to the run's budget (a dispatch, its tokens and
    cost), as work units are; default: the workflow's ``budget.charge_judges`` (false)."""
    per_item: bool = False
    """On a map step: judge each unit's output alone (its own verdict unit
    ``<step>.gate:l<loop>[<i>]``) and re-execute only the rejected items; the accepted ones
    keep their output. ``llm`` and ``expr`` judges (and the output schema) only."""

    @model_validator(mode="after")
    def _check_needs_expr(self) -> GateSpec:
        if self.judge == "expr" and not self.check:
            raise ValueError("an expr judge needs `check:` (a Jinja boolean expression)")
        if self.judge != "expr" and self.check:
            raise ValueError("`check:` is only read by `judge: expr`")
        if self.charged is not None and self.judge != "llm":
            raise ValueError(
                f"`charged:` is only read by `judge: llm` (a {self.judge} judge costs nothing)"
            )
        if self.per_item and self.judge == "human":
            raise ValueError(
                "`per_item:` needs `judge: llm` or `judge: expr` (a human gate decides the "
                "whole step)"
            )
        return self


SCORE_KINDS = ("equals", "contains", "regex", "json_schema", "judge", "python")
"""The keys of a score, exactly one of which names its scorer."""
SCORE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]*$"


class ScoreSpec(_Strict):
    """A score: measures a step's output (each map item's) without gating it; a number.

    Exactly one of ``equals``, ``contains``, ``regex``, ``json_schema``, ``judge`` or
    ``python`` names the scorer (docs/evaluations.md, "Scores")."""

    name: str = Field(pattern=SCORE_NAME_PATTERN, max_length=64)
    """Unique within the step: the unit ``<step>.score:<name>`` and the column
    ``score.<step>.<name>``."""
    equals: str | int | float | bool | list[Any] | dict[str, Any] | None = None
    """1 when the output equals this (a string is a template, compared with the output's
    text, both stripped of surrounding whitespace; any other value is compared as JSON), else 0."""
    contains: str | None = None
    """1 when the output's text contains this template's text, else 0."""
    ignore_case: bool = False
    """``equals``/``contains``: compare casefolded."""
    regex: str | None = None
    """1 when this pattern (a template) is found in the output's text (``re.search``), else 0."""
    json_schema: dict[str, Any] | None = None
    """1 when the output (a JSON text, a code fence allowed, or a JSON value) satisfies this
    JSON Schema, else 0 (the explanation names the first error)."""
    judge: Literal["llm"] | None = None
    """``llm``: a judge rates the output on ``rubric`` within ``scale``, answering
    ``{value, explanation}``; an unparsable or out-of-scale answer is a failed score unit."""
    rubric: str | None = None
    """The question an ``llm`` judge answers (a template)."""
    scale: tuple[float, float] | None = None
    """``[lo, hi]`` of an ``llm`` judge's value (default ``[0, 1]``)."""
    python: str | None = None
    """A callable (``module:function`` or a registered name) called with the output (and
    ``params``, ``item``, ``index`` if it takes them); it returns a number, a bool or
    ``{value, explanation}``."""
    runner: str | None = None
    """Runner of an ``llm`` judge (the gate rule: a prompt step's runner, else the workflow's)."""
    model: str | None = None
    """Model of an ``llm`` judge (the gate rule: an id, alias or params template; default a
    prompt step's model)."""
    charged: bool | None = None
    """Charge an ``llm`` judge's calls to the budget; default ``budget.charge_judges`` (false)."""

    @property
    def kind(self) -> str:
        """The scorer: equals, contains, regex, json_schema, judge or python."""
        return next(k for k in SCORE_KINDS if getattr(self, k) is not None)

    @model_validator(mode="after")
    def _one_scorer(self) -> ScoreSpec:
        given = [k for k in SCORE_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            got = ", ".join(given) if given else "none"
            raise ValueError(f"a score needs exactly one of {', '.join(SCORE_KINDS)} (got {got})")
        kind = given[0]
        if self.ignore_case and kind not in ("equals", "contains"):
            raise ValueError("`ignore_case:` is read only by `equals` and `contains` scores")
        llm_only = ("rubric", "scale", "runner", "model", "charged")
        for key in llm_only:
            if getattr(self, key) is not None and kind != "judge":
                raise ValueError(f"`{key}:` is read only by `judge: llm` scores")
        if kind == "judge" and not (self.rubric or "").strip():
            raise ValueError("a `judge: llm` score needs `rubric:` (what the judge rates)")
        if self.scale is not None:
            lo, hi = self.scale
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"expected `scale: [lo, hi]` with finite lo < hi (got {lo}, {hi})")
        return self


class RouteSpec(_Strict):
    """Select which later steps run."""

    on: str
    """Template whose rendered value (stripped text) picks a case."""
    cases: dict[str, str] = Field(min_length=1)
    """Value → step id; the key ``default`` catches every other value."""


class StepSpec(_Strict):
    """One step; exactly one of prompt / exec / python / workflow / route / agent."""

    id: str = Field(pattern=STEP_ID_PATTERN, max_length=64)
    """Unique step id, usable in templates as ``steps.<id>.output``."""
    prompt: str | None = None
    """Jinja template of an LLM/agent unit."""
    exec: list[str] | None = Field(None, min_length=1)
    """argv of a subprocess unit, frozen and never interpolated."""
    python: str | None = None
    """A callable: ``module:function`` or a name registered from the notebook/Python."""
    workflow: str | None = None
    """Name of a child workflow, frozen into this plan."""
    route: RouteSpec | None = None
    agent: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64)
    """A coding-agent harness (``claude``, ``codex``, ``opencode``, ``gemini`` or a registered
    one) run headless on ``prompt:`` in ``workdir``; see docs/agents.md."""
    permission: Literal["read", "edits", "full"] | None = None
    """What an agent may do (default ``edits``):

    - ``read``: read files only.
    - ``edits``: read and edit files in its folder.
    - ``full``: edit and run any tool without asking (the harness's bypass mode)."""
    workdir: str | None = None
    """The agent's folder, relative to the workflow file's folder and inside it (default: that
    folder)."""
    isolation: Literal["none", "worktree"] | None = None
    """- ``none`` (default): the agent works in ``workdir`` itself.
    - ``worktree``: each attempt gets a fresh ``git worktree add --detach`` under the state dir."""
    session: Literal["fresh", "continue"] | None = None
    """- ``fresh`` (default): every loop starts a new agent session.
    - ``continue``: loop n+1 and a reclaimed attempt resume the previous session."""
    max_turns: int | None = Field(None, ge=1, le=10_000)
    """Agent turns before the harness stops (passed where the harness accepts it)."""
    bridge: bool | None = None
    """Whether the agent's model calls go through wf_magic's bridge (journaled per call,
    budgeted, rate-limited); default: the harness's ``runners: {NAME: {bridge}}``, on where
    its login can be bridged (docs/agents.md, "The bridge")."""
    with_: dict[str, Any] | None = Field(None, alias="with")
    """Template bindings: a child workflow's params, or a python callable's keyword arguments."""
    map: str | None = None
    """Template evaluating to a list: one unit per item (``item``, ``index`` in scope)."""
    reduce: Literal["collect", "vote"] = "collect"
    """Map artifact: ``collect`` = outputs in item order; ``vote`` = the majority output."""
    runner: str | None = None
    """Runner for prompt units (default: the workflow's ``runner``)."""
    model: str | None = None
    """Model passed to the runner: an id, an alias (``models:``), or a template over params
    rendered when the run starts (``"{{ params.model }}"``)."""
    timeout: float | None = Field(None, gt=0, le=86_400)
    """Seconds (or ``90s``, ``30m``, ``2h``) before an attempt is killed and failed; agent steps
    default to 30 minutes."""
    retry: RetrySpec = RetrySpec()
    on_error: Literal["fail", "continue"] = "fail"
    """``fail`` stops the run on a failed unit; ``continue`` records it and goes on."""
    output: dict[str, Any] | None = None
    """JSON Schema (subset) the step's output must satisfy; mismatches feed the gate loop."""
    gate: GateSpec | None = None
    cache: bool | None = None
    """Whether this step's results may be reused by other runs (siblings, re-runs) with the
    same input. Not given: the kind's default (``spec/kinds.py``), which is on for prompt,
    python and workflow steps and off for ``exec`` steps, whose side effects a reuse would
    skip; ``true`` opts an exec step in, ``false`` opts any step out."""
    pass_env: list[str] = Field(default_factory=list)
    """Extra environment variable names an ``exec`` unit receives (never ``WF_*``)."""
    score: list[ScoreSpec] = Field(default_factory=list, max_length=100)
    """Scores measuring the step's output (each map item's) once the step completed (its gate
    accepted): each a journaled unit ``<step>.score:<name>``; a score never gates or loops."""
    options: dict[str, Any] | None = None
    """The step's own sampling settings over its runner's (``temperature``, ``top_p``,
    ``max_tokens``, ``seed``, ``stop``, ``system_prompt``; ``runners/sampling.py``), checked
    at freeze against the names the step's runner takes. Part of each unit's input hash."""

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        found = _DURATION.match(value)
        if found is None:
            raise ValueError(f"expected seconds or a duration like 90s, 30m or 2h (got {value!r})")
        return float(found.group(1)) * _UNIT_S[found.group(2)]

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        given = [k for k in KIND_KEYS if getattr(self, k) is not None]
        if self.agent is not None and "prompt" in given:
            given.remove("prompt")  # an agent step's prompt is what the agent is asked
        if len(given) != 1:
            got = ", ".join(given) if given else "none"
            raise ValueError(f"a step needs exactly one of {', '.join(KIND_KEYS)} (got {got})")
        if self.route is not None and (self.map or self.gate or self.output):
            raise ValueError("a route step takes no map, gate or output")
        if self.with_ is not None and self.python is None and self.workflow is None:
            raise ValueError("`with:` is read only by python and workflow steps")
        kind = self.kind
        if self.pass_env and kind not in ("exec", "agent"):
            raise ValueError("`pass_env:` is read only by exec and agent steps")
        if self.agent is not None and self.prompt is None:
            raise ValueError("an agent step needs `prompt:` (what the agent is asked to do)")
        for key in AGENT_KEYS:
            if getattr(self, key) is not None and kind != "agent":
                raise ValueError(f"`{key}:` is read only by agent steps (this is a {kind} step)")
        if self.reduce != "collect" and self.map is None:
            raise ValueError("`reduce:` needs `map:` (it combines the outputs of a fan-out)")
        if self.runner is not None and kind != "prompt":
            raise ValueError(f"`runner:` is read only by prompt steps (this is a {kind} step)")
        if self.score and kind == "route":
            raise ValueError("a route step takes no score (it has no output to measure)")
        names = [sc.name for sc in self.score]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"score names must be unique within a step (twice: {twice})")
        if self.model is not None and kind not in ("prompt", "agent"):
            raise ValueError(f"`model:` is read only by prompt steps (this is a {kind} step)")
        return self

    @property
    def kind(self) -> str:
        """The step kind: prompt, exec, python, workflow, route or agent (an agent step has a
        ``prompt:`` too: ``agent:`` decides)."""
        if self.agent is not None:
            return "agent"
        return next(k for k in KIND_KEYS if getattr(self, k) is not None)


class BudgetSpec(_Strict):
    """Per-run ceilings; a unit that would pass one is not dispatched."""

    max_units: int | None = Field(None, ge=1)
    """Dispatch attempts (gate rows and reused results are free)."""
    max_tokens: int | None = Field(None, ge=1)
    """Tokens in + out of dispatch attempts."""
    max_cost: float | None = Field(None, gt=0)
    """Cost (runner-reported currency units) of dispatch attempts."""
    charge_judges: bool = False
    """Charge every ``llm`` gate's judge calls to the budget (a gate's ``charged:`` wins):
    judges cost real money."""


class ExecutionSpec(_Strict):
    """How units are dispatched."""

    max_concurrency: int = Field(1, ge=1, le=256)
    """Map units in flight at once (the caller may lower it)."""
    durability: Literal["normal", "full"] = "normal"
    """``full`` selects SQLite synchronous=FULL (power-loss safe, slower)."""


class WorkflowSpec(_Strict):
    """A whole workflow source."""

    name: str = Field(pattern=ID_PATTERN, max_length=64)
    description: str = ""
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Param name → JSON Schema (``type``, ``default``, ``minimum``, ``enum``, ...)."""
    budget: BudgetSpec = BudgetSpec()
    execution: ExecutionSpec = ExecutionSpec()
    runner: str = "scripted"
    """Default runner of prompt steps and llm judges."""
    runners: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Runner configuration by name (``type:`` selects a registered runner, default the name)."""
    models: dict[str, Any] = Field(default_factory=dict)
    """Model aliases: alias → model id, or alias → {runner name or type, ``default``: id};
    they win over ``models.yaml`` beside the file and in the state dir (``spec/aliases.py``)."""
    steps: list[StepSpec] = Field(min_length=1, max_length=10_000)
