"""The ``wf`` command: argparse → Engine, with one table mapping errors to exit codes."""

from __future__ import annotations

import argparse
import os
import signal as signals
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from .arg_values import argv_problem, parse_params
from .cli_errors import (
    command_text,
    debug_traceback,
    exit_past_stuck_units,
    masked,
    printable_stdout,
    redactor,
    report_error,
    show_warning,
    unreadable_text,
)
from .cli_reads import (
    RunLister,
    cmd_calls,
    cmd_compare,
    cmd_diff,
    cmd_events,
    cmd_export_cassette,
    cmd_export_otel,
    cmd_journal,
    cmd_list,
    cmd_show,
    cmd_status,
    cmd_tokens,
    cmd_watch,
    print_run,
    say,
    warn,
)
from .errors import RunAbandoned, RunLockHeld, WorkflowError, clip_message, unexpected_text
from .exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from .sweep_cli import SWEEP_HANDLERS
from .verbs import add_global_options, add_verb_parsers

# The engine, the plan models (pydantic), Jinja and pandas are imported inside the verbs
# that use them, not here, for start-up time: `wf --help` and `wf list` never load them.
if TYPE_CHECKING:
    from .engine import Engine
    from .spec.workflow import Workflow


def _tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _drive(
    engine: Engine, run_id: str, args: argparse.Namespace, live_source: Workflow | None = None
) -> int:
    stop = threading.Event()
    previous = {sig: signals.getsignal(sig) for sig in (signals.SIGTERM, signals.SIGINT)}

    def on_signal(signum: int, frame: object) -> None:
        if stop.is_set():
            # A second Ctrl-C or SIGTERM: stop now (exit 130); the units in flight are owed.
            raise KeyboardInterrupt
        stop.set()
        again = "Ctrl-C" if signum == signals.SIGINT else "SIGTERM"
        print(
            f"stopping after the units in flight ({again} again to stop at once)", file=sys.stderr
        )

    for sig in previous:
        signals.signal(sig, on_signal)
    from .progress import ProgressPrinter

    # Progress goes to stderr, so stdout stays the run's summary and result (pipe-friendly).
    printer = None if getattr(args, "quiet", False) else ProgressPrinter(sys.stderr, tty=_tty())
    unsubscribe = engine.subscribe(printer) if printer is not None else None
    try:
        run = engine.drive(
            run_id,
            max_steps=getattr(args, "max_steps", None),
            signal=stop,
            max_concurrency=getattr(args, "max_concurrency", None),
            max_retries=getattr(args, "max_retries", 0) or 0,
            live_source=live_source,
            # `wf resume/fork --param`: secret params are never stored (`wf run` started the
            # run in this engine, which still holds them).
            params=parse_params(args.param or ()) if live_source is None else None,
            params_from_strings=True,
        )
    finally:
        for sig, handler in previous.items():
            signals.signal(sig, handler)
        if unsubscribe is not None and printer is not None:
            unsubscribe()
            printer.close()
    warn(run.warnings)
    code = print_run(run, say)
    return EXIT_INTERRUPTED if run.stopped_by == "signal" and run.status == "active" else code


def _importable(directory: Path) -> None:
    """Let ``python: module:function`` targets import modules beside the workflow file."""
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


def _load_run_source(engine: Engine, args: argparse.Namespace) -> Workflow:
    """The workflow ``wf run`` names: a file, else a library name (docs/library.md).

    Children ``workflow: NAME`` resolve through the same library. A library workflow's run
    records its origin (file path or URL) as ``source_path``; ``source_hash`` is its sha256.
    """
    from dataclasses import replace

    from .library import Library
    from .library_index import NAME_PATTERN

    ttl_s = 0.0 if args.refresh else None
    with Library.from_environ(store=engine.store, ttl_s=ttl_s) as library, library.using():
        target = Path(args.file)
        if target.is_file() or not NAME_PATTERN.match(args.file):
            # realpath, not resolve(): a loop of links is for the reader to refuse by name
            _importable(Path(os.path.realpath(target)).parent)
            return engine.load(target)
        found = library.find(args.file)
        if not getattr(args, "quiet", False):
            say(f"workflow {found.name}: {found.origin_text}", file=sys.stderr)
        if found.path is not None:
            _importable(found.path.parent)
            return engine.load(found.path)
        return replace(
            engine.load(found.source, source_name=found.origin), source_path=found.origin
        )


