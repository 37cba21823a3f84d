"""A run's journal as OpenTelemetry GenAI span records: pure values, no SDK import.

One run is one trace. Its ids are derived from the run id and the dispatch ids (sha256), so
the same journal always gives the same spans and exporting again never duplicates one:

::

    invoke_workflow <workflow>          the run (root)
    └── step <step>                     one per step that settled
        ├── chat <model>                a prompt unit's attempt
        ├── invoke_agent <harness>      an agent unit's attempt
        │   └── chat <model>            one per model call the agent bridge journaled
        ├── execute_tool <step>         an exec / python unit's attempt
        ├── invoke_workflow <step>      a child workflow unit's attempt
        ├── gate <step>                 a gate verdict (loop n)
        └── score <name>                a score unit

Reuse, retries, throttles and budget stops are span events. The attribute names follow the
OpenTelemetry semantic conventions for generative AI, ``records.SEMCONV_VERSION``
(docs/otel.md has the table).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..hashing import canonical_json
from ..redact import Redactor
from ..sealing import SEAL_PREFIX
from ..store.records import AttemptRow, EventRow, StepRow
from .calls import WIRE_PROVIDERS, call_span
from .records import (
    AttrValue,
    RunJournal,
    SpanEvent,
    SpanKindName,
    SpanRecord,
    attempt_span_id,
    root_span_id,
    step_span_id,
    trace_id_of,
)

SETTLED_STEP = ("completed", "failed", "skipped", "blocked")
"""Step statuses a step span is sent at (a resumed step is sent again, same span id)."""
CONTENT_CAP = 16_384
"""Characters of one prompt or output attached with content on (longer: clipped, marked)."""
_ERROR_TYPE = re.compile(r"^([A-Z][A-Za-z0-9_.]*(?:Error|Exception|Exceeded|Timeout|Interrupt))\b")


# -- the spans ----------------------------------------------------------------------------------
def build_spans(
    journal: RunJournal,
    *,
    redactor: Redactor,
    content: bool = False,
) -> list[SpanRecord]:
    """Every span the journal holds as settled: finished attempts, settled steps, a settled run.

    Args:
        journal: the run's rows.
        redactor: the run's redactor; every text attached passes it.
        content: attach prompts and outputs (``gen_ai.input.messages`` / ``output.messages``).
    """
    builder = _Builder(journal, redactor=redactor, content=content)
    return builder.spans()


class _Builder:
    """Builds one run's spans; holds what every span of the run shares."""

    def __init__(self, journal: RunJournal, *, redactor: Redactor, content: bool) -> None:
        self.j = journal
        self.redact = redactor
        self.content = content
        self.trace_id = trace_id_of(journal.run.run_id)
        self.by_dispatch: dict[str, list[EventRow]] = {}
        for event in journal.events:
            if event.dispatch_id:
                self.by_dispatch.setdefault(event.dispatch_id, []).append(event)

    def spans(self) -> list[SpanRecord]:
        out: list[SpanRecord] = []
        finished = [a for a in self.j.attempts if a.finished_at is not None]
        previous: dict[tuple[str, int], AttemptRow] = {}
        for attempt in sorted(self.j.attempts, key=lambda a: a.attempt_pk):
            key = (attempt.unit_id, attempt.loop)
            if attempt.finished_at is not None:
                out.extend(self._attempt(attempt, previous.get(key)))
            previous[key] = attempt
        for step in self.j.steps:
            if step.status in SETTLED_STEP:
                out.append(self._step(step, [a for a in finished if a.step_id == step.step_id]))
        if self.j.run.status != "active":
            out.append(self._root(finished))
        return out

    # -- the root and the steps ---------------------------------------------------------------
    def _root(self, finished: Sequence[AttemptRow]) -> SpanRecord:
        run = self.j.run
        attrs: dict[str, AttrValue] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.workflow.name": run.workflow,
            "wf_magic.run.id": run.run_id,
            "wf_magic.run.status": run.status,
            "wf_magic.plan.hash": run.plan_hash,
        }
        if run.status_reason:
            attrs["wf_magic.run.reason"] = self.redact.redact(run.status_reason)
        for name, value in _params(run.params_json).items():
            attrs[f"wf_magic.param.{name}"] = self._param(value)
        for key, value in (("parent", run.parent_run_id), ("forked_from", run.forked_from)):
            if value:
                attrs[f"wf_magic.run.{key}"] = value
        ends = [a.finished_at or a.started_at for a in finished]
        end = run.finished_at or max([run.updated_at, *ends])
        events = tuple(
            SpanEvent(name="wf_magic.budget_stop", at_s=s.updated_at, attributes=self._stop(s))
            for s in self.j.steps
            if s.stops_run and s.status == "failed"
        )
        failed = run.status in ("failed", "abandoned")
        return SpanRecord(
            name=f"invoke_workflow {run.workflow}",
            trace_id=self.trace_id,
            span_id=root_span_id(run.run_id),
            parent_id=None,
            kind="internal",
            start_s=run.created_at,
            end_s=max(end, run.created_at),
            attributes=attrs,
            events=events,
            error=self.redact.redact(run.status_reason or run.status) if failed else None,
        )

    def _step(self, step: StepRow, attempts: Sequence[AttemptRow]) -> SpanRecord:
        start = min((a.started_at for a in attempts), default=step.updated_at)
        end = max([*(a.finished_at or a.started_at for a in attempts), step.updated_at])
        attrs: dict[str, AttrValue] = {
            "wf_magic.run.id": step.run_id,
            "wf_magic.step.id": step.step_id,
            "wf_magic.step.kind": step.kind,
            "wf_magic.step.status": step.status,
            "wf_magic.step.loops": step.loop,
            "wf_magic.step.max_loops": step.max_loops,
        }
        if step.note:
            attrs["wf_magic.step.note"] = self.redact.redact(step.note)
        stopped = bool(step.stops_run) and step.status == "failed"
        events = (
            (
                SpanEvent(
                    name="wf_magic.budget_stop", at_s=step.updated_at, attributes=self._stop(step)
                ),
            )
            if stopped
            else ()
        )
        return SpanRecord(
            name=f"step {step.step_id}",
            trace_id=self.trace_id,
            span_id=step_span_id(step.run_id, step.step_id),
            parent_id=root_span_id(step.run_id),
            kind="internal",
            start_s=min(start, end),
            end_s=end,
            attributes=attrs,
            events=events,
            error=self.redact.redact(step.note or "failed") if step.status == "failed" else None,
        )

    def _stop(self, step: StepRow) -> dict[str, AttrValue]:
        return {
            "wf_magic.step.id": step.step_id,
            "wf_magic.reason": self.redact.redact(step.note or ""),
        }

    # -- attempts -----------------------------------------------------------------------------
    def _attempt(self, a: AttemptRow, previous: AttemptRow | None) -> list[SpanRecord]:
        kind = self.j.kinds.get(a.step_id, "prompt")
        attrs = self._common(a)
        if a.phase == "gate":
            name = f"gate {a.step_id}"
            span_kind: SpanKindName = "internal"
            attrs.update(self._verdict(a))
        elif a.phase == "score":
            name = f"score {_score_name(a.unit_id)}"
            span_kind = "internal"
            attrs.update(self._score(a))
        elif kind == "agent":
            name, span_kind = f"invoke_agent {a.runner}", "client"
            attrs.update(self._agent(a))
        elif kind in ("exec", "python", "route"):
            name, span_kind = f"execute_tool {a.step_id}", "internal"
            attrs.update(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": a.step_id,
                    "gen_ai.tool.type": "function",
                }
            )
        elif kind == "workflow":
            name, span_kind = f"invoke_workflow {a.step_id}", "internal"
            attrs["gen_ai.operation.name"] = "invoke_workflow"
        else:
            name, span_kind = f"chat {a.model or a.runner}", "client"
            attrs.update(self._chat(a))
        if self.content:
            attrs.update(self._content(a, kind))
        end = max(a.finished_at or a.started_at, a.started_at)
        span = SpanRecord(
            name=name,
            trace_id=self.trace_id,
            span_id=attempt_span_id(a.dispatch_id),
            parent_id=step_span_id(a.run_id, a.step_id),
            kind=span_kind,
            start_s=a.started_at,
            end_s=end,
            attributes=attrs,
            events=self._events(a, previous),
            error=self.redact.redact(a.failure or "failed") if a.status == "failed" else None,
        )
        return [span, *self._agent_calls(a)]

    def _common(self, a: AttemptRow) -> dict[str, AttrValue]:
        attrs: dict[str, AttrValue] = {
            "wf_magic.run.id": a.run_id,
            "wf_magic.step.id": a.step_id,
            "wf_magic.unit.id": a.unit_id,
            "wf_magic.dispatch.id": a.dispatch_id,
            "wf_magic.attempt": a.attempt,
            "wf_magic.attempt.status": a.status,
            "wf_magic.phase": a.phase,
            "wf_magic.loop": a.loop,
            "wf_magic.runner": a.runner,
        }
        if a.item_index is not None:
            attrs["wf_magic.item.index"] = a.item_index
        if a.cost is not None:
            attrs["wf_magic.cost.usd"] = a.cost
        if a.status == "failed":
            attrs["error.type"] = _error_type(a.failure)
            attrs["wf_magic.failure.transient"] = bool(a.transient)
        if a.reused_from:
            attrs["wf_magic.reused_from"] = a.reused_from
        return attrs

    def _chat(self, a: AttemptRow) -> dict[str, AttrValue]:
        attrs: dict[str, AttrValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_of(a.runner, a.model),
        }
        # A count the server did not report (NULL) is left out, never sent as 0.
        if a.tokens_in is not None:
            attrs["gen_ai.usage.input_tokens"] = a.tokens_in
        if a.tokens_out is not None:
            attrs["gen_ai.usage.output_tokens"] = a.tokens_out
        if a.model:
            attrs["gen_ai.request.model"] = a.model
        return attrs

    def _agent(self, a: AttemptRow) -> dict[str, AttrValue]:
        attrs = self._chat(a)
        attrs["gen_ai.operation.name"] = "invoke_agent"
        attrs["gen_ai.agent.name"] = a.step_id
        facts = self.j.agent_facts.get(a.dispatch_id) or {}
        session = a.session_id or facts.get("session_id")
        if isinstance(session, str) and session:
            attrs["gen_ai.conversation.id"] = session
        for key in ("harness", "version", "turns", "exit_code", "error_class"):
            value = facts.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                attrs[f"wf_magic.agent.{key}"] = (
                    self.redact.redact(value) if isinstance(value, str) else value
                )
        return attrs

    def _agent_calls(self, a: AttemptRow) -> list[SpanRecord]:
        calls = self.j.calls.get(a.dispatch_id, ())
        if not calls:
            return []
        harness = (self.j.agent_facts.get(a.dispatch_id) or {}).get("harness") or a.runner
        provider = WIRE_PROVIDERS.get(str(harness)) or provider_of(a.runner, a.model)
        return [
            call_span(c, a, trace_id=self.trace_id, provider=provider, redactor=self.redact)
            for c in calls
        ]

    def _verdict(self, a: AttemptRow) -> dict[str, AttrValue]:
        out = _json(a.output_json)
        verdict = out if isinstance(out, dict) else {}
        said = (
            "error"
            if a.status == "failed"
            else "pass"
            if verdict.get("complete") is True
            else "reject"
        )
        attrs: dict[str, AttrValue] = {
            "wf_magic.gate.verdict": said,  # error: the judge failed, nothing was decided
            "wf_magic.gate.loop": a.loop,
            "gen_ai.evaluation.name": "gate",
            "gen_ai.evaluation.score.label": said,
        }
        if isinstance(verdict.get("judge"), str):
            attrs["wf_magic.gate.judge"] = verdict["judge"]
        missing = verdict.get("missing")
        if isinstance(missing, list):
            attrs["wf_magic.gate.missing"] = tuple(self.redact.redact(str(m)) for m in missing)
        if a.model:
            attrs.update(self._chat(a) | {"gen_ai.operation.name": "chat"})
        return attrs

    def _score(self, a: AttemptRow) -> dict[str, AttrValue]:
        out = _json(a.output_json)
        value = out.get("value") if isinstance(out, dict) else out
        attrs: dict[str, AttrValue] = {"gen_ai.evaluation.name": _score_name(a.unit_id)}
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs["gen_ai.evaluation.score.value"] = float(value)
        elif isinstance(value, bool):
            attrs["gen_ai.evaluation.score.value"] = float(value)
        explanation = out.get("explanation") if isinstance(out, dict) else None
        if self.content and isinstance(explanation, str):  # it quotes the output
            attrs["gen_ai.evaluation.explanation"] = self._text(explanation)
        return attrs

    def _content(self, a: AttemptRow, kind: str) -> dict[str, AttrValue]:
        attrs: dict[str, AttrValue] = {}
        given = _json(self.j.inputs.get(a.input_hash))
        prompt = _prompt_text(given)
        output = _json(a.output_json)
        if kind in ("exec", "python") and a.phase == "work":
            if prompt is not None:
                attrs["gen_ai.tool.call.arguments"] = self._text(prompt)
            if output is not None:
                text = output if isinstance(output, str) else canonical_json(output)
                attrs["gen_ai.tool.call.result"] = self._text(text)
            return attrs
        if prompt is not None:
            parts = [{"type": "text", "content": self._text(prompt)}]
            attrs["gen_ai.input.messages"] = canonical_json([{"role": "user", "parts": parts}])
        if output is not None:
            text = output if isinstance(output, str) else canonical_json(output)
            parts = [{"type": "text", "content": self._text(text)}]
            message = {"role": "assistant", "parts": parts, "finish_reason": "stop"}
            attrs["gen_ai.output.messages"] = canonical_json([message])
        return attrs

    def _text(self, text: str) -> str:
        text = self.redact.redact(text)
        if len(text) > CONTENT_CAP:
            text = text[:CONTENT_CAP] + f"… [clipped at {CONTENT_CAP} of {len(text)} chars]"
        return text

    def _events(self, a: AttemptRow, previous: AttemptRow | None) -> tuple[SpanEvent, ...]:
        events: list[SpanEvent] = []
        if previous is not None and previous.status == "failed":
            attrs: dict[str, AttrValue] = {
                "wf_magic.attempt": a.attempt,
                "wf_magic.retry_of": previous.dispatch_id,
                "error.type": _error_type(previous.failure),
            }
            events.append(SpanEvent(name="wf_magic.retry", at_s=a.started_at, attributes=attrs))
        if a.status == "reused":
            attrs = {
                "wf_magic.reused_from": a.reused_from or "",
                "wf_magic.saved_tokens": a.saved_tokens,
            }
            events.append(SpanEvent(name="wf_magic.reuse", at_s=a.started_at, attributes=attrs))
        for event in self.by_dispatch.get(a.dispatch_id, ()):
            if event.kind in ("throttled", "warning"):
                data = _json(event.data_json)
                attrs = _flat(self.redact.redact_value(data) if isinstance(data, dict) else {})
                events.append(
                    SpanEvent(name=f"wf_magic.{event.kind}", at_s=event.at, attributes=attrs)
                )
        return tuple(events)

    def _param(self, value: Any) -> AttrValue:
        if isinstance(value, str) and value.startswith(SEAL_PREFIX):
            return "***"
        text = value if isinstance(value, str) else canonical_json(value)
        return self.redact.redact(text)


