"""The values OpenTelemetry export works with: span records, a run's rows, derived ids.

Pure data (no SDK import): ``spans`` builds these from the journal, ``export`` turns them into
the SDK's spans. Trace and span ids are sha256 of the run id and the dispatch ids, so the same
journal always gives the same ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..hashing import canonical_json, sha256_text
from ..store.calls import CallRow
from ..store.records import AttemptRow, EventRow, RunRow, StepRow

SEMCONV_VERSION = "1.41.0"
"""The OpenTelemetry semantic conventions (GenAI, status Development) the spans follow."""
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

AttrValue = str | bool | int | float | tuple[str, ...]
SpanKindName = Literal["internal", "client"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanEvent:
    """Something that happened during a span (a reuse, a retry, a throttle, a budget stop)."""

    name: str
    at_s: float
    attributes: dict[str, AttrValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanRecord:
    """One span, ready for any exporter: ids as integers, times as epoch seconds."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    kind: SpanKindName
    start_s: float
    end_s: float
    attributes: dict[str, AttrValue]
    events: tuple[SpanEvent, ...] = ()
    error: str | None = None
    """Set: the span's status is ERROR with this description."""

    @property
    def span_hex(self) -> str:
        """The span id as OTLP JSON and receivers print it (16 hex digits)."""
        return f"{self.span_id:016x}"

    def fingerprint(self) -> str:
        """A hash of everything sent: a changed span (a resumed step) is sent again."""
        events = [[e.name, e.at_s, _plain(e.attributes)] for e in self.events]
        body = [self.name, self.parent_id, self.kind, self.start_s, self.end_s]
        return sha256_text(canonical_json([*body, _plain(self.attributes), events, self.error]))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunJournal:
    """What the spans of one run are built from (read through the Store: otel/journal.py)."""

    run: RunRow
    steps: Sequence[StepRow]
    attempts: Sequence[AttemptRow]
    events: Sequence[EventRow]
    kinds: Mapping[str, str]
    """Step id → step kind."""
    agent_facts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Dispatch id → the agent facts journaled beside that attempt."""
    inputs: Mapping[str, str] = field(default_factory=dict)
    """Input hash → the unit's resolved input JSON (only read with content on)."""
    calls: Mapping[str, Sequence[CallRow]] = field(default_factory=dict)
    """Dispatch id → the model calls the agent bridge journaled for that attempt, by number."""


# -- ids ----------------------------------------------------------------------------------------
def trace_id_of(run_id: str) -> int:
    """The 16-byte trace id of ``run_id``."""
    return int(sha256_text(f"wf_magic/otel trace\0{run_id}")[:32], 16) or 1


def span_id_of(*parts: str) -> int:
    """The 8-byte span id of the journal thing named by ``parts``."""
    return int(sha256_text("wf_magic/otel span\0" + "\0".join(parts))[:16], 16) or 1


def root_span_id(run_id: str) -> int:
    return span_id_of("run", run_id)


def step_span_id(run_id: str, step_id: str) -> int:
    return span_id_of("step", run_id, step_id)


def attempt_span_id(dispatch_id: str) -> int:
    return span_id_of("attempt", dispatch_id)


def call_span_id(dispatch_id: str, call: int) -> int:
    """The span of model call number ``call`` of an agent attempt: the number, never a
    position, so a call journaled late (a reclaimed attempt's) leaves the others' ids be."""
    return span_id_of("agent-call", dispatch_id, str(call))


def _plain(attrs: Mapping[str, AttrValue]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()}


def span_ids(spans: Iterable[SpanRecord]) -> set[str]:
    """The hex span ids of ``spans``."""
    return {s.span_hex for s in spans}
