"""Reading an agent CLI as it runs: its stdout line by line (session id at once, progress,
capped events, a capped redacted log), its exit within the deadline, and its ``--version``.

Whatever the CLI prints, the reader stays bounded and alive: a line longer than the cap is
skipped as it streams (never held whole), a JSON line nested deeper than ``MAX_DEPTH`` or
holding more than ``MAX_CONTAINERS`` objects is skipped unparsed, invalid UTF-8 is replaced,
and an adapter that chokes on an odd event loses that event, not the reading thread. Each
skip is one line in ``notes`` (and in the log), so a missing result names its cause.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from ..redact import Redactor
from ..runners.orphans import end_group
from ..runners.process import STDERR_KEEP, _Drain, _kill_group
from .harness import MAX_DEPTH, Harness, Watch, depth_over

PROGRESS_EVERY_S = 0.1
EXIT_GRACE_S = 2.0
"""How long stdout may stay open after the CLI exited (a leftover descendant holds it)."""
MAX_CONTAINERS = 200_000
"""The most ``{``/``[`` a streamed line may hold to be parsed (each is a Python object)."""
MAX_NOTES = 20
_CHUNK = 1 << 16


class StreamReader:
    """Reads a CLI's stdout line by line as it arrives (a daemon thread): each line goes to
    the redacted log (capped at ``output_cap`` bytes), JSON lines to the adapter's ``watch``;
    a new session id is handed to ``on_session`` at once, progress to ``on_text``
    (throttled). Lines and events are kept up to ``output_cap`` bytes each (the last events
    past it), and no line longer than ``output_cap`` is ever held."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        *,
        adapter: Harness,
        watch: Watch,
        redactor: Redactor,
        output_cap: int,
        log_path: Path,
        on_session: Callable[[str], None],
        on_text: Callable[[str], None] | None,
    ):
        self.proc, self.adapter, self.watch, self.redactor = proc, adapter, watch, redactor
        self.output_cap, self.on_session, self.on_text = output_cap, on_session, on_text
        self.events: deque[dict[str, Any]] = deque()
        self._event_sizes: deque[int] = deque()
        self._event_bytes = 0
        self.kept_bytes = 0
        self.lines: list[str] = []
        self.notes: list[str] = []
        """One line per thing skipped (an over-long or too deep line, an odd event)."""
        self.leftover: str | None = None
        """How processes the CLI left in its group after it exited were ended (None: none)."""
        self.wake = threading.Event()
        assert proc.stdout is not None and proc.stderr is not None  # PIPE was requested
        self.err = _Drain(proc.stderr, keep=STDERR_KEEP, wake=self.wake, tail=True)
        self.log = _CappedLog(log_path, cap=output_cap)
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._last_progress = 0.0
        self.thread.start()

    def _read(self, pipe: IO[bytes]) -> None:
        number = 0
        try:
            with pipe:
                while raw := pipe.readline(self.output_cap + 1):
                    number += 1
                    if len(raw) > self.output_cap:
                        self._skip_long(pipe, raw, number)
                        continue
                    try:
                        self._line(raw.decode("utf-8", errors="replace"), number)
                    except Exception as exc:  # noqa: BLE001 - one odd line must not end the reading
                        self._note(f"line {number} skipped: {type(exc).__name__} reading it")
        except Exception as exc:  # noqa: BLE001 - the thread never dies with a traceback
            self._note(f"stdout could not be read past line {number} ({type(exc).__name__})")
        finally:
            self.log.close()

    def _skip_long(self, pipe: IO[bytes], head: bytes, number: int) -> None:
        """Drain the rest of an over-long line without keeping it; note its size."""
        size, ended = len(head), head.endswith(b"\n")
        while not ended:
            chunk = pipe.readline(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            ended = chunk.endswith(b"\n")
        self._note(
            f"line {number} skipped: {size:,} bytes, over the line cap of "
            f"{self.output_cap:,} bytes{'' if ended else ' (and no newline before the end)'}"
        )

    def _note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)
        self.log.write(f"[wf_magic: {text}]\n")

    def _line(self, line: str, number: int) -> None:
        self.log.write(self.redactor.redact(line))
        size = len(line)
        if self.kept_bytes < self.output_cap:
            self.lines.append(line)
        self.kept_bytes += size
        event = self._parse(line, number)
        if event is None:
            return
        self._keep(event, size)
        before = self.watch.session_id
        self.adapter.watch(event, self.watch)
        if self.watch.session_id and self.watch.session_id != before:
            self.on_session(self.watch.session_id)
        now = time.monotonic()
        if self.on_text is not None and now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            self.on_text(self.redactor.redact(self.watch.progress()))

    def _parse(self, line: str, number: int) -> dict[str, Any] | None:
        """The JSON object ``line`` holds; None for other text or a line too deep or wide."""
        if not line.lstrip().startswith("{"):
            return None
        containers = line.count("{") + line.count("[")
        if containers > MAX_CONTAINERS:
            self._note(f"line {number} skipped: {containers:,} objects and arrays, over the "
                       f"bound of {MAX_CONTAINERS:,}")  # fmt: skip
            return None
        try:
            event = json.loads(line)
        except RecursionError:
            event, containers = None, MAX_DEPTH + 1
        except ValueError:
            return None
        if containers > MAX_DEPTH and (event is None or depth_over(event, MAX_DEPTH)):
            self._note(f"line {number} skipped: JSON nested deeper than {MAX_DEPTH} levels")
            return None
        return event if isinstance(event, dict) else None

    def _keep(self, event: dict[str, Any], size: int) -> None:
        """Keep ``event``; past ``output_cap`` bytes of events the oldest ones go (the final
        result is among the last)."""
        self.events.append(event)
        self._event_sizes.append(size)
        self._event_bytes += size
        while self._event_bytes > self.output_cap and len(self.events) > 1:
            self.events.popleft()
            self._event_bytes -= self._event_sizes.popleft()

    def wait(self, deadline: float | None) -> int | None:
        """The CLI's exit status once it exited and stdout ended; None at the deadline.

        Whatever the CLI left in its process group is ended once it exited (SIGTERM, then
        SIGKILL; a descendant still holding stdout gets ``EXIT_GRACE_S`` first: the result
        line is out by then).
        """
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                code = self.proc.wait(None if remaining is None else min(remaining, 0.5))
                break
            except subprocess.TimeoutExpired:
                continue
        self.thread.join(EXIT_GRACE_S)
        self.leftover = end_group(self.proc.pid)  # what it left in its group ends with it
        self.thread.join(EXIT_GRACE_S)
        return code

    def finish(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for the reading thread (after a kill)."""
        self.thread.join(grace_s)

    def stdout_text(self) -> str:
        """What stdout said (up to the cap)."""
        return "".join(self.lines)


class _CappedLog:
    """The attempt's stream log: at most ``cap`` bytes of whole lines, then one line saying
    where it was cut, and on close how much more the CLI printed."""

    def __init__(self, path: Path, *, cap: int):
        self.file = path.open("a", encoding="utf-8", errors="replace")
        self.cap, self.written, self.cut_bytes, self.cut_lines = cap, 0, 0, 0
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        size = len(text.encode("utf-8", errors="replace"))
        with self.lock:
            if self.file.closed:
                return
            if self.cut_lines or self.written + size > self.cap:
                if not self.cut_lines:
                    self.file.write(
                        f"[wf_magic: log cut here at {self.written:,} bytes, the output cap "
                        f"of {self.cap:,} bytes; later lines are not logged]\n"
                    )
                self.cut_bytes += size
                self.cut_lines += 1
                return
            self.written += size
            self.file.write(text)
            self.file.flush()

    def close(self) -> None:
        with self.lock:
            if self.file.closed:
                return
            if self.cut_lines:
                self.file.write(
                    f"[wf_magic: {self.cut_lines:,} more lines ({self.cut_bytes:,} bytes) "
                    "after the cut were not logged]\n"
                )
            self.file.close()


_VERSIONS: dict[tuple[str, float], str] = {}
"""``--version`` lines by (resolved binary, mtime): a drive's runners are rebuilt per drive."""


def cli_version(binary: str, *, env: Mapping[str, str], cwd: str) -> str:
    """The first line of ``binary --version`` run like the agent itself: ``env`` (the minimal
    environment with the isolated HOME and the quiet settings), in ``cwd``, its own process
    group killed after; empty when it cannot tell."""
    resolved = shutil.which(binary, path=env.get("PATH")) or binary
    try:
        key = (str(Path(resolved).resolve()), Path(resolved).stat().st_mtime)
    except OSError:
        return ""
    if key not in _VERSIONS:
        try:
            proc = subprocess.Popen(
                [resolved, "--version"],
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            return ""
        assert proc.stdout is not None  # PIPE was requested
        out = _Drain(proc.stdout, keep=4096, wake=threading.Event())
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            return ""
        finally:
            _kill_group(proc)
        out.thread.join(1.0)
        _VERSIONS[key] = (out.text().strip().splitlines() or [""])[0][:120]
    return _VERSIONS[key]
