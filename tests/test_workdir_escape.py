"""An agent's ``workdir:`` is resolved in the worktree as committed and never leads outside it
(the function directly, over generated path shapes, and through the agent runner)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.agent_fakes.bins import git_repo, make_bins
from tests.test_agents import work, workflow
from wf_magic import Engine
from wf_magic.agents import worktrees
from wf_magic.agents.harness import AgentError


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_a_folder_in_the_checkout_that_head_commits_as_a_symlink_outside_is_refused(
    tmp_path: Path,
) -> None:
    repo = git_repo(tmp_path / "repo")
    os.symlink("/", repo / "sub")  # HEAD: sub -> /
    _git(repo, "add", "sub")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "link")
    (repo / "sub").unlink()
    (repo / "sub" / "tmp").mkdir(parents=True)  # the checkout: a real folder sub/tmp
    tree = tmp_path / "state" / "worktrees" / "r-1" / "d-1"
    worktrees.ensure_worktree(repo, tree)
    assert (tree / "sub").is_symlink()
    with pytest.raises(AgentError) as caught:
        worktrees.resolve_workdir(tree, "sub/tmp", step_id="fix")
    assert str(caught.value) == (
        "step fix: workdir 'sub/tmp' in the worktree as committed leads outside it, to '/tmp'; "
        "commit a real folder inside the repository or fix workdir"
    )
    assert caught.value.executed is False


def test_a_committed_folder_and_one_head_lacks_resolve_inside_the_worktree(
    tmp_path: Path,
) -> None:
    repo = git_repo(tmp_path / "repo")
    tree = tmp_path / "wt"
    worktrees.ensure_worktree(repo, tree)
    (tree / "pkg").mkdir()
    os.symlink("pkg", tree / "alias")  # a symlink that stays inside is followed
    assert worktrees.resolve_workdir(tree, ".", step_id="s") == tree.resolve()
    assert worktrees.resolve_workdir(tree, "alias", step_id="s") == (tree / "pkg").resolve()
    made = worktrees.resolve_workdir(tree, "new/deeper", step_id="s")
    assert made == (tree / "new" / "deeper").resolve() and made.is_dir()


@pytest.mark.parametrize(
    ("workdir", "problem"),
    [
        ("/etc", "is not a path relative to the worktree"),
        ("~/x", "is not a path relative to the worktree"),
        ("README", "is not a folder there"),
        ("loop/x", "cannot be resolved"),
        ("..", "leads outside it"),
        ("a/../../x", "leads outside it"),
    ],
)
def test_bad_workdirs_are_one_line_errors_naming_the_step_and_the_path(
    tmp_path: Path, workdir: str, problem: str
) -> None:
    tree = tmp_path / "wt"
    (tree / "a").mkdir(parents=True)
    (tree / "README").write_text("x")
    os.symlink("loop", tree / "loop")
    with pytest.raises(AgentError) as caught:
        worktrees.resolve_workdir(tree, workdir, step_id="s9")
    message = str(caught.value)
    assert message.startswith(f"step s9: workdir {workdir!r} in the worktree as committed ")
    assert problem in message and "\n" not in message
    assert not (tmp_path / "x").exists()


# One component of a generated workdir: a plain name, ``.``/``..``, or a symlink made at that
# level pointing inside, to an absolute folder outside, or relatively up and out.
_COMPONENT = st.one_of(
    st.sampled_from(["a", "b", ".", "..", ""]),
    st.tuples(st.sampled_from(["in", "abs-out", "rel-out", "up1", "self"]), st.integers(0, 99)),
)


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(_COMPONENT, min_size=1, max_size=6), absolute=st.booleans())
def test_no_generated_workdir_resolves_or_creates_anything_outside_the_worktree(
    parts: list[str | tuple[str, int]], absolute: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        outside, tree = base / "outside", base / "state" / "wt"
        outside.mkdir()
        (tree / "a").mkdir(parents=True)
        walk, names = tree, []
        for part in parts:
            if isinstance(part, tuple):
                kind, n = part
                name = f"{kind}{n}"
                target = {
                    "in": str(tree / "a"),
                    "abs-out": str(outside),
                    "rel-out": "../../outside",
                    "up1": "..",
                    "self": ".",
                }[kind]
                planted = walk.is_dir() and walk.resolve().is_relative_to(tree.resolve())
                if planted and not (walk / name).is_symlink():
                    os.symlink(target, walk / name)
                part = name
            names.append(part)
            walk = walk / part
        workdir = ("/" if absolute else "") + "/".join(names)
        absolute = workdir.startswith("/")  # an empty first component makes one too
        expected = Path(os.path.realpath(tree / workdir.lstrip("/")))
        root = tree.resolve()
        try:
            got = worktrees.resolve_workdir(tree, workdir, step_id="gen")
        except AgentError as exc:
            message = str(exc)
            assert message.startswith("step gen: workdir ") and "\n" not in message
            assert exc.executed is False
            assert (
                absolute
                or not expected.is_relative_to(root)
                or (expected.exists() and not expected.is_dir())
            ), message
        else:
            assert not absolute
            assert got == expected and got.is_dir() and got.is_relative_to(root)
        assert list(outside.iterdir()) == []  # nothing was made outside
        assert sorted(p.name for p in base.iterdir()) == ["outside", "state"]
        assert [p.name for p in (base / "state").iterdir()] == ["wt"]


def test_an_agent_step_whose_workdir_head_commits_as_a_symlink_fails_before_the_agent_runs(
    engine: Engine, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    (outside / "x").mkdir(parents=True)
    repo = git_repo(tmp_path / "repo")
    os.symlink(outside, repo / "sub")  # HEAD: sub -> a folder outside the repository
    _git(repo, "add", "sub")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "link")
    (repo / "sub").unlink()
    (repo / "sub" / "x").mkdir(parents=True)  # the checkout: a real folder sub/x
    bins = make_bins(tmp_path / "bin")
    flow = workflow(
        repo, bins, "claude", "[[write escaped.txt x]]", extra="workdir: sub/x\nisolation: worktree"
    )
    run = engine.run(str(flow))
    [attempt] = work(engine, run.run_id)
    assert attempt.status == "failed"
    assert attempt.failure == (
        f"step fix: workdir 'sub/x' in the worktree as committed leads outside it, to "
        f"'{outside / 'x'}'; commit a real folder inside the repository or fix workdir"
    )
    assert list(outside.rglob("*")) == [outside / "x"]  # the agent never ran there
