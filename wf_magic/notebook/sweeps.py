"""``%%sweep``: runs ``Engine.sweep`` over the cell's YAML; the cell's value is the ``Sweep``,
whose rich display is the sweep's grid (static HTML that stays in the saved notebook)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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
    view = _live_view(ctx, wf, grid, rows, ns.repeat) if ctx.use_widgets else None
    try:
        sweep = ctx.engine.sweep(
            wf,
            grid=grid,
            rows=rows,
            repeat=ns.repeat,
            budget=budget or None,
            max_concurrency=ns.max_concurrency,
            key=ns.key,
            progress=view.poke if view is not None else None,
            values_from_strings=True,
        )
    finally:
        if view is not None:
            view.close()
    if ns.as_var:
        ctx.user_ns[ns.as_var] = sweep
    return sweep


def _live_view(
    ctx: CommandContext, wf: Workflow, grid: dict[str, list[str]], rows: Any, repeat: int
) -> SweepGridView | None:
    """The live grid, displayed before the sweep drives (None when the definition is bad:
    ``Engine.sweep`` then says why)."""
    from IPython.display import display

    from ..sweeps.expand import definition, sweep_identity
    from .sweepview import SweepGridView

    try:
        spec = definition(wf.plan, grid=grid, rows=rows, repeat=repeat, from_strings=True)
    except UsageError:
        return None
    sweep_id, _ = sweep_identity(wf.plan_hash, spec)
    view = SweepGridView(ctx.engine.store, sweep_id)
    display(view.widget)  # type: ignore[no-untyped-call]
    return view
