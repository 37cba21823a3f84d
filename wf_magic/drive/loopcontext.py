"""What rendering one loop's units reads, as one hash: the context a resume can trust.

``context_hash(units)`` covers the step (frozen in the plan, with a child plan), the params
and step outputs its templates can read, the loop and its feedback, and the code that
renders and hashes (``_code_fingerprint``). Two loops with equal hashes give every unit the
same ``input_hash``; ``drive/resume.py`` relies on exactly that, so anything that could make
two renders differ with equal inputs (``random``, ``lipsum``, an unparsable template, a
value without a faithful repr) yields None instead.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .. import hashing as hashing_module
from .. import sealing as sealing_module
from .. import templates as templates_module
from ..hashing import sha256_text
from ..templates import TemplateError, references

if TYPE_CHECKING:
    from ..sealing import InputHasher
    from ..spec.plan import Plan, PlanStep

CONTEXT_MIN_UNITS = 100
"""Maps smaller than this render every unit on resume (cheap) and record no context hash."""


class FeedbackInputs(Protocol):
    """A gate rejection carried into the loop (``drive.units.Feedback``)."""

    @property
    def loop(self) -> int: ...
    @property
    def feedback(self) -> str: ...
    @property
    def missing(self) -> tuple[str, ...]: ...


class LoopInputs(Protocol):
    """What a loop's units are rendered from (``drive.units.LoopUnits``)."""

    @property
    def plan(self) -> Plan: ...
    @property
    def step(self) -> PlanStep: ...
    @property
    def params(self) -> Mapping[str, Any]: ...
    @property
    def outputs(self) -> Mapping[str, Any]: ...
    @property
    def loop(self) -> int: ...
    @property
    def feedback(self) -> FeedbackInputs | None: ...
    @property
    def runner_identity(self) -> Mapping[str, Any]: ...
    @property
    def hasher(self) -> InputHasher: ...
    def __len__(self) -> int: ...


def context_hash(units: LoopInputs) -> str | None:
    """The hash of everything rendering ``units`` reads; None when not provable."""
    step = units.step
    code = _code_fingerprint()
    refs = _step_references(_templates_of(step)) if step.map is not None else None
    if len(units) < CONTEXT_MIN_UNITS or code is None or refs is None:
        return None
    if not refs.deterministic:
        return None
    # Only what the templates can read: a param no template names (a secret, say) is
    # neither needed nor hashed here.
    child = units.plan.children.get(step.workflow) if step.workflow else None
    fb = units.feedback
    payload = (
        code,
        step.model_dump(mode="json"),
        sorted(units.runner_identity.items()),
        child.model_dump(mode="json") if child is not None else None,
        _read(units.params, refs.params),
        _read(units.outputs, refs.steps),
        units.loop,
        (fb.loop, fb.feedback, fb.missing) if fb is not None else None,
    )
    try:
        # repr, not JSON: it tells 1 from "1" and True, a tuple from a list, and keeps
        # dict order, all of which a template can see. An object whose repr carries its
        # address makes every drive's hash differ: never a false match, only no shortcut.
        text = repr(payload)
    except (RecursionError, ValueError):
        return None
    # Keyed when it holds a secret (a param the templates read): the recorded context hash
    # must be no more of an oracle than a unit's input hash.
    return units.hasher.hash_text(text).hash


def _read(values: Mapping[str, Any], names: frozenset[str] | None) -> list[Any]:
    """``(name, (value,))`` for each name read (``()`` when absent), in a stable order."""
    keys = list(values) if names is None else sorted(names)
    return [(k, (values[k],) if k in values else ()) for k in keys]


def _templates_of(step: PlanStep) -> tuple[str, ...]:
    """Every template a unit of ``step`` renders (its map, prompt, route and bindings)."""
    out = [t for t in (step.map, step.prompt, step.route.on if step.route else None) if t]
    stack: list[Any] = [step.bindings]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Reads:
    """What a step's templates can read, statically: None means any."""

    deterministic: bool
    steps: frozenset[str] | None
    params: frozenset[str] | None


@functools.lru_cache(maxsize=1024)
def _step_references(templates: tuple[str, ...]) -> _Reads | None:
    """What ``templates`` read and whether they render the same from the same inputs (None:
    one does not parse)."""
    deterministic, steps, params = True, set[str](), set[str]()
    any_step = any_param = False
    for source in templates:
        try:
            refs = references(source)
        except TemplateError:
            return None
        deterministic &= not (refs.filters & _RANDOM or refs.names & _RANDOM)
        steps |= refs.steps
        params |= refs.params
        any_step |= refs.steps_dynamic
        any_param |= refs.params_dynamic
    return _Reads(
        deterministic,
        None if any_step else frozenset(steps),
        None if any_param else frozenset(params),
    )


_RANDOM = frozenset({"random", "lipsum"})
"""The filter and global whose renders differ between runs with the same inputs."""


@functools.cache
def _code_fingerprint() -> str | None:
    """The code a unit's input hash depends on: units (and this module), the kinds,
    templates, hashing and sealing (the keyed hash), Jinja and Python versions (a changed
    renderer never vouches for an old hash)."""
    import jinja2

    parts = [sys.version, jinja2.__version__]
    try:
        for name in _CODE_MODULES:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
            parts.append(Path(str(origin)).read_text(encoding="utf-8"))
    except (OSError, ImportError, UnicodeDecodeError):
        return None
    return sha256_text("\0".join(parts))


_CODE_MODULES = (
    "wf_magic.drive.units",
    __name__,
    "wf_magic.spec.kinds",
    templates_module.__name__,
    hashing_module.__name__,
    sealing_module.__name__,
)
"""The modules whose source the fingerprint covers, by name: found, not imported here (the
units module imports this one)."""
