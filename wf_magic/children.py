"""Child workflows: publish a child run once per (parent, invocation) and drive it in place."""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING

from .errors import RunnerError, UsageError
from .hashing import sha256_text
from .locking import RunLock
from .runners.base import UnitResult
from .spec.freeze import Workflow
from .spec.params import resolve_params
from .spec.plan import PlanStep
from .store import runs as run_sql
from .store.records import RunRow

if TYPE_CHECKING:
    from .drive import Driver
    from .engine import Engine
    from .units import UnitPlan


def drive_child(engine: Engine, driver: Driver, step: PlanStep, unit: UnitPlan) -> UnitResult:
    """Drive the child run of ``unit`` (publishing it first) and return its result.

    The child runs under its own lock, on the parent's driver thread and budget; a parent
    re-drive drives the same child, never a new one.

    Raises:
        ChildBlocked: the child is blocked or was stopped (the parent unit stays in flight).
        ChildBudgetStop: the shared budget stopped the child (a hard stop for the parent).
        RunnerError: the child failed or was abandoned.
    """
    from .dispatch import ChildBlocked, ChildBudgetStop

    parent = driver.run
    child = engine.read(lambda c: run_sql.child_run(c, parent.run_id, unit.unit_id))
    if child is None:
        child = _publish(engine, driver, step, unit)
    with RunLock(engine.lock_dir, child.run_id):
        child = engine.get_run(child.run_id)
        engine.drive_locked(child, driver.options, budget=driver.budget, depth=driver.depth + 1)
    child = engine.get_run(child.run_id)
    label = f"child run {child.run_id} ({child.workflow})"
    if child.status == "completed":
        return UnitResult(output=json.loads(child.result_json or "null"))
    if child.status == "blocked":
        raise ChildBlocked(f"{label} is blocked: {child.status_reason}")
    if child.status == "active":
        raise ChildBlocked(f"{label} was stopped before it finished; resume the parent")
    message = f"{label} {child.status}: {child.status_reason}"
    if any(row.stops_run and row.status == "failed" for row in engine.steps(child.run_id)):
        raise ChildBudgetStop(message)
    raise RunnerError(message)


def _publish(engine: Engine, driver: Driver, step: PlanStep, unit: UnitPlan) -> RunRow:
    """Insert the child run; idempotent on ``(parent_run_id, invocation_key)``."""
    from .runrows import scope_key

    plan = driver.plan.children[step.workflow or ""]
    try:
        params = resolve_params(plan, unit.kwargs or {})
    except UsageError as exc:
        raise RunnerError(f"child workflow {plan.name!r}: {exc}") from None
    plan_json = plan.to_json()
    wf = Workflow(
        name=plan.name,
        source=plan_json,
        source_hash=sha256_text(plan_json),
        source_path=None,
        plan=plan,
        plan_json=plan_json,
        plan_hash=sha256_text(plan_json),
    )
    try:
        run_id = engine.create_run(
            wf,
            params,
            scope=scope_key(plan.name, params),
            # A fork re-executes from its fork step: a child there runs afresh.
            use_cache=bool(driver.run.use_cache) and not driver.reexecutes(step),
            parent=driver.run,
            invocation_key=unit.unit_id,
        )
    except sqlite3.IntegrityError:  # published meanwhile: (parent, invocation_key) is unique
        existing = engine.read(lambda c: run_sql.child_run(c, driver.run.run_id, unit.unit_id))
        if existing is None:
            raise
        return existing
    return engine.get_run(run_id)
