"""A run's stored plan read without decoding it: its plan version, its hashes and its shape.

The read verbs (``wf status``, ``wf list``, ``wf show``, ``wf abandon``, ``Engine.handle``)
report a run from its row and never display a decoded plan, so they work on a plan this
version cannot drive; :func:`plan_warning` says in one line why it cannot be driven, checking
the version, then the shape (the few fields a run view reads, with ``json`` alone), then the
hashes, then whether the plan models accept it (so a hand edit with recomputed hashes, such as
``max_loops: "many"`` or an unknown key, is named too). A drive (``drive/integrity.py``)
checks the version first too, then the hashes, then decodes the plan with the plan models. The
version comes first because another version may hash or shape its plan differently, so a
hash mismatch says nothing about such a plan, and a newer run must stay byte-identical.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, get_args

from ..errors import clip
from ..hashing import sha256_text
from ..store.records import RunRow, StepKind
from .versions import OLDEST_PLAN_VERSION, PLAN_VERSION

_KINDS = frozenset(get_args(StepKind))
_CONTAINERS = {"params": dict, "budget": dict, "execution": dict, "runners": dict, "children": dict}


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionProblem:
    """A plan version outside ``OLDEST_PLAN_VERSION..PLAN_VERSION``."""

    version: int
    """The offending version (the newest one seen if newer, else the oldest)."""
    is_newer: bool

    @property
    def text(self) -> str:
        """What is wrong and what to do, without the run id."""
        if self.is_newer:
            return (
                f"frozen by a newer wf_magic (plan version {self.version} > {PLAN_VERSION}); "
                "upgrade wf_magic to drive it"
            )
        return unsupported_reason(self.version)


def unsupported_reason(version: int) -> str:
    """The status reason of a run abandoned for a plan version older than the oldest supported."""
    return f"plan version {version} is no longer supported; start afresh with `wf run FILE --new`"


class _NotJSON:
    def __init__(self, error: json.JSONDecodeError):
        self.text = f"not JSON ({error.msg} at character {error.pos})"


def _parse(plan_json: str) -> Any:
    """The plan's JSON value, or a ``_NotJSON`` saying why it is none (parsed once per check)."""
    try:
        return json.loads(plan_json)
    except json.JSONDecodeError as exc:
        return _NotJSON(exc)


def _version_key(value: Any) -> Any:
    """The ``plan_version`` a parsed plan names itself (None when it names none)."""
    return value.get("plan_version") if isinstance(value, dict) else None


@lru_cache(maxsize=8)
def _own_version(plan_json: str) -> Any:
    """The ``plan_version`` the plan text names itself, parsed once per text.

    Every drive checks the version (twice: its setup and its walk), and a sweep drives
    thousands of runs of one plan: parsing a 10 000-step plan took ~50 ms a check.
    """
    return _version_key(_parse(plan_json))


def version_problem(run: RunRow, *, parsed: Any = None) -> VersionProblem | None:
    """The run's plan version problem, from its ``plan_version`` column and the plan's own key.

    A newer wf_magic writes both; a hand edit of either one counts (the newer wins).
    ``parsed`` is the plan's JSON value when the caller has it already.
    """
    own = _own_version(run.plan_json) if parsed is None else _version_key(parsed)
    versions = [
        v for v in (run.plan_version, own) if isinstance(v, int) and not isinstance(v, bool)
    ]
    if not versions:
        return None  # no readable version anywhere: the shape check or the decode says more
    if max(versions) > PLAN_VERSION:
        return VersionProblem(version=max(versions), is_newer=True)
    if min(versions) < OLDEST_PLAN_VERSION:
        return VersionProblem(version=min(versions), is_newer=False)
    return None


def shape_problem(plan_json: str, *, parsed: Any = None) -> str | None:
    """What is wrong with the plan's shape, as far as ``json`` can tell (None: looks like a plan).

    This checks what a run view reads (steps, their ids, kinds and runners) and the types of
    the top-level containers; the plan models check everything else when a drive decodes it.
    """
    value = _parse(plan_json) if parsed is None else parsed
    return value.text if isinstance(value, _NotJSON) else _plan_problem(value, "")


