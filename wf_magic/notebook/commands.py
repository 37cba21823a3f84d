"""Plain functions behind ``%%workflow`` and each ``%workflow`` command (the magics route here)."""

from __future__ import annotations

import dataclasses
import functools
import html
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..display import origin_text, plan_html, plan_mermaid, plan_text
from ..display.run import stop_text
from ..errors import DefinitionError, RunLockHeld, UsageError
from ..inspection import (
    AttemptRecord,
    UnitDiff,
    changes_text,
    record_text,
    run_changes,
)
from ..library_index import NAME_PATTERN
from ..run import Run
from ..runners.registry import known_runners
from ..spec.workflow import Workflow
from ..users import check_owner, current_user
from .args import CellArgs, LineArgs
from .drives import driver_text
from .liverun import LiveRun

if TYPE_CHECKING:
    from ..library import Library, LibraryWorkflow
    from ..store.records import EventRow
    from .context import CommandContext

CELL_SOURCE_NAME = "%%workflow cell"
_NAME_LINE = re.compile(r"^name\s*:\s*['\"]?([^'\"\s#]+)", re.MULTILINE)


# -- the cell ---------------------------------------------------------------------------------
def load_cell(ctx: CommandContext, source: str, name: str | None) -> Workflow:
    """Freeze a cell's YAML, or the ``.yaml`` file its one line names; the library learns it.

    NAME fills a missing ``name:`` (and must match a present one).

    Raises:
        UsageError: NAME contradicts the YAML's name, or a definition error (with the cell
            line and the field, in one line).
    """
    text, offset = source, 1  # cell line = YAML line + 1 (the %%workflow line)
    stripped = source.strip()
    if "\n" not in stripped and stripped.endswith((".yaml", ".yml")):
        return _load_file(ctx, Path(stripped).expanduser())
    if "\n" not in stripped and NAME_PATTERN.match(stripped) and name in (None, stripped):
        return _library_cell(ctx, stripped)  # a bare scalar is no workflow: it names one
    if name is not None:
        first_document = re.split(r"^---\s*$", text, maxsplit=1, flags=re.MULTILINE)[0]
        declared = _NAME_LINE.search(first_document)
        if declared is None:
            text, offset = f"name: {name}\n{text}", 0
        elif declared.group(1) != name:
            raise UsageError(
                f"the cell line names the workflow {name!r} but its YAML says "
                f"name: {declared.group(1)}; make them agree or drop one"
            )
    try:
        with _library(ctx) as library, library.using():
            wf = ctx.engine.load(text, source_name=CELL_SOURCE_NAME)
    except DefinitionError as exc:
        where = f" (cell line {exc.line + offset})" if exc.line is not None else ""
        head = f"{exc.field}: " if exc.field else ""
        raise UsageError(f"workflow definition error — {head}{exc.problem}{where}") from None
    ctx.library[wf.name] = wf.source
    return wf


def _load_file(ctx: CommandContext, path: Path) -> Workflow:
    try:
        with _library(ctx) as library, library.using():
            wf = ctx.engine.load(path)
    except DefinitionError as exc:
        raise UsageError(f"workflow definition error — {exc}") from None
    ctx.library[wf.name] = wf.source
    return wf


def _library(ctx: CommandContext) -> Library:
    """The workflow library the environment describes, caching in this notebook's state DB."""
    from ..library import Library

    return Library.from_environ(store=ctx.engine.store)


def _library_cell(ctx: CommandContext, name: str) -> Workflow:
    """A cell holding just a library NAME: the copy ``%workflow use`` pinned, else the
    library's (then pinned, so re-running the cell runs the same source)."""
    if name not in ctx.library_origins:
        use_workflow(ctx, name)
    origin = ctx.library_origins[name]
    try:
        with _library(ctx) as library, library.using():
            wf = ctx.engine.load(ctx.library[name], source_name=origin)
    except DefinitionError as exc:
        raise UsageError(f"workflow definition error — {exc}") from None
    return dataclasses.replace(wf, source_path=origin)


