"""Plan integrity: a run's stored plan and params must match their hashes and plan_version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..bus import EventBus
from ..errors import FileRefused, PlanIntegrityError, PlanVersionError
from ..hashing import sha256_text
from ..reading import read_bounded
from ..spec.plan import PLAN_VERSION, Plan
from ..spec.workflow import MAX_SOURCE_BYTES, Workflow
from ..store import Store
from ..store.records import RunRow


class UndecodablePlan(Exception):
    """An older plan this version cannot decode; ``reason`` says how to start afresh."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def verify(run: RunRow) -> tuple[Plan, dict[str, Any]]:
    """The run's plan and params, after checking hashes and plan_version.

    Raises:
        PlanIntegrityError: the plan or the params were edited outside wf_magic.
        PlanVersionError: a newer wf_magic froze the plan.
        UndecodablePlan: an older plan this version cannot read.
    """
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
    if run.plan_version > PLAN_VERSION:
        raise PlanVersionError(
            f"Run {run.run_id} was frozen by a newer wf_magic (plan_version "
            f"{run.plan_version}; this version reads {PLAN_VERSION}). It was left untouched: "
            "upgrade wf_magic to drive it.",
            run_id=run.run_id,
        )
    try:
        plan = Plan.model_validate_json(run.plan_json)
    except ValidationError as exc:
        raise UndecodablePlan(
            f"plan_version {run.plan_version} cannot be decoded by this wf_magic "
            f"({exc.error_count()} problem(s)); start afresh with `wf run FILE --new`"
        ) from None
    return plan, json.loads(run.params_json)


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
    """Decode a run's plan and params after checking their hashes and plan_version.

    An older plan this version cannot decode abandons the run (with how to start afresh).

    Raises:
        PlanIntegrityError: a hash mismatch (nothing is dispatched).
        PlanVersionError: a newer plan_version (left untouched) or an undecodable one.
    """
    try:
        return verify(run)
    except UndecodablePlan as exc:
        if run.status not in ("completed", "abandoned"):
            store.set_run_status(run.run_id, "abandoned", reason=exc.reason)
            bus.notify("run_status", run_id=run.run_id, status="abandoned", reason=exc.reason)
        raise PlanVersionError(
            f"Run {run.run_id}: {exc.reason}. The run was abandoned.", run_id=run.run_id
        ) from None