def _plan_problem(value: Any, where: str) -> str | None:
    if not isinstance(value, dict):
        return f"{where}expected a JSON object (got {type(value).__name__})"
    if not isinstance(value.get("name"), str):
        return f"{where}name: expected a string (got {_got(value.get('name'))})"
    steps = value.get("steps")
    if not isinstance(steps, list):
        return f"{where}steps: expected a list (got {_got(steps)})"
    for i, step in enumerate(steps):
        problem = _step_problem(step, f"{where}steps[{i}]")
        if problem:
            return problem
    for key, kind in _CONTAINERS.items():
        if key in value and not isinstance(value[key], kind):
            return f"{where}{key}: expected an object (got {_got(value[key])})"
    for name, child in value.get("children", {}).items():
        problem = _plan_problem(child, f"{where}children.{name}.")
        if problem:
            return problem
    return None


def _step_problem(step: Any, where: str) -> str | None:
    if not isinstance(step, dict):
        return f"{where}: expected an object (got {_got(step)})"
    for key in ("id", "runner"):
        if not isinstance(step.get(key), str):
            return f"{where}.{key}: expected a string (got {_got(step.get(key))})"
    kind = step.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:  # a list or an object is unhashable
        kinds = ", ".join(sorted(_KINDS))
        return f"{where}.kind: expected one of {kinds} (got {_got(step.get('kind'))})"
    if step.get("map") is not None and not isinstance(step["map"], str):
        return f"{where}.map: expected a string (got {_got(step['map'])})"
    return None


def _got(value: Any) -> str:
    if value is None:
        return "nothing"
    text = json.dumps(value)
    return text if len(text) <= 40 else f"{type(value).__name__}"


def hash_problem(run: RunRow) -> str | None:
    """Which of the run's plan and params no longer matches its recorded hash."""
    if sha256_text(run.plan_json) != run.plan_hash:
        return f"the stored plan does not match its plan_hash {run.plan_hash[:12]}"
    if sha256_text(run.params_json) != run.params_hash:
        return "the stored params do not match their hash"
    return None


def plan_warning(run: RunRow, *, deep: bool = True) -> str | None:
    """One line saying why this run's stored plan cannot be driven (None: nothing seen).

    Reads only the row, and writes nothing: the version, the shape and the hashes, then
    (``deep``) whether the plan models accept it (validated once per plan hash, never used
    for display). ``deep=False`` checks without the plan models (no pydantic import): only a
    hand edit that also recomputed the plan hash then goes unnamed.
    """
    parsed = _parse(run.plan_json)
    version = version_problem(run, parsed=parsed)
    if version is not None:
        head = f"Run {run.run_id} was " if version.is_newer else f"Run {run.run_id}: "
        return f"{head}{version.text} (shown from its row)"
    shape = shape_problem(run.plan_json, parsed=parsed)
    if shape is not None:
        return (
            f"Run {run.run_id}: its stored plan does not decode ({shape}); it was edited outside "
            "wf_magic and cannot be driven; start afresh with `wf run FILE --new`"
        )
    edited = hash_problem(run)
    if edited is not None:
        return (
            f"Run {run.run_id}: {edited}; it was edited outside wf_magic and cannot be driven; "
            "start afresh with `wf run FILE --new`"
        )
    problem = decode_problem(run.plan_hash, run.plan_json) if deep else None
    if problem is not None:
        return (
            f"Run {run.run_id}: its stored plan does not decode ({problem}); it was edited "
            "outside wf_magic and cannot be driven; start afresh with `wf run FILE --new`"
        )
    return None


_DECODED: dict[str, str | None] = {}
"""``decode_problem`` by plan hash: ``wf list`` validates each distinct plan once."""
_DECODED_MAX = 1024


def decode_problem(plan_hash: str, plan_json: str) -> str | None:
    """What the plan models reject in ``plan_json`` (None: it decodes), on one line.

    Validated and thrown away: a read verb shows the run from its row, never from the
    decoded plan. Only call it once ``plan_json`` matched ``plan_hash`` (the cache key; the
    hash, not the JSON, is kept, so the cache stays small whatever the plans weigh).
    """
    if plan_hash not in _DECODED:
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        _DECODED[plan_hash] = _validate(plan_json)
    return _DECODED[plan_hash]


def _validate(plan_json: str) -> str | None:
    from pydantic import ValidationError

    from .plan import Plan  # plan.py imports this module's versions

    try:
        Plan.model_validate_json(plan_json)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "plan"
        return f"{exc.error_count()} problem(s), first {where}: {clip(first['msg'], 200)}"
    return None
