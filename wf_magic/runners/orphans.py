"""Exec and agent units that outlive their driver: a sidecar file per running unit, the reaper.

An ``exec`` unit's child, like an agent unit's CLI, leads its own process group (so a
timeout can kill all of it). When the driver is killed (``kill -9``, a crashed kernel),
nothing kills that group: it keeps running and could overlap its own reclaimed re-run
under the same ``WF_DISPATCH_ID``. So the exec and agent runners record each unit they
spawn in ``<state dir>/procs/<dispatch_id>.json`` (the unit's kind, process group, host,
the pid of the process that spawned it and both processes' start times) and remove the
file when the unit ends. A file that is still there names a unit whose owner died mid-run;
:func:`reap_orphan`, called on reclaim before the unit is dispatched again, kills that
group if it is still alive.

The file is written from the worker thread that runs the unit: a plain file, never the
SQLite journal (worker threads never write the database).

Limits: a descendant that left the group (``setsid``) is not found. Process start times
come from ``/proc``; without it, pid reuse of the owner is not detected, so a reused owner
pid reads as alive and the group is left alone (the safe side).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import FileRefused
from ..reading import read_bounded_text

PROCS_DIR = "procs"
"""The sidecar folder inside the state dir."""
SIDECAR_BYTES = 64 * 1024
"""A sidecar is a few hundred bytes of JSON; anything past this is not one of ours."""
TERM_GRACE_S = 1.0
"""How long a group gets between SIGTERM and SIGKILL."""
_POLL_S = 0.02
_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitProcess:
    """What the sidecar of one running exec or agent unit records."""

    dispatch_id: str
    run_id: str
    unit_id: str
    pgid: int
    """The unit's process group (its child leads it: pgid = the child's pid)."""
    leader_started: str | None
    """The child's start time (``/proc/<pid>/stat`` field 22), to tell a reused pid apart."""
    host: str
    owner_pid: int
    """The process that spawned the child: the driver (or the executor worker running units)."""
    owner_started: str | None
    argv0: str
    started_at: float
    kind: str = "exec"
    """The unit's step kind, ``exec`` or ``agent`` (a sidecar written before it was kept
    is an exec unit's)."""


def sidecar_path(state_dir: str | Path, dispatch_id: str) -> Path:
    """Where the sidecar of ``dispatch_id`` lives.

    Raises:
        ValueError: ``dispatch_id`` is not a plain name (it would leave the folder).
    """
    if not _SAFE_ID.fullmatch(dispatch_id):
        raise ValueError(f"expected a dispatch id of letters, digits, _ or - (got {dispatch_id!r})")
    return Path(state_dir) / PROCS_DIR / f"{dispatch_id}.json"


def record_unit_process(
    state_dir: str | Path,
    *,
    dispatch_id: str,
    run_id: str,
    unit_id: str,
    pid: int,
    argv0: str,
    kind: str = "exec",
) -> Path:
    """Write the sidecar of a just-spawned ``kind`` unit (atomically); returns its path."""
    record = UnitProcess(
        kind=kind,
        dispatch_id=dispatch_id,
        run_id=run_id,
        unit_id=unit_id,
        pgid=pid,
        leader_started=_start_time(pid),
        host=socket.gethostname(),
        owner_pid=os.getpid(),
        owner_started=_start_time(os.getpid()),
        argv0=argv0,
        started_at=time.time(),
    )
    path = sidecar_path(state_dir, dispatch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(record)), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_unit_process(state_dir: str | Path, dispatch_id: str) -> UnitProcess | None:
    """The sidecar of ``dispatch_id``; None when there is none (or it is unreadable)."""
    try:
        text = read_bounded_text(sidecar_path(state_dir, dispatch_id), limit=SIDECAR_BYTES)
        return UnitProcess(**json.loads(text))
    except (FileRefused, ValueError, TypeError):
        return None


