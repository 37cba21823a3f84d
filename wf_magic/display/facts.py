"""Facts about a run that its renderings and the live view share: rejections, counts, texts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..store.records import AttemptRow, BudgetUse, StepRow

# The drive loads on first use, not here: a map's items are counted only if the run has one.
if TYPE_CHECKING:
    from ..drive.context import DriveStats

RESULT_CHARS = 400
"""How much of a completed run's result the renderings show."""
_DONE = ("succeeded", "reused")


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A gate verdict that sent a step back (or stopped it)."""

    step_id: str
    loop: int
    judge: str
    feedback: str
    missing: tuple[str, ...]
    is_reused: bool = False
    """The verdict was taken from an earlier run (a fork's prefix, the same judge input)."""
    last_loop: int | None = None
    """Set when identical rejections of loops ``loop``..``last_loop`` are shown as one."""

    @property
    def loops(self) -> str:
        """``2``, or ``1–3`` for merged identical rejections."""
        if self.last_loop is None or self.last_loop == self.loop:
            return f"{self.loop}"
        return f"{self.loop}–{self.last_loop}"


def gate_rejections(attempts: Iterable[AttemptRow]) -> list[Rejection]:
    """The journaled gate verdicts (``<step>.gate:l<n>``) that said "not complete", including
    verdicts reused from an earlier run."""
    out = []
    for a in attempts:
        if a.phase != "gate" or a.status not in _DONE or not a.output_json:
            continue
        verdict = json.loads(a.output_json)
        if not isinstance(verdict, dict) or verdict.get("complete", True):
            continue
        out.append(
            Rejection(
                step_id=a.step_id,
                loop=a.loop,
                judge=str(verdict.get("judge", "")),
                feedback=str(verdict.get("feedback") or ""),
                missing=tuple(str(m) for m in verdict.get("missing") or ()),
                is_reused=a.status == "reused",
            )
        )
    return out


def merge_rejections(rejections: Sequence[Rejection]) -> list[Rejection]:
    """Consecutive identical rejections of one step as one row (each message shown once)."""
    out: list[Rejection] = []
    for r in rejections:
        last = out[-1] if out else None
        if (
            last is not None
            and (last.step_id, last.judge, last.feedback, last.missing, last.is_reused)
            == (r.step_id, r.judge, r.feedback, r.missing, r.is_reused)
            and r.loop == (last.last_loop or last.loop) + 1
        ):
            out[-1] = Rejection(
                step_id=last.step_id,
                loop=last.loop,
                judge=last.judge,
                feedback=last.feedback,
                missing=last.missing,
                is_reused=last.is_reused,
                last_loop=r.loop,
            )
        else:
            out.append(r)
    return out


def shown_note(note: str | None, rejections: Sequence[Rejection], step_id: str) -> str:
    """A step's note without the gate feedback the rejections table already shows."""
    text = note or ""
    mine = [r for r in rejections if r.step_id == step_id]
    head, sep, _feedback = text.partition("; last feedback: ")
    return head if sep and mine else text


def shown_reason(reason: str | None, notes: Iterable[str | None]) -> str:
    """A run's status reason, unless a step row already says it (``step X: <note>``)."""
    if not reason:
        return ""
    for note in notes:
        if note and reason.endswith(note):
            return ""
    return reason


def unit_counts(step: StepRow, attempts: Iterable[AttemptRow]) -> tuple[int, int]:
    """(done, seen) work units of the step's current loop, by each unit's latest attempt."""
    latest: dict[str, AttemptRow] = {}
    for a in attempts:
        if a.phase == "work" and a.step_id == step.step_id:
            latest[a.unit_id] = a
    current = [a for a in latest.values() if a.loop == step.loop]
    return sum(a.status in _DONE for a in current), len(current)


class MapStep(Protocol):
    """What counting a step's units reads (a ``PlanStep`` is one)."""

    @property
    def map(self) -> str | None: ...


def unit_total(plan_step: MapStep, params: dict[str, Any], rows: Sequence[StepRow]) -> int | None:
    """How many work units the step has: 1, a map's expansion, or None while its input is owed."""
    if plan_step.map is None:
        return 1
    from ..drive.units import StepInputError, map_items

    outputs = {
        r.step_id: json.loads(r.output_json) if r.output_json else None
        for r in rows
        if r.status in ("completed", "skipped")
    }
    try:
        items = map_items(plan_step.map, params, outputs)
    except StepInputError:
        return None  # an earlier step has not produced the map's input yet
    return len(items)


def result_text(result_json: str | None, *, limit: int = RESULT_CHARS) -> str | None:
    """A completed run's result for display: text as is, anything else as JSON, clipped."""
    if result_json is None:
        return None
    value = json.loads(result_json)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenSplit:
    """A run's or a step's tokens in the one labelling every view uses.

    - ``paid``: tokens of charged attempts, what the budget counts (work units, and judges
      whose gate says ``charged: true``);
    - ``reused``: what the reused answers first cost (paid by an earlier run, not now);
    - ``judge``: tokens LLM judges spent outside the budget (uncharged gates).
    """

    paid: int = 0
    reused: int = 0
    judge: int = 0

    def __add__(self, other: TokenSplit) -> TokenSplit:
        return TokenSplit(
            paid=self.paid + other.paid,
            reused=self.reused + other.reused,
            judge=self.judge + other.judge,
        )


def token_text(split: TokenSplit) -> str:
    """``60 paid · 240 reused · 342 judge`` (reused and judge only when there are some)."""
    parts = [f"{split.paid:,} paid"]
    if split.reused:
        parts.append(f"{split.reused:,} reused")
    if split.judge:
        parts.append(f"{split.judge:,} judge")
    return " · ".join(parts)


def budget_text(use: BudgetUse, *, sep: str = " · ") -> str:
    """``units 5/10 · tokens 66/∞`` (cost only when it is limited or spent)."""
    parts = [
        f"units {use.units:,}/{_limit(use.max_units)}",
        f"tokens {use.tokens:,}/{_limit(use.max_tokens)}",
    ]
    if use.max_cost or use.cost:
        parts.append(f"cost {use.cost:.4g}/{_limit(use.max_cost)}")
    return sep.join(parts)


def _limit(value: float | None) -> str:
    return "∞" if not value else f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def reuse_text(attempts: Iterable[AttemptRow]) -> str | None:
    """``reused 4 results from earlier runs (60 tokens saved)``, or None when nothing was."""
    reused = [a for a in attempts if a.status == "reused"]
    return reuse_line(len(reused), sum(a.saved_tokens for a in reused))


def reuse_line(count: int, saved: int) -> str | None:
    """The reuse line from counts already summed (see :func:`reuse_text`)."""
    if not count:
        return None
    plural = "s" if count != 1 else ""
    return f"reused {count} result{plural} from earlier runs ({saved:,} tokens saved)"


def origin_text(
    *, created: bool, done_before: int, total: int, stats: DriveStats | None
) -> str | None:
    """How a drive began, for the header of a re-run: ``existing run, nothing dispatched``,
    ``resumed: 6/8 already done, 2 dispatched`` (None for a fresh run or an unknown drive)."""
    if created or stats is None:
        return None
    if not stats.dispatched and not stats.reused:
        return "existing run, nothing dispatched"
    return f"resumed: {done_before}/{total} already done, {stats.dispatched} dispatched"


def loop_text(step: StepRow, *, has_gate: bool) -> str:
    """``2/3`` for a gated or looping step, else empty."""
    return f"{step.loop}/{step.max_loops}" if has_gate or step.max_loops > 1 else ""
