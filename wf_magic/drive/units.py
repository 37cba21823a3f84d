"""Steps → units: map expansion, rendered inputs, the gate feedback block and input hashes."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from ..sealing import InputHash, InputHasher
from ..templates import TemplateError, evaluate, references
from .loopcontext import context_hash

if TYPE_CHECKING:
    from ..spec.kinds import KindSpec
    from ..spec.plan import Plan, PlanStep

MAX_MAP_UNITS = 10_000


class StepInputError(Exception):
    """A step's inputs cannot be built (template error, bad map value); fails the step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Feedback:
    """A gate rejection carried into the next loop."""

    loop: int
    """The loop that was rejected."""
    feedback: str
    missing: tuple[str, ...] = ()


class UnitPlan:
    """One unit of one loop: what to send and how to recognise it again.

    Its identity (step, unit id, item) is set when it is built; its rendered input, request
    fields and ``input_hash`` are computed on first use and kept. A resumed map of 10 000
    units whose journal proves most of them done (``LoopUnits.context_hash``) renders only
    the few still owed. A plain slotted class, not a frozen dataclass: building one costs a
    tenth as much, and a loop builds one per map item. Treat it as immutable.
    """

    __slots__ = ("_loop", "_rendered", "item", "item_index", "unit_id")

    def __init__(self, loop: LoopUnits, unit_id: str, item_index: int | None, item: Any) -> None:
        self._loop = loop
        self.unit_id = unit_id
        self.item_index = item_index
        self.item = item
        self._rendered: _Rendered | None = None

    def __repr__(self) -> str:
        return f"UnitPlan({self.unit_id!r}, loop={self.loop})"

    @property
    def step_id(self) -> str:
        return self._loop.step.id

    @property
    def kind(self) -> str:
        return self._loop.step.kind

    @property
    def phase(self) -> str:
        return "work"

    @property
    def loop(self) -> int:
        return self._loop.loop

    @property
    def runner(self) -> str:
        return self._loop.step.runner

    @property
    def model(self) -> str | None:
        return self._loop.step.model

    @property
    def charged(self) -> bool:
        return _kind(self._loop.step.kind).charged

    @property
    def cacheable(self) -> bool:
        return self._loop.step.cache and _kind(self._loop.step.kind).cacheable

    @property
    def input(self) -> dict[str, Any]:
        """The resolved input (what is hashed): kind, model, item, feedback and the kind's part.

        Raises:
            StepInputError: a template of the step cannot be rendered for this unit.
        """
        return self.rendered.input

    @property
    def input_hash(self) -> str:
        """The hash of the canonical resolved input (DESIGN.md §3, invariant 4): its sha256,
        or keyed under the state's key when the input holds a secret (``sealing.InputHasher``).
        """
        return self.rendered.hashed.hash

    @property
    def input_hashes(self) -> tuple[str, ...]:
        """Every hash an attempt of this input may be journaled under: ``input_hash``, then the
        plain sha256 an older wf_magic journaled for a secret-bearing input (found on resume,
        reused, never written again)."""
        return self.rendered.hashed.hashes

    @property
    def prompt(self) -> str | None:
        return self.rendered.fields.get("prompt")

    @property
    def argv(self) -> tuple[str, ...] | None:
        return self.rendered.fields.get("argv")

    @property
    def target(self) -> str | None:
        return self.rendered.fields.get("target")

    @property
    def agent(self) -> dict[str, Any] | None:
        """An agent unit's settings (harness, permission, workdir, isolation, session, …)."""
        return self.rendered.fields.get("agent")

    @property
    def kwargs(self) -> dict[str, Any] | None:
        return self.rendered.fields.get("kwargs")

    @property
    def rendered(self) -> _Rendered:
        """This unit's input, rendered now if it was not yet (see ``input``)."""
        if self._rendered is None:
            self._rendered = self._loop.render(self)
        return self._rendered


