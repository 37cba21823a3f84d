"""Opens a sweep (its definition and cells stored once) and drives its owed cells under one
shared budget, at most ``max_concurrency`` cells at a time, each under its run's lock."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import lifecycle
from ..bus import EventBus
from ..drive.budget import SharedBudget
from ..drive.context import DriveOptions, RunnerPool
from ..drive.executors import UnitSlots, thread_executor
from ..drive.root import FreshRun, drive_locked_run
from ..errors import COUNT_MAX, RunLockHeld, UsageError
from ..hashing import canonical_json
from ..redact import Redactor
from ..sealing import unseal
from ..spec.workflow import Workflow
from ..store import Store
from ..store.sweeps import CellSpec, SweepCellRow, SweepRow, SweepStatus
from .expand import Definition, expand, sweep_identity
from .starts import CellStarts

CEILINGS = ("max_units", "max_tokens", "max_cost")
"""The sweep budget's keys (the same words as a workflow's ``budget:``)."""
SETTLED = ("completed", "abandoned")
"""Run statuses after which a cell is owed nothing."""


@dataclass(slots=True, kw_only=True)
class SweepDrive:
    """What driving a sweep needs from the facade (never the Engine itself)."""

    store: Store
    bus: EventBus
    redactor: Redactor
    namespace: Mapping[str, Any] | None
    max_concurrency: int = 1
    executor: Executor | None = None
    signal: threading.Event | None = None
    progress: Callable[[int, int], None] | None = None
    """Called with (cells settled, cells) as cells settle (terminal progress)."""
    skipped: list[str] = field(default_factory=list)
    """One line per cell skipped because its run was driven elsewhere."""
    secrets: dict[str, Any] = field(default_factory=dict, repr=False)
    """Seal → value of the sweep's secret params (kept in memory only; every cell's drive
    gets them, as a run's drive gets its own)."""
    share: tuple[int, int] = (0, 1)
    """``(k, n)``: drive only the cells whose index is ``k`` modulo ``n`` (one worker's share of
    a sweep spread over ``n`` processes; ``(0, 1)``: every cell)."""


def check_budget(budget: Mapping[str, Any] | None) -> dict[str, Any]:
    """A sweep budget as a dict of known ceilings.

    Raises:
        UsageError: an unknown key or a value that is not a number >= 0.
    """
    import math

    if budget is not None and not isinstance(budget, Mapping):
        raise UsageError(
            f"sweep budget: expected a mapping such as {{'max_units': 40}} (got {budget!r:.60})"
        )
    out: dict[str, Any] = {}
    for name, value in (budget or {}).items():
        if name not in CEILINGS:
            raise UsageError(f"sweep budget: unknown ceiling {name!r}; expected one of {CEILINGS}")
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise UsageError(f"sweep budget {name}: expected a number >= 0 (got {value!r})")
        if name != "max_cost" and not float(value).is_integer():
            raise UsageError(f"sweep budget {name}: expected an integer (got {value!r})")
        if name != "max_cost" and value > COUNT_MAX:
            raise UsageError(f"sweep budget {name}: expected at most {COUNT_MAX} (got {value!r})")
        out[name] = value if name == "max_cost" else int(value)
    return out