def run_cell(
    ctx: CommandContext, args: CellArgs, source: str, *, key: str | None = None
) -> Run | None:
    """``%%workflow``: freeze, find or start the run (DESIGN §4), drive it, return the handle.

    With a launch ``key`` (``--key``), re-executing the cell returns the run the key launched.
    """
    wf = load_cell(ctx, source, args.name) if source.strip() else None
    if wf is None and args.resume is None:
        raise UsageError(
            "the cell is empty: write the workflow YAML under %%workflow (or pass --resume RUN)"
        )
    if args.dry_run:
        if wf is None:
            raise UsageError("--dry-run needs the workflow YAML in the cell")
        wf = ctx.engine.preview(wf, params=args.params, params_from_strings=True)
        show_plan(ctx, wf)
        if args.as_var:
            ctx.user_ns[args.as_var] = wf
        return None
    warnings: list[str] = []
    created = False
    if key is not None and args.resume is not None:
        raise UsageError("--key names a start, --resume an existing run; pick one")
    if wf is None or args.resume is not None:
        run_id = ctx.engine.resolve_run_id(args.resume or "")
    else:
        started = ctx.engine.start(
            wf,
            params=args.params,
            new=args.new,
            no_cache=args.no_cache,
            params_from_strings=True,
            key=key,
        )
        run_id, warnings, created = started.run_id, started.warnings, started.created
    handle = launch(
        ctx,
        run_id,
        max_steps=args.max_steps,
        background=args.background,
        live_source=wf,
        warnings=warnings,
        created=created,
    )
    if args.as_var:
        ctx.user_ns[args.as_var] = handle
    return handle


def show_plan(ctx: CommandContext, wf: Workflow) -> None:
    """Display the frozen plan: an HTML table and a Mermaid graph JupyterLab draws locally."""
    from IPython.display import display

    table = plan_html(wf.plan, plan_hash=wf.plan_hash).split("<pre class='mermaid'>")[0]
    graph = plan_mermaid(wf.plan)
    summary = {"text/plain": plan_text(wf.plan, plan_hash=wf.plan_hash), "text/html": table}
    mermaid = {"text/plain": graph, "text/markdown": f"```mermaid\n{graph}\n```"}
    display(summary, raw=True)  # type: ignore[no-untyped-call]
    display(mermaid, raw=True)  # type: ignore[no-untyped-call]


def launch(
    ctx: CommandContext,
    run_id: str,
    *,
    max_steps: int | None = None,
    background: bool = False,
    live_source: Workflow | None = None,
    warnings: list[str] | None = None,
    created: bool = False,
) -> Run:
    """Drive a run in the foreground or in the background, behind a live view when possible.

    ``created`` says whether the caller created the run (the handle's ``created``).
    """
    # Said here, not from a background thread or under a view that would never move.
    check_owner(run_id, ctx.engine.get_run(run_id).owner, verb="resume")
    warnings = list(warnings or [])
    view = ctx.open_view(run_id, warnings=warnings) if ctx.use_widgets else None
    before = view.snapshot if view is not None else None
    if background:
        ctx.drive_in_background(run_id, max_steps=max_steps, live_source=live_source)
        handle = ctx.engine.status(run_id)
    else:
        try:
            if ctx.drives.is_followable(run_id):
                # A view's button already continues it in this kernel: follow that drive to
                # its end instead of refusing to start a second one.
                ctx.drives.wait(run_id)
            handle = ctx.drives.foreground(
                run_id,
                max_steps=max_steps,
                live_source=live_source,
                when_over=None if view is None else view.refresh,
            )
        finally:
            if view is not None:
                view.flush()
    handle.warnings[:0] = warnings
    handle.created = created
    if view is None:
        return handle
    for message in handle.warnings:
        view.add_warning(message)
    if before is not None and not background:
        done, _running, _failed, total = before.units
        view.origin = origin_text(
            created=created, done_before=done, total=total, stats=handle.stats
        )
    view.flush()
    if not background:
        view.refresh()
    ctx.settle_view(view)
    return LiveRun(handle, view)


