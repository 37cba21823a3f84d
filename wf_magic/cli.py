"""The ``wf`` command: argparse → Engine, with one table mapping errors to exit codes."""

from __future__ import annotations

import argparse
import os
import signal as signals
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from .argtypes import count_at_least, duration_s
from .engine import Engine
from .errors import (
    UsageError,
    WorkflowError,
)
from .exits import EXIT_INTERRUPTED, EXIT_OK, error_exit_code
from .run import Run
from .runners.replay import export_cassette
from .spec.freeze import Workflow


def _params(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--param expects k=v (got {pair!r})")
        out[key] = value
    return out


def _print_run(run: Run, out: Callable[[str], None]) -> int:
    out(repr(run))  # ends with the result of a completed run
    return run.exit_code


def _drive(
    engine: Engine, run_id: str, args: argparse.Namespace, live_source: Workflow | None = None
) -> int:
    stop = threading.Event()
    previous = {sig: signals.getsignal(sig) for sig in (signals.SIGTERM, signals.SIGINT)}

    def on_signal(signum: int, frame: object) -> None:
        if stop.is_set() and signum == signals.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now; the unit in flight is owed
        stop.set()
        print("stopping after the units in flight (Ctrl-C again to stop at once)", file=sys.stderr)

    for sig in previous:
        signals.signal(sig, on_signal)
    try:
        run = engine.drive(
            run_id,
            max_steps=getattr(args, "max_steps", None),
            signal=stop,
            max_concurrency=getattr(args, "max_concurrency", None),
            max_retries=getattr(args, "max_retries", 0) or 0,
            live_source=live_source,
        )
    finally:
        for sig, handler in previous.items():
            signals.signal(sig, handler)
    for warning in run.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    code = _print_run(run, print)
    return EXIT_INTERRUPTED if run.stopped_by == "signal" and run.status == "active" else code


def _importable(directory: Path) -> None:
    """Let ``python: module:function`` targets import modules beside the workflow file."""
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


def cmd_run(engine: Engine, args: argparse.Namespace) -> int:
    _importable(Path(args.file).resolve().parent)
    wf = engine.load(Path(args.file))
    if args.dry_run:
        from .display import plan_text

        print(plan_text(wf.plan, plan_hash=wf.plan_hash))
        return EXIT_OK
    started = engine.start(
        wf,
        params=_params(args.param),
        new=args.new,
        no_cache=args.no_cache,
        params_from_strings=True,
    )
    for w in started.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"run {started.run_id} ({'new' if started.created else 'existing'})", flush=True)
    return _drive(engine, started.run_id, args, live_source=wf)


def cmd_resume(engine: Engine, args: argparse.Namespace) -> int:
    source_path = engine.get_run(engine.resolve_run_id(args.run)).source_path
    if source_path:
        _importable(Path(source_path).parent)
    return _drive(engine, args.run, args)


def cmd_status(engine: Engine, args: argparse.Namespace) -> int:
    if args.run is None:
        return cmd_list(engine, args)
    run = engine.status(args.run)
    print(repr(run))
    return run.exit_code


def cmd_list(engine: Engine, args: argparse.Namespace) -> int:
    runs = engine.list_runs(
        include_children=getattr(args, "all", False), limit=getattr(args, "limit", None)
    )
    if not runs:
        print(f"no runs in {engine.db_path}")
    for row in runs:
        reason = f"  {row.status_reason}" if row.status_reason else ""
        parent = f"  (child of {row.parent_run_id})" if row.parent_run_id else ""
        print(f"{row.run_id}  {row.workflow:<20} {row.status:<10}{reason}{parent}")
    return EXIT_OK


def _frame_out(frame: object, fmt: str) -> None:
    import pandas as pd

    assert isinstance(frame, pd.DataFrame)
    if fmt == "csv":
        frame.to_csv(sys.stdout, index=False)
    elif fmt == "json":
        print(frame.to_json(orient="records", date_format="iso"))
    else:
        with pd.option_context("display.max_rows", None, "display.width", 200):
            print(frame.to_string(index=False))


def cmd_journal(engine: Engine, args: argparse.Namespace) -> int:
    _frame_out(engine.journal(args.run), args.format)
    return EXIT_OK


def cmd_tokens(engine: Engine, args: argparse.Namespace) -> int:
    _frame_out(engine.tokens(args.run, by=args.by), args.format)
    return EXIT_OK


def cmd_events(engine: Engine, args: argparse.Namespace) -> int:
    _frame_out(engine.events(args.run), args.format)
    return EXIT_OK


def cmd_abandon(engine: Engine, args: argparse.Namespace) -> int:
    engine.abandon(args.run)
    print(f"run {args.run} abandoned")
    return EXIT_OK


def cmd_fork(engine: Engine, args: argparse.Namespace) -> int:
    run_id = engine.fork(args.run, from_step=args.from_step).run_id
    print(f"run {run_id} (fork of {args.run} from step {args.from_step})", flush=True)
    return _drive(engine, run_id, args)


def cmd_approve(engine: Engine, args: argparse.Namespace) -> int:
    loop = engine.approve(args.run, args.step, feedback=args.feedback, loop=args.loop)
    print(f"approved {args.run} step {args.step} (loop {loop}); `wf resume {args.run}` continues")
    return EXIT_OK


