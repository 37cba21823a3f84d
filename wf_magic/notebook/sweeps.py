"""``%%sweep``: runs ``Engine.sweep`` over the cell's YAML; the cell's value is the ``Sweep``.
In a kernel its grid is static HTML that stays in the saved notebook and follows the sweep while
the kernel lives (``SweepOutput``: a ``wf sweep-resume`` elsewhere repaints it).

``--background`` drives it on a thread of the kernel (``Engine.sweep(background=True)``): the
cell returns at once, the live grid follows the cells while later cells run, and
``%sweep stop`` (or the handle's ``stop()``) stops it gracefully; ``SweepDrives`` holds this
kernel's background sweeps, so a cell never starts a second driver of one of them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..arg_values import parse_params
from ..errors import UsageError
from ..sweep_cli import parse_grid
from ..sweeps.background import BackgroundSweep
from ..sweeps.handle import Sweep

log = logging.getLogger("wf_magic")

if TYPE_CHECKING:
    from ..spec.workflow import Workflow
    from .context import CommandContext
    from .sweepfollow import FollowedSweep
    from .sweepview import SweepGridView


def sweep_rows(value: str | None, user_ns: Mapping[str, Any]) -> Any:
    """``--rows``: a notebook variable (a DataFrame or a list of dicts), else a file path."""
    if value is None:
        return None
    if value.isidentifier() and value in user_ns:
        return user_ns[value]
    return value


def run_sweep_cell(
    ctx: CommandContext, ns: argparse.Namespace, source: str, *, drives: SweepDrives
) -> Sweep:
    """Freeze the cell's workflow, run the sweep, bind ``--as``; the handle shows the grid.

    An interrupt (the kernel's, a ``KeyboardInterrupt`` in the main thread) stops the sweep
    gracefully: no new cell or unit is dispatched, the units in flight finish, the sweep
    settles ``stopped`` (reason ``interrupted; …``) and one line says so; a second interrupt
    stops waiting (the sweep still winds down on its thread). Under ``--background`` the cell
    waits only for the sweep to open; later interrupts land in later cells, not the sweep.

    A sweep of this definition that ``drives`` still drives in the background is not driven
    a second time: one line says so and the cell follows that drive.

    Raises:
        UsageError: the cell is empty, a bad ``--grid``, or what ``Engine.sweep`` refuses.
    """
    from .commands import load_cell

    if not source.strip():
        raise UsageError("the cell is empty: write the workflow YAML under %%sweep")
    if ns.as_var is not None and not ns.as_var.isidentifier():
        raise UsageError(f"--as expects a Python variable name (got {ns.as_var!r})")
    wf = load_cell(ctx, source, None)
    budget = {
        k: getattr(ns, k)
        for k in ("max_tokens", "max_cost", "max_units")
        if getattr(ns, k) is not None
    }
    grid, rows = parse_grid(ns.grid or ()), sweep_rows(ns.rows, ctx.user_ns)
    # Params every cell shares, as %%workflow takes them: a secret one is sealed, never an axis.
    params = _shared_params(ns, ctx.user_ns)
    # Its id (the rows read once more) only for a live grid or a background drive to find.
    needed = ctx.use_widgets or bool(drives.running())
    sweep_id = _sweep_id(ctx, wf, grid, rows, ns.repeat, params) if needed else None
    running = drives.driving(sweep_id) if sweep_id is not None else None
    if running is not None:
        sweep = _followed(ctx, running)
    else:
        sweep = _driven(
            ctx,
            sweep_id,
            lambda stop, progress: ctx.engine.sweep(
                wf,
                grid=grid,
                rows=rows,
                repeat=ns.repeat,
                budget=budget or None,
                max_concurrency=ns.max_concurrency,
                key=ns.key,
                signal=stop,
                progress=progress,
                values_from_strings=True,
                params=params,
                background=ns.background,
                workers=ns.workers,
            ),
            drives=drives,
        )
    if ns.as_var:
        ctx.user_ns[ns.as_var] = sweep
    return sweep


def _driven(
    ctx: CommandContext,
    sweep_id: str | None,
    sweep: Callable[[threading.Event, Callable[[int, int], None] | None], Sweep],
    *,
    drives: SweepDrives,
) -> Sweep:
    """Run ``sweep(stop, progress)`` under the live grid; a background one returns once the
    sweep opened, its drive kept in ``drives`` and followed by the grid."""
    view = _live_view(ctx, sweep_id) if ctx.use_widgets and sweep_id is not None else None
    stop = threading.Event()
    try:
        drive = _interruptible(lambda: sweep(stop, view.poke if view is not None else None), stop)
    except BaseException:
        if view is not None:
            view.finish()
            ctx.settle_at_next_cell(view)
            _follow(ctx, view.sweep, quiet=True)  # a stopped sweep resumed later repaints it
        raise
    if not isinstance(drive, BackgroundSweep):
        if view is None:
            return drive
        # The grid stays clickable until another cell runs (a click reaches the kernel
        # only once this cell ended); then it gives way to the static grid below it, which
        # follows the sweep (a `wf sweep-resume` in a terminal, another kernel).
        view.finish()
        ctx.settle_at_next_cell(view)
        return _follow(ctx, drive) or drive
    drives.add(drive)
    if view is None:
        return drive
    view.follow(drive)  # it settles at the first cell after the drive ended
    ctx.settle_at_next_cell(view)
    return LiveSweep(drive, view)


def _follow(ctx: CommandContext, sweep: Sweep, *, quiet: bool = False) -> FollowedSweep | None:
    """Show ``sweep``'s static grid in an output that follows it while the kernel lives; the
    handle the cell evaluates to (it displays as nothing: the grid is its display). None when
    the grid cannot be shown (``quiet``: a failed start, whose error the cell shows instead).

    Raises:
        UsageError: the sweep has no row (not ``quiet``).
    """
    from .sweepfollow import FollowedSweep, SweepOutput

    output = SweepOutput(sweep)
    try:
        output.show()
    except UsageError:  # no such sweep: it never opened
        if quiet:
            return None
        raise
    except Exception:
        if quiet:  # the cell raises what stopped the sweep; this must not mask it
            log.exception("showing the grid of sweep %s failed", sweep.sweep_id)
            return None
        raise
    ctx.follow_sweep(output)
    return FollowedSweep(sweep, output)


def _followed(ctx: CommandContext, drive: BackgroundSweep) -> Sweep:
    """A cell's handle on a background sweep an earlier cell started, said in one line: a new
    live grid that follows the same drive (the earlier cell's grid settles as this cell runs)."""
    print(
        f"sweep {drive.sweep_id} is already being driven in the background by this kernel; "
        f"this cell started nothing and follows it (`%sweep stop {drive.sweep_id}` stops it)",
        file=sys.stderr,
    )
    view = _live_view(ctx, drive.sweep_id) if ctx.use_widgets else None
    if view is None:
        return drive
    view.follow(drive)
    ctx.settle_at_next_cell(view)
    return LiveSweep(drive, view)


def _shared_params(ns: argparse.Namespace, user_ns: Mapping[str, Any]) -> dict[str, Any] | None:
    """``--params VAR`` (a dict in the notebook) with ``--param K=V`` over it; None: neither."""
    if not ns.param and ns.params is None:
        return None
    value = user_ns.get(ns.params) if ns.params is not None else {}
    if not isinstance(value, Mapping):
        got = "undefined" if ns.params not in user_ns else type(value).__name__
        raise UsageError(
            f"--params expects the name of a dict in the notebook (got {ns.params!r}: {got})"
        )
    return {**value, **parse_params(ns.param)}


def _interruptible(drive: Callable[[], Sweep], stop: threading.Event) -> Sweep:
    """Run ``drive`` on a thread and wait; an interrupt sets ``stop`` (a graceful stop).

    The main thread only waits, so a kernel interrupt lands here and never inside the
    drive's journal writes (as ``%%workflow``'s foreground drive).

    Raises:
        Whatever ``drive`` raised.
    """
    done = threading.Event()
    outcome: list[Sweep] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(drive())
        except BaseException as exc:  # handed to the waiting thread, raised there
            error.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=target, name="wf-sweep", daemon=True)
    interrupted = False
    try:
        worker.start()
    except KeyboardInterrupt:
        if worker.ident is None:
            raise  # nothing was started
        interrupted = _interrupted(stop)
    while not done.is_set():
        try:
            done.wait(0.1)
        except KeyboardInterrupt:
            if interrupted:
                raise UsageError(
                    "Stopped waiting; the sweep stops after its units in flight "
                    "(`wf sweeps` shows it when it has)."
                ) from None
            interrupted = _interrupted(stop)
    if error:
        raise error[0]
    return outcome[0]


def _interrupted(stop: threading.Event) -> bool:
    stop.set()
    print(
        "Interrupted: the sweep dispatches nothing more and stops after the units in flight; "
        "re-run the cell to continue it.",
        file=sys.stderr,
    )
    return True


def _sweep_id(
    ctx: CommandContext,
    wf: Workflow,
    grid: dict[str, list[str]],
    rows: Any,
    repeat: int,
    params: Mapping[str, Any] | None,
) -> str | None:
    """The id ``Engine.sweep`` gives this cell's sweep (its shared params sealed as it seals
    them), or None when the definition is bad: ``Engine.sweep`` then says why."""
    from ..sweeps.expand import definition, sweep_identity
    from ..sweeps.secrets import fixed_params

    try:
        fixed = fixed_params(ctx.engine.store.state_dir, wf.plan, params, from_strings=True)
        spec = definition(
            wf.plan, grid=grid, rows=rows, repeat=repeat, from_strings=True, params=fixed.params
        )
    except UsageError:
        return None
    return sweep_identity(wf.plan_hash, spec)[0]


def _live_view(ctx: CommandContext, sweep_id: str) -> SweepGridView:
    """The live grid of ``sweep_id``, displayed before the sweep drives."""
    from .sweepview import SweepGridView

    view = SweepGridView(ctx.engine, sweep_id)
    view.show()
    return view


class LiveSweep(Sweep):
    """The ``Sweep`` a ``%%sweep --background`` cell evaluates to while its live grid shows it.

    It displays as one text line until the grid settles (the grid above is its display; a
    static grid printed once would go stale as the cells settle), and as the static grid
    after. ``running``, ``wait()`` and ``stop()`` are the drive's
    (:class:`~wf_magic.sweeps.background.BackgroundSweep`).
    """

    def __init__(self, drive: BackgroundSweep, view: SweepGridView):
        super().__init__(view.engine.store, drive.sweep_id)
        self.drive = drive
        self.view = view

    @property  # the drive's list, set when it ends
    def skipped(self) -> list[str]:
        """Cells the drive skipped because another process drove their run."""
        return self.drive.skipped

    @skipped.setter
    def skipped(self, value: list[str]) -> None:
        pass  # Sweep.__init__ sets it; the drive's list is the one that counts

    @property
    def running(self) -> bool:
        """Whether the drive is still going."""
        return self.drive.running

    @property
    def error(self) -> BaseException | None:
        """What ended the drive, when it raised."""
        return self.drive.error

    def wait(self, timeout: float | None = None) -> LiveSweep:
        """Wait for the drive to end (see ``BackgroundSweep.wait``); returns this handle.

        Raises:
            WorkflowError: what ended the drive, when it raised.
            TimeoutError: the drive is still going after ``timeout``.
        """
        self.drive.wait(timeout)
        return self

    def stop(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Stop the drive gracefully: cells in flight finish, the others stay owed."""
        self.drive.stop(wait=wait, timeout=timeout)

    def __repr__(self) -> str:
        return repr(self.drive)

    def _repr_html_(self) -> str | None:  # type: ignore[override]
        return super()._repr_html_() if self.view.is_settled else None


class SweepDrives:
    """This kernel's background sweeps (``%%sweep --background``), by sweep id."""

    def __init__(self) -> None:
        self._drives: dict[str, BackgroundSweep] = {}
        self._lock = threading.Lock()

    def add(self, drive: BackgroundSweep) -> None:
        with self._lock:
            self._drives[drive.sweep_id] = drive

    def driving(self, sweep_id: str) -> BackgroundSweep | None:
        """The drive of ``sweep_id`` when it is still going."""
        with self._lock:
            drive = self._drives.get(sweep_id)
        return drive if drive is not None and drive.running else None

    def running(self) -> list[BackgroundSweep]:
        """The drives still going, oldest first (finished ones are forgotten)."""
        with self._lock:
            self._drives = {k: d for k, d in self._drives.items() if d.running}
            return list(self._drives.values())

    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every drive gracefully (unloading the extension), waiting ``timeout`` s."""
        drives = self.running()
        for drive in drives:
            drive.stop(wait=False)
        for drive in drives:
            drive.stop(timeout=timeout)


def stop_sweeps(ctx: CommandContext, drives: SweepDrives, sweep: str | None) -> list[str]:
    """``%sweep stop [SWEEP]``: ask this kernel's background drive of SWEEP (else of every
    sweep) to stop after the units in flight, as ``%workflow stop`` asks a run's; the owed
    cells stay for re-running the cell (or ``wf sweep-resume``). Returns the ids asked.

    Raises:
        UsageError: no sweep matches SWEEP, or the prefix is ambiguous.
    """
    if sweep is None:
        asked = drives.running()
        if not asked:
            print("no sweep is being driven in the background by this kernel; nothing to stop")
    else:
        sweep_id = ctx.engine.sweep_handle(sweep).sweep_id
        drive = drives.driving(sweep_id)
        asked = [drive] if drive is not None else []
        if drive is None:
            print(
                f"sweep {sweep_id} is not being driven in the background by this kernel; "
                "nothing was stopped (a `wf sweep` in a terminal stops on Ctrl-C)"
            )
    for drive in asked:
        drive.stop(wait=False)
        print(
            f"stop requested for sweep {drive.sweep_id}; it stops after the units in flight "
            "(re-run its cell or `wf sweep-resume` to continue it)"
        )
    return [d.sweep_id for d in asked]
