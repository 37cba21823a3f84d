"""Every ``wf`` verb on a read-only state dir: reads work, writes say "read-only" (issue 20).

Tests run as root here, and root writes through ``chmod a-w``; so the state dir is made
read-only three real ways, each used where the machine allows it: ``chmod`` (when not root),
the immutable attribute (``chattr +i``, which stops root too: EPERM) and a read-only bind
mount (EROFS). SQLite then fails as it would for a user: it cannot create the ``-wal`` file
("unable to open database file") or write the file ("attempt to write a readonly database").
No verb may call that a database to move aside or restore: each writing verb exits 2 with
one line naming the state dir as read-only, and each reading verb works as before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from wf_magic.errors import StateDirReadOnly

from .conftest import wf_inproc

BLOCKS = """\
name: ro-blocks
steps:
  - id: post
    prompt: Write a post.
    gate: {judge: human, criteria: [on brand], max_loops: 3}
  - id: publish
    prompt: "Publish {{ steps.post.output }}"
"""
DONE = """\
name: ro-done
steps:
  - id: a
    prompt: one
  - id: b
    prompt: two
"""
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass
class Runs:
    """The state dir's runs, and the workflow files they came from."""

    blocked: str
    done: str
    blocks_file: Path
    done_file: Path


def _run_id(stdout: str) -> str:
    return stdout.split()[1]  # "run r-... (new)"


@pytest.fixture
def runs(tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]) -> Runs:
    blocks_file, done_file = tmp_path / "blocks.yaml", tmp_path / "done.yaml"
    blocks_file.write_text(BLOCKS)
    done_file.write_text(DONE)
    blocked = wf_inproc(capsys, state_dir, "run", str(blocks_file), "--quiet")
    assert blocked.returncode == 3, blocked.stderr
    done = wf_inproc(capsys, state_dir, "run", str(done_file), "--quiet")
    assert done.returncode == 0, done.stderr
    return Runs(_run_id(blocked.stdout), _run_id(done.stdout), blocks_file, done_file)


# -- three ways to make a directory read-only -----------------------------------------------
def _chmod(state_dir: Path, tmp_path: Path) -> Iterator[Path]:
    if IS_ROOT:
        pytest.skip("root writes through chmod a-w")
    paths = [state_dir, *state_dir.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        yield state_dir
    finally:
        for p in paths:
            p.chmod(modes[p])


def _immutable(state_dir: Path, tmp_path: Path) -> Iterator[Path]:
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("needs chattr")
    made = subprocess.run([chattr, "-R", "+i", str(state_dir)], capture_output=True, check=False)
    try:
        if made.returncode != 0:
            pytest.skip(f"chattr +i refused here: {made.stderr.decode().strip()}")
        assert not os.access(state_dir, os.W_OK)
        yield state_dir
    finally:
        subprocess.run([chattr, "-R", "-i", str(state_dir)], capture_output=True, check=False)


def _read_only_mount(state_dir: Path, tmp_path: Path) -> Iterator[Path]:
    view = tmp_path / "ro-view"
    view.mkdir()
    mounted = subprocess.run(
        ["mount", "--bind", "-o", "ro", str(state_dir), str(view)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("needs a read-only bind mount (root with CAP_SYS_ADMIN)")
    try:
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)


MAKERS = {"chmod": _chmod, "chattr-immutable": _immutable, "ro-bind-mount": _read_only_mount}


@pytest.fixture(params=sorted(MAKERS))
def read_only(
    request: pytest.FixtureRequest, runs: Runs, state_dir: Path, tmp_path: Path
) -> Iterator[Path]:
    """The state dir holding ``runs``, read-only (the path to pass to ``--db``)."""
    yield from MAKERS[request.param](state_dir, tmp_path)


# -- the verbs ---------------------------------------------------------------------------------
def _writing_verbs(r: Runs) -> list[tuple[str, ...]]:
    return [
        ("run", str(r.blocks_file), "--quiet"),
        ("run", str(r.done_file), "--new", "--quiet"),
        ("resume", r.blocked, "--quiet"),
        ("fork", r.done, "--from", "b"),
        ("abandon", r.blocked),
        ("approve", r.blocked, "post"),
        ("reject", r.blocked, "post", "--feedback", "more"),
        ("stop", r.blocked),
        ("gc", "--older-than", "0s"),
    ]


def _reading_verbs(r: Runs) -> list[tuple[str, ...]]:
    return [
        ("list",),
        ("status",),
        ("status", r.blocked),
        ("journal", r.blocked),
        ("tokens", r.done),
        ("events", r.blocked),
        ("show", r.done, "a"),
        ("diff", r.done, r.done),
        ("export-cassette", r.done),
        ("gc", "--older-than", "0s", "--dry-run"),
    ]


def test_every_verb_that_writes_names_the_read_only_state_dir_in_one_line(
    read_only: Path, runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    for args in _writing_verbs(runs):
        result = wf_inproc(capsys, read_only, *args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert len(lines) == 1, (args, result.stderr)
        line = lines[0]
        assert line.startswith("error: ") and "Traceback" not in result.stderr
        assert f"the state dir {read_only} is read-only (" in line, (args, line)
        assert "writable directory" in line, (args, line)
        for misleading in ("Move it aside", "Restore", "backup", "not a usable"):
            assert misleading not in line, (args, line)


def test_every_verb_that_only_reads_works_on_a_read_only_state_dir_as_before(
    runs: Runs,
    state_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    before = {args: wf_inproc(capsys, state_dir, *args) for args in _reading_verbs(runs)}
    for name in sorted(MAKERS):
        maker = MAKERS[name](state_dir, tmp_path / name)
        (tmp_path / name).mkdir()
        try:
            view = next(maker)
        except pytest.skip.Exception:
            continue
        try:
            for args, was in before.items():
                now = wf_inproc(capsys, view, *args)
                assert (now.returncode, now.stderr) == (was.returncode, ""), (
                    name,
                    args,
                    now.stderr,
                )
                assert now.stdout.replace(str(view), str(state_dir)) == was.stdout, (name, args)
        finally:
            next(maker, None)


def test_a_new_state_dir_under_a_read_only_parent_is_named_read_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    maker = _read_only_mount(parent, tmp_path) if IS_ROOT else _chmod(parent, tmp_path)
    try:
        view = next(maker)
    except pytest.skip.Exception as exc:
        pytest.skip(str(exc))
    try:
        flow = tmp_path / "flow.yaml"
        flow.write_text(DONE)
        result = wf_inproc(capsys, view / "state", "run", str(flow))
        assert result.returncode == 2
        assert result.stderr.startswith(f"error: the state dir {view / 'state'} is read-only (")
    finally:
        next(maker, None)


def test_the_read_only_error_is_a_usage_error_naming_dir_reason_and_run() -> None:
    error = StateDirReadOnly("/srv/wf", reason="Read-only file system", run_id="r-1")
    assert str(error) == (
        "Run r-1: the state dir /srv/wf is read-only (Read-only file system); this needs to "
        "write to it. Make it writable, or point --db / WF_MAGIC_HOME at a writable directory "
        "(verbs that only read, such as `wf status` and `wf list`, work as they are)."
    )
    assert isinstance(error, ValueError)
    assert StateDirReadOnly.from_os_error("/srv/wf", OSError(28, "No space left")) is None