# -- line commands ------------------------------------------------------------------------------
def cmd_list(ctx: CommandContext, args: LineArgs) -> Any:
    """The entries ``wf list`` prints (``display.listing``): the newest root runs (default 50)
    as a frame, each sweep's cells as one line per sweep, a sweep's cells with ``--sweep``,
    and how many were left out; ``--all``: the plain frame of every run and column.

    The compact view shows each run's params (secret ones masked) beside its workflow, so
    two scopes of one workflow are told apart.
    """
    from ..display.listing import entry_line, rest_line, runs_listing
    from ..store.listing import CellEntry
    from ..store.records import RunRow

    mine = current_user() if args.mine else None
    if args.all and args.sweep is None:
        frame = ctx.engine.runs()
        if mine is not None:  # yours, and nobody's (runs from before owners were recorded)
            frame = frame[frame["owner"].isna() | (frame["owner"] == mine)]
        frame = frame.iloc[::-1].reset_index(drop=True)
        frame = frame.head(args.limit) if args.limit else frame
        if frame.empty:
            print(f"no runs {f'of {mine} ' if mine else ''}in {ctx.engine.where}")
            return None
        return frame
    store = ctx.engine.store
    listing = runs_listing(store, limit=args.limit, every=args.all, sweep=args.sweep, owner=mine)
    if not listing.entries:
        print(f"no runs {f'of {mine} ' if mine else ''}in {ctx.engine.where}")
        return None
    order: list[str] = []
    lines: list[tuple[int, str]] = []  # (position, line) of the entries that are no run row
    for entry in listing.entries:
        run = entry.run if isinstance(entry, CellEntry) else entry
        if isinstance(run, RunRow):
            order.append(run.run_id)
        else:
            lines.append((len(order) + len(lines), entry_line(entry, store.superseded_by)))
    frame = ctx.engine.runs()
    place = {run_id: i for i, run_id in enumerate(order)}
    frame = frame[frame["run"].isin(place)]  # a run deleted meanwhile is simply not shown
    frame = frame.iloc[frame["run"].map(place).argsort()].reset_index(drop=True)
    shown = _scoped_runs_frame()(frame)
    shown.listed_lines = tuple(lines)
    shown.rest_line = rest_line(listing, every=args.all, cells=args.sweep is not None)
    return shown


@functools.cache
def _scoped_runs_frame() -> type:
    """``RunsFrame`` whose display adds a ``params`` column after ``workflow``, the listing's
    lines that are no run (a sweep, a cell without a run) in their places, and the count of
    the entries left out."""
    import pandas as pd

    from ..store.runs import params_text
    from .frames import RunsFrame

    class ScopedRunsFrame(RunsFrame):
        _metadata = ["listed_lines", "rest_line"]  # attributes pandas lets us set
        listed_lines: tuple[tuple[int, str], ...] = ()
        rest_line: str | None = None

        def readable(self) -> Any:
            out = super().readable()
            shown = [params_text(v) if isinstance(v, str) else "" for v in self["params"]]
            out.insert(list(out.columns).index("workflow") + 1, "params", shown)
            rows = out.to_dict("records")
            for position, line in self.listed_lines:
                rows.insert(position, {c: "" for c in out.columns} | {"run": line})
            return pd.DataFrame(rows, columns=out.columns)

        def __repr__(self) -> str:
            rest = f"\n{self.rest_line}" if self.rest_line else ""
            return super().__repr__() + rest

        def _repr_html_(self) -> str:
            rest = f"<p>{html.escape(self.rest_line)}</p>" if self.rest_line else ""
            return super()._repr_html_() + rest

    return ScopedRunsFrame


