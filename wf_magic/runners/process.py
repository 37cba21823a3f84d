"""The ``exec`` runner: argv as a subprocess, no shell, minimal env, capped output, timeout.

Limits hold whatever the child does with its pipes:

- ``timeout:`` is wall-clock from dispatch. At the deadline the child's whole process group
  is killed (the child leads a new session, so its children, background ``&`` jobs
  included, are in that group) and the attempt fails, transient.
- stdout is read as it arrives and kept up to the output cap (1 MiB by default,
  ``runners: {exec: {output_cap: N}}``). Past the cap nothing more is kept; bytes are only
  counted, for at most ``OVER_CAP_GRACE_S``, so a child that simply wrote too much reports
  its exact size. Then the group is killed and the attempt fails, naming the cap and the
  byte count. An endless producer (``yes``) cannot fill the driver's memory, block on a
  full pipe or run forever.
- stderr is drained as it arrives; its last 64 KiB are kept for the failure message.

- When the child exits, the attempt ends: whatever it left in its process group (a
  background ``sleep 300 &``, a server it started) is ended too — SIGTERM, then SIGKILL
  after ``orphans.TERM_GRACE_S`` — and its pipes are read to their end for at most
  ``PIPE_GRACE_S`` more, so a leftover holding stdout open cannot hold the attempt.

Limit: a descendant that leaves the group (``setsid``, a daemonising double fork) escapes
the kill. It is not waited for: the attempt ends at once and the threads still reading its
pipes end when it closes them.

While a unit runs, its process group is recorded in ``<state dir>/procs/<dispatch_id>.json``
(see :mod:`wf_magic.runners.orphans`), so a group that outlives a killed driver can be
reaped when the unit is reclaimed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from typing import IO

from ..errors import RunnerError
from ..redact import Redactor
from .base import BaseRunner, RunnerContext, UnitRequest, UnitResult
from .orphans import end_group, forget_unit_process, record_unit_process

OUTPUT_CAP_BYTES = 1_048_576
STDERR_TAIL = 2000
STDERR_KEEP = 64 * 1024
OVER_CAP_GRACE_S = 0.5
"""How long stdout past the cap is still counted (not kept) before the group is killed."""
PIPE_GRACE_S = 1.0
"""After the child exited and its group was ended: how long its pipes are still read (a
descendant that left the group may hold them open)."""
EXIT_POLL_S = 0.05
"""While a pipe is still open: how often the child is checked for having exited."""
_READ_SIZE = 65536
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


class _Drain:
    """Read a pipe to its end in a daemon thread as bytes arrive, so the child never blocks.

    Every byte is counted; at most ``keep`` are kept: the first ones, or with ``tail`` the
    last ones. ``wake`` is set when the pipe ends and when more than ``keep`` bytes arrived.
    """

    def __init__(self, pipe: IO[bytes], *, keep: int, wake: threading.Event, tail: bool = False):
        self.buffer = bytearray()
        self.total = 0
        self.keep = keep
        self.tail = tail
        self.wake = wake
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self.thread.start()

    @property
    def is_over(self) -> bool:
        """Whether more than ``keep`` bytes arrived."""
        return self.total > self.keep

    def _drain(self, pipe: IO[bytes]) -> None:
        try:
            with pipe:
                fd = pipe.fileno()
                # os.read returns what is there; a buffered read would wait for a full block.
                for chunk in iter(lambda: os.read(fd, _READ_SIZE), b""):
                    was_over = self.is_over
                    self.total += len(chunk)
                    self._keep(chunk)
                    if self.is_over and not was_over:
                        self.wake.set()
        except OSError:
            pass  # the pipe broke: what was read is what there is
        finally:
            self.ended.set()
            self.wake.set()

    def _keep(self, chunk: bytes) -> None:
        if self.tail:
            self.buffer += chunk
            del self.buffer[: max(0, len(self.buffer) - self.keep)]
        elif len(self.buffer) < self.keep:
            self.buffer += chunk[: self.keep - len(self.buffer)]

    def text(self) -> str:
        """What was kept, decoded."""
        return bytes(self.buffer).decode("utf-8", errors="replace")


class ExecRunner(BaseRunner):
    """Runs ``request.argv``; stdout is the output (JSON-decoded when a schema is set).

    The timeout is wall-clock from dispatch and kills the child's process group; stdout past
    the output cap kills it too (see the module docstring, and its limit: a ``setsid``
    descendant escapes the group and is not killed).
    """

    ANSWER_OPTIONS: frozenset[str] = frozenset(())
    """``output_cap`` only decides whether an attempt fails: nothing is hashed."""

    def __init__(self, *, output_cap: int = OUTPUT_CAP_BYTES, state_dir: str | None = None):
        self.output_cap = output_cap
        self.state_dir = state_dir
        """Where running units' process groups are recorded (None: not recorded)."""

    @classmethod
    def from_context(cls, ctx: RunnerContext) -> ExecRunner:
        """Factory (``runners: {exec: {output_cap: N}}`` sets the byte cap)."""
        return cls(
            output_cap=int(ctx.options.get("output_cap", OUTPUT_CAP_BYTES)),
            state_dir=ctx.state_dir,
        )

    def run(self, request: UnitRequest) -> UnitResult:
        argv = list(request.argv or ())
        deadline = None if request.timeout_s is None else time.monotonic() + request.timeout_s
        try:
            proc = subprocess.Popen(
                argv,
                env=dict(request.env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
        except OSError as exc:
            raise RunnerError(f"cannot start {argv[0]!r}: {exc.strerror}", executed=False) from exc
        try:
            return self._finish(proc, request, deadline)
        finally:
            if self.state_dir is not None:
                forget_unit_process(self.state_dir, request.dispatch_id)

    def _finish(
        self, proc: subprocess.Popen[bytes], request: UnitRequest, deadline: float | None
    ) -> UnitResult:
        """Record the unit's group, wait for the child within the limits, read its output."""
        argv = list(request.argv or ())
        if self.state_dir is not None:
            try:
                record_unit_process(
                    self.state_dir,
                    dispatch_id=request.dispatch_id,
                    run_id=request.run_id,
                    unit_id=request.unit_id,
                    pid=proc.pid,
                    argv0=argv[0],
                )
            except (OSError, ValueError):
                pass  # a read-only state dir: the unit runs, only an orphan goes unrecorded
        if proc.stdout is None or proc.stderr is None:  # pragma: no cover - PIPE was requested
            raise RunnerError(f"cannot read the output of {argv[0]!r}")
        wake = threading.Event()
        out = _Drain(proc.stdout, keep=self.output_cap, wake=wake)
        err = _Drain(proc.stderr, keep=STDERR_KEEP, wake=wake, tail=True)
        try:
            code = _wait(proc, out, err, wake, deadline)
        except BaseException:
            _kill_group(proc)  # an interrupt must not leave the child running
            raise
        if code is not None:
            # The child exited: what it left in its group goes with the attempt.
            end_group(proc.pid)
            until = time.monotonic() + PIPE_GRACE_S
            out.ended.wait(PIPE_GRACE_S)
            err.ended.wait(max(0.0, until - time.monotonic()))
        if code is None:
            written, complete = out.total, out.ended.is_set()  # before the kill adds to them
            _kill_group(proc)
            if out.is_over:
                raise RunnerError(_over_cap(written, self.output_cap, complete=complete))
            raise RunnerError(
                f"timed out after {request.timeout_s:g}s and was killed: {argv[0]}",
                transient=True,
            )
        stdout, stderr = out.text(), err.text()
        if code != 0:
            # Redacted before the tail is cut: a cut inside a secret the child's environment
            # holds would leave a piece of it (the drive's redactor masks a piece at "…" too).
            whole = Redactor.from_environ(request.env).redact(stderr)
            tail = whole[-STDERR_TAIL:].strip()
            if tail and (err.is_over or len(whole) > STDERR_TAIL):
                tail = "…" + tail
            raise RunnerError(f"exited with status {code}" + (f"; stderr: {tail}" if tail else ""))
        output: object = stdout
        if request.output_schema is not None:
            try:
                output = json.loads(stdout, parse_constant=_refuse_constant)
            except ValueError:
                output = stdout  # the schema check reports it and feeds the gate loop
        return UnitResult(output=output)


def _wait(
    proc: subprocess.Popen[bytes],
    out: _Drain,
    err: _Drain,
    wake: threading.Event,
    deadline: float | None,
) -> int | None:
    """The child's exit status once both pipes ended or it exited; None at the deadline or
    past the cap.

    Past the cap, waiting goes on only until stdout ends or ``OVER_CAP_GRACE_S`` passes.
    A pipe still open after the child exited is held by something it left behind: the exit
    ends the wait (the caller ends the group).
    """
    over_until: float | None = None
    while True:
        wake.clear()  # cleared before the checks, so a drain ending meanwhile is not missed
        if out.is_over:
            if out.ended.is_set():
                return None
            if over_until is None:
                over_until = time.monotonic() + OVER_CAP_GRACE_S
        elif out.ended.is_set() and err.ended.is_set():
            break
        elif proc.poll() is not None:
            return proc.returncode
        ends = [t for t in (deadline, over_until) if t is not None]
        remaining = min(ends) - time.monotonic() if ends else None
        if remaining is not None and remaining <= 0:
            return None
        wake.wait(EXIT_POLL_S if remaining is None else min(remaining, EXIT_POLL_S))
    # Both pipes are closed; the child may still run (it closed them itself).
    try:
        return proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def _over_cap(written: int, cap: int, *, complete: bool) -> str:
    """The failure of an attempt whose stdout passed the cap (``complete``: it ended)."""
    size = (
        f"stdout was {written} bytes, over the cap of {cap} bytes"
        if complete
        else f"stdout passed the cap of {cap} bytes ({written} bytes read before the process "
        "group was killed)"
    )
    return f"{size}; write large results to a file and print its path"


def _refuse_constant(name: str) -> object:
    # NaN/Infinity are not JSON; leave the raw text for the schema check to report.
    raise ValueError(f"{name} is not a JSON number")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group and reap the child (never waits on its pipes)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
