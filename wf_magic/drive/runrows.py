"""New run rows: readable run ids, scope keys and the row a fresh run starts from."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from ..hashing import canonical_json, sha256_text
from ..redact import mask_url
from ..spec.workflow import Workflow
from ..store.records import RunRow
from ..users import current_user

_SUFFIXES = 1 << 24
_ids_lock = threading.Lock()
_ids_state: list[Any] = [None, 0, 0]  # (pid, second), first suffix, ids given in that second


def new_run_id() -> str:
    """A sortable, readable run id: ``r-YYYYmmdd-HHMMSS-xxxxxx`` (UTC).

    The suffix of a process's first id in a second is random, the next ones count up from it:
    a sweep starting thousands of cells in one second never draws the same id twice (random
    draws would: 2 000 of 2^24 collide one time in eight), and two processes collide only
    if their runs of suffixes overlap. A forked child starts its own run of suffixes.
    """
    now = time.time()
    key = (os.getpid(), int(now))
    with _ids_lock:
        if _ids_state[0] != key:
            _ids_state[:] = [key, secrets.randbelow(_SUFFIXES), 0]
        suffix = (_ids_state[1] + _ids_state[2]) % _SUFFIXES
        _ids_state[2] += 1
    return f"r-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(int(now)))}-{suffix:06x}"


def scope_key(workflow: str, params: Mapping[str, Any]) -> str:
    """A run's scope: workflow name + params after defaults, as canonical JSON."""
    return canonical_json({"workflow": workflow, "params": dict(params)})


def new_run_row(
    wf: Workflow,
    params: Mapping[str, Any],
    *,
    run_id: str,
    scope: str,
    use_cache: bool,
    parent: RunRow | None = None,
    invocation_key: str | None = None,
    forked_from: RunRow | None = None,
    fork_step: str | None = None,
) -> RunRow:
    """The ``runs`` row of a new, ``active`` run of ``wf`` (a child charges its root).

    The run belongs to the current user; a child run to its parent's owner.
    """
    now = time.time()
    params_json = canonical_json(dict(params))
    return RunRow(
        run_id=run_id,
        workflow=wf.name,
        plan_json=wf.plan_json,
        plan_hash=wf.plan_hash,
        plan_version=wf.plan.plan_version,
        source_hash=wf.source_hash,
        source_path=mask_url(wf.source_path) if wf.source_path else None,  # a URL's secrets
        params_json=params_json,
        params_hash=sha256_text(params_json),
        status="active",
        status_reason=None,
        scope_key=scope,
        parent_run_id=parent.run_id if parent else None,
        invocation_key=invocation_key,
        root_run_id=parent.root_run_id if parent else run_id,
        forked_from=forked_from.run_id if forked_from else None,
        fork_step=fork_step,
        use_cache=int(use_cache),
        stop_requested=0,
        result_json=None,
        created_at=now,
        updated_at=now,
        finished_at=None,
        owner=parent.owner if parent else current_user(),
    )


def plan_steps(wf: Workflow) -> list[tuple[str, int, str, int]]:
    """The step rows a new run of ``wf`` starts with: (step_id, position, kind, max_loops)."""
    return [(s.id, i, s.kind, s.max_loops) for i, s in enumerate(wf.plan.steps)]