def cmd_status(ctx: CommandContext, args: LineArgs) -> Run:
    handle = ctx.engine.status(_run(ctx, args))
    if not ctx.use_widgets or handle.warnings:
        return handle  # a plan this version cannot drive: its text view, with the warning
    view = ctx.open_view(handle.run_id)
    view.refresh()  # static unless this kernel drives it; it follows the run until it settles
    return LiveRun(handle, view)


def cmd_resume(ctx: CommandContext, args: LineArgs) -> Run | None:
    try:
        return launch(ctx, _run(ctx, args), max_steps=args.max_steps, background=args.background)
    except RunLockHeld as exc:
        if not args.skip_if_locked:
            raise
        print(f"run {exc.run_id} is being driven by {exc.holder}; skipped (--skip-if-locked)")
        return None


def cmd_fork(ctx: CommandContext, args: LineArgs) -> Run:
    # Its secret params (known to this kernel's engine, or WF_PARAM_*) are checked before
    # the fork exists: a missing one leaves no run behind.
    run_id = ctx.engine.fork(_run(ctx, args), from_step=args.from_step or "", params={}).run_id
    print(f"run {run_id}: fork of {args.run} from step {args.from_step}")
    return launch(ctx, run_id, max_steps=args.max_steps, background=args.background, created=True)


def cmd_abandon(ctx: CommandContext, args: LineArgs) -> None:
    run_id = _run(ctx, args)
    for warning in ctx.engine.handle(run_id).warnings:  # abandoning never decodes the plan
        print(f"warning: {warning}")
    done = ctx.engine.abandon(run_id, reason=args.reason or "abandoned by user")
    below = ", ".join(r for r in done if r != run_id)
    print(f"run {run_id} abandoned" + (f"; so are its child run(s) {below}" if below else ""))


def cmd_approve(ctx: CommandContext, args: LineArgs) -> None:
    run_id = _run(ctx, args)
    loop = ctx.engine.approve(run_id, args.step or "", feedback=args.feedback, loop=args.loop)
    print(
        f"approved {run_id} step {args.step} (loop {loop}); "
        f"`%workflow resume {run_id}` continues the run"
    )


def cmd_reject(ctx: CommandContext, args: LineArgs) -> None:
    run_id = _run(ctx, args)
    loop = ctx.engine.reject(run_id, args.step or "", feedback=args.feedback or "", loop=args.loop)
    print(
        f"rejected {run_id} step {args.step} (loop {loop}); "
        f"`%workflow resume {run_id}` re-executes it with the feedback"
    )


def cmd_journal(ctx: CommandContext, args: LineArgs) -> Any:
    """The run's journal frame, shown in a compact column set (``--all``: every column)."""
    from .frames import JournalFrame

    frame = ctx.engine.journal(_run(ctx, args))
    return frame if args.all else JournalFrame(frame)


def cmd_show(ctx: CommandContext, args: LineArgs) -> Any:
    """One attempt of a unit: what it was sent (input), answered (output) and cost."""
    record = ctx.engine.handle(_run(ctx, args)).attempt(args.unit or "", args.attempt)
    return AttemptView(record)


def cmd_diff(ctx: CommandContext, args: LineArgs) -> Any:
    """Units whose input differs between two runs, as a coloured diff."""
    run_a = _run(ctx, args)
    run_b = ctx.engine.resolve_run_id(args.other or "")
    changes = run_changes(ctx.engine.store, run_a, run_b, unit_id=args.unit)
    return UnitDiff(changes_text(run_a, run_b, changes))


def cmd_compare(ctx: CommandContext, args: LineArgs) -> Any:
    """Two runs side by side, unit by unit (renders as an HTML table)."""
    return ctx.engine.compare(_run(ctx, args), args.other or "", show_all=args.all)


