"""Git worktrees of agent attempts: one ``git worktree add --detach`` per dispatch id under the
state dir, kept when the agent left changes, removed when clean, swept when their run is gone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..errors import FileRefused
from ..reading import read_bounded_text
from .harness import AgentError

WORKTREES_DIR = "worktrees"
GIT_FILE_BYTES = 64 * 1024
"""The largest ``.git`` file of a worktree read (one ``gitdir:`` line)."""
_GIT_TIMEOUT_S = 60.0


class GitError(Exception):
    """A git command failed (its stderr's first line is the message)."""


def _git(*args: str, cwd: str | Path) -> str:
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=str(cwd),
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git {args[0]} failed: {exc}") from exc
    if done.returncode != 0:
        lines = [x for x in done.stderr.strip().splitlines() if x.strip()]
        fatal = [x for x in lines if x.startswith(("fatal:", "error:"))]
        line = (fatal or lines or [f"exit status {done.returncode}"])[-1]
        raise GitError(f"git {args[0]} failed: {line}")
    return done.stdout


def repo_root(folder: Path) -> Path | None:
    """The top folder of the git work tree holding ``folder`` (None outside a repository)."""
    try:
        return Path(_git("rev-parse", "--show-toplevel", cwd=folder).strip()).resolve()
    except GitError:
        return None


def worktree_path(state_dir: str | Path, run_id: str, dispatch_id: str) -> Path:
    """Where the worktree of ``dispatch_id`` lives (a reclaimed attempt finds the same one)."""
    return Path(state_dir) / WORKTREES_DIR / run_id / dispatch_id


def ensure_worktree(repo: Path, path: Path) -> None:
    """A detached worktree of ``repo``'s HEAD at ``path``, unless one is there already.

    Raises:
        GitError: git could not add it (e.g. a repository without a commit).
    """
    if (path / ".git").exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():  # a leftover folder of a worktree that was removed by hand
        shutil.rmtree(path)
        _git("worktree", "prune", cwd=repo)
    _git("worktree", "add", "--detach", str(path), "HEAD", cwd=repo)


def resolve_workdir(worktree: Path, workdir: str | Path, *, step_id: str) -> Path:
    """The folder the agent runs in: ``workdir`` (relative to the worktree's top) resolved in
    the worktree as committed, created if HEAD lacks it, and never outside the worktree.

    The checkout's ``workdir`` was checked in the user's folder; HEAD may differ there (a
    folder in the checkout that HEAD commits as a symlink to ``/`` or ``../..``), so each
    component is resolved again here, in the worktree, before anything is created in it.

    Raises:
        AgentError: (not executed) ``workdir`` is absolute, leads outside the worktree
            (``..``, a symlink at any level, a symlink loop), or names something not a folder.
    """
    text = str(workdir)
    root = Path(worktree).resolve()
    if Path(text).is_absolute() or text.startswith("~"):
        raise _workdir_error(step_id, text, "is not a path relative to the worktree")
    try:
        folder = (root / text).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before 3.13)
        raise _workdir_error(step_id, text, f"cannot be resolved ({exc})") from exc
    if not folder.is_relative_to(root):
        raise _workdir_error(step_id, text, f"leads outside it, to {str(folder)!r}")
    if folder.exists() and not folder.is_dir():
        raise _workdir_error(step_id, text, "is not a folder there")
    try:
        # Resolved: no component that exists is a symlink, so mkdir stays under ``root``.
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _workdir_error(step_id, text, f"cannot be created ({exc.strerror})") from exc
    return folder


def _workdir_error(step_id: str, workdir: str, problem: str) -> AgentError:
    return AgentError(
        f"step {step_id}: workdir {workdir!r} in the worktree as committed {problem}; "
        "commit a real folder inside the repository or fix workdir",
        executed=False,
    )


def changes(path: Path) -> tuple[list[str], str]:
    """The files changed in the work tree at ``path`` (untracked ones too) and a diff stat."""
    status = _git("status", "--porcelain", "--untracked-files=all", cwd=path)
    files = sorted({line[3:].split(" -> ")[-1] for line in status.splitlines() if len(line) > 3})
    if not files:
        return [], ""
    _git("add", "--intent-to-add", "--all", cwd=path)  # new files count in the diff stat
    stat = _git("diff", "--stat", "HEAD", cwd=path).strip()
    return files, stat


def remove_worktree(repo: Path, path: Path) -> None:
    """Remove the worktree at ``path`` (and its admin entry in ``repo``)."""
    try:
        _git("worktree", "remove", "--force", str(path), cwd=repo)
    except GitError:
        shutil.rmtree(path, ignore_errors=True)
        try:
            _git("worktree", "prune", cwd=repo)
        except GitError:
            pass


def sweep(state_dir: str | Path, run_ids: list[str]) -> list[Path]:
    """Remove the worktrees of ``run_ids`` (runs gc deleted); returns the folders removed."""
    removed: list[Path] = []
    for run_id in run_ids:
        folder = Path(state_dir) / WORKTREES_DIR / run_id
        if not folder.is_dir():
            continue
        for path in sorted(p for p in folder.iterdir() if p.is_dir()):
            repo = _repo_of(path)
            if repo is not None:
                remove_worktree(repo, path)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def _repo_of(path: Path) -> Path | None:
    """The main repository of the worktree at ``path`` (from its ``.git`` file)."""
    try:
        # Bounded: the agent owned this folder, and may have left a FIFO or a huge file here.
        text = read_bounded_text(path / ".git", limit=GIT_FILE_BYTES).strip()
    except (FileRefused, UnicodeDecodeError):
        return None
    if not text.startswith("gitdir:"):
        return None
    admin = Path(text.split(":", 1)[1].strip())  # <repo>/.git/worktrees/<name>
    common = admin.parent.parent
    return common.parent if common.name == ".git" else None
