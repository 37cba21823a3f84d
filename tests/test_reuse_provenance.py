"""Reuse you can see: a reused attempt names the run and unit its answer came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from wf_magic import Engine
from wf_magic.notebook.frames import JournalFrame

from .conftest import wf_inproc

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

FLOW = """
name: prov
steps:
  - id: draft
    map: "{{ ['a', 'b'] }}"
    prompt: "Draft {{ item }}"
  - id: wrap
    prompt: "Wrap WHAT"
"""


def _two_runs(engine: Engine) -> tuple[str, str]:
    first = engine.run(FLOW.replace("WHAT", "up")).run_id
    second = engine.run(FLOW.replace("WHAT", "it")).run_id
    return first, second


def test_the_journal_names_the_run_and_unit_a_reused_answer_came_from(engine: Engine) -> None:
    first, second = _two_runs(engine)
    journal = engine.journal(second)
    reused = journal[journal.status == "reused"]
    assert reused[["unit", "reused_from_run", "reused_from_unit"]].values.tolist() == [
        ["draft[0]", first, "draft[0]"],
        ["draft[1]", first, "draft[1]"],
    ]
    fresh = journal[journal.status != "reused"]
    assert fresh.reused_from_run.isna().all() and fresh.reused_from_unit.isna().all()


def test_a_reuse_of_a_reuse_points_at_the_run_that_paid(engine: Engine) -> None:
    first, second = _two_runs(engine)
    third = engine.run(FLOW.replace("WHAT", "again")).run_id
    journal = engine.journal(third)
    assert set(journal[journal.status == "reused"].reused_from_run) == {first}
    assert second != first


def test_the_notebook_journal_shows_run_and_unit_not_a_dispatch_prefix(engine: Engine) -> None:
    first, second = _two_runs(engine)
    shown = JournalFrame(engine.journal(second)).readable()
    assert shown.loc[shown.unit == "draft[0]", "reused_from"].tolist() == [f"{first} · draft[0]"]


def test_wf_show_names_the_source_run_and_unit(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    with Engine(state_dir) as engine:
        first, second = _two_runs(engine)
        record = engine.handle(second).attempt("draft[1]")
    assert (record.reused_from_run, record.reused_from_unit) == (first, "draft[1]")
    out = wf_inproc(capsys, state_dir, "show", second, "draft[1]").stdout
    assert f"reused from run {first} unit draft[1] (dispatch {record.reused_from})" in out


def test_wf_journal_prints_a_compact_table_and_every_column_with_all(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    with Engine(state_dir) as engine:
        first, second = _two_runs(engine)
    compact = wf_inproc(capsys, state_dir, "journal", second).stdout.splitlines()
    assert compact[0].split() == [
        "step",
        "unit",
        "attempt",
        "loop",
        "phase",
        "status",
        "runner",
        "model",
        "tokens_in",
        "tokens_out",
        "duration_s",
        "started_at",
        "reused_from_run",
        "reused_from_unit",
    ]
    assert first in compact[1]
    every = wf_inproc(capsys, state_dir, "journal", second, "--all").stdout.splitlines()
    assert "dispatch_id" in every[0].split() and "input_hash" in every[0].split()
