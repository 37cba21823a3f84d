"""The Engine's sweep verbs (a mixin): start or resume a sweep, a handle on one, the list."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bus import EventBus
from ..errors import CONCURRENCY_MAX, UsageError, WorkflowError, check_counts, check_mapping
from ..redact import Redactor
from ..store import Store
from ..store.location import PgLocation
from ..store.sweeps import SweepRow

if TYPE_CHECKING:
    import pandas as pd

    from ..spec.workflow import Workflow
    from .driver import SweepDrive
    from .handle import Sweep

_AMBIGUOUS_SHOWN = 8


class SweepVerbs:
    """``Engine.sweep`` and friends; the Engine provides the attributes declared here."""

    store: Store
    bus: EventBus
    redactor: Redactor
    namespace: Mapping[str, Any] | None
    max_concurrency: int | None
    executor: Executor | None
    db_path: Path
    where: str
    location: PgLocation | None
    state_dir: Path
    durability: str
    library: dict[str, str]

    _secrets: dict[str, Any]

    def load(self, source: str | Path, *, source_name: str | None = None) -> Workflow:
        raise NotImplementedError

    def _know(self, secrets: Mapping[str, Any]) -> None:
        raise NotImplementedError

    # -- sweeps -----------------------------------------------------------------------------
    def sweep(
        self,
        source: Workflow | str | Path,
        *,
        grid: Mapping[str, Sequence[Any]] | None = None,
        rows: Any = None,
        repeat: int = 1,
        budget: Mapping[str, Any] | None = None,
        max_concurrency: int | None = None,
        key: str | None = None,
        signal: threading.Event | None = None,
        progress: Callable[[int, int], None] | None = None,
        values_from_strings: bool = False,
        params: Mapping[str, Any] | None = None,
        background: bool = False,
        workers: int | None = None,
    ) -> Sweep:
        """Run ``source`` over every cell of ``grid`` × ``rows`` × ``repeat``, under one
        ``budget`` (``max_units`` / ``max_tokens`` / ``max_cost``) over the whole sweep.

        ``background=True`` returns at once with a
        :class:`~wf_magic.sweeps.background.BackgroundSweep` (``running``, ``wait()``,
        ``stop()``) whose cells are driven on a thread of their own.

        ``params`` are the same in every cell (a secret param's value, an API key, goes
        here or in ``WF_PARAM_<NAME>``: it is stored only as its seal, never as an axis).

        ``workers=N`` (default ``$WF_MAGIC_SWEEP_WORKERS``, else 1) spreads the cells over N
        processes, this one included, ``max_concurrency`` split between them; the budget
        stays exact across them (see :mod:`wf_magic.sweeps.workers`).

        The same definition again resumes (or shows) its sweep; a changed one is a new sweep
        whose unchanged cells find their completed runs. See docs/sweeps.md.

        Raises:
            UsageError: an axis or row column is not a declared param or is a secret one, a
                cell's params are invalid, a bad budget or repeat, or ``key`` launched
                another definition.
            DefinitionError: the source is invalid.
        """
        from ..spec.workflow import Workflow
        from .driver import open_sweep
        from .expand import definition
        from .secrets import fixed_params

        check_counts(max_concurrency=(max_concurrency, 1, CONCURRENCY_MAX))
        check_mapping(params, what="sweep params")
        check_mapping(grid, what="sweep grid")
        wf = source if isinstance(source, Workflow) else self.load(source)
        spread = self._workers(wf, workers)
        fixed = fixed_params(
            self.store.state_dir, wf.plan, params, from_strings=values_from_strings
        )
        self._know(fixed.vault)
        spec = definition(
            wf.plan,
            grid=grid,
            rows=rows,
            repeat=repeat,
            from_strings=values_from_strings,
            params=fixed.params,
        )
        row = open_sweep(self.store, wf, spec, budget=budget, key=key, secrets=fixed.vault)
        return self._drive_sweep(
            row.sweep_id,
            wf,
            max_concurrency,
            signal,
            progress,
            secrets=fixed.vault,
            background=background,
            workers=spread,
        )

    def sweep_resume(
        self,
        sweep_id: str,
        *,
        budget: Mapping[str, Any] | None = None,
        max_concurrency: int | None = None,
        signal: threading.Event | None = None,
        progress: Callable[[int, int], None] | None = None,
        params: Mapping[str, Any] | None = None,
        params_from_strings: bool = False,
        background: bool = False,
        workers: int | None = None,
        share: tuple[int, int] | None = None,
    ) -> Sweep:
        """Drive a sweep's owed cells again; ``budget`` sets new ceilings (the keys given
        replace the stored ones), else the stored ones hold. ``workers`` as for
        :meth:`sweep`; ``share=(k, n)`` drives only the cells whose index is ``k`` modulo
        ``n`` and leaves the sweep's status to whoever drives the rest (what a worker
        process does).

        The sweep's secret params are stored only as seals, so their values come from
        ``params`` (checked against the seals), from this engine if it started the sweep, from
        ``WF_PARAM_<NAME>``, or from the param's default, as for a run's resume.

        Raises:
            UsageError: no such sweep, a bad budget, or a secret param missing or differing
                from the sweep's.
        """
        import json

        from .driver import reopen_sweep
        from .secrets import resupplied

        check_counts(max_concurrency=(max_concurrency, 1, CONCURRENCY_MAX))
        row = reopen_sweep(self.store, self.sweep_handle(sweep_id).sweep_id, budget=budget)
        wf = self._stored_workflow(row)
        if wf.plan_hash != row.plan_hash:
            raise UsageError(
                f"sweep {row.sweep_id}: its stored source now freezes into another plan "
                "(a python target or library workflow changed); start a new sweep instead"
            )
        spread = 1 if share is not None else self._workers(wf, workers)
        secrets = resupplied(
            self.store.state_dir,
            row.sweep_id,
            wf.plan,
            json.loads(row.definition_json).get("params") or {},
            given=params,
            known=self._secrets,
            from_strings=params_from_strings,
        )
        self._know(secrets)
        return self._drive_sweep(
            row.sweep_id,
            wf,
            max_concurrency,
            signal,
            progress,
            secrets=secrets,
            background=background,
            workers=spread,
            share=share,
        )

    def _stored_workflow(self, row: SweepRow) -> Workflow:
        """The sweep's workflow as a resume freezes it: from the file it was started from
        while that file still holds the stored source (its ``models.yaml`` and its path
        recorded on new cells' runs, as ``wf sweep`` did), else from the stored text."""
        from .driver import source_path_of

        path = source_path_of(row)
        if path is not None and "://" not in path:
            try:
                wf = self.load(Path(path))
            except WorkflowError:  # moved, unreadable, or edited into something invalid
                pass
            else:
                if wf.source == row.source:
                    return wf
        return self.load(row.source, source_name=row.workflow)

    def _drive_sweep(
        self,
        sweep_id: str,
        wf: Workflow,
        max_concurrency: int | None,
        signal: threading.Event | None,
        progress: Callable[[int, int], None] | None,
        *,
        secrets: Mapping[str, Any],
        background: bool = False,
        workers: int = 1,
        share: tuple[int, int] | None = None,
    ) -> Sweep:
        from .driver import SweepDrive, drive_cells, drive_sweep, sweep_row
        from .handle import Sweep

        if background and signal is None:
            signal = threading.Event()  # what the handle's stop() sets
        ctx = SweepDrive(
            store=self.store,
            bus=self.bus,
            redactor=self.redactor,
            namespace=self.namespace,
            max_concurrency=max_concurrency or self.max_concurrency or 1,
            executor=self.executor,
            signal=signal,
            progress=progress,
            secrets=dict(secrets),
            share=share or (0, 1),
        )

        def drive() -> list[str]:
            row = sweep_row(self.store, sweep_id)
            if share is not None:
                drive_cells(ctx, row, wf)  # a worker's share: the sweep's driver settles it
            elif workers > 1:
                self._drive_spread(ctx, row, wf, workers)
            else:
                drive_sweep(ctx, row, wf)
            return list(ctx.skipped)

        if background and signal is not None:
            from .background import BackgroundSweep

            return BackgroundSweep(self.store, sweep_id, drive=drive, signal=signal)
        drive()
        return Sweep(self.store, sweep_id, skipped=ctx.skipped)

    def _workers(self, wf: Workflow, workers: int | None) -> int:
        """How many processes drive ``wf``'s sweep: ``workers``, else the environment's
        default; refused when another process could not drive its cells."""
        from .workers import check_workers, default_workers, refuse_unspreadable

        count = default_workers() if workers is None else check_workers(workers)
        if count > 1:
            refuse_unspreadable(wf, has_executor=self.executor is not None)
        return count

    def _drive_spread(self, ctx: SweepDrive, row: SweepRow, wf: Workflow, workers: int) -> None:
        import os

        from .driver import source_path_of
        from .workers import WorkerOrder, drive_spread, secret_params, state_of

        path = source_path_of(row)
        order = WorkerOrder(
            sweep_id=row.sweep_id,
            share=0,
            shares=workers,
            max_concurrency=ctx.max_concurrency,
            state=state_of(self.location, self.state_dir),
            durability=self.durability,
            library=dict(self.library),
            params=secret_params(row, ctx.secrets),
            import_dirs=[]
            if path is None or "://" in path
            else [os.path.dirname(os.path.realpath(path))],
        )
        drive_spread(ctx, row, wf, workers=workers, order=order)

    def sweep_handle(self, sweep_id: str) -> Sweep:
        """A handle on a sweep by id (or a unique prefix of one).

        Raises:
            UsageError: no sweep matches, or the prefix is ambiguous.
        """
        from .handle import Sweep

        if self.store.get_sweep(sweep_id) is None:
            near = self.store.find_sweep_prefix(sweep_id, limit=_AMBIGUOUS_SHOWN + 1)
            if len(near) != 1:
                hint = f" It matches {', '.join(near)}." if near else " `wf sweeps` lists them."
                raise UsageError(f"No sweep {sweep_id!r} in {self.where}.{hint}")
            sweep_id = near[0]
        return Sweep(self.store, sweep_id)

    def sweeps(self) -> pd.DataFrame:
        """One row per sweep: id, workflow, status, reason, cells, budget, created_at."""
        from .handle import sweeps_frame

        return sweeps_frame(self.store)
