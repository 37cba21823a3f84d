"""The ``wf`` verbs that read a run without driving it — ``status``, ``list``, the frames
(``journal``, ``tokens``, ``calls``, ``events``), ``watch``, ``show``, ``diff``, ``compare``,
the exports — and the printing every verb shares (a model's words made visible)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO, cast

from .display.spreadsheet import print_frame
from .exits import EXIT_OK
from .visible import visible

# The engine, pandas and the display modules are imported inside the verbs that use them.
if TYPE_CHECKING:
    from .engine import Engine
    from .run import Run
    from .store.store import Store


class RunLister(Protocol):
    """What ``wf list`` needs: the Engine, or just its Store (no engine import); the listing
    itself reads the Store (the Engine's ``store``)."""

    db_path: Path
    where: str
    """The state's location as shown to people (the SQLite file, or the PostgreSQL schema)."""


def say(text: str, *, file: TextIO | None = None) -> None:
    """Print text that may hold a model's words: its control characters made visible."""
    print(visible(text), file=file)


def warn(warnings: Iterable[str]) -> None:
    for warning in warnings:
        say(f"warning: {warning}", file=sys.stderr)


def print_run(run: Run, out: Callable[[str], None]) -> int:
    out(repr(run))  # ends with the result of a completed run
    return run.exit_code


def cmd_status(engine: Engine, args: argparse.Namespace) -> int:
    if args.run is None:
        return cmd_list(engine, args)
    from .store.runs import params_text

    run = engine.status(args.run)
    warn(run.warnings)  # why its plan cannot be driven: once, on stderr, not in the summary
    run.warnings.clear()
    header, *rest = repr(run).split("\n")
    shown = params_text(run.row.params_json)  # tells two scopes of one workflow apart
    origin = run.row.source_path or ""
    fetched = (  # a library workflow fetched from a URL: where from, and what was verified
        [f"  source: {origin} (sha256 {run.row.source_hash})"] if "://" in origin else []
    )
    say("\n".join([header, *([f"  params: {shown}"] if shown else []), *fetched, *rest]))
    from .display.children import child_tree, children_lines

    for line in children_lines(child_tree(engine.store, run.run_id)):
        say(line)
    return run.exit_code


def cmd_list(engine: RunLister, args: argparse.Namespace) -> int:
    """The newest runs, one line each (a sweep's cells as one line per sweep), then how many
    were left out (``--all``: every run; ``--sweep``: one sweep's cells): the lines of
    ``display.listing``, shared with ``%workflow list``."""
    from .display.listing import listing_lines, runs_listing
    from .users import current_user

    store = cast("Store", getattr(engine, "store", engine))  # a Store or the Engine
    mine = current_user() if getattr(args, "mine", False) else None
    every, sweep = bool(getattr(args, "all", False)), getattr(args, "sweep", None)
    listing = runs_listing(
        store, limit=getattr(args, "limit", None), every=every, sweep=sweep, owner=mine
    )
    if not listing.entries:
        print(f"no runs {f'of {mine} ' if mine else ''}in {engine.where}")
    from .spec.stored import plan_warning
    from .store.listing import CellEntry
    from .store.records import RunRow

    shown = [e.run if isinstance(e, CellEntry) else e for e in listing.entries]
    runs = [r for r in shown if isinstance(r, RunRow)]  # no sweep, no cell without a run
    warn(filter(None, map(plan_warning, runs)))
    for line in listing_lines(
        listing, every=every, cells=sweep is not None, successor_of=store.superseded_by
    ):
        say(line)
    return EXIT_OK


def cmd_journal(engine: Engine, args: argparse.Namespace) -> int:
    frame = engine.journal(args.run)
    if args.format == "table" and not args.all:
        from .store.frames import JOURNAL_COMPACT

        frame = frame[list(JOURNAL_COMPACT)]
        blanks = ("model", "session_id", "reused_from_run", "reused_from_unit", "failure")
        frame = frame.drop(columns=[c for c in blanks if frame[c].isna().all()])
    print_frame(frame, args.format)
    return EXIT_OK


def cmd_tokens(engine: Engine, args: argparse.Namespace) -> int:
    print_frame(engine.tokens(args.run, by=args.by), args.format)
    return EXIT_OK


def cmd_calls(engine: Engine, args: argparse.Namespace) -> int:
    frame = engine.calls(args.run, unit=args.unit)
    print_frame(frame, args.format)
    if frame.empty:
        of = f"unit {args.unit} of run {args.run}" if args.unit else f"run {args.run}"
        warn(
            [
                f"{of} made no model call through the agent bridge: calls are recorded for "
                "bridged agent steps (docs/agents.md); `wf journal` shows every attempt"
            ]
        )
    return EXIT_OK


def cmd_events(engine: Engine, args: argparse.Namespace) -> int:
    """A frame of the run's events, or (``--since``, ``--follow``, ``--format json``) one line
    per event, its cursor first, then ``cursor: N`` on stderr (wf_magic.tail)."""
    if args.since is None and not args.follow and args.format != "json":
        print_frame(engine.events(args.run), args.format)
        return EXIT_OK
    from .tail import print_events

    return print_events(
        engine,
        args.run,
        since=args.since or 0,
        follow=args.follow,
        idle_s=args.idle_s,
        fmt=args.format,
    )


def cmd_watch(engine: Engine, args: argparse.Namespace) -> int:
    """``wf watch RUN``: ``wf events RUN --follow`` under the name ``%workflow watch`` has."""
    from .tail import print_events

    return print_events(engine, args.run, since=0, follow=True, idle_s=args.idle_s, fmt="table")


def cmd_show(engine: Engine, args: argparse.Namespace) -> int:
    from .inspection import record_text

    handle = engine.handle(args.run)
    warn(handle.warnings)
    record = handle.attempt(args.unit, args.attempt)
    if args.format == "json":
        print(json.dumps(record.to_json(), indent=2, default=str))
    else:
        say(record_text(record))
    return EXIT_OK


def cmd_diff(engine: Engine, args: argparse.Namespace) -> int:
    from .inspection import changes_text, run_changes

    run_a, run_b = engine.resolve_run_id(args.run), engine.resolve_run_id(args.other)
    say(changes_text(run_a, run_b, run_changes(engine.store, run_a, run_b, unit_id=args.unit)))
    return EXIT_OK


def cmd_compare(engine: Engine, args: argparse.Namespace) -> int:
    comparison = engine.compare(args.run, args.other, show_all=args.all)
    if args.format == "json":
        print(comparison.frame().to_json(orient="records"))
    else:
        say(comparison.text())
    return EXIT_OK


def cmd_export_cassette(engine: Engine, args: argparse.Namespace) -> int:
    from .runners.replay import export_cassette

    run_id = engine.resolve_run_id(args.run)
    for line in export_cassette(engine.store, run_id):
        print(line)
    return EXIT_OK


def cmd_export_otel(engine: Engine, args: argparse.Namespace) -> int:
    headers = [pair for group in args.headers or () for pair in group]
    for run in args.run:
        report = engine.export_otel(
            run,
            endpoint=args.endpoint,
            headers=headers,
            content=args.content,
            timeout_s=args.timeout,
        )
        say(f"{report.run_id}: {report.sent} spans sent, trace {report.trace_id}")
    return EXIT_OK
