"""Rows crossing the store boundary as frozen dataclasses, and the status vocabularies."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields
from functools import cache
from typing import Literal, TypeVar

RunStatus = Literal["active", "blocked", "completed", "failed", "abandoned"]
"""Run status:

- ``active``: work remains; a drive (or resume) continues it.
- ``blocked``: waiting on a person (human gate, gate exhausted, judge failure).
- ``completed``: every step completed or was skipped.
- ``failed``: a step failed (unit failure, budget stop); resuming re-opens it.
- ``abandoned``: given up (superseded, abandoned by a person, undecodable plan).
"""
StepStatus = Literal["pending", "completed", "failed", "skipped", "blocked"]
"""Step status: ``pending`` (owed), ``completed``, ``failed``, ``skipped`` (by a route),
``blocked`` (a gate waits on a person or a judge)."""
AttemptStatus = Literal["running", "succeeded", "failed", "reused"]
"""Attempt status: ``running`` (reserved, not finished), ``succeeded``, ``failed``,
``reused`` (answered from an earlier run's succeeded attempt, zero tokens charged)."""

Phase = Literal["work", "gate", "score"]
"""Attempt phase:

- ``work``: a step's unit.
- ``gate``: a verdict unit ``<step>.gate:l<n>``.
- ``score``: a score unit ``<step>.score:<name>`` (``[i]`` per map item; m019)."""
StepKind = Literal["prompt", "exec", "python", "workflow", "route", "agent"]
"""Step kind (``wf_magic.spec.kinds.KINDS`` says how each behaves)."""

TERMINAL_RUN = ("completed", "abandoned")

T = TypeVar("T")


def from_row(cls: type[T], row: sqlite3.Row) -> T:
    """Build dataclass ``cls`` from a row holding (at least) its field names."""
    return cls(**{name: row[name] for name in _field_names(cls)})  # type: ignore[arg-type]


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    """The field names of dataclass ``cls`` (``fields()`` costs ~3 µs a row otherwise)."""
    return tuple(f.name for f in fields(cls))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    """A row of ``runs``."""

    run_id: str
    workflow: str
    plan_json: str
    plan_hash: str
    plan_version: int
    source_hash: str
    source_path: str | None
    params_json: str
    params_hash: str
    status: RunStatus
    status_reason: str | None
    scope_key: str
    parent_run_id: str | None
    invocation_key: str | None
    root_run_id: str
    forked_from: str | None
    fork_step: str | None
    use_cache: int
    stop_requested: int
    result_json: str | None
    created_at: float
    updated_at: float
    finished_at: float | None
    owner: str | None = None
    """The user the run belongs to (``wf_magic.users``); None: nobody's (a run from before
    owners were recorded), which anyone may change."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    """A row of ``steps`` (the step-state projection, written only by the spine)."""

    run_id: str
    step_id: str
    position: int
    kind: StepKind
    status: StepStatus
    loop: int
    max_loops: int
    note: str | None
    output_json: str | None
    updated_at: float
    stops_run: int = 0
    """1 when the step's failure stops the run whatever its on_error (a budget stop)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRow:
    """A row of ``attempts`` (the append-only journal)."""

    attempt_pk: int
    run_id: str
    workflow: str
    step_id: str
    unit_id: str
    attempt: int
    dispatch_id: str
    phase: Phase
    loop: int
    item_index: int | None
    runner: str
    model: str | None
    status: AttemptStatus
    input_hash: str
    charged: int
    tokens_in: int | None
    """None (NULL): the server reported no count — unknown, never 0 (m022)."""
    tokens_out: int | None
    cost: float | None
    saved_tokens: int
    reused_from: str | None
    session_id: str | None
    output_json: str | None
    failure: str | None
    transient: int | None
    started_at: float
    finished_at: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRow:
    """A row of ``events``."""

    event_id: int
    run_id: str
    at: float
    kind: str
    step_id: str | None
    unit_id: str | None
    dispatch_id: str | None
    data_json: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetUse:
    """A run's charged use against its ceilings."""

    units: int
    tokens: int
    cost: float
    max_units: int | None
    max_tokens: int | None
    max_cost: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeChoice:
    """What a start decides on seeing its scope's newest run (inside the start's transaction).

    ``keep`` set: that run is the answer and nothing is written. Otherwise the new run is
    inserted, abandoning ``supersede`` (an unfinished run of the scope) in the same write.
    """

    keep: RunRow | None = None
    supersede: str | None = None
