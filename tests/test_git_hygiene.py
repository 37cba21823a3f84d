"""wf_magic's own git commands in an agent's worktree cannot be hijacked by what the agent did.

Each case below is something an agent could do in its worktree (it can write the repository's
shared config with ``git config``, replace ``.git``, add ``.gitattributes``) so that a program
of its choosing — here a script that touches a marker file — runs when wf_magic reads the
attempt's changes, removes the worktree, adds the next one, or ``wf gc`` sweeps it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.agent_fakes.bins import git_repo
from wf_magic.agents import safegit, worktrees


class Scene:
    """A repository, one attempt's worktree of it, another repository, and the marker script."""

    def __init__(self, tmp: Path):
        self.repo = git_repo(tmp / "repo")
        self.state = tmp / "state"
        self.tree = worktrees.worktree_path(self.state, "r-1", "d-1")
        self.marker = tmp / "HIJACKED"
        self.evil = tmp / "evil.sh"
        self.evil.write_text(f"#!/bin/sh\necho \"$0 $*\" >> '{self.marker}'\ncat\n")
        self.evil.chmod(0o755)
        self.other = git_repo(tmp / "other")
        worktrees.ensure_worktree(self.repo, self.tree)
        self.head = _safe_head(self.repo)

    def agent_git(self, *args: str) -> None:
        """``git`` as the agent would run it in its worktree (plain, its own environment)."""
        subprocess.run(["git", *args], cwd=self.tree, check=True, capture_output=True)


def _safe_head(repo: Path) -> str:
    return safegit.git("rev-parse", "HEAD", cwd=repo).strip()


def _pointer_to_other_repo(s: Scene) -> None:
    (s.tree / ".git").unlink()
    (s.tree / ".git").write_text(f"gitdir: {s.other / '.git'}\n")
    subprocess.run(["git", "config", "core.fsmonitor", str(s.evil)], cwd=s.other, check=True)


def _git_dir_replaced_by_a_repository(s: Scene) -> None:
    (s.tree / ".git").unlink()
    subprocess.run(["git", "init", "-q"], cwd=s.tree, check=True)
    subprocess.run(["git", "config", "core.fsmonitor", str(s.evil)], cwd=s.tree, check=True)


def _fsmonitor(s: Scene) -> None:
    s.agent_git("config", "core.fsmonitor", str(s.evil))


def _hooks_path(s: Scene) -> None:
    hooks = s.marker.parent / "hooks"
    hooks.mkdir()
    for name in ("post-checkout", "post-index-change", "pre-commit", "reference-transaction"):
        os.symlink(s.evil, hooks / name)
    s.agent_git("config", "core.hooksPath", str(hooks))


def _hook_in_the_repository(s: Scene) -> None:
    for name in ("post-checkout", "post-index-change", "reference-transaction"):
        os.symlink(s.evil, s.repo / ".git" / "hooks" / name)


def _diff_driver(s: Scene) -> None:
    (s.tree / ".gitattributes").write_text("* diff=evil\n")
    s.agent_git("config", "diff.evil.command", str(s.evil))
    s.agent_git("config", "diff.evil.textconv", str(s.evil))


def _external_diff(s: Scene) -> None:
    s.agent_git("config", "diff.external", str(s.evil))


def _filter_driver(s: Scene) -> None:
    (s.tree / ".gitattributes").write_text("* filter=evil\n")
    for key in ("clean", "smudge"):
        s.agent_git("config", f"filter.evil.{key}", str(s.evil))
    s.agent_git("config", "filter.evil.required", "true")


def _filter_process(s: Scene) -> None:
    (s.repo / ".git" / "info").mkdir(exist_ok=True)
    (s.repo / ".git" / "info" / "attributes").write_text("* filter=odd=name.x\n")
    s.agent_git("config", "filter.odd=name.x.process", str(s.evil))
    s.agent_git("config", "filter.odd=name.x.clean", str(s.evil))


