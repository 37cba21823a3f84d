"""The shape of the verb table (``Verb``, ``Option``, ``OneOf``, the faces) and the options
several verbs share; ``verbs.py`` holds the table itself, ``sweep_verbs.py`` the sweep verbs.
Imports only the stdlib and ``wf_magic.arg_values``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .arg_values import count_at_least, number_in
from .errors import CONCURRENCY_MAX

Face = Literal["cli", "notebook"]
"""Where a verb or option exists:

- ``cli``: the ``wf`` command.
- ``notebook``: the ``%workflow`` line magic.
"""
CLI: frozenset[Face] = frozenset({"cli"})
NOTEBOOK: frozenset[Face] = frozenset({"notebook"})
BOTH: frozenset[Face] = CLI | NOTEBOOK

TOKENS_BY: tuple[str, ...] = ("step", "model", "runner", "loop", "run", "phase")
"""The keys ``tokens --by`` groups by; the same keys ``store.frames.tokens_frame`` accepts."""
FORMATS: tuple[str, ...] = ("table", "csv", "json")
"""How the ``wf`` command prints a frame (``--format``)."""


# --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One positional argument (``flag`` without dashes) or ``--option`` of a verb."""

    flag: str
    """``run`` (a positional) or ``--max-steps`` (an option)."""
    help: str | None = None
    type: Callable[[str], object] | None = None
    """Turns the text into the value (argparse ``type``); argparse reports its errors."""
    choices: tuple[str, ...] | None = None
    default: object = None
    action: Literal["store_true", "append", "extend"] | None = None
    nargs: Literal["?", "+"] | None = None
    const: object = None
    """The value of a bare ``--option`` when ``nargs`` is ``?``."""
    dest: str | None = None
    """The attribute the value lands on (default: argparse's, from ``flag``)."""
    metavar: str | None = None
    required: bool = False
    faces: frozenset[Face] = BOTH


@dataclass(frozen=True, slots=True, kw_only=True)
class OneOf:
    """Options that exclude each other (one of them is required when ``required``)."""

    options: tuple[Option, ...]
    required: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Verb:
    """One sub-command: ``wf NAME ...`` and/or ``%workflow NAME ...``."""

    name: str
    help: str
    options: tuple[Option | OneOf, ...] = ()
    faces: frozenset[Face] = BOTH


# -- options several verbs share ----------------------------------------------------------------
IDLE_S = number_in(0, 30 * 86400.0)
"""``--idle S``: seconds without a driver, from 0 to 30 days (a finite wait: ``nan`` never ends)."""

RUN = Option(flag="run", help="a run id, or a unique prefix of one")
STEP = Option(flag="step", help="a step id of the run")
MAX_STEPS = Option(
    flag="--max-steps", type=count_at_least(1), metavar="N", help="stop after N finished steps"
)
MAX_CONCURRENCY = Option(
    flag="--max-concurrency",
    type=count_at_least(1, CONCURRENCY_MAX),
    metavar="N",
    help="cap on units in flight",
    faces=CLI,
)
QUIET = Option(
    flag="--quiet",
    action="store_true",
    help="no progress lines while driving (the summary is still printed)",
    faces=CLI,
)
MAX_RETRIES = Option(
    flag="--max-retries",
    type=count_at_least(0),
    default=0,
    metavar="N",
    help="re-open the run up to N times after a unit failure",
    faces=CLI,
)
RESUPPLY_PARAM = Option(
    flag="--param",
    action="append",
    metavar="K=V",
    help="a secret param of the run again (its value is never stored; repeatable)",
    faces=CLI,
)
SKIP_IF_LOCKED = Option(
    flag="--skip-if-locked",
    action="store_true",
    help="when another driver holds the run, say who and exit 0 instead of 75 (for cron)",
)
BACKGROUND = Option(
    flag="--background",
    action="store_true",
    help="drive in a thread; the notebook stays usable",
    faces=NOTEBOOK,
)
FEEDBACK = Option(flag="--feedback", metavar="TEXT", help="what the step should change")
LOOP = Option(
    flag="--loop",
    type=count_at_least(1),
    metavar="N",
    help="the loop you are deciding (refused if stale)",
)
FORMAT = Option(
    flag="--format", choices=FORMATS, default="table", help="how to print the frame", faces=CLI
)
