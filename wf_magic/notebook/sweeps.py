"""``%%sweep``: runs ``Engine.sweep`` over the cell's YAML; the cell's value is the ``Sweep``,
whose rich display is the sweep's grid (static HTML that stays in the saved notebook)."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..arg_values import parse_params
from ..errors import UsageError
from ..sweep_cli import parse_grid

if TYPE_CHECKING:
    from ..spec.workflow import Workflow
    from ..sweeps.handle import Sweep
    from .context import CommandContext
    from .sweepview import SweepGridView


def sweep_rows(value: str | None, user_ns: Mapping[str, Any]) -> Any:
    """``--rows``: a notebook variable (a DataFrame or a list of dicts), else a file path."""
    if value is None:
        return None
    if value.isidentifier() and value in user_ns:
        return user_ns[value]
    return value


def run_sweep_cell(ctx: CommandContext, ns: argparse.Namespace, source: str) -> Sweep:
    """Freeze the cell's workflow, run the sweep, bind ``--as``; the handle shows the grid.

    An interrupt (the kernel's, a ``KeyboardInterrupt`` in the main thread) stops the sweep
    gracefully: no new cell or unit is dispatched, the units in flight finish, the sweep
    settles ``stopped`` (reason ``interrupted; …``) and one line says so; a second interrupt
    stops waiting (the sweep still winds down on its thread).

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
    view = _live_view(ctx, wf, grid, rows, ns.repeat) if ctx.use_widgets else None
    stop = threading.Event()
    try:
        sweep = _interruptible(
            lambda: ctx.engine.sweep(
                wf,
                grid=grid,
                rows=rows,
                repeat=ns.repeat,
                budget=budget or None,
                max_concurrency=ns.max_concurrency,
                key=ns.key,
                signal=stop,
                progress=view.poke if view is not None else None,
                values_from_strings=True,
                params=params,
            ),
            stop,
        )
    finally:
        if view is not None:
            # The grid stays clickable until another cell runs (a click reaches the kernel
            # only once this cell ended); then it gives way to the static grid below it.
            view.finish()
            ctx.settle_at_next_cell(view)
    if ns.as_var:
        ctx.user_ns[ns.as_var] = sweep
    return sweep


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


def _live_view(
    ctx: CommandContext, wf: Workflow, grid: dict[str, list[str]], rows: Any, repeat: int
) -> SweepGridView | None:
    """The live grid, displayed before the sweep drives (None when the definition is bad:
    ``Engine.sweep`` then says why)."""
    from ..sweeps.expand import definition, sweep_identity
    from .sweepview import SweepGridView

    try:
        spec = definition(wf.plan, grid=grid, rows=rows, repeat=repeat, from_strings=True)
    except UsageError:
        return None
    sweep_id, _ = sweep_identity(wf.plan_hash, spec)
    view = SweepGridView(ctx.engine, sweep_id)
    view.show()
    return view
