"""The sweep verbs of the verb table (docs/sweeps.md, docs/evaluations.md); their handlers
are in ``wf_magic.sweep_cli``."""

from __future__ import annotations

from dataclasses import replace

from .arg_values import count_at_least, number_in
from .verb_table import CLI, FORMAT, MAX_CONCURRENCY, QUIET, RESUPPLY_PARAM, Option, Verb

SWEEP = Option(flag="sweep", help="a sweep id, or a unique prefix of one")
WORKERS = Option(
    flag="--workers",
    type=count_at_least(1, 64),
    metavar="N",
    help="spread the cells over N processes (default $WF_MAGIC_SWEEP_WORKERS, else 1)",
    faces=CLI,
)
SWEEP_CEILINGS = (
    Option(flag="--max-tokens", type=count_at_least(0), metavar="N", help="sweep token ceiling"),
    Option(flag="--max-cost", type=number_in(0), metavar="X", help="sweep cost ceiling"),
    Option(flag="--max-units", type=count_at_least(0), metavar="N", help="sweep unit ceiling"),
)
SWEEP_VERBS: tuple[Verb, ...] = (
    Verb(
        name="sweep",
        help="run a workflow over a grid of params × dataset rows × repeats, under one budget",
        faces=CLI,
        options=(
            Option(flag="file", metavar="FILE", help="the workflow's YAML file"),
            Option(
                flag="--grid",
                action="append",
                metavar="K=V1,V2",
                help="a grid axis: a declared param and its values (repeatable)",
            ),
            Option(flag="--rows", metavar="FILE", help="dataset rows: a .csv or .jsonl file"),
            Option(
                flag="--param",
                action="append",
                metavar="K=V",
                help="a param every cell shares, e.g. a secret (stored only sealed; repeatable)",
            ),
            Option(flag="--repeat", type=count_at_least(1), default=1, metavar="N"),
            *SWEEP_CEILINGS,
            Option(flag="--key", metavar="K", help="a launch key naming this sweep"),
            MAX_CONCURRENCY,
            WORKERS,
            QUIET,
        ),
    ),
    Verb(name="sweeps", help="list sweeps", faces=CLI),
    Verb(name="sweep-status", help="show a sweep's cells by status", faces=CLI, options=(SWEEP,)),
    Verb(
        name="sweep-resume",
        help="drive a sweep's owed cells; a ceiling option sets a new ceiling",
        faces=CLI,
        options=(
            SWEEP,
            *SWEEP_CEILINGS,
            MAX_CONCURRENCY,
            WORKERS,
            QUIET,
            replace(RESUPPLY_PARAM, help="a secret param of the sweep again (never stored)"),
        ),
    ),
    Verb(
        name="sweep-frame",
        help="print a sweep's frame: one row per cell",
        faces=CLI,
        options=(SWEEP, FORMAT),
    ),
    Verb(
        name="sweep-summary",
        help="print a sweep's metrics: per group and score, mean with its 95 % interval",
        faces=CLI,
        options=(
            SWEEP,
            Option(
                flag="--by",
                action="extend",
                nargs="+",
                metavar="AXIS",
                help=(
                    "group by these axes or row fields (`--by model style`, `--by model,style` "
                    "or `--by model --by style`; default: one group)"
                ),
            ),
            FORMAT,
        ),
    ),
)
"""The sweep verbs (docs/sweeps.md, docs/evaluations.md); their handlers are in
``wf_magic.sweep_cli``."""
