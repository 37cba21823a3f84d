"""The one table of verbs and their options: the ``wf`` parser and the ``%workflow`` parser.

Each verb and option is written once, marked with the faces that have it: ``cli`` (the
``wf`` command) and ``notebook`` (the ``%workflow`` line magic). The faces build their
argparse parsers from :data:`VERBS` with :func:`add_verb_parsers` and route the parsed
``command`` to their own functions. The value parsers they share (``k=v`` params, counts,
durations, argv that is not UTF-8) are ``arg_values.py``'s.

This module sits between the faces and the engine: it imports only the stdlib,
``wf_magic.arg_values`` and the table's parts (``verb_table.py``: the shape and the shared
options; ``sweep_verbs.py``: the sweep verbs).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .arg_values import SECONDS_MAX, count_at_least, duration_s, number_in
from .sweep_verbs import SWEEP_VERBS
from .verb_table import (
    BACKGROUND,
    CLI,
    FEEDBACK,
    FORMAT,
    IDLE_S,
    LOOP,
    MAX_CONCURRENCY,
    MAX_RETRIES,
    MAX_STEPS,
    NOTEBOOK,
    QUIET,
    RESUPPLY_PARAM,
    RUN,
    SKIP_IF_LOCKED,
    STEP,
    TOKENS_BY,
    Face,
    OneOf,
    Option,
    Verb,
)

# -- the table ----------------------------------------------------------------------------------
GLOBAL_OPTIONS: tuple[Option, ...] = (
    Option(flag="--db", help="state dir (default $WF_MAGIC_HOME or ./.wf_magic)", faces=CLI),
    Option(flag="--debug", action="store_true", help="show tracebacks", faces=CLI),
)
"""Options of the whole command rather than one verb (accepted before or after the verb)."""

VERBS: tuple[Verb, ...] = (
    Verb(
        name="run",
        help="run a workflow file or library name (resumes its unfinished run if unchanged)",
        faces=CLI,  # the notebook runs a workflow with the %%workflow cell magic
        options=(
            Option(
                flag="file",
                metavar="FILE|NAME",
                help="the workflow's YAML file, or a name in the workflow library "
                "($WF_MAGIC_PATH folders, ./workflows, the $WF_MAGIC_INDEX index)",
            ),
            Option(
                flag="--param",
                action="append",
                metavar="K=V",
                help="a workflow param (repeatable); values are coerced to the declared type",
            ),
            Option(flag="--new", action="store_true", help="always start a fresh run"),
            Option(flag="--no-cache", action="store_true", help="no result reuse across runs"),
            Option(
                flag="--key",
                metavar="K",
                help="a launch key: a later run with K and the same request returns that run",
            ),
            MAX_STEPS,
            MAX_CONCURRENCY,
            MAX_RETRIES,
            QUIET,
            replace(SKIP_IF_LOCKED, faces=CLI),
            Option(flag="--dry-run", action="store_true", help="freeze and show the plan only"),
            Option(
                flag="--refresh",
                action="store_true",
                help="refetch the workflow library's index now (ignore its cache TTL)",
            ),
            Option(
                flag="--replay",
                metavar="CASSETTE",
                help="answer every prompt step, judge and agent call from this cassette "
                "(`wf export-cassette RUN`): offline, at no cost",
            ),
        ),
    ),
    Verb(
        name="list",
        help="list the newest runs (a sweep's cells on one line per sweep) and count the rest",
        options=(
            Option(
                flag="--limit",
                type=count_at_least(1),
                metavar="N",
                help="the newest N (default 50)",
            ),
            Option(
                flag="--all",
                action="store_true",
                help="every run: no limit, child runs (with their parent) and sweep cells each "
                "on a line",
            ),
            Option(
                flag="--sweep",
                metavar="SWEEP",
                help="only this sweep's cells (a sweep id or a unique prefix), newest first",
            ),
            OneOf(
                options=(
                    Option(
                        flag="--mine",
                        action="store_true",
                        help="only your runs (and unowned ones from before owners were kept)",
                    ),
                    Option(
                        flag="--all-users",
                        action="store_true",
                        help="every user's runs (the default); the owner column says whose",
                    ),
                ),
                required=False,
            ),
        ),
    ),
    Verb(
        name="status",
        help="show a run (or list runs)",
        options=(
            replace(RUN, nargs="?", faces=CLI),  # `wf status` alone lists the runs
            replace(RUN, faces=NOTEBOOK),
        ),
    ),
    Verb(
        name="resume",
        help="drive an existing run",
        options=(
            RUN,
            MAX_STEPS,
            MAX_CONCURRENCY,
            MAX_RETRIES,
            QUIET,
            BACKGROUND,
            RESUPPLY_PARAM,
            SKIP_IF_LOCKED,
        ),
    ),
    Verb(
        name="fork",
        help="re-run from a step, reusing everything before it",
        options=(
            RUN,
            Option(flag="--from", dest="from_step", required=True, metavar="STEP"),
            MAX_STEPS,
            BACKGROUND,
            RESUPPLY_PARAM,
        ),
    ),
    Verb(
        name="abandon",
        help="give up a run",
        options=(
            RUN,
            Option(
                flag="--reason",
                metavar="TEXT",
                help="why (the run's status reason)",
                faces=NOTEBOOK,
            ),
        ),
    ),
    Verb(name="approve", help="approve a blocked gate", options=(RUN, STEP, FEEDBACK, LOOP)),
    Verb(
        name="reject",
        help="reject a blocked gate",
        options=(RUN, STEP, replace(FEEDBACK, required=True), LOOP),
    ),
    Verb(name="stop", help="ask a run's driver to stop between units", options=(RUN,)),
    Verb(
        name="adopt",
        help="make another user's run yours, so you may resume, decide, stop, abandon or fork it",
        options=(RUN,),
    ),
    Verb(
        name="journal",
        help="print a run's journal",
        options=(
            RUN,
            FORMAT,
            Option(
                flag="--all",
                action="store_true",
                help="every column (a table shows a compact set by default; csv and json "
                "always have every column)",
            ),
        ),
    ),
    Verb(
        name="tokens",
        help="token accounting of a run",
        options=(
            RUN,
            Option(
                flag="--by",
                choices=TOKENS_BY,
                default="step",
                nargs="?",
                const="step",
                help="the grouping key",
            ),
            FORMAT,
        ),
    ),
    Verb(
        name="calls",
        help="print one row per model call of a run's agent attempts (made through the bridge)",
        options=(RUN, Option(flag="--unit", metavar="UNIT", help="only this unit"), FORMAT),
        faces=CLI,
    ),
    Verb(
        name="events",
        help="print a run's events (after a cursor, following the run until it settles)",
        options=(
            RUN,
            FORMAT,
            Option(
                flag="--since",
                type=count_at_least(0),
                metavar="CURSOR",
                help="only events after this cursor (an event id, as printed by --follow)",
            ),
            Option(
                flag="--follow",
                action="store_true",
                help="keep printing new events until the run settles; the cursor to resume "
                "from is printed last on stderr (`cursor: N`)",
                faces=CLI,
            ),
            Option(
                flag="--idle",
                dest="idle_s",
                type=IDLE_S,
                default=10.0,
                metavar="S",
                help="with --follow: stop after S seconds of an active run without a driver",
                faces=CLI,
            ),
        ),
    ),
    Verb(
        name="show",
        help="what one attempt of a unit was sent, answered and cost",
        options=(
            RUN,
            Option(flag="unit", help="a unit id of the run, e.g. draft[2] or outline.gate:l1"),
            Option(
                flag="--attempt", type=count_at_least(1), metavar="N", help="default: the newest"
            ),
            Option(
                flag="--format",
                choices=("text", "json"),
                default="text",
                help="how to print the attempt",
                faces=CLI,
            ),
        ),
    ),
    Verb(
        name="diff",
        help="units whose input differs between two runs, with the diff and the token delta",
        options=(
            Option(flag="run", help="the earlier run (id or unique prefix)"),
            Option(flag="other", help="the later run (id or unique prefix)"),
            Option(flag="--unit", metavar="UNIT", help="only this unit"),
        ),
    ),
    Verb(
        name="compare",
        help="two runs side by side: per unit both outputs (every loop), changed/new/removed/"
        "reused, token and cost deltas",
        options=(
            Option(flag="run", help="the earlier run (id, unique prefix or workflow name)"),
            Option(flag="other", help="the later run (id, unique prefix or workflow name)"),
            Option(
                flag="--all",
                action="store_true",
                help="list every unit, not only the ones that differ",
            ),
            Option(
                flag="--format",
                choices=("text", "json"),
                default="text",
                help="how to print the comparison",
                faces=CLI,
            ),
        ),
    ),
    Verb(
        name="budget",
        help="a run's budget: used vs limit per ceiling",
        faces=NOTEBOOK,
        options=(RUN,),
    ),
    Verb(
        name="watch",
        help="follow a run driven elsewhere (e.g. by `wf run`) until it settles; "
        "`wf watch RUN` prints its events as `wf events RUN --follow` does",
        options=(
            RUN,
            Option(
                flag="--idle",
                dest="idle_s",
                type=IDLE_S,
                default=10.0,
                metavar="S",
                help="stop watching after S seconds without a driver",
            ),
        ),
    ),
    Verb(
        name="gc",
        help="delete finished runs older than a retention",
        options=(
            OneOf(
                options=(
                    Option(
                        flag="--older-than-days",
                        type=number_in(0, SECONDS_MAX / 86400),
                        metavar="N",
                    ),
                    Option(
                        flag="--older-than",
                        dest="older_than_s",
                        type=duration_s,
                        metavar="DURATION",
                        help="e.g. 30d, 12h, 45m, 90s",
                    ),
                )
            ),
            Option(
                flag="--status",
                dest="statuses",
                action="append",
                choices=("completed", "failed", "abandoned"),
                help="only runs of this status (repeatable; default: every finished status)",
                faces=CLI,
            ),
            Option(
                flag="--dry-run",
                action="store_true",
                help="list what would be deleted; delete nothing",
                faces=CLI,
            ),
            Option(
                flag="--vacuum",
                action="store_true",
                help="afterwards rebuild the file to return freed space",
                faces=CLI,
            ),
        ),
    ),
    Verb(
        name="use",
        help="load a workflow from the library by name: cells may then call it as a child "
        "(`workflow: NAME`), and a workflow cell holding just NAME runs it",
        faces=NOTEBOOK,
        options=(
            Option(
                flag="run",  # the positional lands on LineArgs.run, as every verb's first one
                metavar="NAME",
                help="a workflow name ($WF_MAGIC_PATH folders, ./workflows, $WF_MAGIC_INDEX)",
            ),
        ),
    ),
    Verb(name="config", help="show the magics' settings", faces=NOTEBOOK),
    Verb(
        name="check",
        help="freeze workflow files and print each one's plan hash or error; writes nothing",
        faces=CLI,
        options=(Option(flag="files", nargs="+", metavar="FILE", help="workflow YAML files"),),
    ),
    Verb(
        name="new",
        help="write a commented starter workflow NAME.yaml that runs offline as written",
        faces=CLI,
        options=(
            Option(flag="name", metavar="NAME", help="the workflow name (or a path NAME.yaml)"),
            Option(
                flag="--kind",
                choices=("prompt", "map", "gate"),
                default="prompt",
                help="what the starter shows",
            ),
            Option(flag="--force", action="store_true", help="overwrite an existing file"),
        ),
    ),
    Verb(
        name="export-cassette",
        help="print a run's answers as JSONL for the replay runner",
        faces=CLI,
        options=(RUN,),
    ),
    Verb(
        name="export-otel",
        help="send runs as OpenTelemetry GenAI traces to an OTLP/HTTP endpoint (docs/otel.md)",
        faces=CLI,
        options=(
            Option(flag="run", nargs="+", metavar="RUN", help="run ids, or unique prefixes"),
            Option(
                flag="--endpoint",
                required=True,
                metavar="URL",
                help="the receiver, e.g. http://127.0.0.1:4318 (/v1/traces is appended)",
            ),
            Option(
                flag="--headers",
                nargs="+",
                action="append",
                metavar="K=V",
                help="headers for the receiver (a collector's auth), repeatable",
            ),
            Option(
                flag="--content",
                action="store_true",
                help="attach prompts and outputs (redacted); off by default",
            ),
            Option(
                flag="--timeout",
                type=number_in(0.1, 600.0),
                default=10.0,
                metavar="S",
                help="seconds a receiver has to take each request, retries included",
            ),
        ),
    ),
    *SWEEP_VERBS,
)
"""Every verb of either face, in the order the help lists them."""


# -- building parsers ---------------------------------------------------------------------------
def verb_names(face: Face) -> tuple[str, ...]:
    """The verbs ``face`` has, in table order."""
    return tuple(v.name for v in VERBS if face in v.faces)


def add_global_options(
    parser: argparse.ArgumentParser, face: Face, *, after_verb: bool = False
) -> None:
    """Add :data:`GLOBAL_OPTIONS` of ``face`` to ``parser``.

    ``after_verb`` builds the copy each verb's parser inherits (``wf list --db DIR``): its
    defaults are SUPPRESSed so that a value given before the verb is not reset by the verb's.
    """
    for option in GLOBAL_OPTIONS:
        if face in option.faces:
            extra = {"default": argparse.SUPPRESS} if after_verb else {}
            parser.add_argument(option.flag, **{**_argparse_kwargs(option), **extra})


def add_verb_parsers(
    parser: argparse.ArgumentParser,
    face: Face,
    *,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> dict[str, argparse.ArgumentParser]:
    """Add one required sub-parser per verb of ``face`` (``dest="command"``) to ``parser``.

    The sub-parsers are of ``parser``'s class and share its ``add_help``.

    Returns:
        The sub-parser of each verb, by name (a face sets its handler on them).
    """
    sub = parser.add_subparsers(dest="command", required=True)
    out: dict[str, argparse.ArgumentParser] = {}
    for verb in VERBS:
        if face not in verb.faces:
            continue
        sp = sub.add_parser(
            verb.name,
            help=_plain(verb.help),
            parents=list(parents),
            add_help=parser.add_help,
        )
        for item in verb.options:
            if isinstance(item, OneOf):
                group = sp.add_mutually_exclusive_group(required=item.required)
                for option in item.options:
                    if face in option.faces:
                        group.add_argument(option.flag, **_argparse_kwargs(option))
            elif face in item.faces:
                sp.add_argument(item.flag, **_argparse_kwargs(item))
        out[verb.name] = sp
    return out


def _plain(text: str | None) -> str | None:
    """A help text of the table as argparse prints it verbatim (it %-formats help: ``95 %``
    would fail ``wf --help``); the table holds plain text, as ``%workflow?`` shows it."""
    return None if text is None else text.replace("%", "%%")


def _argparse_kwargs(option: Option) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "help": _plain(option.help),
        "type": option.type,
        "choices": option.choices,
        "action": option.action,
        "nargs": option.nargs,
        "const": option.const,
        "dest": option.dest,
        "metavar": option.metavar,
    }
    out = {k: v for k, v in kwargs.items() if v is not None}
    if option.default is not None:
        out["default"] = option.default
    if option.required:
        out["required"] = True
    return out
