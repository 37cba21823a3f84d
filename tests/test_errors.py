"""The error tree (wf_magic.errors): one base class, one-line messages that say what to do."""

from __future__ import annotations

from wf_magic import (
    BudgetExceeded,
    DefinitionError,
    MigrationError,
    PlanIntegrityError,
    PlanVersionError,
    RunLockHeld,
    RunnerError,
    UsageError,
    WorkflowError,
)


def test_every_documented_error_class_is_a_workflow_error() -> None:
    for cls in (
        DefinitionError,
        UsageError,
        PlanIntegrityError,
        RunLockHeld,
        BudgetExceeded,
        RunnerError,
        MigrationError,
    ):
        assert issubclass(cls, WorkflowError)
    err = DefinitionError("bad", field="steps[0].id", line=3)
    assert (err.field, err.line) == ("steps[0].id", 3)


def test_definition_and_usage_errors_are_value_errors() -> None:
    assert issubclass(DefinitionError, ValueError) and issubclass(UsageError, ValueError)
    assert issubclass(PlanVersionError, PlanIntegrityError)


def test_a_definition_error_is_one_line_naming_field_source_and_line() -> None:
    err = DefinitionError("expected\n   a  mapping", field="steps", line=2, source_name="wf.yaml")
    assert str(err) == "steps: expected a mapping (wf.yaml, line 2)"
    assert err.problem == "expected a mapping"
    assert str(DefinitionError("no steps")) == "no steps"


def test_budget_exceeded_names_the_figures_and_what_to_do() -> None:
    err = BudgetExceeded(
        run_id="r-1", step_id="s", unit_id="s[2]", ceiling="max_units", used=2, limit=2
    )
    assert str(err) == (
        "Budget exceeded in run r-1: max_units used 2 of 2; unit s[2] was not dispatched. "
        "Raise budget.max_units and start a new run (--new), or fork this one."
    )
    assert (err.run_id, err.step_id, err.unit_id) == ("r-1", "s", "s[2]")
    cost = BudgetExceeded(
        run_id="r-1", step_id=None, unit_id="a", ceiling="max_cost", used=1.25, limit=1.5
    )
    assert "max_cost used 1.2500 of 1.5000" in str(cost)


def test_run_lock_held_names_the_holder_when_it_is_known() -> None:
    known = RunLockHeld("r-1", pid=42, since="2024-01-02 03:04:05", host="box")
    assert str(known) == (
        "Run r-1 is being driven by pid 42 on box since 2024-01-02 03:04:05; "
        "wait for it or stop that process (`wf stop r-1`)."
    )
    unknown = RunLockHeld("r-1", pid=None, since=None)
    assert str(unknown).startswith("Run r-1 is being driven by another driver; ")


def test_a_runner_error_is_permanent_and_executed_unless_said_otherwise() -> None:
    err = RunnerError("boom")
    assert (err.transient, err.executed, err.tokens_in, err.tokens_out) == (False, True, 0, 0)
    retry = RunnerError("later", transient=True, executed=False, tokens_in=3)
    assert (retry.transient, retry.executed, retry.tokens_in) == (True, False, 3)
