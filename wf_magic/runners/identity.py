"""Runner settings in the reuse identity: which of a runner's options can change an answer.

Each runner declares the split. A built-in runner class lists its answer-changing option
names in ``ANSWER_OPTIONS``; a plugin factory may carry ``answer_options`` (a collection of
names, or a callable ``options -> dict``). A factory that declares nothing has every option
hashed: a needless re-dispatch is cheaper than a silently reused stale answer.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from .registry import runner_factory

AnswerOptions = Collection[str] | Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""A runner's declared split: the option names that can change an answer, or a function
picking them (for options whose effect depends on their value)."""


def answer_options(kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a runner of type ``kind`` that can change its answers.

    An unknown type (nothing registered yet) hashes every option, like an undeclared split.
    """
    options = {k: v for k, v in options.items() if k != "type"}
    factory = runner_factory(kind)
    declared: AnswerOptions | None = getattr(factory, "answer_options", None)
    if declared is None:
        return options
    if callable(declared):
        return dict(declared(options))
    return {k: v for k, v in options.items() if k in declared}


def runner_identity(runners: Mapping[str, Mapping[str, Any]], name: str) -> dict[str, Any]:
    """What of runner ``name``'s settings (``plan.runners[name]``) a unit's input hash covers.

    Empty when no option can change an answer (the hash is then what it was before runner
    settings were hashed: journals recorded by option-free runners keep their reuse). A
    named instance's ``type`` is part of it: the same options on another runner type answer
    differently.
    """
    options = runners.get(name) or {}
    if not options:
        return {}
    kind = str(options.get("type", name))
    picked = answer_options(kind, options)
    if picked and "type" in options:
        picked["type"] = kind
    return picked
