"""Run lifecycles: find or create a scope's run (superseding an unfinished one), fork a run,
and hand a drive the secret params its run stores only as seals."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .bus import EventBus
from .drive.runrows import new_run_id, new_run_row, plan_steps, scope_key
from .errors import PlanVersionTooNew, UsageError
from .hashing import hash_value
from .redact import is_secret_key
from .sealing import (
    Sealed,
    Sealer,
    env_name,
    has_secrets,
    is_seal,
    missing_secret,
    seals_of,
)
from .spec.models_resolve import preview_workflow, workflow_for_params
from .spec.params import coerce_param, normalise, resolve_params
from .spec.plan import Plan
from .spec.stored import version_problem
from .spec.workflow import Workflow
from .store import Store
from .store.cellstarts import CellStart
from .store.records import RunRow, ScopeChoice
from .store.runs import LaunchKey
from .users import current_user

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
    secrets: dict[str, Any] = field(default_factory=dict, repr=False)
    """Seal → value of the secret params of this start (for the drive; never stored)."""


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
    shared_plan: bool = False,
    cell: tuple[str, int] | None = None,
) -> Started:
    """Find or create the run a (re-)run of ``wf`` should drive (DESIGN.md §4).

    ``shared_plan``: a new run keeps its plan once per plan hash (``store/plans.py``), as a
    sweep's cells do. ``cell``: the (sweep id, cell index) a created run is recorded for, in
    its insert's transaction (a run continued as it is is not: its caller records it).

    With a launch ``key``, the first start records it with the run it settles on; a later
    start with the key and the same request (plan hash + params hash) returns that run,
    whatever ``new`` says, and one with another request is refused.

    Secret params (:mod:`wf_magic.sealing`) are stored, and scoped, by their seals; one not
    given is read from ``WF_PARAM_<NAME>`` when set. ``Started.secrets`` keeps the values.

    Only a run the current user may change (theirs, or nobody's) is continued or superseded:
    another user's run of the scope is left alone and this start creates the user's own.

    A ``model:`` templated from params is rendered here (``spec/models_resolve.py``): the run
    stores, and hashes, the plan of its own params, so the plan hash compared with the scope's
    latest run and promised to a launch key is that one.

    Raises:
        UsageError: params are undeclared or invalid, or render an unusable model; ``key``
            launched another request.
        RunLockHeld: the run to supersede is being driven.
    """
    if key is not None and not 0 < len(key) <= MAX_KEY_LENGTH:
        raise UsageError(
            f"expected a non-empty launch key of at most {MAX_KEY_LENGTH} characters "
            f"(got {len(key)})"
        )
    given = _with_secret_env(wf, params, os.environ)
    sealed = _sealed(store, resolve_params(wf.plan, given, from_strings=params_from_strings))
    wf = workflow_for_params(wf, sealed.params)
    started = _start(
        store,
        bus,
        wf,
        sealed.params,
        new=new,
        no_cache=no_cache,
        key=key,
        shared_plan=shared_plan,
        cell=cell,
    )
    started.secrets.update(sealed.vault)
    return started


def cell_starts(
    store: Store, wf: Workflow, cells: Sequence[tuple[int, Mapping[str, Any]]]
) -> list[CellStart]:
    """The fresh runs a batch of sweep cells ``(cell_index, params)`` would start, as
    :func:`start` makes them (params resolved, secrets sealed, models rendered), written by
    nobody yet: ``Store.start_cells`` inserts those whose scope has no run in one
    transaction, and a cell it leaves out takes :func:`start` (continue or supersede).

    Raises:
        UsageError: a cell's params are invalid, or render an unusable model.
    """
    out: list[CellStart] = []
    ids: set[str] = set()
    for index, params in cells:
        given = _with_secret_env(wf, params, os.environ)
        sealed = _sealed(store, resolve_params(wf.plan, given))
        cell_wf = workflow_for_params(wf, sealed.params)
        run_id = new_run_id()
        while run_id in ids:  # never within one process and second (new_run_id); a guard
            run_id = new_run_id()
        ids.add(run_id)
        scope = scope_key(cell_wf.name, sealed.params)
        row = new_run_row(cell_wf, sealed.params, run_id=run_id, scope=scope, use_cache=True)
        out.append(CellStart(index, row, plan_steps(cell_wf)))
    return out


def _start(
    store: Store,
    bus: EventBus,
    wf: Workflow,
    resolved: dict[str, Any],
    *,
    new: bool,
    no_cache: bool,
    key: str | None,
    shared_plan: bool = False,
    cell: tuple[str, int] | None = None,
) -> Started:
    """:func:`start` once the params are resolved and their secrets sealed."""
    scope = scope_key(wf.name, resolved)
    if key is None:
        # The common case (continue a run) writes nothing. Another user's run in the scope is
        # never continued or superseded: this user gets a run of their own beside it.
        latest = store.latest_in_scope(scope, owner=current_user())
        if latest is not None and not new and latest.plan_hash == wf.plan_hash:
            return _continue(latest, wf, no_cache=no_cache)
    row = new_run_row(wf, resolved, run_id=new_run_id(), scope=scope, use_cache=not no_cache)
    superseded: list[RunRow] = []
    with contextlib.ExitStack() as held:

        def decide(current: RunRow | None) -> ScopeChoice:
            # Runs inside the insert's transaction: a start that won the race meanwhile is
            # seen here, so this one continues that run instead of inserting a second.
            if current is not None and not new and current.plan_hash == wf.plan_hash:
                return ScopeChoice(keep=current)
            old = current if current is not None and current.status in UNFINISHED else None
            if old is None:
                return ScopeChoice()
            _refuse_newer(old)
            held.enter_context(store.run_lock(old.run_id))  # refuses at once
            superseded[:] = [old]
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
            row,
            plan_steps(wf),
            decide=decide,
            launch_key=key,
            check_key=check_key,
            shared_plan=shared_plan,
            cell=cell,
        )
    if kept.run_id != row.run_id:
        return _continue(kept, wf, no_cache=no_cache)
    return _created(bus, row, superseded=superseded[0] if superseded else None)


def preview(
    wf: Workflow, *, params: Mapping[str, Any] | None, params_from_strings: bool = False
) -> Workflow:
    """``wf`` as a start with ``params`` would freeze it (dry runs), writing nothing.

    Templated models are rendered when the params resolve; without params given, a workflow
    whose params do not resolve (a required one) is shown as frozen, its templates pending.
    Secret values are never rendered: a template reading one is refused, as at a start.

    Raises:
        UsageError: given params are invalid, or render an unusable model.
    """
    return preview_workflow(wf, params, from_strings=params_from_strings)


def _refuse_newer(old: RunRow) -> None:
    """A run frozen by a newer wf_magic is never superseded here: its row stays as it is."""
    version = version_problem(old)
    if version is not None and version.is_newer:
        raise PlanVersionTooNew(
            f"Run {old.run_id} of this scope was {version.text}, or `wf abandon {old.run_id}` "
            "and run again. Nothing was changed.",
            run_id=old.run_id,
        )


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
    # One unfinished run per scope and user: the fork supersedes its source when that is
    # unfinished, else the scope's unfinished run (an earlier fork of a superseded source).
    supersede = source
    if source.status not in UNFINISHED and source.parent_run_id is None:
        latest = store.latest_in_scope(source.scope_key, owner=current_user())
        if latest is not None and latest.status in UNFINISHED:
            supersede = latest
    return _create(store, bus, wf, row, supersede=supersede)


def _continue(run: RunRow, wf: Workflow, *, no_cache: bool = False) -> Started:
    """The scope's existing run of the same plan (``created=False``).

    ``--no-cache`` cannot change a run that exists: it is said, with the way to re-run.
    """
    warnings = []
    if no_cache and run.use_cache:
        shown = "the completed run is shown" if run.status == "completed" else "continuing it"
        warnings.append(
            f"--no-cache applies to new runs only: run {run.run_id} of this cell already "
            f"exists ({run.status}); {shown}. Pass --new --no-cache to re-run it without reuse."
        )
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
    lock = store.run_lock(old.run_id) if old else contextlib.nullcontext()
    with lock:
        store.create_run(row, plan_steps(wf), supersede=old.run_id if old else None)
    return _created(bus, row, superseded=old)


def _created(bus: EventBus, row: RunRow, *, superseded: RunRow | None) -> Started:
    if superseded is None:
        return Started(run_id=row.run_id, created=True)
    if superseded.status == "failed":
        # Its failure stays visible: the run keeps its status and reason (store/runs.py).
        warning = (
            f"run {superseded.run_id} failed earlier ({superseded.status_reason or 'no reason'});"
            f" it stays failed, superseded by {row.run_id}"
        )
        return Started(run_id=row.run_id, created=True, warnings=[warning])
    reason = f"superseded by {row.run_id}"
    bus.notify("run_status", run_id=superseded.run_id, status="abandoned", reason=reason)
    warning = f"run {superseded.run_id} was unfinished and is now abandoned ({reason})"
    return Started(run_id=row.run_id, created=True, warnings=[warning])


# -- secret params: sealed at rest, handed back by the caller to every drive ----------------
def drive_secrets(
    store: Store,
    run: RunRow,
    *,
    given: Mapping[str, Any] | None,
    known: Mapping[str, Any],
    from_strings: bool = False,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Seal → value of the secret params of ``run`` for a drive (empty when it has none).

    A run stores its secret params only as seals (:mod:`wf_magic.sealing`), so each one is
    taken, in order, from ``given`` (``--param`` / ``params=``), from ``known`` (values this
    engine saw at the start) or from the environment (``WF_PARAM_<NAME>``), and checked
    against its seal. A given non-secret param must equal the run's own.

    Raises:
        UsageError: a secret param is missing, differs from the value the run started with,
            or the state dir's key file is gone; a given param the run does not have or
            whose value differs.
    """
    stored: dict[str, Any] = json.loads(run.params_json)
    given = dict(given or {})
    env = os.environ if environ is None else environ
    _check_plain_params(run, stored, given, from_strings=from_strings)
    vault: dict[str, Any] = {}
    schemas: dict[str, Any] | None = None
    for name, value in stored.items():
        seals = seals_of(value, name=name)
        if not seals:
            continue
        if name not in given and all(s in known for s in seals):
            vault.update((s, known[s]) for s in seals)
            continue
        text = given.get(name, env.get(env_name(name)))
        if text is None:
            raise missing_secret(run.run_id, name)
        if isinstance(text, str) and (from_strings or name not in given):
            schemas = schemas if schemas is not None else _param_schemas(run)
            text = coerce_param(schemas.get(name, {}), text, name=name)
        whole = (name,) if is_seal(value) and not is_secret_key(name) else ()
        sealed = _sealed(store, {name: normalise(text)}, run_id=run.run_id, whole=whole)
        if sealed.params[name] != value:
            raise UsageError(
                f"Run {run.run_id}: the secret param {name!r} differs from the value the run "
                "started with (its keyed hash does not match). Pass the original value, or "
                f"start a new run for the new one (`wf run FILE --new --param {name}=...`).",
                run_id=run.run_id,
            )
        vault.update(sealed.vault)
    return vault


def _sealed(
    store: Store, params: dict[str, Any], *, run_id: str | None = None, whole: tuple[str, ...] = ()
) -> Sealed:
    """``params`` with their secret values (and the params in ``whole``) sealed under the
    state dir's key.

    A new run (no ``run_id``) creates the key when missing; a run's check needs its own.
    """
    if not whole and not has_secrets(params):
        return Sealed(params=params, vault={})
    state_dir = store.state_dir
    sealer = Sealer.ensure(state_dir) if run_id is None else Sealer.existing(state_dir)
    if sealer is None:
        raise UsageError(
            f"Run {run_id}: its secret params were sealed with {store.state_dir}/"
            "secret.key, which is gone, so no value can be checked against them. Restore the "
            "file, or start a new run (`wf run FILE --new`).",
            run_id=run_id,
        )
    return sealer.seal_params(params, whole=whole)


def _with_secret_env(
    wf: Workflow, params: Mapping[str, Any] | None, environ: Mapping[str, str]
) -> dict[str, Any]:
    """``params`` plus each secret param not given, from ``WF_PARAM_<NAME>`` when set."""
    out = dict(params or {})
    for name, schema in wf.plan.params.items():
        text = environ.get(env_name(name))
        if name not in out and text is not None and is_secret_key(name):
            out[name] = coerce_param(schema, text, name=name)
    return out


def _check_plain_params(
    run: RunRow, stored: dict[str, Any], given: dict[str, Any], *, from_strings: bool
) -> None:
    """A param handed to a drive must be one of the run's, and a non-secret one its value."""
    schemas: dict[str, Any] | None = None
    for name, value in given.items():
        if name not in stored:
            raise UsageError(
                f"Run {run.run_id} has no param {name!r}; its params: {sorted(stored) or 'none'}",
                run_id=run.run_id,
            )
        if seals_of(stored[name], name=name):
            continue
        if from_strings and isinstance(value, str):
            schemas = schemas if schemas is not None else _param_schemas(run)
            value = coerce_param(schemas.get(name, {}), value, name=name)
        if normalise(value) != stored[name]:
            raise UsageError(
                f"Run {run.run_id} started with another value of param {name!r}; a run's "
                "params are fixed. Start a new run for other params.",
                run_id=run.run_id,
            )


def _param_schemas(run: RunRow) -> dict[str, Any]:
    """The param schemas of ``run``'s frozen plan (read only when a value needs coercing)."""
    return dict(json.loads(run.plan_json).get("params") or {})
