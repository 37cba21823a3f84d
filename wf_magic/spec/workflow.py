"""A loaded workflow: its source and the frozen plan, as the engine keeps it.

Apart from ``spec/freeze.py`` (which makes one and imports YAML, the authoring models and
the static checks): a resume, ``wf status`` and the drive only need the plan's models.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import Plan

MAX_SOURCE_BYTES = 1_000_000
"""A workflow source (file or text) holds at most this many bytes (UTF-8)."""


@dataclass(frozen=True, slots=True)
class Workflow:
    """A loaded workflow: its source, and the plan it freezes into."""

    name: str
    source: str
    source_hash: str
    source_path: str | None
    plan: Plan
    plan_json: str
    plan_hash: str
