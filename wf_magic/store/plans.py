"""Plans kept once per plan hash (``plans``, m017), for runs that keep none of their own.

A sweep's cells are runs of one plan (or of a few, one per rendered ``model:``): each cell's
run row holds ``plan_json = ''`` and reads its plan from ``plans`` by ``plan_hash``, so a
10 000-cell sweep stores its plans once, not 10 000 times. Every other run keeps its plan on
its own row, as DESIGN §3 has it.
"""

from __future__ import annotations


def plan_of(alias: str) -> str:
    """The plan JSON of the ``runs`` row ``alias`` (SQL): its own, else the shared copy of its
    hash (``''`` when that is missing too: the integrity check then names the mismatch)."""
    return (
        f"COALESCE(NULLIF({alias}.plan_json, ''),"
        f" (SELECT p.plan_json FROM plans p WHERE p.plan_hash = {alias}.plan_hash), '')"
    )
