"""The gate spine (wf_magic.drive.spine): the only writer of step rows, and what they imply.

``derive_run_status`` and ``run_result`` are pure functions of a plan and its step rows;
``complete_step`` writes a step row (and one ``step_status`` event) only when it changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers_flow import journal_counts
from wf_magic import Engine, load_workflow
from wf_magic.drive.spine import LoopWork, derive_run_status, run_result
from wf_magic.store.records import StepRow, StepStatus

PLAN = load_workflow("""
name: spine
steps:
  - id: a
    prompt: A
  - id: b
    prompt: B
    on_error: continue
  - id: c
    prompt: C
""").plan


def row(
    step_id: str,
    status: StepStatus,
    *,
    note: str | None = None,
    output: Any = None,
    stops_run: int = 0,
) -> StepRow:
    """A step row of PLAN (``output`` is stored as JSON; None stores nothing)."""
    return StepRow(
        run_id="r-1",
        step_id=step_id,
        position="abc".index(step_id),
        kind="prompt",
        status=status,
        loop=1,
        max_loops=1,
        note=note,
        output_json=None if output is None else json.dumps(output),
        updated_at=0.0,
        stops_run=stops_run,
    )


def rows(*step_rows: StepRow) -> dict[str, StepRow]:
    return {r.step_id: r for r in step_rows}


# -- derive_run_status ------------------------------------------------------------------------
def test_a_run_with_steps_still_pending_is_active() -> None:
    status = derive_run_status(
        PLAN, rows(row("a", "completed"), row("b", "pending"), row("c", "pending"))
    )
    assert status == ("active", None)


def test_a_run_whose_steps_all_completed_or_were_skipped_is_completed() -> None:
    status = derive_run_status(
        PLAN, rows(row("a", "completed"), row("b", "skipped"), row("c", "completed"))
    )
    assert status == ("completed", None)


def test_a_failed_step_fails_the_run_naming_the_step_and_its_note() -> None:
    status = derive_run_status(
        PLAN,
        rows(
            row("a", "failed", note="unit a failed: boom"), row("b", "pending"), row("c", "pending")
        ),
    )
    assert status == ("failed", "step a: unit a failed: boom")


def test_a_step_failed_under_on_error_continue_lets_the_run_complete() -> None:
    status = derive_run_status(
        PLAN, rows(row("a", "completed"), row("b", "failed", note="x"), row("c", "completed"))
    )
    assert status == ("completed", None)


def test_a_budget_stop_fails_the_run_even_under_on_error_continue() -> None:
    stop = "Budget exceeded in run r-1: max_units used 1 of 1"
    status = derive_run_status(
        PLAN,
        rows(
            row("a", "completed"), row("b", "failed", note=stop, stops_run=1), row("c", "pending")
        ),
    )
    assert status == ("failed", f"step b: {stop}")


def test_a_blocked_step_blocks_the_run_naming_the_step_and_why() -> None:
    waiting = "waiting for a human verdict on loop 1"
    status = derive_run_status(
        PLAN, rows(row("a", "completed"), row("b", "blocked", note=waiting), row("c", "pending"))
    )
    assert status == ("blocked", f"step b: {waiting}")


@pytest.mark.parametrize(
    ("a", "c", "expected"),
    [
        ("blocked", "failed", ("blocked", "step a: of a")),
        ("failed", "blocked", ("failed", "step a: of a")),
    ],
)
def test_the_first_stuck_step_in_plan_order_decides_the_run_status(
    a: StepStatus, c: StepStatus, expected: tuple[str, str]
) -> None:
    status = derive_run_status(
        PLAN, rows(row("a", a, note="of a"), row("b", "completed"), row("c", c, note="of c"))
    )
    assert status == expected


# -- run_result -------------------------------------------------------------------------------
def test_the_result_is_the_output_of_the_last_completed_step() -> None:
    result = run_result(
        PLAN,
        rows(
            row("a", "completed", output={"k": 1}),
            row("b", "completed", output=[2]),
            row("c", "skipped"),
        ),
    )
    assert result == [2]


def test_a_failed_step_or_a_completed_step_without_output_gives_no_result() -> None:
    result = run_result(
        PLAN,
        rows(row("a", "completed", output="one"), row("b", "failed"), row("c", "completed")),
    )
    assert result == "one"


def test_a_run_without_a_completed_output_has_no_result() -> None:
    result = run_result(PLAN, rows(row("a", "pending"), row("b", "pending"), row("c", "pending")))
    assert result is None


# -- LoopWork ---------------------------------------------------------------------------------
def test_loop_work_is_complete_once_every_unit_has_an_output_or_a_failure() -> None:
    work = LoopWork.empty(2)
    assert not work.is_complete
    work.outputs[0] = None  # a failed unit's output
    work.failures["m[0]"] = "boom"
    assert not work.is_complete
    work.outputs[1] = "x"
    assert work.is_complete
    assert LoopWork.empty(0).is_complete


# -- complete_step on a real drive ------------------------------------------------------------
LOOPING = """
name: looping
runners:
  scripted:
    rules:
      - {kind: judge, match: '"v1"', reply: {complete: false, feedback: "more", missing: [x]}}
      - {match: "more", reply: "v2"}
      - {match: "^Write", reply: "v1"}
steps:
  - id: a
    prompt: Write A.
    gate: {max_loops: 3}
  - id: b
    prompt: "B {{ steps.a.output }}"
"""


def test_each_step_status_change_is_announced_once_as_a_step_status_event(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(LOOPING)
    changes = [
        (e.step_id, json.loads(e.data_json or "{}"))
        for e in engine.store.events_after(run.run_id)
        if e.kind == "step_status"
    ]
    assert changes == [
        ("a", {"loop": 2, "note": None, "status": "pending"}),
        ("a", {"loop": 2, "note": "gate passed at loop 2/3 (llm)", "status": "completed"}),
        ("b", {"loop": 1, "note": None, "status": "completed"}),
    ]
    assert [(s.step_id, s.status, s.loop) for s in engine.steps(run.run_id)] == [
        ("a", "completed", 2),
        ("b", "completed", 1),
    ]


def test_re_driving_a_finished_run_writes_no_step_row_and_no_event(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run(LOOPING)
    before = journal_counts(engine, run.run_id)
    assert engine.drive(run.run_id).status == "completed"
    assert journal_counts(engine, run.run_id) == before