def reap_orphan(
    state_dir: str | Path, dispatch_id: str, *, grace_s: float = TERM_GRACE_S
) -> str | None:
    """Kill the process group an exec or agent unit left behind when its driver died.

    Call it when a ``running`` attempt is reclaimed, before the unit is dispatched again.
    On this host, when the recorded owner process is dead and the group still lives, the
    group gets SIGTERM, ``grace_s`` to exit, then SIGKILL. A live owner's group is never
    touched, nor one recorded on another host.

    Returns:
        None when there is nothing to report (no sidecar, or the group already ended; the
        stale sidecar is removed). Otherwise one line saying what was done or why not.
    """
    record = read_unit_process(state_dir, dispatch_id)
    if record is None:
        return None
    unit = f"{record.kind} unit {record.unit_id}"
    what = f"{unit} (dispatch {dispatch_id}, process group {record.pgid})"
    host = socket.gethostname()
    if record.host != host:
        return (
            f"{what} was started on host {record.host}, not {host}: not touched; "
            f"stop it there if it still runs"
        )
    if _is_same_process(record.owner_pid, record.owner_started):
        return f"{what} left alone: its driver pid {record.owner_pid} is alive"
    if not _group_alive(record):
        forget_unit_process(state_dir, dispatch_id)
        return None
    how = _kill_group(record.pgid, grace_s=grace_s)
    if _group_alive(record):
        return f"{what} of dead driver pid {record.owner_pid} could not be killed ({how})"
    forget_unit_process(state_dir, dispatch_id)
    return f"killed {what} left running by dead driver pid {record.owner_pid} ({how})"


def forget_unit_process(state_dir: str | Path, dispatch_id: str) -> None:
    """Remove the sidecar of ``dispatch_id`` (the unit ended); never raises."""
    try:
        sidecar_path(state_dir, dispatch_id).unlink(missing_ok=True)
    except (OSError, ValueError):
        pass  # nothing recorded, or a read-only state dir: nothing to remove


def end_group(pgid: int, *, grace_s: float = TERM_GRACE_S) -> str | None:
    """End what a unit whose child exited left in its process group ``pgid``: SIGTERM, then
    SIGKILL after ``grace_s``. Returns None when the group was already empty (one syscall),
    else how it was ended."""
    how = _kill_group(pgid, grace_s=grace_s)
    return None if how == "already gone" else how


def reap_orphans(state_dir: str | Path, run_ids: Collection[str] | None = None) -> list[str]:
    """:func:`reap_orphan` for every recorded unit (of ``run_ids`` when given); what it said.

    ``wf gc`` calls it for the runs it deletes: a run whose driver was killed and that was
    then abandoned is never resumed, so nothing else would end what its units left running.
    """
    folder = Path(state_dir) / PROCS_DIR
    if not folder.is_dir():
        return []
    said = []
    for path in sorted(folder.glob("*.json")):
        record = read_unit_process(state_dir, path.stem)
        if record is None or (run_ids is not None and record.run_id not in run_ids):
            continue
        line = reap_orphan(state_dir, path.stem)
        if line is not None:
            said.append(line)
    return said


def _kill_group(pgid: int, *, grace_s: float) -> str:
    """SIGTERM the group, wait up to ``grace_s`` for it to go, then SIGKILL; says which."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return "already gone"
    except PermissionError:
        return "permission denied"
    if _gone_within(pgid, grace_s):
        return "SIGTERM"
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return "SIGTERM"
    except PermissionError:
        return "SIGTERM, then SIGKILL: permission denied"
    _gone_within(pgid, grace_s)
    return f"SIGTERM, then SIGKILL after {grace_s:g}s"


def _gone_within(pgid: int, grace_s: float) -> bool:
    """Wait up to ``grace_s`` for the group to have no members; whether it has none."""
    deadline = time.monotonic() + grace_s
    while _members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _group_alive(record: UnitProcess) -> bool:
    """Whether the recorded group still has live members (and is the recorded one)."""
    leader = _start_time(record.pgid)
    if leader is not None and record.leader_started is not None:
        if leader != record.leader_started:
            return False  # the group ended and its pid now names another process
    return bool(_members(record.pgid))


def _members(pgid: int) -> bool:
    """Whether the process group ``pgid`` has a member that is not a zombie."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _is_same_process(pid: int, started: str | None) -> bool:
    """Whether ``pid`` is alive and (where start times are known) the same process."""
    fields = _stat_fields(pid)
    if fields is not None:
        return fields[0] != "Z" and (started is None or fields[19] == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not Path("/proc").is_dir()  # with /proc, a pid missing from it is gone


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (None without ``/proc``)."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None else None


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, …, starttime at [19]."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # The command name is in parentheses and may itself contain ") ", so split at the last.
    fields = text[text.rfind(")") + 2 :].split()
    return fields if len(fields) > 19 else None