def open_sweep(
    store: Store,
    wf: Workflow,
    spec: Definition,
    *,
    budget: Mapping[str, Any] | None,
    key: str | None,
    secrets: Mapping[str, Any] | None = None,
) -> SweepRow:
    """The sweep of this definition: found (its ceilings replaced when ``budget`` is given) or
    created with all its cells in one transaction.

    Raises:
        UsageError: a cell's params are invalid, or ``key`` launched another definition.
    """
    sweep_id, digest = sweep_identity(wf.plan_hash, spec)
    if key is not None:
        prior = store.sweep_by_key(key)
        if prior is not None and prior.sweep_id != sweep_id:
            raise UsageError(
                f"sweep key {key!r} launched sweep {prior.sweep_id}, of another definition; "
                "use another key, or `wf sweep-resume "
                f"{prior.sweep_id}` to continue that one"
            )
    ceilings = check_budget(budget)
    found = store.get_sweep(sweep_id)
    if found is not None:
        if budget is not None:
            store.set_sweep_status(sweep_id, "running", None, budget_json=canonical_json(ceilings))
            found = sweep_row(store, sweep_id)
        return found
    cells = expand(wf.plan, spec, secrets=secrets)
    now = time.time()
    row = SweepRow(
        sweep_id=sweep_id,
        workflow=wf.name,
        source=wf.source,
        plan_json=wf.plan_json,
        plan_hash=wf.plan_hash,
        definition_json=_stored_definition(spec, wf.source_path),
        definition_hash=digest,
        budget_json=canonical_json(ceilings),
        sweep_key=key,
        status="running",
        status_reason=None,
        cells=len(cells),
        created_at=now,
        updated_at=now,
    )
    store.create_sweep(
        row,
        [
            CellSpec(
                cell_index=c.index,
                point_json=canonical_json(c.point),
                row_index=c.row_index,
                repeat=c.repeat,
                params_json=canonical_json(c.params),
            )
            for c in cells
        ],
    )
    return sweep_row(store, sweep_id)  # another `wf sweep` of this definition may have won


def _stored_definition(spec: Definition, source_path: str | None) -> str:
    """The definition as stored: with the workflow file it came from, when there is one (not
    part of the sweep's identity; a resume imports its python steps' modules from its folder)."""
    stored = json.loads(spec.as_json())
    if source_path is not None:
        stored["source_path"] = source_path
    return canonical_json(stored)


def source_path_of(sweep: SweepRow) -> str | None:
    """The workflow file ``sweep`` was started from (None: a text source, a notebook cell)."""
    path = json.loads(sweep.definition_json).get("source_path")
    return path if isinstance(path, str) and path else None


def reopen_sweep(store: Store, sweep_id: str, *, budget: Mapping[str, Any] | None) -> SweepRow:
    """The sweep to resume, its ceilings updated by ``budget`` (the keys given replace the
    stored ones; the others hold).

    Raises:
        UsageError: no such sweep, or a bad budget.
    """
    row = sweep_row(store, sweep_id)
    if budget:
        ceilings = {**json.loads(row.budget_json), **check_budget(budget)}
        store.set_sweep_status(sweep_id, "running", None, budget_json=canonical_json(ceilings))
        row = sweep_row(store, sweep_id)
    return row


def seed_shared_budget(store: Store, sweep: SweepRow) -> SharedBudget:
    """The sweep's ceilings and what it already paid (its own charged attempts)."""
    ceilings = json.loads(sweep.budget_json)
    units, tokens, cost = store.sweep_usage(sweep.sweep_id)
    return SharedBudget(**ceilings, units=units, tokens=tokens, cost=cost)


def drive_sweep(ctx: SweepDrive, sweep: SweepRow, wf: Workflow) -> SweepRow:
    """Drive every owed cell of ``sweep``; returns its row with the status it settled on.

    A cell's run is recorded before it is driven, so a killed sweep finds it again; a run
    another process drives is skipped (and listed in ``ctx.skipped``), never raced.
    """
    shared = drive_cells(ctx, sweep, wf)
    interrupted = ctx.signal is not None and ctx.signal.is_set()
    return settle_sweep(ctx.store, sweep, shared, interrupted=interrupted)


def owed_cells(
    store: Store, sweep_id: str, share: tuple[int, int] = (0, 1)
) -> tuple[list[SweepCellRow], list[SweepCellRow]]:
    """(the sweep's cells of this share, those of them still owed something: a run to
    finish, or a completed run's failed score units to measure again). A cell whose run `wf
    gc` deleted is owed nothing: its result was had and paid (the sweep still counts what it
    paid), and deleting it is no order to pay for it again."""
    k, n = share
    cells = [c for c in store.sweep_cells(sweep_id) if c.cell_index % n == k]
    rescores = store.sweep_rescores(sweep_id)
    return cells, [
        c
        for c in cells
        if c.status != "deleted" and (c.run_status not in SETTLED or c.run_id in rescores)
    ]