@dataclass(frozen=True, slots=True)
class _Rendered:
    fields: dict[str, Any]
    """The unit request's fields (``prompt`` / ``argv`` / ``target`` + ``kwargs``)."""
    input: dict[str, Any]
    hashed: InputHash
    """``input`` hashed: its hash, its canonical JSON and the journal's (redacted) copy."""

    @property
    def input_hash(self) -> str:
        return self.hashed.hash

    @property
    def input_json(self) -> str:
        """``input``'s canonical JSON (what ``input_hash`` hashes; unredacted)."""
        return self.hashed.text


class StepOutputs(dict[str, Any]):
    """Step id → output, keeping the ``steps`` scope of templates up to date as it is written.

    Building ``{id: {"output": out}}`` afresh for every unit cost O(steps) per unit: O(n²)
    over a long plan and O(steps × units) over a map. Writes go through ``__setitem__``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.scope: dict[str, dict[str, Any]] = {}

    def __setitem__(self, step_id: str, output: Any) -> None:
        super().__setitem__(step_id, output)
        self.scope[step_id] = {"output": output}


def template_context(
    params: Mapping[str, Any],
    outputs: Mapping[str, Any],
    *,
    item: Any = None,
    index: int | None = None,
    feedback: Feedback | None = None,
) -> dict[str, Any]:
    """The names in scope of a template: params, steps.<id>.output, item/index, gate."""
    return {
        "params": params,
        "sweep": params.get("sweep") or _NO_SWEEP,
        "steps": (
            outputs.scope
            if isinstance(outputs, StepOutputs)
            else {sid: {"output": out} for sid, out in outputs.items()}
        ),
        "item": item,
        "index": index,
        "gate": {
            "feedback": feedback.feedback if feedback else "",
            "missing": list(feedback.missing) if feedback else [],
            "loop": (feedback.loop + 1) if feedback else 1,
        },
    }


_NO_SWEEP = {"repeat": 0}
"""``sweep`` in the templates of a run that is no repeated sweep cell."""


@functools.lru_cache(maxsize=1024)
def _places_feedback(prompt: str) -> bool:
    """Whether the template itself places ``gate.feedback`` or ``gate.missing``."""
    return "gate" in references(prompt).names and bool(
        re.search(r"gate\s*(?:\.\s*|\[\s*['\"])(?:feedback|missing)\b", prompt)
    )


def feedback_block(feedback: Feedback) -> str:
    """The "Gate feedback" block appended to every prompt of a re-executed loop."""
    lines = [f"\n\nGate feedback (loop {feedback.loop} was rejected):", feedback.feedback.strip()]
    if feedback.missing:
        lines.append("Missing:")
        lines.extend(f"- {m}" for m in feedback.missing)
    return "\n".join(lines)


def expand_items(
    step: PlanStep,
    params: Mapping[str, Any],
    outputs: Mapping[str, Any],
    *,
    redact: Callable[[str], str] | None = None,
) -> list[Any] | None:
    """The map items of ``step`` (None when it is not a map step).

    Raises:
        StepInputError: the map template fails or yields no list, or too many items.
    """
    return None if step.map is None else map_items(step.map, params, outputs, redact=redact)


def map_items(
    source: str,
    params: Mapping[str, Any],
    outputs: Mapping[str, Any],
    *,
    redact: Callable[[str], str] | None = None,
) -> list[Any]:
    """The items a ``map:`` template expands to over ``params`` and step ``outputs``.

    ``redact`` (the drive's redactor) masks a value quoted in a message *before* it is
    clipped: a clip inside a secret would leave a piece no redactor can tell from text.

    Raises:
        StepInputError: the template fails or yields no list, or too many items.
    """
    try:
        value = evaluate(source, template_context(params, outputs))
    except TemplateError as exc:
        raise StepInputError(f"map template failed: {exc}") from exc
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        # Redacted, then cut (not folded onto one line): the cut lands after the masks.
        shown = str(value) if redact is None else redact(str(value))
        shown = shown if len(shown) <= 80 else shown[:79] + "…"
        raise StepInputError(f"map must evaluate to a list (got {type(value).__name__}: {shown!r})")
    if len(value) > MAX_MAP_UNITS:
        raise StepInputError(
            f"map expands to {len(value)} units, more than the bound of "
            f"{MAX_MAP_UNITS}; split the list or pre-aggregate it"
        )
    return value


def build_units(
    plan: Plan,
    step: PlanStep,
    *,
    params: Mapping[str, Any],
    outputs: Mapping[str, Any],
    loop: int,
    feedback: Feedback | None,
    redact: Callable[[str], str] | None = None,
    item_feedback: Mapping[int, Feedback] | None = None,
    hasher: InputHasher | None = None,
) -> LoopUnits:
    """The work units of ``step`` at ``loop``, in item order (rendered on first use).

    ``redact`` masks secrets in a message before it is clipped (see :func:`map_items`).
    ``hasher`` (the drive's, ``RunState.hasher``) hashes each unit's input; without one
    every input is hashed plainly, as nothing in it were secret.
    ``item_feedback`` (a per-item gate) gives each map item its own last rejection: an item
    absent from it renders as it did when its gate accepted it, so it keeps its input hash
    and its output is found in the journal instead of being re-dispatched.

    Raises:
        StepInputError: the map template fails or yields no list, or too many items. A unit
            whose own template fails raises it when its input is first used.
    """
    items = expand_items(step, params, outputs, redact=redact)
    return LoopUnits(
        plan,
        step,
        params=params,
        outputs=outputs,
        loop=loop,
        feedback=feedback,
        items=items,
        item_feedback=item_feedback,
        hasher=hasher,
    )


class LoopUnits(Sequence[UnitPlan]):
    """The units of one loop of one step, with everything rendering them reads.

    A unit's ``UnitPlan`` is built on first access: a resume of a 10 000-unit map that the
    journal answers (``drive/resume.py``) touches only the units still owed, and building
    them all cost a fifth of such a resume.
    """

    def __init__(
        self,
        plan: Plan,
        step: PlanStep,
        *,
        params: Mapping[str, Any],
        outputs: Mapping[str, Any],
        loop: int,
        feedback: Feedback | None,
        items: list[Any] | None,
        item_feedback: Mapping[int, Feedback] | None = None,
        hasher: InputHasher | None = None,
    ) -> None:
        self.plan = plan
        self.step = step
        self.params = params
        self.outputs = outputs
        self.loop = loop
        self.feedback = feedback
        self.item_feedback = item_feedback or {}
        self.hasher = hasher or _PLAIN
        self._items = items
        self._built: list[UnitPlan | None] = [None] * (1 if items is None else len(items))
        self._context_hash: tuple[str | None] | None = None
        self._runner_identity: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self._built)

    @overload
    def __getitem__(self, index: int) -> UnitPlan: ...

    @overload
    def __getitem__(self, index: slice) -> list[UnitPlan]: ...

    def __getitem__(self, index: int | slice) -> UnitPlan | list[UnitPlan]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._built)))]
        unit = self._built[index]  # IndexError as a list would raise it
        if unit is None:
            i = index + len(self._built) if index < 0 else index
            if self._items is None:
                unit = UnitPlan(self, self.step.id, None, None)
            else:
                unit = UnitPlan(self, f"{self.step.id}[{i}]", i, self._items[i])
            self._built[i] = unit
        return unit

    def __iter__(self) -> Iterator[UnitPlan]:
        for i in range(len(self._built)):
            yield self[i]

    def __repr__(self) -> str:
        return f"LoopUnits({self.step.id!r}, loop={self.loop}, units={len(self)})"

    def render(self, unit: UnitPlan) -> _Rendered:
        """``unit``'s request fields, resolved input and input hash.

        Raises:
            StepInputError: a template of the step cannot be rendered for this unit.
        """
        step, idx = self.step, unit.item_index
        feedback = self.feedback if idx is None else self.item_feedback.get(idx, self.feedback)
        block = None
        if (
            feedback
            and step.kind in ("prompt", "agent")
            and not _places_feedback(step.prompt or "")
        ):
            block = feedback_block(feedback)
        from ..spec.kinds import UnitSource  # on first use: see _kind

        source = UnitSource(
            plan=self.plan,
            step=step,
            context=template_context(
                self.params, self.outputs, item=unit.item, index=idx, feedback=feedback
            ),
            item=unit.item,
            index=idx,
            feedback_block=block,
        )
        try:
            fields, resolved_kind = _kind(step.kind).build(source)
        except TemplateError as exc:
            raise StepInputError(f"unit {unit.unit_id}: template failed: {exc}") from exc
        fb = (
            {"feedback": feedback.feedback, "missing": list(feedback.missing)} if feedback else None
        )
        resolved: dict[str, Any] = {
            "kind": step.kind,
            "model": step.model,
            "item": unit.item,
            "feedback": fb,
        }
        resolved.update(resolved_kind)
        if step.options:  # a step's sampling settings change its answers (unset: hash as before)
            resolved["options"] = step.options
        if "sweep" in self.params and "sweep" not in self.plan.params:
            resolved["sweep"] = self.params["sweep"]  # a repeat is a fresh call, not a reuse
        return _Rendered(fields, resolved, self._hash(resolved))

    def _hash(self, resolved: dict[str, Any]) -> InputHash:
        """``resolved`` hashed (``resolved`` gains the runner settings and content hash)."""
        content = self.hasher.hash_value(resolved)
        settings = self.runner_identity
        if not settings:
            return content
        # The runner's answer-changing settings join the identity (runners/identity.py);
        # ``content_hash`` (the hash without them) lets ``replay`` find the recording.
        resolved.update(runner=settings, content_hash=content.hash)
        hashed = self.hasher.hash_value(resolved)
        if content.legacy is None:
            return hashed
        # What an older wf_magic journaled: every hash plain, the content hash's too.
        legacy = {**resolved, "content_hash": content.legacy}
        return InputHash(
            hash=hashed.hash,
            legacy=_PLAIN.hash_value(legacy).hash,
            text=hashed.text,
            kept_json=hashed.kept_json,
        )

    @property
    def runner_identity(self) -> dict[str, Any]:
        """The step runner's answer-changing options (empty: none; computed once a loop)."""
        if self._runner_identity is None:
            from ..runners.identity import runner_identity

            self._runner_identity = runner_identity(self.plan.runners, self.step.runner)
        return self._runner_identity

    @property
    def context_hash(self) -> str | None:
        """A hash of everything rendering these units reads (``drive/loopcontext.py``): two
        loops with equal hashes give every unit the same ``input_hash``. None when that
        cannot be proven (a small map, a single step, ``random``): every unit is compared.
        """
        if self._context_hash is None:
            # Items with feedback of their own (a per-item gate) are compared unit by unit.
            self._context_hash = (None if self.item_feedback else context_hash(self),)
        return self._context_hash[0]


def _kind(name: str) -> KindSpec:
    """The kind named ``name``. ``spec.kinds`` is imported on first use: ``wf status`` counts
    a map's items through this module without loading the plan models (pydantic)."""
    try:
        return _KINDS[name]
    except KeyError:
        from ..spec.kinds import KINDS

        _KINDS.update(KINDS)
        return _KINDS[name]


_PLAIN = InputHasher.plain()
"""The hasher of units rendered outside a drive: nothing in them is secret."""

_KINDS: dict[str, KindSpec] = {}
"""``spec.kinds.KINDS`` once imported (a function-level import per call cost ~10 µs a unit)."""
