"""wf_magic's own git commands: explicit paths, a clean environment, and every program a
repository's config or attributes could start (hooks, fsmonitor, pagers, external diffs,
filter/diff/merge drivers, ssh, credential helpers) switched off.

An agent in a worktree can write the repository's config (``git config`` there writes the
shared one) and replace the worktree's ``.git``; neither may make wf_magic's status, diff or
add run a program of the agent's choosing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

GIT_TIMEOUT_S = 60.0

SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.sshCommand", "false"),
    ("core.gitProxy", ""),
    ("core.askPass", ""),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("core.alternateRefsCommand", ""),
    ("credential.helper", ""),
    ("diff.external", ""),
    ("diff.ignoreSubmodules", "all"),
    ("core.useBuiltinFSMonitor", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("gpg.program", "false"),
    ("protocol.allow", "never"),
    ("submodule.recurse", "false"),
    ("status.submoduleSummary", "false"),
)
"""Config every command runs with (command-line config outranks the repository's)."""

DRIVER_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "filter": (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")),
    "diff": (("command", ""), ("textconv", "")),
    "merge": (("driver", ""),),
}
"""Per-driver keys emptied for every driver a repository's config names (an empty command is
no command: git then reads and writes the file as stored)."""


class GitError(Exception):
    """A git command failed (its stderr's first line is the message)."""


def git(
    *args: str, cwd: str | Path, git_dir: Path | None = None, work_tree: Path | None = None
) -> str:
    """Run ``git args`` in ``cwd`` (against ``git_dir``/``work_tree`` when given) safely.

    Raises:
        GitError: git could not start, timed out, or exited non-zero.
    """
    where: list[str] = []
    if git_dir is not None:
        where.append(f"--git-dir={git_dir}")
    if work_tree is not None:
        where.append(f"--work-tree={work_tree}")
    try:
        listing = _run([*where, "config", "--list", "-z"], cwd=cwd, config=SAFE_CONFIG)
    except GitError:
        listing = ""  # no repository here (yet): nothing can name a driver
    return _run([*where, *args], cwd=cwd, config=SAFE_CONFIG + driver_overrides(listing))


def driver_overrides(listing: str) -> tuple[tuple[str, str], ...]:
    """The overrides emptying each filter/diff/merge driver named in ``git config -l -z``."""
    names: dict[tuple[str, str], None] = {}
    for entry in listing.split("\0"):
        key = entry.split("\n", 1)[0]
        section, _, rest = key.partition(".")
        sub, dot, _var = rest.rpartition(".")
        if dot and sub and section.lower() in DRIVER_KEYS:
            names[(section.lower(), sub)] = None
    return tuple(
        (f"{section}.{sub}.{var}", value)
        for section, sub in names
        for var, value in DRIVER_KEYS[section]
    )


def environment(config: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The driver's environment without ``GIT_*``, no system or global config, ``config``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_TERMINAL_PROMPT="0",
        GIT_PAGER="cat",
        GIT_CONFIG_COUNT=str(len(config)),
    )
    # GIT_CONFIG_KEY_n rather than -c: a driver's name may hold '=' or anything else.
    for n, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{n}"] = key
        env[f"GIT_CONFIG_VALUE_{n}"] = value
    return env


def _run(args: list[str], *, cwd: str | Path, config: tuple[tuple[str, str], ...]) -> str:
    verb = next((a for a in args if not a.startswith("--")), "?")
    try:
        done = subprocess.run(
            ["git", "--no-pager", *args],
            cwd=str(cwd),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=environment(config),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git {verb} failed: {exc}") from exc
    if done.returncode != 0:
        lines = [x for x in done.stderr.strip().splitlines() if x.strip()]
        fatal = [x for x in lines if x.startswith(("fatal:", "error:"))]
        line = (fatal or lines or [f"exit status {done.returncode}"])[-1]
        raise GitError(f"git {verb} failed: {line}")
    return done.stdout