def drive_cells(ctx: SweepDrive, sweep: SweepRow, wf: Workflow) -> SharedBudget:
    """Drive the owed cells of ``ctx.share`` (the sweep's status is left to the caller);
    returns the budget this drive counted."""
    shared = seed_shared_budget(ctx.store, sweep)
    cells, owed = owed_cells(ctx.store, sweep.sweep_id, ctx.share)
    settled = [len(cells) - len(owed)]
    lock = threading.Lock()
    pool = ctx.executor or (
        thread_executor(ctx.max_concurrency) if ctx.max_concurrency > 1 else None
    )
    options = DriveOptions(
        signal=ctx.signal,
        max_concurrency=ctx.max_concurrency,
        executor=pool,
        shared_budget=shared,
        secrets=dict(ctx.secrets),
        # One count of units in flight for every cell: the cap is the sweep's, not each cell's.
        unit_slots=UnitSlots(ctx.max_concurrency),
        payer=sweep.sweep_id,
        # The cells' threads are the pool's bound already: a cell's lone unit runs on its own
        # cell's thread. A caller's executor (a Dask cluster) still runs every unit.
        lone_units_inline=ctx.executor is None,
    )
    # One runner pool for every cell: the cells share a plan, so one runner (one HTTP client
    # and its connections) serves them all, as it serves the units of one map.
    runners = RunnerPool(
        state_dir=ctx.store.state_dir, namespace=ctx.namespace, journal=ctx.store.journal_url
    )

    starts = CellStarts(ctx.store, sweep, wf, owed, shared, secrets=ctx.secrets)

    def one(cell: SweepCellRow) -> None:
        if shared.reached or (ctx.signal is not None and ctx.signal.is_set()):
            return
        _drive_cell(ctx, sweep, wf, cell, options, runners, starts.fresh_run(cell))
        with lock:
            settled[0] += 1
            if ctx.progress is not None:
                ctx.progress(settled[0], len(cells))

    try:
        if ctx.max_concurrency > 1 and len(owed) > 1:
            with ThreadPoolExecutor(
                ctx.max_concurrency, thread_name_prefix="wf-cell"
            ) as cells_pool:
                for future in [cells_pool.submit(one, c) for c in owed]:
                    future.result()
        else:
            for cell in owed:
                one(cell)
    finally:
        if pool is not None and pool is not ctx.executor:
            pool.shutdown(wait=True)
        runners.close()
        try:
            starts.take_back()  # the runs of cells never driven, and their locks, whatever ended
        finally:
            ctx.store.flush()  # the last cells' writes, and so their locks
    return shared


def _drive_cell(
    ctx: SweepDrive,
    sweep: SweepRow,
    wf: Workflow,
    cell: SweepCellRow,
    options: DriveOptions,
    runners: RunnerPool,
    fresh: FreshRun | None = None,
) -> None:
    run_id, status = cell.run_id, cell.run_status
    if fresh is not None:
        run_id, status = fresh.run.run_id, "active"
    elif run_id is None:
        # A cell stores its secret params as seals: its run starts from the values (and seals
        # them again, to the same seals, under the state dir's key).
        params = unseal(json.loads(cell.params_json), ctx.secrets, run_id=sweep.sweep_id)
        started = lifecycle.start(
            ctx.store,
            ctx.bus,
            wf,
            params=params,
            shared_plan=True,
            cell=(sweep.sweep_id, cell.cell_index),
        )
        run_id = started.run_id
        if not started.created:  # the scope's run already: a changed sweep's unchanged cell
            ctx.store.set_cell_run(sweep.sweep_id, cell.cell_index, run_id)
            row = ctx.store.get_run(run_id)
            status = None if row is None else row.status
        else:
            status = "active"
    # The lock is taken only for a run that may owe work (the drive reads the row again). A
    # cell whose run was completed when it was listed owes failed score units (owed_cells):
    # its drive measures them again.
    rescore = fresh is None and cell.run_status == "completed" and run_id == cell.run_id
    if status is None or (status in SETTLED and not rescore) or status == "blocked":
        return
    try:
        drive_locked_run(
            ctx.store,
            ctx.bus,
            run_id,
            options=options,
            redactor=ctx.redactor,
            namespace=ctx.namespace,
            runners=runners,
            # The cell's last writes go with the next cell's reservation (its lock held
            # until then): one transaction a cell.
            carry=True,
            fresh=fresh,
        )
    except RunLockHeld as exc:
        note = f"skipped: {exc}"
        ctx.skipped.append(f"cell {cell.cell_index} ({run_id}) {note}")
        ctx.store.set_cell_run(sweep.sweep_id, cell.cell_index, run_id, note=note)