def _check_cassette(cassette: str) -> None:
    """Read ``--replay``'s cassette once before a run starts, so a broken or empty one is a
    usage error (exit 2, nothing written), not a run whose every unit fails.

    Raises:
        UsageError: a line is no recording, the file is not UTF-8 or too large, or it holds
            no recording at all.
    """
    from pathlib import Path

    from .errors import RunnerError, UsageError
    from .runners.cassette_calls import load_calls
    from .runners.replay import load_cassette

    path = Path(cassette).expanduser()
    try:
        found = len(load_cassette(path)) + len(load_calls(path))
    except RunnerError as exc:
        problem = str(exc).rstrip(".")
        raise UsageError(
            f"--replay {cassette}: {problem}; write it again with `wf export-cassette RUN`."
            if "export-cassette" not in problem
            else f"--replay {cassette}: {problem}."
        ) from None
    if not found:
        raise UsageError(
            f"--replay {cassette}: the cassette holds no recording; write one with "
            f"`wf export-cassette RUN > {cassette}` after a run against the real runners."
        )


def cmd_run(engine: Engine, args: argparse.Namespace) -> int:
    wf = _load_run_source(engine, args)
    if args.replay:
        from .spec.replaying import replayed

        wf = replayed(wf, args.replay)
        _check_cassette(args.replay)
    if args.dry_run:
        from .display import plan_text

        wf = engine.preview(wf, params=parse_params(args.param or ()), params_from_strings=True)
        say(plan_text(wf.plan, plan_hash=wf.plan_hash))
        return EXIT_OK
    started = engine.start(
        wf,
        params=parse_params(args.param or ()),
        new=args.new,
        no_cache=args.no_cache,
        params_from_strings=True,
        key=args.key,
    )
    for w in started.warnings:
        say(f"warning: {w}", file=sys.stderr)
    print(f"run {started.run_id} ({'new' if started.created else 'existing'})", flush=True)
    return _drive(engine, started.run_id, args, live_source=wf)


def cmd_resume(engine: Engine, args: argparse.Namespace) -> int:
    row = engine.get_run(engine.resolve_run_id(args.run))
    if row.status == "abandoned":
        raise RunAbandoned(row.run_id, reason=row.status_reason, verb="resume")
    source_path = row.source_path
    if source_path and "://" not in source_path:  # a library workflow's URL is no folder
        _importable(Path(source_path).parent)
    return _drive(engine, args.run, args)


def cmd_check(args: argparse.Namespace) -> int:
    """``FILE: ok PLAN_HASH`` or ``FILE:LINE: error: ...`` per file (wf_magic.spec.authoring)."""
    from .spec.authoring import check_file

    checks = [check_file(path) for path in args.files]
    for check in checks:
        say(check.text())
    return EXIT_OK if all(c.ok for c in checks) else EXIT_USAGE


def cmd_new(args: argparse.Namespace) -> int:
    from .spec.starters import write_starter

    path = write_starter(args.name, kind=args.kind, force=args.force)
    print(f"wrote {path} (a {args.kind} starter); `wf check {path}` then `wf run {path}`")
    return EXIT_OK


def cmd_abandon(engine: Engine, args: argparse.Namespace) -> int:
    warn(engine.handle(args.run).warnings)  # abandoning never decodes the plan
    rid = engine.resolve_run_id(args.run)
    done = engine.abandon(rid)
    below = ", ".join(r for r in done if r != rid)
    if rid not in done:  # abandoned before abandoning cascaded: its family is ended now
        print(f"run {rid} was already abandoned; abandoned its unfinished child run(s) {below}")
    else:
        with_children = f" with its unfinished child run(s) {below}" if below else ""
        print(f"run {rid} abandoned{with_children}")
    return EXIT_OK


