"""The plan versions this wf_magic writes and drives (DESIGN.md §7).

A module of its own so that both the plan (``plan.py``, which writes the version) and the
stored-plan reader (``stored.py``, which checks it and validates with the plan models) import
it, without either importing the other's importer.
"""

from __future__ import annotations

PLAN_VERSION = 1
"""Bumped whenever the plan's JSON shape changes; runs record the version that froze them."""
OLDEST_PLAN_VERSION = 1
"""The oldest plan version this wf_magic still drives (DESIGN.md §7); older runs are abandoned."""
