"""Reading an agent CLI as it runs: its stdout line by line (session id at once, progress,
capped events, a redacted log), its exit within the deadline, and its ``--version``."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ..redact import Redactor
from ..runners.process import STDERR_KEEP, _Drain, _kill_group
from .harness import Harness, Watch

TAIL_EVENTS = 500
"""Past the output cap only this many last events are kept (the final result is among them)."""
PROGRESS_EVERY_S = 0.1
EXIT_GRACE_S = 2.0
"""How long stdout may stay open after the CLI exited (a leftover descendant holds it)."""


class StreamReader:
    """Reads a CLI's stdout line by line as it arrives (a daemon thread): each line goes to
    the redacted log, JSON lines to the adapter's ``watch``; a new session id is handed to
    ``on_session`` at once, progress to ``on_text`` (throttled). Events are kept, capped."""

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
        self.kept_bytes = 0
        self.lines: list[str] = []
        self.wake = threading.Event()
        assert proc.stdout is not None and proc.stderr is not None  # PIPE was requested
        self.err = _Drain(proc.stderr, keep=STDERR_KEEP, wake=self.wake, tail=True)
        self.log = log_path.open("a", encoding="utf-8")
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._last_progress = 0.0
        self.thread.start()

    def _read(self, pipe: IO[bytes]) -> None:
        try:
            with pipe:
                for raw in iter(pipe.readline, b""):
                    self._line(raw.decode("utf-8", errors="replace"))
        except (OSError, ValueError):
            pass
        finally:
            self.log.close()

    def _line(self, line: str) -> None:
        self.log.write(self.redactor.redact(line))
        self.log.flush()
        cap = self.output_cap
        if self.kept_bytes < cap:
            self.lines.append(line)
        self.kept_bytes += len(line)
        try:
            event = json.loads(line) if line.lstrip().startswith("{") else None
        except ValueError:
            event = None
        if not isinstance(event, dict):
            return
        self.events.append(event)
        if self.kept_bytes > cap and len(self.events) > TAIL_EVENTS:
            self.events.popleft()
        before = self.watch.session_id
        self.adapter.watch(event, self.watch)
        if self.watch.session_id and self.watch.session_id != before:
            self.on_session(self.watch.session_id)
        now = time.monotonic()
        if self.on_text is not None and now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            self.on_text(self.redactor.redact(self.watch.progress()))

    def wait(self, deadline: float | None) -> int | None:
        """The CLI's exit status once it exited and stdout ended; None at the deadline.

        A descendant still holding stdout after the CLI exited gets ``EXIT_GRACE_S``, then
        the group is killed (the result line is out by then).
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
        if self.thread.is_alive():
            _kill_group(self.proc)
            self.thread.join(EXIT_GRACE_S)
        return code

    def finish(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for the reading thread (after a kill)."""
        self.thread.join(grace_s)

    def stdout_text(self) -> str:
        """What stdout said (up to the cap)."""
        return "".join(self.lines)


_VERSIONS: dict[tuple[str, float], str] = {}
"""``--version`` lines by (resolved binary, mtime): a drive's runners are rebuilt per drive."""


def cli_version(binary: str) -> str:
    """The first line of ``binary --version`` (empty when it cannot tell)."""
    resolved = shutil.which(binary) or binary
    try:
        key = (str(Path(resolved).resolve()), Path(resolved).stat().st_mtime)
    except OSError:
        return ""
    if key not in _VERSIONS:
        try:
            done = subprocess.run(
                [resolved, "--version"],
                capture_output=True,
                text=True,
                timeout=20,
                stdin=subprocess.DEVNULL,
            )
            _VERSIONS[key] = (done.stdout.strip().splitlines() or [""])[0][:120]
        except (OSError, subprocess.TimeoutExpired):
            return ""
    return _VERSIONS[key]
