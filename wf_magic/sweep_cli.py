"""The ``wf sweep`` verbs: argparse namespaces → ``Engine.sweep`` and the sweep reads."""

from __future__ import annotations

import argparse
import signal as signals
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .arg_values import parse_params
from .errors import UsageError
from .exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK

if TYPE_CHECKING:
    from .engine import Engine
    from .sweeps.handle import Sweep

SWEEP_EXIT_CODES = {
    "completed": EXIT_OK,
    "running": EXIT_OK,
    "stopped": EXIT_FAILED,
    "failed": EXIT_FAILED,
}
"""The exit code of a sweep left in each status (a budget stop is a failure, as for a run)."""


def parse_grid(pairs: Sequence[str]) -> dict[str, list[str]]:
    """``["k=a,b", ...]`` → ``{"k": ["a", "b"]}`` (values coerced later, per param type).

    Raises:
        UsageError: a pair has no ``=``, an empty key, or the same axis twice.
    """
    out: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, values = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--grid expects K=V1,V2 (got {pair!r})")
        if key in out:
            raise UsageError(f"--grid {key} is given twice; list all its values in one --grid")
        out[key] = values.split(",")
    return out


def _ceilings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        k: getattr(args, k)
        for k in ("max_tokens", "max_cost", "max_units")
        if getattr(args, k, None) is not None
    }


def _progress(args: argparse.Namespace) -> Callable[[int, int], None] | None:
    if getattr(args, "quiet", False):
        return None

    def show(done: int, total: int) -> None:
        print(f"\rsweep: {done}/{total} cells", end="", file=sys.stderr, flush=True)

    return show


def _driving(fn: Callable[[threading.Event], Sweep]) -> Sweep:
    """Run ``fn`` with SIGINT/SIGTERM setting a stop event (the units in flight finish)."""
    stop = threading.Event()
    previous = {sig: signals.getsignal(sig) for sig in (signals.SIGTERM, signals.SIGINT)}

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        print("\nstopping the sweep after the units in flight", file=sys.stderr)

    for sig in previous:
        signals.signal(sig, on_signal)
    try:
        return fn(stop)
    finally:
        for sig, handler in previous.items():
            signals.signal(sig, handler)


def _report(sweep: Sweep, *, interrupted: bool) -> int:
    print(file=sys.stderr) if interrupted else None
    row = sweep.row
    totals = sweep.totals()
    print(
        f"sweep {row.sweep_id} {row.workflow}: {row.status} · {row.cells} cells · "
        f"{int(totals['units'])} units, {int(totals['tokens'])} tokens paid"
    )
    if row.status_reason:
        print(f"  {row.status_reason}")
    for line in sweep.skipped:
        print(f"warning: {line}", file=sys.stderr)
    if interrupted and (row.status == "running" or _stopped_by_interrupt(row.status_reason)):
        return EXIT_INTERRUPTED
    return SWEEP_EXIT_CODES.get(row.status, EXIT_FAILED)


def _stopped_by_interrupt(reason: str | None) -> bool:
    return bool(reason and reason.startswith("interrupted"))


def _importable(directory: Path) -> None:
    """Let ``python: module:function`` targets import modules beside the workflow file."""
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


def cmd_sweep(engine: Engine, args: argparse.Namespace) -> int:
    from .sweeps.expand import read_rows_file

    _importable(Path(args.file).resolve().parent)
    wf = engine.load(Path(args.file))
    # Read before the drive starts: a bad rows file is refused before any signal is taken.
    rows = None if args.rows is None else read_rows_file(Path(args.rows))
    ceilings = _ceilings(args)
    stopped: list[threading.Event] = []

    def go(stop: threading.Event) -> Sweep:
        stopped.append(stop)
        return engine.sweep(
            wf,
            grid=parse_grid(args.grid or ()),
            rows=rows,
            repeat=args.repeat,
            budget=ceilings or None,
            max_concurrency=args.max_concurrency,
            key=args.key,
            signal=stop,
            progress=_progress(args),
            values_from_strings=True,
            params=parse_params(args.param or ()),
            workers=args.workers,
        )

    sweep = _driving(go)
    if not args.quiet:
        print(file=sys.stderr)
    return _report(sweep, interrupted=stopped[0].is_set())