class AttemptView:
    """An attempt record that prints as text and renders as HTML (input, then output)."""

    def __init__(self, record: AttemptRecord):
        self.record = record

    def __repr__(self) -> str:
        return record_text(self.record)

    def _repr_html_(self) -> str:
        return (
            "<pre style='white-space:pre-wrap'>" + html.escape(record_text(self.record)) + "</pre>"
        )


def cmd_tokens(ctx: CommandContext, args: LineArgs) -> Any:
    return ctx.engine.tokens(_run(ctx, args), by=args.by)


def cmd_events(ctx: CommandContext, args: LineArgs) -> Any:
    frame = ctx.engine.events(_run(ctx, args))
    if args.since is None:
        return frame
    return frame[frame["event_id"] > args.since].reset_index(drop=True)


def cmd_budget(ctx: CommandContext, args: LineArgs) -> Any:
    """The budget frame, shown with whole counts and "no limit" for an unset ceiling."""
    from .frames import BudgetFrame

    return BudgetFrame(ctx.engine.budget(_run(ctx, args)))


def cmd_stop(ctx: CommandContext, args: LineArgs) -> None:
    run_id = _run(ctx, args)
    check_owner(run_id, ctx.engine.get_run(run_id).owner, verb="stop")  # before a local stop
    here = ctx.drives.stop(run_id)
    if ctx.engine.stop(run_id):
        status = ctx.engine.get_run(run_id).status
        print(stop_text(run_id, status, driven=here or ctx.engine.is_driving(run_id)))
    else:
        print(f"run {run_id} is finished; there is nothing to stop (nothing was changed)")


def cmd_adopt(ctx: CommandContext, args: LineArgs) -> None:
    done = ctx.engine.adopt(_run(ctx, args))
    if not done.adopted:
        print(f"run {done.run_id} is already yours ({done.owner}); nothing was changed")
        return
    below = [r for r in done.adopted if r != done.run_id]
    with_children = f" with its child run(s) {', '.join(below)}" if below else ""
    print(
        f"adopted run {done.run_id}{with_children} from {done.previous_owner or 'nobody'}; "
        f"it is {done.owner}'s now"
    )


def cmd_gc(ctx: CommandContext, args: LineArgs) -> None:
    seconds = args.older_than_s
    if seconds is None:
        seconds = (args.older_than_days or 0) * 86400
    deleted = ctx.engine.gc(older_than_s=seconds)
    print(
        f"deleted {len(deleted)} finished run(s)" + (f": {', '.join(deleted)}" if deleted else "")
    )


def cmd_use(ctx: CommandContext, args: LineArgs) -> None:
    """Load a workflow from the library: later cells call it as a child or run it by name."""
    if not args.run:
        raise UsageError("%workflow use needs a workflow name, e.g. `%workflow use review`")
    found, wf = use_workflow(ctx, args.run)
    print(
        f"using {found.name} from {found.origin_text}; cells may call it "
        f"(`workflow: {found.name}`), and a %%workflow cell holding just `{found.name}` runs it"
    )
    show_plan(ctx, wf)


def use_workflow(ctx: CommandContext, name: str) -> tuple[LibraryWorkflow, Workflow]:
    """Resolve ``name`` through the library, freeze it, and pin it in the notebook's library.

    Raises:
        LibraryError: the library cannot provide it (not found, fetch, sha256, index).
        UsageError: its definition is invalid.
    """
    try:
        with _library(ctx) as library, library.using():
            found = library.find(name)
            wf = ctx.engine.load(found.source, source_name=found.origin)
    except DefinitionError as exc:
        raise UsageError(f"workflow definition error — {exc}") from None
    ctx.library[name] = wf.source
    ctx.library_origins[name] = found.origin
    return found, wf


