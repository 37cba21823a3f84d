"""A run view's output moves between the live widget and the static HTML without a race: a
drive thread ending while the kernel's main thread shows the view live (Approve, then a drive
that finishes at once) still leaves the static view last, and no output names a closed model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_notebook import (
    RecordingHandle,
    cell,
    ipython_shell,
    magics_in,
    slow_digest,
    until,
)
from wf_magic.notebook.magics import WorkflowMagics
from wf_magic.notebook.widgets import RunView

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

GATED = """\
name: signoff
runner: scripted
runners:
  scripted:
    rules:
      - {match: "^Publish", reply: "published", sleep_s: 0.2}
steps:
  - id: draft
    prompt: "Draft the notes"
  - id: signoff
    prompt: "Polish: {{ steps.draft.output }}"
    gate: {judge: human}
  - id: publish
    prompt: "Publish: {{ steps.signoff.output }}"
"""
"""Blocks at a human gate; after Approve, one short unit (long enough to be seen driving)."""


def _open_model_ids() -> set[str]:
    from ipywidgets.widgets import widget as module

    return set(module._instances)


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


@pytest.fixture
def magics(shell: InteractiveShell, tmp_path: Path) -> Iterator[WorkflowMagics]:
    with magics_in(shell, tmp_path / "state", widgets="on") as found:
        yield found


def test_a_drive_ending_while_approve_shows_the_view_live_leaves_the_static_view_last(
    shell: InteractiveShell, magics: WorkflowMagics
) -> None:
    run = shell.run_cell_magic("workflow", "", GATED)
    view: RunView = run.view
    view.display_handle, view.decision_handle = RecordingHandle(), RecordingHandle()
    view.refresh()
    assert view.is_static and view.is_closed
    assert "Blocked: waiting on step" in view.display_handle.last()["text/html"]
    shown = view.live_bundle

    def live_bundle_slowly() -> dict[str, Any]:
        # The main thread has built the live bundle (models open again, their ids in it);
        # the drive ends before that bundle is published: the worst interleaving, forced.
        bundle = shown()
        magics.drives.wait(run.run_id, timeout=1.0)
        return bundle

    view.live_bundle = live_bundle_slowly  # type: ignore[method-assign]
    view.approve_button.click()  # the click's handler runs on the kernel's main thread
    assert magics.drives.wait(run.run_id, timeout=20)
    view.flush()
    assert magics.engine.status(run.run_id).status == "completed"
    last = view.display_handle.last()
    assert WIDGET_VIEW not in last, "the live widget of a finished drive was published last"
    assert "Run completed." in last["text/html"]
    assert view.decision_handle.last() == {"text/plain": ""}
    # Nothing published names a model the front end no longer has (no "model not found").
    assert view.is_static and view.is_closed
    open_ids = _open_model_ids()
    for handle in (view.display_handle, view.decision_handle):
        shown_last = handle.last().get(WIDGET_VIEW)
        assert shown_last is None or shown_last["model_id"] in open_ids


def test_a_view_shown_again_as_a_cells_value_goes_static_with_its_first_output(
    shell: InteractiveShell, magics: WorkflowMagics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run.view`` as a later cell's value opens the view's models again in that output;
    when the view goes static again (Approve, the drive ends) that output gets the static
    HTML too, so no output of the notebook names a model that was closed."""
    import IPython.display

    run = shell.run_cell_magic("workflow", "", GATED)
    view: RunView = run.view
    view.display_handle, view.decision_handle = RecordingHandle(), RecordingHandle()
    view.refresh()
    assert view.is_static and view.is_closed
    again: list[RecordingHandle] = []

    def display(obj: Any, **kw: Any) -> RecordingHandle:
        handle = RecordingHandle()
        handle.update(obj)
        again.append(handle)
        return handle

    monkeypatch.setattr(IPython.display, "display", display)
    view._ipython_display_()
    [shown] = again
    assert WIDGET_VIEW in shown.last() and not view.is_closed  # live and clickable there
    view.approve_button.click()
    assert magics.drives.wait(run.run_id, timeout=20)
    view.flush()
    assert magics.engine.status(run.run_id).status == "completed"
    assert view.is_static and view.is_closed
    for handle in (view.display_handle, shown):
        assert WIDGET_VIEW not in handle.last() and "Run completed." in handle.last()["text/html"]


def test_a_view_whose_cell_stopped_waiting_goes_static_when_its_drive_thread_ends(
    shell: InteractiveShell, magics: WorkflowMagics
) -> None:
    """A second interrupt stops the cell waiting while the drive thread winds down: when that
    thread ends the view still becomes its static HTML (no later cell needs to run), so a
    saved notebook holds no live widget of a drive that is over."""
    body = slow_digest(1.5)

    class Interrupted(threading.Event):
        """The cell's wait for its drive, interrupted twice (as two kernel interrupts)."""

        def __init__(self) -> None:
            super().__init__()
            self.left = 2

        def wait(self, timeout: float | None = None) -> bool:
            if self.left and threading.current_thread() is threading.main_thread():
                self.left -= 1
                super().wait(0.2)
                raise KeyboardInterrupt
            return super().wait(timeout)

    shown: list[RunView] = []
    show, begin = RunView.show, magics.drives._begin

    def recorded(view: RunView) -> None:
        show(view)
        view.display_handle = RecordingHandle()
        shown.append(view)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        drive = begin(*args, **kwargs)
        drive.done = Interrupted()
        return drive

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunView, "show", recorded)
        patch.setattr(magics.drives, "_begin", interrupted)
        stopped = cell(shell, "", body)
    [view] = shown
    assert not view.is_static  # the cell stopped waiting: its drive still ran then
    assert magics.drives.wait(stopped.run_id, timeout=30)
    until(lambda: view.is_static)
    assert WIDGET_VIEW not in view.display_handle.last()
    assert view.is_closed and magics.engine.status(stopped.run_id).status == "active"
