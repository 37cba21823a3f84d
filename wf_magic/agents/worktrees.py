"""Git worktrees of agent attempts: one ``git worktree add --detach`` per dispatch id under the
state dir, kept when the agent left changes, removed when clean, swept when their run is gone;
wf_magic's git runs against the admin folder it recorded, never the agent's ``.git``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import FileRefused
from ..reading import read_bounded_text
from . import safegit
from .harness import AgentError
from .safegit import GitError

__all__ = [
    "GitError",
    "changes",
    "ensure_worktree",
    "remove_worktree",
    "repo_root",
    "resolve_workdir",
    "sweep",
    "worktree_path",
]

WORKTREES_DIR = "worktrees"
GIT_FILE_BYTES = 64 * 1024
"""The largest ``.git`` file, admin ``gitdir`` file or record of a worktree read."""
RECORD_SUFFIX = ".gitadmin"
"""Beside each worktree (outside it, where the agent does not work): the record of its admin
folder in the repository and the commit it started from, written when wf_magic adds it."""


def _git(*args: str, cwd: str | Path) -> str:
    return safegit.git(*args, cwd=cwd)


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
    if not path.is_symlink() and (_admin_of(path) is not None or (path / ".git").exists()):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():  # a leftover of a worktree removed by hand
        _remove_tree(path)
        _git("worktree", "prune", cwd=repo)
    _git("worktree", "add", "--detach", str(path), "HEAD", cwd=repo)
    admin = _verified_admin(path, _pointer_of(path))  # just written by git: not the agent's yet
    if admin is None:
        raise GitError(f"git worktree add failed: no admin folder links back to {path}")
    base = safegit.git("rev-parse", "HEAD", cwd=path, git_dir=admin, work_tree=path).strip()
    _record(path).write_text(json.dumps({"admin": str(admin), "base": base}) + "\n")


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
    """The files changed in the work tree at ``path`` since the commit it started from (untracked
    ones and the agent's own commits too) and a diff stat.

    Git runs against the admin folder wf_magic recorded, never the ``.git`` the agent may have
    replaced, with every config-driven program off (see :mod:`.safegit`).

    Raises:
        GitError: the worktree's admin folder is gone or git failed.
    """
    admin = _admin_of(path)
    if admin is None:
        raise GitError(f"git status failed: {path} is no longer a worktree wf_magic added")
    base = _read_record(path).get("base") or "HEAD"

    def git(*args: str) -> str:
        return safegit.git(*args, cwd=path, git_dir=admin, work_tree=path)

    quiet = ("--no-ext-diff", "--no-textconv", "--ignore-submodules=all", "--no-renames")
    status = git(
        "status",
        "--porcelain",
        "-z",
        "--untracked-files=all",
        "--no-renames",
        "--ignore-submodules=all",
    )
    files = {entry[3:] for entry in status.split("\0") if len(entry) > 3}
    moved = base != "HEAD" and git("rev-parse", "HEAD").strip() != base
    if not files and not moved:
        return [], ""
    git("add", "--intent-to-add", "--all")  # new files count in the diff stat
    names = git("diff", "--name-only", "-z", *quiet, base)
    files.update(n for n in names.split("\0") if n)
    stat = git("diff", "--stat", *quiet, base).strip()
    return sorted(files), stat


def remove_worktree(repo: Path | None, path: Path) -> None:
    """Remove the worktree at ``path`` and its admin folder in the repository.

    No git command runs in the worktree: its folder is deleted (symlinks in it are not
    followed) and the admin folder that links back to it, which wf_magic recorded, goes too.
    """
    admin = _admin_of(path)
    _remove_tree(path)
    _record(path).unlink(missing_ok=True)
    if admin is not None:
        shutil.rmtree(admin, ignore_errors=True)
    elif repo is not None:
        try:
            _git("worktree", "prune", cwd=repo)
        except GitError:
            pass


def sweep(state_dir: str | Path, run_ids: list[str]) -> list[Path]:
    """Remove the worktrees of ``run_ids`` (runs gc deleted); returns the folders removed."""
    removed: list[Path] = []
    for run_id in run_ids:
        folder = Path(state_dir) / WORKTREES_DIR / run_id
        if not folder.is_dir() or folder.is_symlink():
            continue
        for path in sorted(p for p in folder.iterdir() if p.is_dir() or p.is_symlink()):
            if path.name.endswith(RECORD_SUFFIX):
                continue
            remove_worktree(None, path)
            removed.append(path)
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def _record(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


def _read_record(path: Path) -> dict[str, str]:
    try:
        data = json.loads(read_bounded_text(_record(path), limit=GIT_FILE_BYTES))
    except (FileRefused, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def _admin_of(path: Path) -> Path | None:
    """The admin folder of the worktree at ``path``: the one wf_magic recorded when it added it
    (a worktree added before records were kept: its ``.git`` pointer), if it links back."""
    recorded = _read_record(path).get("admin")
    return _verified_admin(path, Path(recorded) if recorded else _pointer_of(path))


def _pointer_of(path: Path) -> Path | None:
    try:
        # Bounded: the agent owned this folder, and may have left a FIFO or a huge file here.
        text = read_bounded_text(path / ".git", limit=GIT_FILE_BYTES).strip()
    except (FileRefused, UnicodeDecodeError):
        return None
    return Path(text.split(":", 1)[1].strip()) if text.startswith("gitdir:") else None


def _verified_admin(path: Path, admin: Path | None) -> Path | None:
    """``admin`` if it is a worktree admin folder (``<common>/worktrees/<name>``) whose
    ``gitdir`` names ``path/.git``; None otherwise."""
    if path.is_symlink():  # the agent replaced its folder: nothing of git's is there
        return None
    if admin is None or not admin.is_absolute() or admin.parent.name != "worktrees":
        return None
    try:
        back = read_bounded_text(admin / "gitdir", limit=GIT_FILE_BYTES).strip()
    except (FileRefused, UnicodeDecodeError):
        return None
    # Folders compared resolved (git may write a real path), never through ``.git`` itself:
    # the agent may have made that a symlink to somewhere else.
    if os.path.realpath(Path(back).parent) != os.path.realpath(path):
        return None
    return admin


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def settle(repo: Path, path: Path) -> dict[str, Any]:
    """Changed files and diff stat of the attempt's worktree; removed when clean."""
    try:
        files, stat = changes(path)
    except GitError as exc:
        return {"path": str(path), "kept": True, "error": str(exc)}
    if not files:
        remove_worktree(repo, path)
    return {"path": str(path), "kept": bool(files), "changed_files": files, "diff_stat": stat}
