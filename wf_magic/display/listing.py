"""The run listing of ``wf list`` and ``%workflow list``: the newest runs, one line per sweep,
a sweep's cells on request, and a count of the rest.

Both faces call :func:`runs_listing` with the options :mod:`wf_magic.verbs` gives them and
read the same lines: the CLI prints them, the notebook shows its runs as a frame and the
other lines (sweeps, cells without a run, the count of the rest) beside it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UsageError, count_text
from ..store import Store
from ..store.listing import CellEntry, RunListing, SweepEntry
from ..store.records import RunRow

DEFAULT_LIMIT = 50
"""Entries a listing shows unless ``--all`` or ``--limit`` says otherwise."""
AMBIGUOUS_SHOWN = 5
"""Sweep ids a prefix matching several names."""


def runs_listing(
    store: Store,
    *,
    limit: int | None = None,
    every: bool = False,
    sweep: str | None = None,
    owner: str | None = None,
) -> RunListing:
    """The entries ``wf list`` shows.

    Args:
        store: the state.
        limit: the newest this many entries (default :data:`DEFAULT_LIMIT`; with ``every``:
            no bound).
        every: every run, child runs and sweep cells too, each on its own line (``--all``).
        sweep: only this sweep's cells (an id or a unique prefix; ``--sweep``).
        owner: only that user's runs and nobody's (``--mine``).

    Raises:
        UsageError: no sweep matches ``sweep``, or the prefix matches several.
    """
    shown = limit if limit is not None else (None if every else DEFAULT_LIMIT)
    if sweep is not None:
        return store.cell_listing(resolve_sweep(store, sweep), limit=shown)
    return store.run_listing(
        limit=shown, include_children=every, group_sweeps=not every, owner=owner
    )


def resolve_sweep(store: Store, sweep: str) -> str:
    """The sweep id ``sweep`` names (itself, or the one sweep it is a prefix of).

    Raises:
        UsageError: no sweep matches, or several do.
    """
    if store.get_sweep(sweep) is not None:
        return sweep
    near = store.find_sweep_prefix(sweep, limit=AMBIGUOUS_SHOWN + 1)
    if len(near) == 1:
        return near[0]
    hint = f" It matches {', '.join(near)}." if near else " `wf sweeps` lists them."
    raise UsageError(f"No sweep {sweep!r} in {store.where}.{hint}")


def run_line(row: RunRow, *, successor: str | None = None) -> str:
    """One run: id, workflow, status, owner (``-`` for nobody's), params, reason, parent, and
    the run that superseded a failed one (it keeps its failure)."""
    from ..store.runs import params_text

    shown = params_text(row.params_json)  # tells two scopes of one workflow apart
    params = f"  {shown}" if shown else ""
    reason = f"  {row.status_reason}" if row.status_reason else ""
    parent = f"  (child of {row.parent_run_id})" if row.parent_run_id else ""
    reason += f"  superseded by {successor}" if successor else ""
    owner = row.owner or "-"
    return f"{row.run_id}  {row.workflow:<20} {row.status:<10} {owner:<12}{params}{reason}{parent}"


def sweep_line(entry: SweepEntry) -> str:
    """One sweep: ``sweep S W: 2 000 cells · 1 990 completed · 10 failed``."""
    counts = "".join(f" · {count_text(n)} {status}" for status, n in entry.counts)
    row = entry.sweep
    return f"sweep {row.sweep_id} {row.workflow}: {count_text(row.cells)} cells{counts}"


def cell_line(entry: CellEntry, *, successor: str | None = None) -> str:
    """One sweep cell: its run's line, or the cell's own when it has no run (pending, deleted);
    then ``cell N``."""
    from ..store.runs import params_text

    if entry.run is not None:
        return f"{run_line(entry.run, successor=successor)}  cell {entry.cell_index}"
    shown = params_text(entry.params_json)
    params = f"  {shown}" if shown else ""
    head = f"{entry.run_id or '-'}  {entry.workflow:<20} {entry.status:<10} {'-':<12}"
    return f"{head}{params}  cell {entry.cell_index}"


def rest_line(listing: RunListing, *, every: bool, cells: bool) -> str | None:
    """``… and 1 950 older runs; --all shows every run`` (None when nothing was left out)."""
    noun = "cell" if cells else "run"
    parts = [
        f"{count_text(n)} older {what}{'' if n == 1 else 's'}"
        for n, what in ((listing.older_runs, noun), (listing.older_sweeps, "sweep"))
        if n
    ]
    if not parts:
        return None
    hint = "a larger --limit shows more" if every else f"--all shows every {noun}"
    return f"… and {' and '.join(parts)}; {hint}"


def listing_lines(
    listing: RunListing,
    *,
    every: bool,
    cells: bool,
    successor_of: Callable[[str], str | None],
) -> list[str]:
    """The listing's lines, newest first, then the count of the rest (:func:`rest_line`).

    ``successor_of`` names the run that superseded a failed run (``Store.superseded_by``).
    """
    lines = [entry_line(e, successor_of) for e in listing.entries]
    rest = rest_line(listing, every=every, cells=cells)
    return [*lines, *([rest] if rest else [])]


def entry_line(
    entry: RunRow | SweepEntry | CellEntry, successor_of: Callable[[str], str | None]
) -> str:
    """One entry of a listing as a line."""
    if isinstance(entry, SweepEntry):
        return sweep_line(entry)
    run = entry.run if isinstance(entry, CellEntry) else entry
    successor = successor_of(run.run_id) if run is not None and run.status == "failed" else None
    if isinstance(entry, CellEntry):
        return cell_line(entry, successor=successor)
    return run_line(entry, successor=successor)
