"""Record and replay of an agent attempt's model calls: what each call sent and got back, kept
redacted and capped, and the answers a replayed attempt is given from a cassette, in order.

Recording keeps the request body (the model, the messages, the tool list) and the answer's
bytes as the CLI received them (the SSE stream or the JSON body), each up to
:data:`RECORD_CAP` bytes; headers, where the CLI's credentials travel, are never kept. A
body past the cap is kept clipped and marked truncated: a truncated answer cannot be
replayed (its call fails the replayed attempt, naming the cap).

The agent's working folder is kept as :data:`WORKDIR_MARK` wherever it appears in a body
(a Claude Code ``Write`` names its file by absolute path; the system prompt names the folder),
its HOME as :data:`HOME_MARK`, and replay writes the replaying attempt's own folders in
their place: a cassette recorded in one checkout, worktree or machine replays in another,
and names neither folder.

Replay answers call n of an attempt with recorded call n of the same step, unit and attempt
number: the status, the content type, and the body (an SSE stream event by event, each its
own HTTP chunk). A request that differs from the recorded one (the API path, the model, the
tools offered) is answered anyway, with a warning naming the difference; a call past the
recording is answered with a provider-shaped error and fails the attempt (``replay
exhausted after N calls``).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..store.calls import CallBody, RecordedCall
from .usage import CallUsage

WORKDIR_MARK = "<wf_magic:workdir>"
"""Stands for the agent's working folder in a recorded body (see the module docstring)."""
HOME_MARK = "<wf_magic:home>"
"""Stands for the agent's HOME (its own, under the state dir) in a recorded body."""
RECORD_CAP = 1_048_576
"""The most bytes of a call's request body, and of its answer, kept (1 MiB each)."""
_SSE_EVENT = re.compile(rb"(?<=\n\n)|(?<=\r\n\r\n)")
"""Where one SSE event ends and the next begins (after a blank line)."""


@dataclass(slots=True)
class Capture:
    """One call's request and answer as they pass the bridge (bounded by :data:`RECORD_CAP`)."""

    method: str
    path: str
    request: bytes
    status: int | None = None
    content_type: str | None = None
    answer: bytearray = field(default_factory=bytearray)
    cut: bool = False

    def keep(self, chunk: bytes) -> None:
        """Keep ``chunk`` of the answer (past the cap: clipped, marked truncated)."""
        room = RECORD_CAP - len(self.answer)
        if len(chunk) > room:
            self.cut = True
        if room > 0:
            self.answer += chunk[:room]

    def body(
        self, redact: Callable[[str], str], *, folders: Mapping[str, str | None] | None = None
    ) -> CallBody:
        """What is journaled: both bodies as redacted text (each of ``folders``, mark → path,
        kept as its mark), the tool names offered."""
        request = self.request[:RECORD_CAP].decode("utf-8", errors="replace")
        answered = self.status is not None

        def kept(text: str) -> str:
            return redact(mark_folders(text, folders or {}))

        return CallBody(
            method=self.method,
            path=self.path,
            tools=tool_names(self.request),
            request=kept(request) if request else None,
            request_truncated=len(self.request) > RECORD_CAP,
            status=self.status,
            content_type=self.content_type,
            response=kept(bytes(self.answer).decode("utf-8", errors="replace"))
            if answered
            else None,
            response_truncated=self.cut,
        )


def _spellings(folder: str) -> list[str]:
    """How ``folder`` may be written in a body: as given and resolved, raw and as a JSON
    string's content; never the root alone."""
    import os

    paths = {folder.rstrip("/"), os.path.realpath(folder).rstrip("/")}
    found = {p for p in paths if len(p) > 1} | {json.dumps(p)[1:-1] for p in paths if len(p) > 1}
    return sorted(found)


def mark_folders(text: str, folders: Mapping[str, str | None]) -> str:
    """``text`` with each folder of ``folders`` (mark → path) written as its mark, where it
    stands as a path of its own (after a quote, a space, a bracket, a tag or an escaped
    newline; before a separator or the end), never inside a longer one (``/a/bc``,
    ``/x/a/b``); the longest first, so a folder inside another keeps its own mark."""
    pairs = [(s, mark) for mark, path in folders.items() if path for s in _spellings(path)]
    for spelling, mark in sorted(pairs, key=lambda pair: len(pair[0]), reverse=True):
        parts, last, edge = [], 0, -1
        for found in re.finditer(_PATH_START + re.escape(spelling) + _PATH_END, text):
            inside = found.start() == edge  # right after the folder: a name inside it
            edge = found.end()
            if not inside:
                parts += [text[last : found.start()], mark]
                last = found.end()
        text = "".join(parts) + text[last:]
    return text


_PATH_START = r"(?:(?<=^)|(?<=[\s\"'`(\[{:=,;|>])|(?<=\\n)|(?<=\\t)|(?<=\\r))"
_PATH_END = r"(?=$|[/\\\"'`\s<>:,;.)\]}])"


def unmark_folders(text: str, folders: Mapping[str, str | None], *, json_text: bool) -> str:
    """``text`` with each mark of ``folders`` written as its path (JSON-escaped in a JSON or
    SSE body); a mark without a path stays."""
    for mark, path in folders.items():
        if path and mark in text:
            text = text.replace(mark, json.dumps(path)[1:-1] if json_text else path)
    return text


