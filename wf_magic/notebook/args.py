"""Parse ``%%workflow`` and ``%workflow`` arguments into frozen dataclasses (no engine calls)."""

from __future__ import annotations

import argparse
import functools
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ..arg_values import parse_params
from ..errors import UsageError
from ..verb_table import OneOf, Option
from ..verbs import VERBS, add_verb_parsers, verb_names

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True, slots=True, kw_only=True)
class CellArgs:
    """The options of one ``%%workflow`` cell."""

    name: str | None = None
    """The workflow name when the YAML has no ``name:`` (checked against it when it has)."""
    params: dict[str, Any]
    """``--param k=v`` strings merged over the ``--params VAR`` mapping."""
    new: bool = False
    resume: str | None = None
    max_steps: int | None = None
    dry_run: bool = False
    no_cache: bool = False
    background: bool = False
    as_var: str | None = None


def cell_args(ns: argparse.Namespace, user_ns: Mapping[str, Any]) -> CellArgs:
    """Build :class:`CellArgs` from the magic_arguments namespace of a ``%%workflow`` line.

    Raises:
        UsageError: a malformed ``--param``, a ``--params`` name that is not a mapping in the
            notebook, a bad ``--as`` name, or contradictory flags.
    """
    params: dict[str, Any] = {}
    if ns.params is not None:
        value = user_ns.get(ns.params)
        if not isinstance(value, Mapping):
            got = "undefined" if ns.params not in user_ns else type(value).__name__
            raise UsageError(
                f"--params expects the name of a dict in the notebook (got {ns.params!r}: {got})"
            )
        params.update(value)
    params.update(parse_params(ns.param or ()))
    if ns.as_var is not None and not _IDENTIFIER.match(ns.as_var):
        raise UsageError(f"--as expects a Python variable name (got {ns.as_var!r})")
    if ns.new and ns.resume:
        raise UsageError("--new and --resume contradict each other; pick one")
    if ns.resume and (params or ns.no_cache):
        given = ", ".join(
            flag for flag, on in (("--param/--params", params), ("--no-cache", ns.no_cache)) if on
        )
        raise UsageError(
            f"--resume drives run {ns.resume} as it was started, so {given} cannot apply; "
            "drop them, or start a new run with them (--new)"
        )
    if ns.max_steps is not None and ns.max_steps < 1:
        raise UsageError(f"--max-steps expects a positive number (got {ns.max_steps})")
    return CellArgs(
        name=ns.name,
        params=params,
        new=ns.new,
        resume=ns.resume,
        max_steps=ns.max_steps,
        dry_run=ns.dry_run,
        no_cache=ns.no_cache,
        background=ns.background,
        as_var=ns.as_var,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LineArgs:
    """The options of one ``%workflow COMMAND ...`` line (unused fields keep their default)."""

    command: str
    run: str | None = None
    step: str | None = None
    from_step: str | None = None
    feedback: str | None = None
    loop: int | None = None
    by: str = "step"
    reason: str | None = None
    max_steps: int | None = None
    background: bool = False
    older_than_days: float | None = None
    older_than_s: float | None = None
    """``gc --older-than DURATION`` (the CLI's spelling) in seconds."""
    idle_s: float = 10.0
    since: int | None = None
    """``events --since CURSOR``: only events with a greater id."""
    limit: int | None = None
    all: bool = False
    unit: str | None = None
    attempt: int | None = None
    other: str | None = None
    skip_if_locked: bool = False
    """``resume --skip-if-locked``: another driver holding the run is said, not raised."""
    mine: bool = False
    """``list --mine``: only the current user's runs (and nobody's)."""
    all_users: bool = False
    """``list --all-users``: every user's runs (the default)."""
    sweep: str | None = None
    """``list --sweep SWEEP``: only that sweep's cells."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser that raises :class:`UsageError` instead of exiting the kernel."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"%workflow {self.prog.split()[-1]}: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise UsageError(message or self.format_usage())


@functools.cache
def _line_parser() -> _Parser:
    parser = _Parser(prog="%workflow", add_help=False)
    add_verb_parsers(parser, "notebook")
    return parser


COMMANDS = verb_names("notebook")
"""The ``%workflow`` verbs, in the order of the table in verbs.py."""


def line_args(command: str, rest: str | Sequence[str]) -> LineArgs:
    """Parse the arguments after ``%workflow COMMAND``.

    Raises:
        UsageError: an unknown command or malformed arguments.
    """
    if command not in COMMANDS:
        raise UsageError(
            f"%workflow: unknown command {command!r}; commands: "
            f"{', '.join(COMMANDS)} (`%workflow?` shows the help)"
        )
    argv = shlex.split(rest) if isinstance(rest, str) else list(rest)
    if command == "status" and not argv:
        command = "list"  # `%workflow status` alone lists the runs, as `wf status` does
    ns, extra = _line_parser().parse_known_args([command, *argv])
    if extra:  # said here, as the verb's parser would, so the message names the verb
        raise UsageError(f"%workflow {command}: unrecognized arguments: {' '.join(extra)}")
    return LineArgs(**vars(ns))


# -- help --------------------------------------------------------------------------------------
def line_help(*, cell_usage: str = "") -> str:
    """The ``%workflow`` docstring (``%workflow?``): every notebook verb and option, built from
    the table in verbs.py so that the help cannot fall behind the parser; ``cell_usage`` (the
    ``%%workflow`` parser's usage) adds the cell's options."""
    lines = []
    for verb in VERBS:
        if "notebook" not in verb.faces:
            continue
        words = [f"%workflow {verb.name}"]
        for item in verb.options:
            if isinstance(item, OneOf):
                shown = [_usage(o, bare=True) for o in item.options if "notebook" in o.faces]
                text = " | ".join(shown)
                words.append(text if item.required else f"[{text}]")
            elif "notebook" in item.faces:
                words.append(_usage(item))
        lines.append(f"    {' '.join(words)}\n        {verb.help}")
    cell = ""
    if cell_usage.strip():
        usage = " ".join(cell_usage.replace("::", "").split())
        cell = f"\n\nA cell runs a workflow (``%%workflow?`` explains each option)::\n\n    {usage}"
    return (
        "Manage workflow runs.\n\nCommands::\n\n"
        + "\n".join(lines)
        + "\n\nRUN may be a run id, a unique prefix of one or a workflow name (its newest"
        " run); `%workflow status` alone lists the runs. COMMAND defaults to list." + cell + "\n"
    )


def _usage(option: Option, *, bare: bool = False) -> str:
    """``RUN``, ``[--feedback TEXT]``, ``--from STEP``, ``[--by [step|model|...]]``."""
    if not option.flag.startswith("-"):
        name = option.metavar or option.flag.upper()
        return f"[{name}]" if option.nargs == "?" else name
    value = ""
    if option.action != "store_true":
        value = "|".join(option.choices) if option.choices else option.metavar or "VALUE"
        value = f" [{value}]" if option.nargs == "?" else f" {value}"
    text = f"{option.flag}{value}"
    return text if option.required or bare else f"[{text}]"
