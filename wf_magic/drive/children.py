"""Child workflows: publish a child run once per (parent, invocation) and read its outcome.

The loop drives the child in place (``drive_run(ctx.child(redactor), child)``) between the two.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import RunLockHeld, RunnerError, UsageError
from ..hashing import sha256_text
from ..redact import is_secret_key
from ..runners.base import UnitResult
from ..sealing import Sealer, has_secrets
from ..spec.models_resolve import plan_for_params
from ..spec.params import resolve_params
from ..spec.plan import PlanStep
from ..spec.workflow import Workflow
from ..store import Store
from ..store.records import RunRow
from .context import DriveContext, RunState
from .runrows import new_run_id, new_run_row, plan_steps, scope_key
from .units import UnitPlan


class ChildBlocked(Exception):
    """A child workflow run is blocked; its parent unit stays in flight."""


class ChildBudgetStop(Exception):
    """A child workflow run was stopped by the (shared) budget: a hard stop for the parent."""


class ChildLockHeld(RunLockHeld):
    """A parent's drive reached a child run another driver holds: the parent's unit stays
    owed and its drive ends (CLI exit 75), naming the child and its holder."""

    def __init__(self, parent_run_id: str, step_id: str, held: RunLockHeld):
        super().__init__(held.run_id or "", pid=held.pid, since=held.since, host=held.host)
        self.child_run_id = held.run_id
        self.run_id, self.step_id = parent_run_id, step_id
        who = f"pid {held.pid}" if held.pid is not None else "another driver"
        who += f" on {held.host}" if held.host else ""
        who += f" since {held.since}" if held.since else ""
        self.message = (
            f"Run {parent_run_id}: step {step_id} waits on its child run {held.run_id}, which "
            f"is being driven by {who}; the step stays owed. Wait for that driver (or "
            f"`wf stop {held.run_id}`), then `wf resume {parent_run_id}`."
        )


def publish(ctx: DriveContext, state: RunState, step: PlanStep, unit: UnitPlan) -> RunRow:
    """The child run of ``unit``: the one published earlier, else a new one.

    Idempotent on ``(parent_run_id, invocation_key)``: a parent re-drive finds its child.

    Raises:
        RunnerError: the child's params are invalid.
    """
    plan = state.plan.children[step.workflow or ""]
    existing = ctx.store.child_run(state.run_id, unit.unit_id)
    try:
        params = resolve_params(plan, unit.kwargs or {})
    except UsageError as exc:
        if existing is not None:
            return existing
        raise RunnerError(f"child workflow {plan.name!r}: {exc}") from None
    # A child's secret params are sealed like a root run's; their values reach the child's
    # drive through this drive's secrets, which a re-driven parent fills again here.
    params = _sealed(ctx, state, params)
    if existing is not None:
        return existing
    try:
        plan = plan_for_params(plan, params)  # a `model:` templated from the child's params
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
    row = new_run_row(
        wf,
        params,
        run_id=new_run_id(),
        scope=scope_key(plan.name, params),
        # A fork re-executes from its fork step: a child there runs afresh.
        use_cache=bool(state.run.use_cache) and not state.reexecutes(step),
        parent=state.run,
        invocation_key=unit.unit_id,
    )
    return ctx.store.publish_child(row, plan_steps(wf))


def _sealed(ctx: DriveContext, state: RunState, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with secret values sealed; the values join the drive's secrets.

    A param under a plain name that carries one of this drive's secrets (a secret param's
    value, a secret from the environment, a credential-looking string) is sealed whole: the
    child's row never holds it, and its drive gets the value from this one's.
    """
    whole = [k for k, v in params.items() if not is_secret_key(k) and _carries(ctx, state, v)]
    if not whole and not has_secrets(params):
        return params
    sealed = Sealer.ensure(ctx.store.state_dir).seal_params(params, whole=whole)
    ctx.options.secrets.update(sealed.vault)
    return sealed.params


def _carries(ctx: DriveContext, state: RunState, value: Any) -> bool:
    """Whether ``value`` holds a secret this drive knows (masked by its redactor, or equal to
    a secret too short to be masked inside text)."""
    if state.redactor.redact_value(value) is not value:
        return True
    return any(value == secret for secret in ctx.options.secrets.values())


def child_result(store: Store, child: RunRow) -> UnitResult:
    """The parent unit's result from a driven child run.

    Raises:
        ChildBlocked: the child is blocked or was stopped (the parent unit stays in flight).
        ChildBudgetStop: the shared budget stopped the child (a hard stop for the parent).
        RunnerError: the child failed or was abandoned.
    """
    label = f"child run {child.run_id} ({child.workflow})"
    if child.status == "completed":
        return UnitResult(output=json.loads(child.result_json or "null"))
    if child.status == "blocked":
        raise ChildBlocked(f"{label} is blocked: {child.status_reason}")
    if child.status == "active":
        raise ChildBlocked(f"{label} was stopped before it finished; resume the parent")
    message = f"{label} {child.status}: {child.status_reason}"
    if any(row.stops_run and row.status == "failed" for row in store.steps_of(child.run_id)):
        raise ChildBudgetStop(message)
    raise RunnerError(message)