def _included_config(s: Scene) -> None:
    extra = s.marker.parent / "extra.cfg"
    extra.write_text(f"[core]\n\tfsmonitor = {s.evil}\n[diff]\n\texternal = {s.evil}\n")
    s.agent_git("config", "include.path", str(extra))


def _worktree_config(s: Scene) -> None:
    s.agent_git("config", "extensions.worktreeConfig", "true")
    s.agent_git("config", "--worktree", "core.fsmonitor", str(s.evil))


def _pager_and_editor(s: Scene) -> None:
    for key in ("core.pager", "pager.status", "pager.diff", "core.editor", "core.sshCommand"):
        s.agent_git("config", key, str(s.evil))


def _core_worktree_elsewhere(s: Scene) -> None:
    s.agent_git("config", "core.worktree", str(s.other))


HIJACKS: dict[str, Callable[[Scene], None]] = {
    ".git file points at another repository": _pointer_to_other_repo,
    ".git replaced by a repository of its own": _git_dir_replaced_by_a_repository,
    "core.fsmonitor": _fsmonitor,
    "core.hooksPath": _hooks_path,
    "hooks in the repository's .git/hooks": _hook_in_the_repository,
    "diff driver command and textconv": _diff_driver,
    "diff.external": _external_diff,
    "filter driver clean/smudge, required": _filter_driver,
    "filter process driver with an odd name": _filter_process,
    "include.path": _included_config,
    "config.worktree": _worktree_config,
    "pager, editor, ssh": _pager_and_editor,
    "core.worktree elsewhere": _core_worktree_elsewhere,
}