def settle_sweep(
    store: Store, sweep: SweepRow, shared: SharedBudget, *, interrupted: bool = False
) -> SweepRow:
    """Write the status the sweep's cells add up to, and return its row.

    ``interrupted``: the drive's stop signal was set (an interrupt, a stop): with cells owed
    the sweep is ``stopped``, its reason ``interrupted; …`` (resumable like a budget stop).
    """
    cells = store.sweep_cells(sweep.sweep_id)
    status: SweepStatus
    # A cell whose run gc deleted was done (its reason, shown with the status, says so).
    done = sum(c.run_status == "completed" or c.status == "deleted" for c in cells)
    reached = None if shared.reached is None else _reached(store, sweep.sweep_id, shared)
    if done == len(cells):
        status, reason = "completed", None
        rescores = store.sweep_rescores(sweep.sweep_id)
        if rescores:
            reason = (
                f"{len(rescores)} cell(s) hold a score that failed (NaN in the frame); "
                f"`wf sweep-resume {sweep.sweep_id}` measures them again"
            )
    elif reached is not None:
        ceiling, used, limit = reached
        status = "stopped"
        reason = (
            f"sweep budget {ceiling} reached (used {used:g} of {limit:g}); "
            f"{len(cells) - done} cell(s) owed; `wf sweep-resume {sweep.sweep_id} "
            f"--{ceiling.replace('_', '-')} N` sets a new ceiling"
        )
    else:
        bad = [c for c in cells if c.run_status in ("failed", "blocked", "abandoned")]
        owed = len(cells) - done - len(bad)
        if owed and interrupted:
            status = "stopped"
            reason = (
                f"interrupted; {owed} cell(s) owed; `wf sweep-resume {sweep.sweep_id}` continues"
            )
        elif owed:
            status, reason = "running", f"{owed} cell(s) owed; `wf sweep-resume {sweep.sweep_id}`"
        else:
            status = "failed"
            reason = (
                f"{len(bad)} cell(s) failed, blocked or abandoned (first: cell {bad[0].cell_index})"
            )
    store.set_sweep_status(sweep.sweep_id, status, reason)
    return sweep_row(store, sweep.sweep_id)


def _reached(store: Store, sweep_id: str, shared: SharedBudget) -> tuple[str, float, float] | None:
    """(ceiling, used, limit) of the ceiling that stopped the sweep, counted from what every
    driver of it paid (the journal), not only this one."""
    row = store.get_sweep(sweep_id)
    ceilings = json.loads(row.budget_json) if row is not None else {}
    units, tokens, cost = store.sweep_usage(sweep_id)
    for ceiling, used in (("max_units", units), ("max_tokens", tokens), ("max_cost", cost)):
        limit = ceilings.get(ceiling)
        if limit is not None and used >= limit:
            return ceiling, used, limit
    if shared.reached in CEILINGS:  # this drive's own count (a ceiling lowered meanwhile)
        name = shared.reached
        own = {"max_units": shared.units, "max_tokens": shared.tokens, "max_cost": shared.cost}
        return name, own[name], getattr(shared, name)
    return None


def sweep_row(store: Store, sweep_id: str) -> SweepRow:
    """The row of ``sweep_id``.

    Raises:
        UsageError: no such sweep (deleted under this drive, or a mistyped id).
    """
    row = store.get_sweep(sweep_id)
    if row is None:
        raise UsageError(f"No sweep {sweep_id!r} in {store.where}; `wf sweeps` lists them.")
    return row
