"""The tours under nbval (issue 23, item 7): each notebook in notebooks/ is committed with its
outputs, and re-running it must reproduce them, so a change that alters what a learner sees
fails the suite.

``pytest --nbval`` runs each notebook in a subprocess on this Python's kernel, from a copy in
a temporary folder (the tours write their state dir, worktrees and stand-in CLIs beside
themselves). The kernel's IPython profile sets ``WorkflowMagics.widgets = 'off'``: nbval
does not apply ``update_display_data`` (it logs "unhandled iopub msg"), so a live run view
would be compared as its first draw ("active", steps pending) instead of the static HTML it
becomes when its drive ends; off, a cell shows that static rendering at once. The live
views themselves are covered by test_notebooks.py and the browser test. notebooks/nbval_sanitize.cfg masks what differs on every run: run and sweep
ids, dispatch ids and hashes, timestamps, durations, temporary paths. Regenerate the saved
outputs with ``.venv/bin/python scripts/nbval_outputs.py`` after a deliberate change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
SANITIZE = REPO / "notebooks" / "nbval_sanitize.cfg"
KERNEL_CONFIG = "c.WorkflowMagics.widgets = 'off'\n"
"""As in scripts/nbval_outputs.py, which saved the outputs compared here."""


def test_every_tour_is_committed_with_its_outputs() -> None:
    import nbformat

    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.execution_count for c in code), path.name
        assert sum(len(c.outputs) for c in code) > 0, path.name
        assert "widgets" not in nb.metadata, path.name  # no saved widget state


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_tour_reproduces_its_saved_outputs_under_nbval(path: Path, tmp_path: Path) -> None:
    _setup(path, tmp_path)
    done = _nbval(path, tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_second_pass_in_the_same_folder_reproduces_them_too(path: Path, tmp_path: Path) -> None:
    """Run All again after a kernel restart, beside the first pass's state dir (and the agent
    tour's repository): each tour starts from its own fresh state, so nbval passes twice."""
    _setup(path, tmp_path)
    for attempt in ("first", "second"):
        done = _nbval(path, tmp_path)
        assert done.returncode == 0, attempt + done.stdout[-6000:] + done.stderr[-2000:]


def _setup(path: Path, tmp_path: Path) -> None:
    """The tour and the sanitizers in a folder of their own, and a kernel profile."""
    work = tmp_path / "notebooks"
    work.mkdir()
    shutil.copy(path, work / path.name)
    shutil.copy(SANITIZE, work / SANITIZE.name)
    for companion in REPO.joinpath("notebooks").glob("*.jsonl"):  # a tour's cassette
        shutil.copy(companion, work / companion.name)
    (tmp_path / "tmp").mkdir()
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(KERNEL_CONFIG)


def _nbval(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``pytest --nbval`` over the tour set up in ``tmp_path`` (see :func:`_setup`)."""
    env = {
        **os.environ,
        "IPYTHONDIR": str(tmp_path / "ipython"),
        "PYTHONPATH": str(REPO),
        "TMPDIR": str(tmp_path / "tmp"),
        "WF_MAGIC_HOME": str(tmp_path / "state"),  # the tours set their own; never ~/.wf_magic
        "JUPYTERHUB_USER": "learner",  # the owner the saved outputs show (scripts/nbval_outputs.py)
    }
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "--nbval",
        f"notebooks/{path.name}",
        "--nbval-sanitize-with",
        f"notebooks/{SANITIZE.name}",
        "--nbval-current-env",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
