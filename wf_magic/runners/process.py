"""The ``exec`` runner: argv as a subprocess, no shell, minimal env, capped output, timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from typing import IO

from ..errors import RunnerError
from .base import BaseRunner, RunnerContext, UnitRequest, UnitResult

OUTPUT_CAP_BYTES = 1_048_576
STDERR_TAIL = 2000
_BASE_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "TMP",
    "TEMP",
    "SYSTEMROOT",
    "TZ",
)


def minimal_env(pass_env: list[str] | tuple[str, ...], wf_vars: dict[str, str]) -> dict[str, str]:
    """PATH, HOME, locale and temp dirs, plus the ``pass_env`` names and the WF_* variables."""
    env = {k: os.environ[k] for k in (*_BASE_ENV, *pass_env) if k in os.environ}
    env.update(wf_vars)
    return env


class _Capped:
    """Drain a pipe continuously (so the child never blocks), keeping at most ``cap`` bytes."""

    def __init__(self, pipe: IO[bytes], cap: int):
        self.chunks: list[bytes] = []
        self.total = 0
        self.cap = cap
        self.thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self.thread.start()

    def _drain(self, pipe: IO[bytes]) -> None:
        with pipe:
            for chunk in iter(lambda: pipe.read(65536), b""):
                self.total += len(chunk)
                kept = sum(len(c) for c in self.chunks)
                if kept < self.cap:
                    self.chunks.append(chunk[: self.cap - kept])

    def text(self) -> str:
        self.thread.join()
        return b"".join(self.chunks).decode("utf-8", errors="replace")


class ExecRunner(BaseRunner):
    """Runs ``request.argv``; stdout is the output (JSON-decoded when a schema is set)."""

    def __init__(self, *, output_cap: int = OUTPUT_CAP_BYTES):
        self.output_cap = output_cap

    @classmethod
    def from_context(cls, ctx: RunnerContext) -> ExecRunner:
        """Factory (``runners: {exec: {output_cap: N}}`` sets the byte cap)."""
        return cls(output_cap=int(ctx.options.get("output_cap", OUTPUT_CAP_BYTES)))

    def run(self, request: UnitRequest) -> UnitResult:
        argv = list(request.argv or ())
        try:
            proc = subprocess.Popen(
                argv,
                env=dict(request.env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise RunnerError(f"cannot start {argv[0]!r}: {exc.strerror}", executed=False) from exc
        assert proc.stdout is not None and proc.stderr is not None  # PIPE was requested
        out = _Capped(proc.stdout, self.output_cap + 1)
        err = _Capped(proc.stderr, 64 * 1024)
        try:
            code = proc.wait(timeout=request.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise RunnerError(
                f"timed out after {request.timeout_s}s and was killed: {argv[0]}", transient=True
            ) from None
        except BaseException:
            _kill(proc)  # an interrupt must not leave the child running
            raise
        stdout, stderr = out.text(), err.text()
        if out.total > self.output_cap:
            raise RunnerError(
                f"stdout was {out.total} bytes, over the cap of {self.output_cap} "
                "bytes; write large results to a file and print its path"
            )
        if code != 0:
            tail = stderr[-STDERR_TAIL:].strip()
            raise RunnerError(f"exited with status {code}" + (f"; stderr: {tail}" if tail else ""))
        output: object = stdout
        if request.output_schema is not None:
            try:
                output = json.loads(stdout, parse_constant=_refuse_constant)
            except ValueError:
                output = stdout  # the schema check reports it and feeds the gate loop
        return UnitResult(output=output)


def _refuse_constant(name: str) -> object:
    # NaN/Infinity are not JSON; leave the raw text for the schema check to report.
    raise ValueError(f"{name} is not a JSON number")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
