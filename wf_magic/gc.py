"""``Engine.gc`` as a mixin (``GcVerbs``): deleting finished runs, their receipts and files.

Kept apart from engine.py by concept, as the sweep verbs are (sweeps/verbs.py); the Engine
supplies the attributes declared below.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .arg_values import SECONDS_MAX
from .errors import RunLockHeld, UsageError
from .store import Store

GC_STATUSES: tuple[str, ...] = ("completed", "failed", "abandoned")
"""The run statuses gc deletes (finished ones); ``wf gc --status`` picks among them."""


class GcVerbs:
    """The Engine's garbage collection of finished runs (see :meth:`gc`)."""

    store: Store
    state_dir: Path

    def gc(
        self,
        *,
        older_than_s: float,
        statuses: Sequence[str] = GC_STATUSES,
        dry_run: bool = False,
        vacuum: bool = False,
        on_skip: Callable[[str, str], None] | None = None,
    ) -> list[str]:
        """Delete finished root runs (and their children) older than the retention.

        Each run is deleted under its lock and its descendants' (a family any member of which
        is being driven is skipped), and its status is re-checked inside the delete, so a
        failed run resumed meanwhile is kept. A tree with a live member (an ``active`` or
        ``blocked`` child of a finished root) is never deleted; abandon the root to end it.
        Each deleted run leaves a receipt in the same transaction (``runs(include_deleted=
        True)``). The lock files of deleted runs go too.

        Args:
            older_than_s: the retention: runs finished at least this long ago go.
            statuses: only root runs of these (finished) statuses.
            dry_run: only list what would be deleted.
            vacuum: afterwards rebuild the file to return the freed pages to the disk.
            on_skip: called with ``(run_id, why)`` for each candidate kept.

        Returns:
            The deleted root run ids (with ``dry_run``: those that would be deleted).

        Raises:
            UsageError: a negative retention, or a status that is not a finished one.
        """
        if (
            isinstance(older_than_s, bool)
            or not isinstance(older_than_s, int | float)
            or not math.isfinite(older_than_s)
            or not 0 <= older_than_s <= SECONDS_MAX
        ):
            raise UsageError(
                "gc retention must be a number of seconds from 0 to 100 years "
                f"(got {older_than_s!r})"
            )
        wrong = [s for s in statuses if s not in GC_STATUSES]
        if wrong or not statuses:
            raise UsageError(
                f"expected finished statuses {', '.join(GC_STATUSES)} "
                f"(got {', '.join(map(repr, wrong)) or 'none'})"
            )
        cutoff = time.time() - older_than_s
        candidates = self.store.finished_runs_before(cutoff)
        if set(statuses) != set(GC_STATUSES):
            rows = [self.store.get_run(c) for c in candidates]
            candidates = [r.run_id for r in rows if r is not None and r.status in statuses]
        candidates = self._without_live_members(candidates, on_skip)
        if dry_run:
            return candidates
        deleted = self._delete_finished(
            candidates, cutoff=cutoff, statuses=statuses, on_skip=on_skip
        )
        if vacuum:
            self.store.vacuum()
        return deleted

    def _without_live_members(
        self, candidates: list[str], on_skip: Callable[[str, str], None] | None
    ) -> list[str]:
        """The candidates none of whose descendants is active or blocked."""
        from .store.runs import LIVE

        kept = []
        for rid in candidates:
            live = [c for c in self.store.descendants(rid) if c.status in LIVE]
            if not live:
                kept.append(rid)
            elif on_skip is not None:
                on_skip(
                    rid,
                    f"its child run {live[0].run_id} is {live[0].status}; "
                    f"`wf abandon {rid}` ends the family, then gc deletes it",
                )
        return kept

    def _delete_finished(
        self,
        candidates: list[str],
        *,
        cutoff: float,
        statuses: Sequence[str],
        on_skip: Callable[[str, str], None] | None,
    ) -> list[str]:
        import contextlib

        deleted = []
        for rid in candidates:
            with contextlib.ExitStack() as held:
                locks: dict[str, Any] = {}
                try:
                    for member in [rid, *(c.run_id for c in self.store.descendants(rid))]:
                        locks[member] = held.enter_context(self.store.run_lock(member))
                except RunLockHeld as exc:
                    if on_skip is not None:
                        on_skip(rid, f"{exc.message} (kept)")
                    continue
                tree = self.store.delete_finished_tree(rid, cutoff=cutoff, statuses=statuses)
                for run_id in tree:
                    (locks.get(run_id) or self.store.run_lock(run_id)).remove()
                _reap_leftovers(self.state_dir, list(tree))
                _sweep_agent_files(self.state_dir, list(tree))
            if tree:
                deleted.append(rid)
        return deleted


def _reap_leftovers(state_dir: Path, run_ids: list[str]) -> None:
    """End the process groups units of runs gc deleted left running when their driver died
    (a killed run that was abandoned, never resumed: nothing else would end them)."""
    if not run_ids or not (state_dir / "procs").is_dir():
        return
    from .runners.orphans import reap_orphans

    reap_orphans(state_dir, set(run_ids))


def _sweep_agent_files(state_dir: Path, run_ids: list[str]) -> None:
    """The worktrees, HOMEs, sidecars and logs of agent attempts of runs gc deleted."""
    if not run_ids or not ((state_dir / "worktrees").is_dir() or (state_dir / "agents").is_dir()):
        return
    from .agents import sidecars, worktrees

    worktrees.sweep(state_dir, run_ids)
    sidecars.sweep(state_dir, run_ids)
