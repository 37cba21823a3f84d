"""Verdict types: a gate's decision, what a judged loop carries, what a waiting gate waits on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

WaitingJudge = Literal["human", "failed", "exhausted"]
"""Why a gate waits:

- ``human``: a human gate has no recorded decision for this loop.
- ``failed``: the judge could not answer (no loop was consumed).
- ``exhausted``: every loop was rejected; a person may approve the last artifact.
"""


def gate_unit_id(step_id: str, loop: int) -> str:
    """The unit id of a step's verdict at ``loop``: ``<step>.gate:l<loop>``."""
    return f"{step_id}.gate:l{loop}"


def gate_item_unit_id(step_id: str, loop: int, index: int) -> str:
    """The unit id of a per-item gate's verdict on map item ``index``:
    ``<step>.gate:l<loop>[<index>]``."""
    return f"{step_id}.gate:l{loop}[{index}]"


class VerdictError(Exception):
    """A judge answered something that is not a verdict (a judge failure, never a pass)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A gate's decision on one loop's artifact."""

    complete: bool
    feedback: str = ""
    missing: tuple[str, ...] = ()
    judge: str = "llm"
    """Who decided: ``llm``, ``expr``, ``human`` or ``schema``."""

    def to_json(self) -> dict[str, Any]:
        """The verdict as stored in the gate attempt's output."""
        return {
            "complete": self.complete,
            "feedback": self.feedback,
            "missing": list(self.missing),
            "judge": self.judge,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        """Rebuild a stored verdict."""
        return cls(
            complete=bool(data["complete"]),
            feedback=str(data.get("feedback") or ""),
            missing=tuple(str(m) for m in data.get("missing") or ()),
            judge=str(data.get("judge", "llm")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """What a blocked gate waits on, stored in the step row's output as ``{"waiting": ...}``."""

    loop: int
    input_hash: str
    summary: str
    judge: WaitingJudge

    def to_json(self) -> dict[str, Any]:
        """The step output of a waiting gate."""
        return {
            "waiting": {
                "loop": self.loop,
                "input_hash": self.input_hash,
                "summary": self.summary,
                "judge": self.judge,
            }
        }

    @classmethod
    def from_json(cls, data: Any) -> Waiting | None:
        """The waiting state in a step output (None when the output is not one)."""
        inner = data.get("waiting") if isinstance(data, Mapping) else None
        if not isinstance(inner, Mapping):
            return None
        return cls(
            loop=int(inner["loop"]),
            input_hash=str(inner["input_hash"]),
            summary=str(inner.get("summary") or ""),
            judge=inner.get("judge", "human"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Judged:
    """A verdict with the judge input it answered (a human may later override it)."""

    verdict: Verdict
    input_hash: str
    summary: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GateWaiting:
    """A gate that has no verdict now (a person must act, or the judge failed)."""

    reason: str
    waiting: Waiting


VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "complete": {"type": "boolean"},
        "feedback": {"type": "string"},
        "missing": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["complete"],
}
