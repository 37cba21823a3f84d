"""Views follow their run while the kernel lives: a static run view repaints (throttled, by
polling the journal from a thread) when its run is decided, driven or finished elsewhere — the
``wf`` CLI in a subprocess, another cell — until the run settles; the kernel's main thread is
never held meanwhile."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_notebook import (
    HUMAN_DRAFT,
    RecordingHandle,
    drives_of,
    engine_at,
    ipython_shell,
    magics_in,
    until,
    view_of,
)
from wf_magic import Engine
from wf_magic.notebook.drives import Drives
from wf_magic.notebook.magics import WorkflowMagics


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    yield from engine_at(tmp_path / "state")


@pytest.fixture
def drives(engine: Engine) -> Iterator[Drives]:
    yield from drives_of(engine)


def _wf(state: Path, *args: str) -> None:
    env = {**os.environ, "WF_MAGIC_HOME": str(state)}
    subprocess.run(
        [sys.executable, "-m", "wf_magic", *args], env=env, check=True, capture_output=True
    )


def test_a_static_view_repaints_after_wf_approve_and_wf_resume_in_a_subprocess(
    engine: Engine, drives: Drives, tmp_path: Path
) -> None:
    run_id = engine.run(HUMAN_DRAFT).run_id
    view = view_of(engine, run_id, drives)
    view.display_handle, view.decision_handle = RecordingHandle(), RecordingHandle()
    view.flush()
    view.refresh()
    assert view.is_static and "Blocked: waiting on step" in view.display_handle.html()
    published = len(view.display_handle.published)
    _wf(tmp_path / "state", "approve", run_id, "draft")
    # Decided elsewhere: the static output says so within a few polls, the panel goes.
    until(lambda: len(view.display_handle.published) > published)
    assert view.decision_handle.published[-1] == {"text/plain": ""}
    started = time.monotonic()
    _wf(tmp_path / "state", "resume", run_id)
    until(lambda: "Run completed." in view.display_handle.html())
    assert time.monotonic() - started < 20
    until(lambda: not view.clock.is_running)  # settled: it stops observing
    assert view.throttle.is_closed
    view.close()


def test_a_static_view_of_a_stopped_run_follows_a_drive_from_another_process(
    engine: Engine, tmp_path: Path
) -> None:
    run_id = engine.start(
        "name: two\nrunner: scripted\nsteps:\n  - id: a\n    prompt: hi\n"
        "  - id: b\n    prompt: there\n"
    ).run_id
    engine.drive(run_id, max_steps=1)
    view = view_of(engine, run_id)
    view.display_handle = RecordingHandle()
    view.flush()
    view.refresh()
    assert "not being driven" in view.display_handle.html()
    assert view.clock.is_running  # it follows: the run can still change
    _wf(tmp_path / "state", "resume", run_id)
    until(lambda: "Run completed." in view.display_handle.html())
    view.close()


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


@pytest.fixture
def magics(shell: InteractiveShell, tmp_path: Path) -> Iterator[WorkflowMagics]:
    with magics_in(shell, tmp_path / "state", widgets="on") as found:
        yield found


def test_an_older_view_follows_its_run_after_a_later_cell_approves_and_finishes_it(
    shell: InteractiveShell, magics: WorkflowMagics
) -> None:
    first = shell.run_cell_magic("workflow", "", HUMAN_DRAFT)
    old = first.view
    old.display_handle, old.decision_handle = RecordingHandle(), RecordingHandle()
    old.refresh()
    assert "Blocked: waiting on step" in old.display_handle.html()
    # A later cell decides from code and drives the run with a newer view.
    shell.run_cell(f"_r = {first.run_id!r}")
    magics.engine.approve(first.run_id, "draft")
    shell.run_line_magic("workflow", f"resume {first.run_id}")
    assert old.retired is not None
    until(lambda: "Run completed." in old.display_handle.html())
    assert old.decision_handle.published[-1] == {"text/plain": ""}
