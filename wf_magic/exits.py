"""The one table of exit codes: what a run's status and each error class exit with (DESIGN.md §5).

The ``wf`` command and ``Run.exit_code`` both read it; nothing else defines an exit code.
"""

from __future__ import annotations

from .errors import (
    BudgetExceeded,
    DefinitionError,
    GateDecisionRefused,
    LeaseLost,
    MigrationError,
    PlanIntegrityError,
    PlanVersionTooNew,
    RunLockHeld,
    RunNotOwned,
    StateDBError,
    UsageError,
    WorkflowError,
)

EXIT_OK = 0
"""Done, or stopped gracefully (``--max-steps``, a stop request)."""
EXIT_FAILED = 1
"""The run failed or was abandoned; plan integrity, budget, migration and state DB errors."""
EXIT_USAGE = 2
"""A usage or definition error, a refused gate decision, another user's run (not adopted), or a
plan from a newer wf_magic."""
EXIT_BLOCKED = 3
"""The run is blocked (a human gate waits, a gate is exhausted, a judge failed)."""
EXIT_LOCKED = 75
"""Another driver holds the run (``RunLockHeld``), or this driver lost its lease (``LeaseLost``)."""
EXIT_INTERRUPTED = 130
"""Interrupted by SIGINT; the run stays active."""

STATUS_EXIT_CODES: dict[str, int] = {
    "completed": EXIT_OK,
    "active": EXIT_OK,
    "failed": EXIT_FAILED,
    "blocked": EXIT_BLOCKED,
    "abandoned": EXIT_FAILED,
}
"""The exit code of a run left in each status."""

ERROR_EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (RunLockHeld, EXIT_LOCKED),
    (LeaseLost, EXIT_LOCKED),
    (DefinitionError, EXIT_USAGE),
    (RunNotOwned, EXIT_USAGE),  # not 75: waiting changes nothing, `wf adopt RUN` does
    (UsageError, EXIT_USAGE),
    (GateDecisionRefused, EXIT_USAGE),
    (PlanVersionTooNew, EXIT_USAGE),  # not 75: retrying later changes nothing, upgrading does
    (PlanIntegrityError, EXIT_FAILED),
    (BudgetExceeded, EXIT_FAILED),
    (MigrationError, EXIT_FAILED),
    (StateDBError, EXIT_FAILED),
    (WorkflowError, EXIT_FAILED),
)
"""The exit code of each error class; the first matching entry wins (subclasses first)."""


def status_exit_code(status: str) -> int:
    """The exit code of a run in ``status``."""
    return STATUS_EXIT_CODES.get(status, EXIT_FAILED)


def error_exit_code(exc: BaseException) -> int:
    """The exit code of ``exc`` (a ``WorkflowError``; anything else exits 1)."""
    return next((code for cls, code in ERROR_EXIT_CODES if isinstance(exc, cls)), EXIT_FAILED)