@pytest.mark.parametrize("how", HIJACKS, ids=list(HIJACKS))
@pytest.mark.parametrize("removal", ["settle", "gc"])
def test_no_hijack_runs_a_program_when_changes_are_read_and_the_worktree_goes(
    tmp_path: Path, how: str, removal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Scene(tmp_path)
    (s.tree / "agent.txt").write_text("the agent's work\n")
    (s.tree / "README").write_text("changed by the agent\n")
    HIJACKS[how](s)
    # The driver's own environment may carry GIT_* too; none of it is used either.
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", str(s.evil))
    monkeypatch.setenv("GIT_DIR", str(s.other / ".git"))

    files, stat = worktrees.changes(s.tree)
    assert "agent.txt" in files and "README" in files
    assert "agent.txt" in stat and "README" in stat
    if removal == "settle":
        worktrees.remove_worktree(s.repo, s.tree)
    else:
        assert worktrees.sweep(s.state, ["r-1"]) == [s.tree]
        assert not (s.state / "worktrees" / "r-1").exists()
    worktrees.ensure_worktree(s.repo, s.tree.with_name("d-2"))  # the next attempt's

    assert not s.marker.exists(), s.marker.read_text()
    assert not s.tree.exists()
    assert sorted(p.name for p in (s.repo / ".git" / "worktrees").iterdir()) == ["d-2"]
    monkeypatch.delenv("GIT_DIR")
    assert _safe_head(s.repo) == s.head
    assert (s.repo / "README").read_text() == "main checkout\n"
    assert _safe_head(s.other) == safegit.git("rev-parse", "HEAD", cwd=s.other).strip()
    assert not s.marker.exists()


def test_a_commit_the_agent_made_counts_as_a_change_and_keeps_the_worktree(
    tmp_path: Path,
) -> None:
    s = Scene(tmp_path)
    (s.tree / "made.txt").write_text("x\n")
    s.agent_git("add", "made.txt")
    s.agent_git("-c", "user.name=a", "-c", "user.email=a@e", "commit", "-q", "-m", "agent")
    files, stat = worktrees.changes(s.tree)
    assert files == ["made.txt"] and "made.txt" in stat


def test_a_clean_worktree_has_no_changes_and_a_removed_admin_folder_is_an_error(
    tmp_path: Path,
) -> None:
    s = Scene(tmp_path)
    assert worktrees.changes(s.tree) == ([], "")
    worktrees.remove_worktree(s.repo, s.tree)
    with pytest.raises(worktrees.GitError, match="is no longer a worktree wf_magic added"):
        worktrees.changes(s.tree)


def test_a_tampered_record_is_not_trusted_without_the_admin_folder_linking_back(
    tmp_path: Path,
) -> None:
    s = Scene(tmp_path)
    keep = s.other / ".git" / "worktrees" / "victim"
    keep.mkdir(parents=True)
    (keep / "gitdir").write_text("/somewhere/else/.git\n")
    record = s.tree.with_name("d-1" + worktrees.RECORD_SUFFIX)
    record.write_text(f'{{"admin": "{keep}", "base": "HEAD"}}\n')
    worktrees.remove_worktree(None, s.tree)
    assert keep.is_dir()  # not ours: it names another worktree


_NAME = st.text(
    st.characters(blacklist_characters='\0\n"\\', blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(names=st.lists(_NAME, min_size=1, max_size=4, unique=True))
def test_every_driver_the_config_names_is_emptied_whatever_its_name(names: list[str]) -> None:
    listing = "".join(
        f"filter.{n}.clean\n/x\0diff.{n}.textconv\n/y\0merge.{n}.driver\n/z\0" for n in names
    )
    got = dict(safegit.driver_overrides(listing + "core.fsmonitor\n/w\0user.name\0"))
    for n in names:
        for key in ("clean", "smudge", "process"):
            assert got[f"filter.{n}.{key}"] == ""
        assert got[f"filter.{n}.required"] == "false"
        assert got[f"diff.{n}.command"] == got[f"diff.{n}.textconv"] == ""
        assert got[f"merge.{n}.driver"] == ""
    assert len(got) == 7 * len(names)


def test_a_worktree_folder_replaced_by_a_symlink_is_unlinked_not_followed(
    tmp_path: Path,
) -> None:
    s = Scene(tmp_path)
    admin = s.repo / ".git" / "worktrees" / "d-1"
    os.rename(s.tree, tmp_path / "moved")
    os.symlink(s.other, s.tree)  # the agent's last act: its folder now names another repo
    with pytest.raises(worktrees.GitError, match="is no longer a worktree wf_magic added"):
        worktrees.changes(s.tree)
    assert worktrees.sweep(s.state, ["r-1"]) == [s.tree]
    assert not s.tree.is_symlink() and (s.other / "README").read_text() == "main checkout\n"
    assert (s.other / ".git" / "HEAD").exists()
    assert admin.is_dir()  # it did not link back to the symlink: left for `git worktree prune`
    assert not s.marker.exists()


def test_a_reclaimed_attempt_never_works_in_a_symlink_its_predecessor_left(
    tmp_path: Path,
) -> None:
    s = Scene(tmp_path)
    os.rename(s.tree, tmp_path / "moved")
    os.symlink(s.other, s.tree)
    worktrees.ensure_worktree(s.repo, s.tree)
    assert not s.tree.is_symlink() and (s.tree / "README").read_text() == "main checkout\n"
    assert worktrees.changes(s.tree) == ([], "")
    assert sorted(p.name for p in (s.other / ".git").iterdir() if p.name == "worktrees") == []


@pytest.mark.parametrize(
    "name", ["a b.txt", 'quo"te.txt', "new\nline.txt", "ünïcödé.txt", "-dash", "x -> y"]
)
def test_changed_file_names_come_back_exactly_whatever_their_characters(
    tmp_path: Path, name: str
) -> None:
    s = Scene(tmp_path)
    (s.tree / name).write_text("x\n")
    files, stat = worktrees.changes(s.tree)
    assert files == [name]
    assert stat.endswith("1 file changed, 1 insertion(+)")