def tool_names(request: bytes) -> list[str] | None:
    """The names of the tools a request offers, in its order (Anthropic and OpenAI ``tools``
    with a ``name`` or a ``function.name``, Gemini ``functionDeclarations``); None when the
    body is not a JSON object."""
    try:
        value = json.loads(request) if request.lstrip().startswith(b"{") else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    names: list[str] = []
    tools = value.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(tool.get("name"), str):
            names.append(tool["name"])
        elif isinstance(function, dict) and isinstance(function.get("name"), str):
            names.append(function["name"])
        elif isinstance(tool.get("functionDeclarations"), list):
            names += [
                str(d.get("name")) for d in tool["functionDeclarations"] if isinstance(d, dict)
            ]
        elif isinstance(tool.get("type"), str):
            names.append(tool["type"])
    return names


def sse_pieces(text: str) -> list[bytes]:
    """An SSE answer cut after each event (a JSON answer: one piece)."""
    raw = text.encode("utf-8")
    return [p for p in _SSE_EVENT.split(raw) if p] or [raw]


async def play(
    writer: asyncio.StreamWriter,
    body: CallBody,
    capture: Capture,
    usage: CallUsage,
    *,
    folders: Mapping[str, str | None] | None = None,
) -> int:
    """Write the recorded answer ``body`` to the CLI (chunked; an SSE stream event by event,
    the closing chunk left to the caller), reading its usage as it passes; its status. The
    recording's folder marks become ``folders``' paths, the replaying agent's folders."""
    status = body.status or 200
    capture.status, capture.content_type = status, body.content_type
    head = f"HTTP/1.1 {status} {'OK' if status < 400 else 'Error'}\r\n"
    head += f"content-type: {body.content_type or 'application/json'}\r\n"
    writer.write((head + "transfer-encoding: chunked\r\nconnection: close\r\n\r\n").encode())
    streamed = "event-stream" in (body.content_type or "")
    json_text = streamed or "json" in (body.content_type or "application/json")
    text = unmark_folders(body.response or "", folders or {}, json_text=json_text)
    for piece in sse_pieces(text) if streamed else [text.encode("utf-8")]:
        capture.keep(piece)
        if streamed:
            usage.feed(piece)
        writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
        await writer.drain()
    usage.finish(None if streamed else bytes(capture.answer))
    return status


class Replay:
    """The recorded calls of one attempt, handed out in order (thread-safe)."""

    def __init__(self, calls: Sequence[RecordedCall], *, where: str) -> None:
        self.calls = list(calls)
        self.where = where
        """What the recording is (``cassette tape.jsonl, unit fix attempt 1``), for messages."""
        self.served = 0
        self.folders: dict[str, str | None] = {}
        """Mark → the replaying agent's folder, written where the recording has its own."""
        self.warnings: list[str] = []
        self.failure: str | None = None
        """Why the attempt fails (the recording ran out, or an answer was truncated)."""
        self._lock = threading.Lock()

    def next(self, *, path: str, model: str | None, request: bytes) -> RecordedCall | None:
        """The recorded answer of the next call (None: the recording is exhausted, and the
        attempt's :attr:`failure` says so); a difference from the recorded request is added
        to :attr:`warnings`."""
        with self._lock:
            number = self.served + 1
            if self.served >= len(self.calls):
                self.failure = self.failure or (
                    f"replay exhausted after {len(self.calls)} calls: the CLI made call "
                    f"{number} and {self.where} has no more"
                )
                return None
            self.served = number
            recorded = self.calls[number - 1]
            said = differences(recorded, path=path, model=model, tools=tool_names(request))
            if said:
                self.warnings.append(
                    f"replay: call {number} differs from the recording ({said}); answered "
                    "with the recorded answer"
                )
            if recorded.body.response_truncated:
                self.failure = self.failure or (
                    f"call {number} of {self.where} cannot be replayed: its answer was cut at "
                    f"the recording cap of {RECORD_CAP:,} bytes"
                )
            return recorded


def differences(
    recorded: RecordedCall, *, path: str, model: str | None, tools: list[str] | None
) -> str:
    """What differs between a live request and the recorded one ('' when nothing does)."""
    said = []
    if path.split("?")[0] != recorded.body.path.split("?")[0]:
        said.append(f"path {path.split('?')[0]}, recorded {recorded.body.path.split('?')[0]}")
    asked = _request_model(recorded.body.request) or recorded.model
    if model != asked:
        said.append(f"model {model}, recorded {asked}")
    old = recorded.body.tools
    if tools is not None and old is not None and tools != old:
        added = [t for t in tools if t not in old]
        missing = [t for t in old if t not in tools]
        parts = [
            f"+{', +'.join(added)}" if added else "",
            f"-{', -'.join(missing)}" if missing else "",
        ]
        shown = ", ".join(p for p in parts if p) or "the same names in another order"
        said.append(f"tools {shown}")
    return "; ".join(said)


def _request_model(request: str | None) -> str | None:
    """The model a recorded request named (None: not readable, or a truncated request)."""
    if not request or not request.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(request)
    except (ValueError, RecursionError):
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) else None