def provider_of(runner: str, model: str | None) -> str:
    """``gen_ai.provider.name``: the model's ``provider:`` prefix if it has one, else the runner."""
    if model and ":" in model:
        head = model.split(":", 1)[0]
        if head.isidentifier():
            return {"google-gla": "gcp.gemini", "bedrock": "aws.bedrock"}.get(head, head)
    return runner


def _score_name(unit_id: str) -> str:
    """The score's name in its unit id ``<step>.score:<name>[i]``."""
    return unit_id.partition(".score:")[2].split("[")[0] or unit_id


def _error_type(failure: str | None) -> str:
    """``error.type``: the exception class a failure names, else ``_OTHER`` (semconv)."""
    found = _ERROR_TYPE.match(failure or "")
    return found.group(1) if found else "_OTHER"


def _prompt_text(given: Any) -> str | None:
    if isinstance(given, dict):
        for key in ("prompt", "argv", "input"):
            if key in given:
                value = given[key]
                return value if isinstance(value, str) else canonical_json(value)
        return canonical_json(given)
    return None if given is None else str(given)


def _params(params_json: str) -> dict[str, Any]:
    params = _json(params_json)
    return params if isinstance(params, dict) else {}


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _flat(data: Mapping[str, Any]) -> dict[str, AttrValue]:
    """An event's data as span attributes ``wf_magic.<key>`` (scalars kept, the rest JSON)."""
    out: dict[str, AttrValue] = {}
    for key, value in data.items():
        if isinstance(value, (str, bool, int, float)):
            out[f"wf_magic.{key}"] = value
        elif value is not None:
            out[f"wf_magic.{key}"] = canonical_json(value)
    return out