def cmd_fork(engine: Engine, args: argparse.Namespace) -> int:
    run_id = engine.fork(
        args.run,
        from_step=args.from_step,
        params=parse_params(args.param or ()),  # its secrets checked before the fork exists
        params_from_strings=True,
    ).run_id
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
    from .display.run import stop_text

    row = engine.get_run(engine.resolve_run_id(args.run))
    if not engine.stop(row.run_id):
        print(f"run {row.run_id} is {row.status}; there is nothing to stop (nothing was changed)")
        return EXIT_OK
    print(stop_text(row.run_id, row.status, driven=engine.is_driving(row.run_id)))
    return EXIT_OK


def cmd_adopt(engine: Engine, args: argparse.Namespace) -> int:
    done = engine.adopt(args.run)
    if not done.adopted:
        print(f"run {done.run_id} is already yours ({done.owner}); nothing was changed")
        return EXIT_OK
    below = [r for r in done.adopted if r != done.run_id]
    with_children = f" with its child run(s) {', '.join(below)}" if below else ""
    print(
        f"adopted run {done.run_id}{with_children} from {done.previous_owner or 'nobody'}; "
        f"it is {done.owner}'s now"
    )
    return EXIT_OK


def cmd_gc(engine: Engine, args: argparse.Namespace) -> int:
    seconds = args.older_than_s if args.older_than_s is not None else args.older_than_days * 86400
    statuses = args.statuses or ("completed", "failed", "abandoned")

    def kept(run_id: str, why: str) -> None:
        say(f"kept {run_id}: {why}", file=sys.stderr)

    deleted = engine.gc(
        older_than_s=seconds,
        statuses=statuses,
        dry_run=args.dry_run,
        vacuum=args.vacuum,
        on_skip=kept,
    )
    for run_id in deleted:
        print(run_id)
    if args.dry_run:
        print(f"would delete {len(deleted)} finished run(s)")
    else:
        vacuumed = "; vacuumed" if args.vacuum else ""
        print(f"deleted {len(deleted)} finished run(s), receipts kept{vacuumed}")
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors exit with the exit-code table's ``EXIT_USAGE``."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


HANDLERS: dict[str, Callable[[Engine, argparse.Namespace], int]] = {
    "run": cmd_run,
    "list": cmd_list,
    "status": cmd_status,
    "resume": cmd_resume,
    "fork": cmd_fork,
    "abandon": cmd_abandon,
    "approve": cmd_approve,
    "reject": cmd_reject,
    "stop": cmd_stop,
    "adopt": cmd_adopt,
    "journal": cmd_journal,
    "tokens": cmd_tokens,
    "calls": cmd_calls,
    "events": cmd_events,
    "watch": cmd_watch,
    "show": cmd_show,
    "diff": cmd_diff,
    "compare": cmd_compare,
    "gc": cmd_gc,
    "export-cassette": cmd_export_cassette,
    "export-otel": cmd_export_otel,
    **SWEEP_HANDLERS,
}
"""The function behind each ``wf`` verb of the table in verbs.py that reads or writes runs."""

AUTHORING: dict[str, Callable[[argparse.Namespace], int]] = {"check": cmd_check, "new": cmd_new}
"""The verbs that need no state dir: nothing is opened or created for them."""


