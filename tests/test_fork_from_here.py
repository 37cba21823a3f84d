"""Fork from here, clicked in a run view: the fork is driven, and its view takes the
decision output below the old view (the old run is superseded)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_notebook import cell, ipython_shell, magics_in
from wf_magic.notebook.magics import WorkflowMagics

from .test_notebook_views import EXHAUSTED


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


@pytest.fixture
def magics(shell: InteractiveShell, tmp_path: Path) -> Iterator[WorkflowMagics]:
    with magics_in(shell, tmp_path / "state", widgets="on") as found:
        yield found


def test_fork_from_here_drives_the_fork_in_the_old_views_decision_output(
    shell: InteractiveShell, magics: WorkflowMagics
) -> None:
    first = cell(shell, "", EXHAUSTED)
    assert first.status == "blocked"
    view = magics.views[first.run_id]
    handle = view.decision_handle
    assert handle is not None and view.is_static  # blocked: static view, live panel below
    view.fork_button.click()
    engine = magics.engine
    (forked,) = [r.run_id for r in engine.list_runs() if r.run_id != first.run_id]
    assert "the fork is driven below" in view.message.value
    assert view.decision_handle is None  # handed over: the old view no longer clears it
    fork_view = magics.views[forked]
    assert fork_view.display_handle is handle
    assert magics.drives.wait(forked, 30)
    fork_view.flush()
    # The fork re-ran the step from the fork point and stopped at the same exhausted gate.
    attempts = engine.attempts(forked)
    assert {a.unit_id for a in attempts if a.phase == "work"} == {"draft[0]", "draft[1]"}
    assert engine.get_run(forked).status == "blocked"
    assert engine.get_run(first.run_id).status == "abandoned"