def cmd_config(ctx: CommandContext, args: LineArgs) -> None:
    engine = ctx.engine
    shelf = _library(ctx)  # only described: nothing is read or fetched
    lines = [
        f"state dir        {engine.state_dir}",
        f"database         {engine.where}",
        f"durability       {ctx.durability}",
        f"max concurrency  {ctx.max_concurrency or '(the plan decides)'}",
        f"widgets          {ctx.widgets} (live view {'on' if ctx.use_widgets else 'off'})",
        "default runner   scripted (a plan's `runner:` overrides it)",
        f"runners          {', '.join(known_runners())}",
        f"library          {', '.join(sorted(ctx.library)) or '(no cells run yet)'}",
        f"library folders  {', '.join(str(f) for f in shelf.folders)} ($WF_MAGIC_PATH first)",
        f"library index    {shelf.index or '(none: set $WF_MAGIC_INDEX)'} "
        f"(fresh for {shelf.ttl_s:g} s: $WF_MAGIC_LIBRARY_TTL)",
        "settings         %config WorkflowMagics.state_dir = '...' (also durability, "
        "max_concurrency, widgets, watch_poll_s)",
    ]
    print("\n".join(lines))


def cmd_watch(ctx: CommandContext, args: LineArgs) -> Run:
    """Follow a run driven elsewhere by polling its events until it is no longer active."""
    engine = ctx.engine
    run_id = _run(ctx, args)
    view = ctx.open_view(run_id, subscribe=False) if ctx.use_widgets else None
    after = _last_event_id(ctx, run_id)
    if view is None:
        driver = driver_text(engine, run_id) or "no driver holds it now"
        print(f"watching {run_id} ({engine.get_run(run_id).status}, {driver}); interrupt to stop")
    idle_since: float | None = None
    try:
        while True:
            rows = _events_after(ctx, run_id, after)
            if rows:
                after = rows[-1].event_id
                if view is not None:
                    view.poke()
                else:
                    print("\n".join(_event_line(r) for r in rows))
            if engine.get_run(run_id).status != "active":
                break
            if engine.is_driving(run_id):
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > args.idle_s:
                print(
                    f"no driver has held {run_id} for {args.idle_s:g}s; stopped watching "
                    f"(`%workflow resume {run_id}` drives it here)",
                    file=sys.stderr,
                )
                break
            time.sleep(ctx.watch_poll_s)
    except KeyboardInterrupt:
        print(f"stopped watching {run_id}", file=sys.stderr)
    handle = engine.status(run_id)
    if view is None:
        return handle
    view.flush()
    view.refresh()
    return LiveRun(handle, view)


def _run(ctx: CommandContext, args: LineArgs) -> str:
    if not args.run:
        raise UsageError(f"%workflow {args.command} needs a run id (`%workflow list`)")
    return ctx.engine.resolve_run_id(args.run)


def _last_event_id(ctx: CommandContext, run_id: str) -> int:
    after = 0
    while rows := _events_after(ctx, run_id, after):
        after = rows[-1].event_id
    return after


def _events_after(ctx: CommandContext, run_id: str, after: int) -> list[EventRow]:
    return ctx.engine.store.events_after(run_id, after)


def _event_line(row: EventRow) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(row.at))
    where = " ".join(x for x in (row.step_id, row.unit_id) if x)
    data = f"  {row.data_json}" if row.data_json and len(row.data_json) <= 160 else ""
    return f"{stamp}  {row.kind:<14} {where}{data}"


COMMANDS: dict[str, Callable[[CommandContext, LineArgs], Any]] = {
    "list": cmd_list,
    "status": cmd_status,
    "resume": cmd_resume,
    "abandon": cmd_abandon,
    "fork": cmd_fork,
    "approve": cmd_approve,
    "reject": cmd_reject,
    "journal": cmd_journal,
    "show": cmd_show,
    "diff": cmd_diff,
    "compare": cmd_compare,
    "tokens": cmd_tokens,
    "events": cmd_events,
    "budget": cmd_budget,
    "watch": cmd_watch,
    "stop": cmd_stop,
    "adopt": cmd_adopt,
    "gc": cmd_gc,
    "use": cmd_use,
    "config": cmd_config,
}
