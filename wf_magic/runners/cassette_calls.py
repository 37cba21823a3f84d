"""A cassette's agent-call lines: one recorded model call of an agent attempt per line.

``wf export-cassette RUN`` writes, beside the prompt steps' recordings, one line per model
call an agent attempt made through the bridge (``kind: agent_call``): its step, unit,
attempt and call number, the model, the request (redacted text, capped), the tool names it
offered, and the answer as the CLI received it (status, content type, body: the SSE stream
or the JSON, redacted, capped; ``response_truncated`` when it was cut at the cap, which
makes the call unreplayable). An agent step replays them (``bridge/tape.py``); the
``replay`` runner skips them, and a cassette without them loads as before.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import FileRefused, RunnerError
from ..hashing import canonical_json
from ..reading import read_bounded
from ..store.calls import CallBody, RecordedCall

KIND = "agent_call"
MAX_CASSETTE_BYTES = 100_000_000
"""A cassette larger than this is refused unread (about 50 000 recordings of 2 KB each)."""

AttemptKey = tuple[str, str, int]
"""(step id, unit id, attempt number): whose calls a replayed attempt is answered with."""


def read_cassette(path: Any) -> str:
    """A cassette's text (at most :data:`MAX_CASSETTE_BYTES`; a FIFO, a device or a folder
    is refused before it is opened).

    Raises:
        RunnerError: permanent, when the file is missing, unreadable, too large or not UTF-8.
    """
    try:
        return read_bounded(path, limit=MAX_CASSETTE_BYTES).decode("utf-8")
    except FileRefused as exc:
        if exc.reason == "missing":
            raise RunnerError(
                f"Replay cassette {path} does not exist; write one with "
                f"`wf export-cassette RUN > {path}` after a run against a real runner."
            ) from None
        raise RunnerError(f"Replay cassette {path} cannot be read: {exc.problem}.") from None
    except UnicodeDecodeError as exc:
        raise RunnerError(
            f"Replay cassette {path} is not UTF-8 (byte offset {exc.start}); write it again "
            "with `wf export-cassette RUN`."
        ) from None


def call_line(call: RecordedCall) -> str:
    """The cassette line of a journaled call (canonical JSON, no newline)."""
    body = call.body
    return canonical_json(
        {
            "kind": KIND,
            "step": call.step_id,
            "unit": call.unit_id,
            "attempt": call.attempt,
            "call": call.call,
            "model": call.model,
            "status": call.status,
            "method": body.method,
            "path": body.path,
            "tools": body.tools,
            "request": body.request,
            "request_truncated": body.request_truncated,
            "http_status": body.status,
            "content_type": body.content_type,
            "response": body.response,
            "response_truncated": body.response_truncated,
        }
    )


def is_call_line(data: Any) -> bool:
    return isinstance(data, dict) and data.get("kind") == KIND


def call_from_json(data: dict[str, Any], *, where: str) -> RecordedCall:
    """Decode an agent-call line.

    Raises:
        RunnerError: permanent, naming ``where`` and the field that is wrong.
    """

    def text(name: str, *, required: bool = False) -> str | None:
        value = data.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise RunnerError(f"{where}: {name} must be a string (got {value!r:.40}).")
        return value

    def number(name: str, *, required: bool = True) -> int | None:
        value = data.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise RunnerError(f"{where}: {name} must be a whole number (got {value!r:.40}).")
        return value

    tools = data.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, str) for t in tools)
    ):
        raise RunnerError(f"{where}: tools must be a list of names.")
    return RecordedCall(
        step_id=text("step", required=True) or "",
        unit_id=text("unit", required=True) or "",
        attempt=number("attempt") or 0,
        call=number("call") or 0,
        model=text("model"),
        status=text("status") or "ok",
        body=CallBody(
            method=text("method") or "POST",
            path=text("path", required=True) or "",
            tools=tools,
            request=text("request"),
            request_truncated=bool(data.get("request_truncated")),
            status=number("http_status", required=False),
            content_type=text("content_type"),
            response=text("response"),
            response_truncated=bool(data.get("response_truncated")),
        ),
    )


def load_calls(path: Any) -> dict[AttemptKey, list[RecordedCall]]:
    """The agent calls a cassette recorded, by (step, unit, attempt), in call order.

    Raises:
        RunnerError: permanent, when the file cannot be read or a line is not JSON or an
            agent-call line is malformed (naming the file and line).
    """
    found: dict[AttemptKey, list[RecordedCall]] = {}
    for number, line in enumerate(read_cassette(path).splitlines(), start=1):
        if not line.strip() or '"agent_call"' not in line:
            continue
        where = f"replay cassette {path} line {number}"
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise RunnerError(f"{where} is not JSON: {exc}.") from exc
        if is_call_line(data):
            call = call_from_json(data, where=where)
            found.setdefault((call.step_id, call.unit_id, call.attempt), []).append(call)
    for calls in found.values():
        calls.sort(key=lambda c: c.call)
    return found
