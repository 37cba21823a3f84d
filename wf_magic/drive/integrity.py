"""Plan integrity: a run's stored plan must be of a known plan_version, match its hashes, decode."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..bus import EventBus
from ..errors import FileRefused, PlanIntegrityError, PlanVersionError, PlanVersionTooNew
from ..hashing import sha256_text
from ..reading import read_bounded
from ..spec.plan import Plan
from ..spec.stored import version_problem
from ..spec.workflow import MAX_SOURCE_BYTES, Workflow
from ..store import Store
from ..store.records import RunRow


class UnsupportedPlan(Exception):
    """A plan older than the oldest version this wf_magic drives; ``reason`` says what to do."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def verify(run: RunRow) -> tuple[Plan, dict[str, Any]]:
    """The run's plan and params, after checking its plan version, its hashes and its shape.

    The version comes first (spec/stored.py says why): a plan of another version may hash
    differently, and a newer one must be left byte-identical whatever else is wrong with it.

    Raises:
        PlanVersionTooNew: a newer wf_magic froze the plan.
        UnsupportedPlan: the plan is older than ``OLDEST_PLAN_VERSION``.
        PlanIntegrityError: the plan or the params were edited outside wf_magic, or the plan
            does not decode.
    """
    version = version_problem(run)
    if version is not None and version.is_newer:
        raise PlanVersionTooNew(
            f"Run {run.run_id} was {version.text}. Nothing was changed.", run_id=run.run_id
        )
    if version is not None:
        raise UnsupportedPlan(version.text)
    if sha256_text(run.plan_json) != run.plan_hash:
        raise PlanIntegrityError(
            f"Run {run.run_id}: the stored plan does not match its plan_hash "
            f"{run.plan_hash[:12]}; it was edited outside wf_magic. Nothing was dispatched. "
            "Start a new run from the source (--new) or fork an intact run.",
            run_id=run.run_id,
        )
    if sha256_text(run.params_json) != run.params_hash:
        raise PlanIntegrityError(
            f"Run {run.run_id}: the stored params do not match their hash; they were edited "
            "outside wf_magic. Nothing was dispatched. Start a new run with the params you want.",
            run_id=run.run_id,
        )
    try:
        plan = _decoded(run.plan_json)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "plan"
        raise PlanIntegrityError(
            f"Run {run.run_id}: its stored plan (plan version {run.plan_version}) does not "
            f"decode ({exc.error_count()} problem(s), first {where}: {first['msg']}); it was "
            "edited outside wf_magic. Nothing was dispatched. Start afresh with "
            "`wf run FILE --new`.",
            run_id=run.run_id,
        ) from None
    return plan, json.loads(run.params_json)


@lru_cache(maxsize=8)
def _decoded(plan_json: str) -> Plan:
    """The plan a (hash-checked) plan text decodes to, kept for the next drive of it.

    A sweep drives thousands of cell runs of one plan, and every drive verifies it twice
    (the drive's setup and the walk): decoding is most of that. Plans are frozen models, so
    one decoded plan serves every run whose text is the same. Failures are not cached.
    """
    return Plan.model_validate_json(plan_json)


def drift_warnings(run: RunRow, live: Workflow | None) -> list[str]:
    """A warning when the live source (cell or file) differs from the run's frozen source."""
    current: str | None = None
    if live is not None and live.plan_hash == run.plan_hash:
        return []  # same plan: the caller already said the edit changes nothing that runs
    if live is not None:
        current = live.source_hash
    elif run.source_path and Path(run.source_path).is_file():
        current = _file_hash(run.source_path)
    if current is not None and current != run.source_hash:
        return [
            f"the workflow source changed since run {run.run_id} started; continuing "
            "with its frozen plan (start a new run with --new to pick up the edit)"
        ]
    return []


def _file_hash(path: str) -> str | None:
    """The source hash of the file at ``path`` now, read bounded (None: it cannot be read)."""
    try:
        data = read_bounded(path, limit=MAX_SOURCE_BYTES)
    except FileRefused as exc:
        # Grown past the bound: the frozen source (within it) cannot be what it holds now.
        return "(larger than the bound)" if exc.reason == "too_large" else None
    try:
        return sha256_text(data.decode("utf-8"))
    except UnicodeDecodeError:
        return "(not UTF-8)"  # no frozen source was


def verified_plan(store: Store, bus: EventBus, run: RunRow) -> tuple[Plan, dict[str, Any]]:
    """Decode a run's plan and params after checking their plan version and hashes.

    A plan older than the oldest supported version abandons the run (with how to start
    afresh); nothing is dispatched.

    Raises:
        PlanVersionTooNew: a newer plan version (the row is left untouched).
        PlanVersionError: an unsupported older plan version (the run was abandoned).
        PlanIntegrityError: a hash mismatch, or a plan that does not decode (untouched).
    """
    try:
        return verify(run)
    except UnsupportedPlan as exc:
        outcome = f"it stays {run.status}"
        if run.status not in ("completed", "abandoned"):
            store.set_run_status(run.run_id, "abandoned", reason=exc.reason)
            bus.notify("run_status", run_id=run.run_id, status="abandoned", reason=exc.reason)
            outcome = "the run was abandoned"
        raise PlanVersionError(
            f"Run {run.run_id}: {exc.reason}. Nothing was dispatched; {outcome}.",
            run_id=run.run_id,
        ) from None
