"""Run lifecycles: find or create a scope's run (superseding an unfinished one), fork a run."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .bus import EventBus
from .drive.runrows import new_run_id, new_run_row, plan_steps, scope_key
from .errors import UsageError
from .hashing import hash_value
from .locking import RunLock
from .spec.freeze import Workflow
from .spec.params import resolve_params
from .spec.plan import Plan
from .store import Store
from .store.records import RunRow, ScopeChoice
from .store.runs import LaunchKey

MAX_KEY_LENGTH = 200
"""The longest launch key accepted (a cron job id, a notebook cell id, a date)."""
UNFINISHED = ("active", "blocked", "failed")
"""Run statuses a scope has at most one of (a later start supersedes it)."""


@dataclass(slots=True, kw_only=True)
class Started:
    """The run a start or fork settled on."""

    run_id: str
    created: bool
    warnings: list[str] = field(default_factory=list)


def start(
    store: Store,
    bus: EventBus,
    wf: Workflow,
    *,
    params: Mapping[str, Any] | None,
    new: bool = False,
    no_cache: bool = False,
    params_from_strings: bool = False,
    key: str | None = None,
) -> Started:
    """Find or create the run a (re-)run of ``wf`` should drive (DESIGN.md §4).

    With a launch ``key``, the first start records it with the run it settles on; a later
    start with the key and the same request (plan hash + params hash) returns that run,
    whatever ``new`` says, and one with another request is refused.

    Raises:
        UsageError: params are undeclared or invalid; ``key`` launched another request.
        RunLockHeld: the run to supersede is being driven.
    """
    if key is not None and not 0 < len(key) <= MAX_KEY_LENGTH:
        raise UsageError(
            f"expected a non-empty launch key of at most {MAX_KEY_LENGTH} characters "
            f"(got {len(key)})"
        )
    resolved = resolve_params(wf.plan, params, from_strings=params_from_strings)
    scope = scope_key(wf.name, resolved)
    if key is None:
        latest = store.latest_in_scope(scope)  # the common case (continue a run) writes nothing
        if latest is not None and not new and latest.plan_hash == wf.plan_hash:
            return _continue(latest, wf)
    row = new_run_row(wf, resolved, run_id=new_run_id(), scope=scope, use_cache=not no_cache)
    superseded: list[str] = []
    with contextlib.ExitStack() as held:

        def decide(current: RunRow | None) -> ScopeChoice:
            # Runs inside the insert's transaction: a start that won the race meanwhile is
            # seen here, so this one continues that run instead of inserting a second.
            if current is not None and not new and current.plan_hash == wf.plan_hash:
                return ScopeChoice(keep=current)
            old = current if current is not None and current.status in UNFINISHED else None
            if old is None:
                return ScopeChoice()
            held.enter_context(RunLock(store.lock_dir, old.run_id))  # refuses at once
            superseded[:] = [old.run_id]
            return ScopeChoice(supersede=old.run_id)

        def check_key(prior: LaunchKey) -> None:
            if (prior.plan_hash, prior.params_hash) != (row.plan_hash, row.params_hash):
                raise UsageError(
                    f"Launch key {prior.key!r} already launched run {prior.run_id} for request "
                    f"{request_hash(prior.plan_hash, prior.params_hash)}; this start is request "
                    f"{request_hash(row.plan_hash, row.params_hash)} (another plan or params). "
                    "Reuse a key only for the same workflow and params, or pass a new key.",
                    run_id=prior.run_id,
                )

        kept = store.start_in_scope(
            row, plan_steps(wf), decide=decide, launch_key=key, check_key=check_key
        )
    if kept.run_id != row.run_id:
        return _continue(kept, wf)
    return _created(bus, row, superseded=superseded[0] if superseded else None)


def request_hash(plan_hash: str, params_hash: str) -> str:
    """What a launch key promises: the sha256 of a start's plan hash and params hash."""
    return hash_value({"plan_hash": plan_hash, "params_hash": params_hash})


def fork(
    store: Store,
    bus: EventBus,
    source: RunRow,
    plan: Plan,
    params: dict[str, Any],
    *,
    from_step: str,
) -> Started:
    """A new run of ``source``'s frozen plan reusing every result before ``from_step``.

    Raises:
        UsageError: ``from_step`` is not a step of the plan.
        RunLockHeld: the unfinished source is being driven.
    """
    ids = [s.id for s in plan.steps]
    if from_step not in ids:
        raise UsageError(
            f"Run {source.run_id} has no step {from_step!r}; steps: {ids}", run_id=source.run_id
        )
    wf = Workflow(
        name=plan.name,
        source="",
        source_hash=source.source_hash,
        source_path=source.source_path,
        plan=plan,
        plan_json=source.plan_json,
        plan_hash=source.plan_hash,
    )
    row = new_run_row(
        wf,
        params,
        run_id=new_run_id(),
        scope=source.scope_key,
        use_cache=True,
        forked_from=source,
        fork_step=from_step,
    )
    return _create(store, bus, wf, row, supersede=source)


def _continue(run: RunRow, wf: Workflow) -> Started:
    """The scope's existing run of the same plan (``created=False``)."""
    warnings = []
    if run.source_hash != wf.source_hash:
        warnings.append(
            "the source changed only in ways that do not change the plan; "
            f"continuing run {run.run_id}"
        )
    return Started(run_id=run.run_id, created=False, warnings=warnings)


def _create(
    store: Store, bus: EventBus, wf: Workflow, row: RunRow, *, supersede: RunRow | None
) -> Started:
    """Insert ``row``; an unfinished ``supersede`` is abandoned in the same transaction,
    under its lock (a driven run is refused with RunLockHeld and nothing is half-written)."""
    old = supersede if supersede is not None and supersede.status in UNFINISHED else None
    lock = RunLock(store.lock_dir, old.run_id) if old else contextlib.nullcontext()
    with lock:
        store.create_run(row, plan_steps(wf), supersede=old.run_id if old else None)
    return _created(bus, row, superseded=old.run_id if old else None)


def _created(bus: EventBus, row: RunRow, *, superseded: str | None) -> Started:
    if superseded is None:
        return Started(run_id=row.run_id, created=True)
    reason = f"superseded by {row.run_id}"
    bus.notify("run_status", run_id=superseded, status="abandoned", reason=reason)
    warning = f"run {superseded} was unfinished and is now abandoned ({reason})"
    return Started(run_id=row.run_id, created=True, warnings=[warning])
