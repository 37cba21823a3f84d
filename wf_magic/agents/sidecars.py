"""What an agent attempt leaves in the state dir: its sidecar (launches, session id, worktree,
usage so far), its redacted stream log, and the run's isolated HOME.

The sidecar is written from the worker thread the moment the session id is known (a plain
file: worker threads never write the journal), so a driver killed mid-agent leaves it for the
reclaimed attempt, which continues that session in the same worktree.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FileRefused
from ..reading import read_bounded, read_bounded_text

AGENTS_DIR = "agents"
SIDECAR_BYTES = 64 * 1024
"""The largest sidecar read back: a few counters and ids (a bigger one is not ours)."""
_NAMESPACE = uuid.UUID("6f1c7f0e-8a59-4c1b-9d55-1e0d7f2a9b31")


@dataclass(slots=True, kw_only=True)
class Sidecar:
    """The state of one dispatch id's launches."""

    launches: int = 0
    session_id: str | None = None
    worktree: str | None = None
    usage_total: list[int] = field(default_factory=lambda: [0, 0])
    """The session's cumulative (tokens in, out) as the harness last reported them."""


def run_folder(state_dir: str | Path, run_id: str) -> Path:
    """The run's agent folder (0700): sidecars, logs, scratch files and its HOME."""
    folder = Path(state_dir) / AGENTS_DIR / run_id
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def isolated_home(state_dir: str | Path, run_id: str) -> Path:
    """The HOME of the run's agents (0700): no user settings leak in, sessions survive."""
    home = run_folder(state_dir, run_id) / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    os.chmod(home, 0o700)
    return home


SCRUB_FILE_BYTES = 32 * 1024 * 1024
"""Files of the isolated HOME larger than this are left as they are (no transcript is)."""


def scrub_home(home: Path, redact: Callable[[Any], Any], *, since: float) -> list[str]:
    """Mask the run's secrets in what the agent CLI wrote under its isolated ``home`` since
    ``since`` (a ``time.time()``): its session transcripts hold the prompt, secret params and
    all. JSON Lines and JSON files are masked value by value (they stay valid for the CLI's
    resume); other UTF-8 text as text; binary files are left alone. Returns the files changed,
    relative to ``home``; a file that cannot be read or replaced is skipped (the next
    attempt's scrub tries it again)."""
    changed: list[str] = []
    for path in sorted(home.rglob("*")):
        try:
            info = path.lstat()  # a symlink's own: never followed out of the HOME
            if not stat.S_ISREG(info.st_mode) or info.st_mtime < since - 1.0:
                continue
            raw = read_bounded(path, limit=SCRUB_FILE_BYTES)  # larger: refused, left alone
            masked = _masked(raw, path.suffix, redact)
            if masked is None or masked == raw:
                continue
            spare = path.with_name(f".{path.name}.wf-scrub")
            spare.write_bytes(masked)
            os.chmod(spare, info.st_mode & 0o777)
            os.replace(spare, path)
            changed.append(str(path.relative_to(home)))
        except (OSError, FileRefused):  # gone, special or grown past the bound meanwhile
            continue
    return changed


def _masked(raw: bytes, suffix: str, redact: Callable[[Any], Any]) -> bytes | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if suffix == ".jsonl":
        return "".join(_masked_json_line(line, redact) for line in text.splitlines(True)).encode()
    if suffix == ".json":
        try:
            value = json.loads(text)
        except ValueError:
            pass
        else:
            masked = redact(value)
            return raw if masked == value else json.dumps(masked, ensure_ascii=False).encode()
    return str(redact(text)).encode()


def _masked_json_line(line: str, redact: Callable[[Any], Any]) -> str:
    """One JSON Lines line masked value by value; a line with nothing to mask is kept as
    it was, byte for byte."""
    body = line.rstrip("\r\n")
    try:
        value = json.loads(body)
    except ValueError:
        return str(redact(line))
    masked = redact(value)
    return line if masked == value else json.dumps(masked, ensure_ascii=False) + line[len(body) :]


def scratch(state_dir: str | Path, run_id: str, dispatch_id: str) -> Path:
    """A folder of ``dispatch_id`` for files given to the CLI (a schema file)."""
    folder = run_folder(state_dir, run_id) / "scratch" / dispatch_id
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def _path(state_dir: str | Path, run_id: str, dispatch_id: str, suffix: str) -> Path:
    return run_folder(state_dir, run_id) / f"{dispatch_id}{suffix}"


def load(state_dir: str | Path, run_id: str, dispatch_id: str) -> Sidecar | None:
    """The sidecar of ``dispatch_id`` (None: never launched, or unreadable)."""
    try:
        path = _path(state_dir, run_id, dispatch_id, ".json")
        data: dict[str, Any] = json.loads(read_bounded_text(path, limit=SIDECAR_BYTES))
        return Sidecar(**{k: v for k, v in data.items() if k in Sidecar.__dataclass_fields__})
    except (OSError, ValueError, TypeError, FileRefused):  # ValueError: UnicodeDecodeError too
        return None


def save(state_dir: str | Path, run_id: str, dispatch_id: str, sidecar: Sidecar) -> None:
    """Write the sidecar atomically (a crash leaves the old one or the new one)."""
    path = _path(state_dir, run_id, dispatch_id, ".json")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(sidecar)))
    os.replace(tmp, path)


def log_path(state_dir: str | Path, run_id: str, dispatch_id: str) -> Path:
    """Where the attempt's (redacted) stream log goes."""
    return _path(state_dir, run_id, dispatch_id, ".log")


def preset_session_id(dispatch_id: str, launch: int) -> str:
    """The session id a harness that takes one is started with: derived from the dispatch id
    and the launch number, so it is known before the CLI prints anything."""
    return str(uuid.uuid5(_NAMESPACE, f"{dispatch_id}/{launch}"))


def sweep(state_dir: str | Path, run_ids: list[str]) -> None:
    """Remove the agent folders (HOME, sidecars, logs) of runs gc deleted."""
    for run_id in run_ids:
        shutil.rmtree(Path(state_dir) / AGENTS_DIR / run_id, ignore_errors=True)