def cmd_sweep_resume(engine: Engine, args: argparse.Namespace) -> int:
    import os

    from .sweeps.driver import source_path_of

    # As `wf sweep` (and `wf resume` for a run) did: python steps import modules beside the
    # workflow file.
    path = source_path_of(engine.sweep_handle(args.sweep).row)
    if path is not None and "://" not in path:
        _importable(Path(os.path.realpath(path)).parent)
    stopped: list[threading.Event] = []

    def go(stop: threading.Event) -> Sweep:
        stopped.append(stop)
        return engine.sweep_resume(
            args.sweep,
            budget=_ceilings(args) or None,
            max_concurrency=args.max_concurrency,
            signal=stop,
            progress=_progress(args),
            params=parse_params(args.param or ()),
            params_from_strings=True,
            workers=args.workers,
        )

    sweep = _driving(go)
    if not args.quiet:
        print(file=sys.stderr)
    return _report(sweep, interrupted=stopped[0].is_set())


def cmd_sweeps(engine: Engine, args: argparse.Namespace) -> int:
    from .sweeps.handle import sweep_status

    for row in engine.store.list_sweeps():
        status, why = sweep_status(row, engine.store.sweep_cell_counts(row.sweep_id))
        reason = f"  {why}" if why else ""
        print(f"{row.sweep_id}  {row.workflow:<20} {status:<10} {row.cells} cells{reason}")
    return EXIT_OK


def cmd_sweep_status(engine: Engine, args: argparse.Namespace) -> int:
    sweep = engine.sweep_handle(args.sweep)
    row = sweep.row
    counts: dict[str, int] = {}
    for cell in sweep.cells():
        counts[cell.status] = counts.get(cell.status, 0) + 1  # pending, deleted: no run
    totals = sweep.totals()
    reason = sweep.status_reason
    print(f"sweep {row.sweep_id} {row.workflow}: {sweep.status} · {row.cells} cells")
    if reason:
        print(f"  {reason}")
    print("  cells: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    print(f"  calls: {sweep.flow()}")
    print(
        f"  paid: {int(totals['units'])} units, {int(totals['tokens'])} tokens, "
        f"cost {totals['cost']:g}; budget {sweep.budget or 'none'}"
    )
    return SWEEP_EXIT_CODES.get(row.status, EXIT_FAILED)


def cmd_sweep_frame(engine: Engine, args: argparse.Namespace) -> int:
    from .display.spreadsheet import print_frame

    print_frame(engine.sweep_handle(args.sweep).frame(), args.format)
    return EXIT_OK


def cmd_sweep_summary(engine: Engine, args: argparse.Namespace) -> int:
    by = [name.strip() for given in args.by or () for name in given.split(",") if name.strip()]
    if args.by and not by:
        raise UsageError(
            "--by: expected an axis or rows field name (got only blanks); leave --by out for "
            "one group over the whole sweep"
        )
    from .display.spreadsheet import print_frame

    frame = engine.sweep_handle(args.sweep).summary(by=by)
    print_frame(frame, args.format)
    if args.format == "table":
        print(f"interval: {frame.attrs['ci_method']}")
    return EXIT_OK


SWEEP_HANDLERS: dict[str, Callable[[Engine, argparse.Namespace], int]] = {
    "sweep": cmd_sweep,
    "sweeps": cmd_sweeps,
    "sweep-status": cmd_sweep_status,
    "sweep-resume": cmd_sweep_resume,
    "sweep-frame": cmd_sweep_frame,
    "sweep-summary": cmd_sweep_summary,
}
"""The function behind each sweep verb of ``verbs.SWEEP_VERBS``."""