def cmd_reject(engine: Engine, args: argparse.Namespace) -> int:
    loop = engine.reject(args.run, args.step, feedback=args.feedback, loop=args.loop)
    print(f"rejected {args.run} step {args.step} (loop {loop}); `wf resume {args.run}` continues")
    return EXIT_OK


def cmd_stop(engine: Engine, args: argparse.Namespace) -> int:
    engine.stop(args.run)
    print(f"stop requested for {args.run}; its driver stops after the units in flight")
    return EXIT_OK


def cmd_gc(engine: Engine, args: argparse.Namespace) -> int:
    seconds = args.older_than if args.older_than is not None else args.older_than_days * 86400
    deleted = engine.gc(older_than_s=seconds)
    for run_id in deleted:
        print(run_id)
    print(f"deleted {len(deleted)} finished run(s)")
    return EXIT_OK


def cmd_export_cassette(engine: Engine, args: argparse.Namespace) -> int:
    run_id = engine.resolve_run_id(args.run)
    for line in export_cassette(engine.store, run_id):
        print(line)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The ``wf`` argument parser."""
    p = argparse.ArgumentParser(prog="wf", description="Durable LLM-agent workflows.")
    p.add_argument("--db", help="state dir (default $WF_MAGIC_HOME or ./.wf_magic)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    # The same two options after the verb (`wf list --db DIR`); SUPPRESS keeps a value given
    # before the verb from being reset by the subparser's default.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, help="state dir")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)

    def add(
        name: str, fn: Callable[[Engine, argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, parents=[common])
        sp.set_defaults(fn=fn)
        return sp

    r = add("run", cmd_run, "run a workflow file (resumes its unfinished run if unchanged)")
    r.add_argument("file")
    r.add_argument("--param", action="append", default=[], metavar="K=V")
    r.add_argument("--new", action="store_true", help="always start a fresh run")
    r.add_argument("--no-cache", action="store_true", help="no result reuse across runs")
    r.add_argument("--max-steps", type=count_at_least(1), help="stop after N finished steps")
    r.add_argument("--max-concurrency", type=count_at_least(1))
    r.add_argument(
        "--max-retries",
        type=int,
        default=0,
        help="re-open the run up to N times after a unit failure",
    )
    r.add_argument("--dry-run", action="store_true", help="freeze and show the plan only")
    for name, fn, help_ in (("resume", cmd_resume, "drive an existing run"),):
        sp = add(name, fn, help_)
        sp.add_argument("run")
        sp.add_argument("--max-steps", type=count_at_least(1))
        sp.add_argument("--max-concurrency", type=count_at_least(1))
        sp.add_argument("--max-retries", type=count_at_least(0), default=0)
    add("status", cmd_status, "show a run (or list runs)").add_argument("run", nargs="?")
    ls = add("list", cmd_list, "list runs")
    ls.add_argument("--limit", type=count_at_least(1))
    ls.add_argument("--all", action="store_true", help="child runs too (with their parent)")
    for name, fn in (("journal", cmd_journal), ("events", cmd_events)):
        sp = add(name, fn, f"print a run's {name}")
        sp.add_argument("run")
        sp.add_argument("--format", choices=["table", "csv", "json"], default="table")
    t = add("tokens", cmd_tokens, "token accounting of a run")
    t.add_argument("run")
    t.add_argument(
        "--by", choices=["step", "model", "runner", "loop", "run", "phase"], default="step"
    )
    t.add_argument("--format", choices=["table", "csv", "json"], default="table")
    add("abandon", cmd_abandon, "give up a run").add_argument("run")
    f = add("fork", cmd_fork, "re-run from a step, reusing everything before it")
    f.add_argument("run")
    f.add_argument("--from", dest="from_step", required=True, metavar="STEP")
    f.add_argument("--max-steps", type=count_at_least(1))
    for name, fn in (("approve", cmd_approve), ("reject", cmd_reject)):
        sp = add(name, fn, f"{name} a blocked gate")
        sp.add_argument("run")
        sp.add_argument("step")
        sp.add_argument("--feedback", required=name == "reject")
        sp.add_argument("--loop", type=int, help="the loop you are deciding (refused if stale)")
    add("stop", cmd_stop, "ask a run's driver to stop between units").add_argument("run")
    g = add("gc", cmd_gc, "delete finished runs older than a retention")
    retention = g.add_mutually_exclusive_group(required=True)
    retention.add_argument("--older-than-days", type=float, metavar="N")
    retention.add_argument(
        "--older-than", type=duration_s, metavar="DURATION", help="e.g. 30d, 12h, 45m, 90s"
    )
    add(
        "export-cassette",
        cmd_export_cassette,
        "print a run's answers as JSONL for the replay runner",
    ).add_argument("run")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``wf`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    engine = Engine(args.db)
    try:
        return int(args.fn(engine, args))
    except BrokenPipeError:
        # stdout went away (`wf run F | head -1`): stop quietly, as a SIGPIPE'd tool would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except KeyboardInterrupt:
        print("interrupted: the run stays active; `wf resume` continues it", file=sys.stderr)
        return EXIT_INTERRUPTED
    except WorkflowError as exc:
        if args.debug:
            raise
        code = error_exit_code(exc)
        print(f"error: {exc}", file=sys.stderr)
        return code
    finally:
        engine.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
