"""How a ``wf`` command reports what went wrong: one ``error:`` line with every secret masked,
its exit code, a warning as one line, and an exit past unit threads an interrupt left stuck."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, TextIO

from .errors import WorkflowError, clip_message
from .exits import EXIT_INTERRUPTED, error_exit_code
from .visible import visible

if TYPE_CHECKING:
    from .redact import Redactor
    from .store import Store


def report_error(args: argparse.Namespace, exc: WorkflowError, store: Store | None = None) -> int:
    """Print ``exc`` as one masked ``error:`` line and return its exit code (``--debug``: its
    traceback first, masked the same way; the exit code stays what it is without)."""
    if args.debug:
        debug_traceback(args, exc, store)
    text = masked(str(exc), store, args) if store is not None else redactor(args).redact(str(exc))
    print(f"error: {visible(clip_message(text))}", file=sys.stderr)
    return error_exit_code(exc)


def debug_traceback(args: argparse.Namespace, exc: BaseException, store: Store | None) -> None:
    """``--debug``: the traceback of ``exc`` on stderr, every secret masked as in the error
    line (a traceback quotes the messages and arguments of its frames)."""
    import traceback

    text = "".join(traceback.format_exception(exc))
    shown = masked(text, store, args) if store is not None else redactor(args).redact(text)
    print(shown, end="" if shown.endswith("\n") else "\n", file=sys.stderr)


def masked(text: str, store: Store, args: argparse.Namespace) -> str:
    """An error line with every secret masked as the journal masks it: the environment's, the
    secret params this command was handed (``--param api_key=...``, ``conf={"gh_token": ...}``,
    however nested) and credential shapes."""
    from .redact import is_secret_key, secret_strings

    given: dict[str, object] = {}
    for pair in getattr(args, "param", None) or ():
        name, _, value = pair.partition("=")
        given[name.strip()] = value
        if not is_secret_key(name.strip()):
            try:
                given[name.strip()] = json.loads(value)
            except ValueError:
                pass
    return store.scrubber.redactor(None).with_secrets(secret_strings(given)).redact(text)


def command_text(args: argparse.Namespace) -> str:
    """The command an unexpected error names: the verb and what it was given to act on
    (never option values: a ``--param`` or ``--feedback`` may hold a secret)."""
    named = [getattr(args, dest, None) for dest in ("file", "run", "unit", "other")]
    return shlex.join(["wf", str(args.command), *(str(v) for v in named if v is not None)])


def redactor(args: argparse.Namespace) -> Redactor:
    """Masks the environment's secrets and the secret-looking ``--param`` values."""
    from .redact import Redactor, is_secret_key

    pairs = (str(p).partition("=") for p in getattr(args, "param", None) or ())
    return Redactor.from_environ(extra=[v for k, _, v in pairs if is_secret_key(k.strip())])


@contextmanager
def printable_stdout() -> Iterator[None]:
    """Text that is not UTF-8 (a lone surrogate in an output) prints escaped, never raises."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    errors = getattr(sys.stdout, "errors", None)
    if reconfigure is None or errors is None:
        yield
        return
    reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        with suppress(ValueError):  # closed meanwhile
            reconfigure(errors=errors)


def exit_past_stuck_units(store: Store) -> None:
    """End the process now when a unit thread still runs after an interrupt.

    The interpreter joins every thread-pool thread at exit, so a unit that never returns
    would keep the process alive for ever. Its attempt stays ``running`` (owed to the next
    drive, which reaps an exec unit's process group); everything journaled is committed.
    """
    stuck = [
        t
        for t in threading.enumerate()
        if t.name.startswith("wf-unit") and t.is_alive() and not t.daemon
    ]
    if not stuck:
        return
    store.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def unreadable_text(store: Store, args: argparse.Namespace, exc: Exception) -> str:
    """What to say about an SQLite error no layer translated: most likely a hand edit."""
    run = getattr(args, "run", None)
    head = f"Run {run}: " if run else ""
    first = " ".join((str(exc).splitlines() or [""])[0].split())
    return (
        f"{head}cannot read the state database {store.where} ({type(exc).__name__}: "
        f"{first}; integrity_check: {store.integrity_check()}); a row was probably "
        "edited by hand. Restore state.db from a backup or start afresh with "
        "`wf run FILE --new`; `--debug` shows the traceback."
    )


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Warnings on the command line are one ``warning: ...`` line, not a source listing."""
    print(f"warning: {visible(str(message))}", file=file or sys.stderr)