def build_parser() -> argparse.ArgumentParser:
    """The ``wf`` argument parser, built from the verb table (verbs.py)."""
    p = _Parser(prog="wf", description="Durable LLM-agent workflows.")
    add_global_options(p, "cli")
    common = argparse.ArgumentParser(add_help=False)
    add_global_options(common, "cli", after_verb=True)
    for name, sp in add_verb_parsers(p, "cli", parents=[common]).items():
        if name in AUTHORING:
            sp.set_defaults(authoring=AUTHORING[name])
        else:
            sp.set_defaults(fn=HANDLERS[name])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``wf`` console script; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    problem = argv_problem(words)  # stored as UTF-8 text in state.db: refused before anything
    if problem is not None:
        print(f"wf: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser()
    rest, params = _take_params(words)
    args = parser.parse_args(rest)
    if params:
        if not hasattr(args, "param"):  # a verb without --param: argparse says so
            args = parser.parse_args(words)
        args.param = [*(args.param or ()), *params]
    if getattr(args, "authoring", None) is not None:
        return _authoring(args)
    with printable_stdout():
        return _main(args, words)


def _take_params(words: list[str]) -> tuple[list[str], list[str]]:
    """``words`` without their ``--param K=V`` pairs, and those values in order.

    argparse rescans the indices of every option left for each option it consumes, which
    is quadratic: 100 000 ``--param`` took a quarter of an hour to parse. Taken out first,
    they cost a pass (``--`` ends the options, as for argparse).
    """
    rest: list[str] = []
    params: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            rest.extend(words[i:])
            break
        if word == "--param" and i + 1 < len(words) and not words[i + 1].startswith("--"):
            params.append(words[i + 1])
            i += 2
            continue
        if word.startswith("--param="):
            params.append(word.removeprefix("--param="))
        else:
            rest.append(word)
        i += 1
    return rest, params


def _main(args: argparse.Namespace, words: list[str]) -> int:
    from .store import Store
    from .store.db import default_state, store_target

    target: RunLister
    engine = None
    try:
        if args.fn is cmd_list or (args.fn is cmd_status and args.run is None):
            # Listing runs needs only the Store: the engine is never imported (start-up time).
            store = Store(store_target(args.db if args.db else default_state()))
            target = store
        else:
            from .engine import Engine

            engine = Engine(args.db)
            store, target = engine.store, engine
    except WorkflowError as exc:  # a state that names no folder or server (--db, WF_MAGIC_HOME)
        return report_error(args, exc)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show_warning
            return int(args.fn(target, args))
    except BrokenPipeError:
        # stdout went away (`wf run F | head -1`): stop quietly, as a SIGPIPE'd tool would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except KeyboardInterrupt:
        print("interrupted: the run stays active; `wf resume` continues it", file=sys.stderr)
        exit_past_stuck_units(store)
        return EXIT_INTERRUPTED
    except RunLockHeld as exc:
        if not getattr(args, "skip_if_locked", False):
            return report_error(args, exc)
        # A cron job firing while the previous one still drives the run is not an error.
        print(f"run {exc.run_id} is being driven by {exc.holder}; skipped (--skip-if-locked)")
        return EXIT_OK
    except WorkflowError as exc:
        return report_error(args, exc, store)
    except Exception as exc:  # noqa: BLE001 - an error no layer translated: one line, not a wall
        if args.debug:
            debug_traceback(args, exc, store)
        from .store.faults import is_state_db_fault

        text = (
            unreadable_text(store, args, exc)
            if is_state_db_fault(exc)
            else unexpected_text(exc, command=command_text(args))
        )
        say(f"error: {clip_message(masked(text, store, args))}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        # The engine's close gives a live OpenTelemetry export its last seconds (the run's
        # root span settles last) and says a failing collector's one warning line.
        if engine is not None:
            engine.close()
        else:
            store.close()


def _authoring(args: argparse.Namespace) -> int:
    """An authoring verb (no state dir): its errors end it as ``_main``'s do, in one line."""
    try:
        return int(args.authoring(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except WorkflowError as exc:
        return report_error(args, exc)
    except Exception as exc:  # noqa: BLE001 - an error no layer translated: one line, not a wall
        if args.debug:
            debug_traceback(args, exc, None)
        text = unexpected_text(exc, command=command_text(args))
        say(f"error: {clip_message(redactor(args).redact(text))}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
