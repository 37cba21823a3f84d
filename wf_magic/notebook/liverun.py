"""``LiveRun``: the ``Run`` a cell evaluates to when a live view already shows it.

It displays as nothing (the view above is its display), and a gate decision the view's
buttons already journaled is reported, not raised, when the notebook's code makes it again.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..errors import GateDecisionRefused
from ..run import Run


class LiveRun(Run):
    """The ``Run`` a cell evaluates to when a live view already shows it: no ``Out[n]``.

    ``repr()``/``print()`` still give the full text summary; ``.view`` is the widget.
    A decision the view's buttons already recorded is not an error when the notebook's code
    makes it again (a tutorial cell run after clicking Approve): see :meth:`approve`.
    """

    def __init__(self, handle: Run, view: Any):
        super().__init__(
            handle.store, handle.run_id, bus=handle.bus, stats=handle.stats, created=handle.created
        )
        self.warnings.extend(handle.warnings)
        self.view = view

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        # No status here: the view above stays current, a status printed once would go stale.
        return {"text/plain": f"<Run {self.run_id} ({self.row.workflow})>"}

    def _repr_html_(self) -> None:  # type: ignore[override]
        return None  # the live view above is the rich display

    def _ipython_display_(self) -> None:
        """Show nothing as the cell's value: the view above is this run's display."""

    def approve(self, step_id: str, *, feedback: str | None = None, loop: int | None = None) -> int:
        """Approve like :meth:`Run.approve`; an approval already journaled for the step's
        latest gate loop (the view's button, another cell) is reported, not raised.

        Raises:
            GateDecisionRefused: the step is not waiting and no person approved it.
        """
        try:
            return super().approve(step_id, feedback=feedback, loop=loop)
        except GateDecisionRefused:
            decided = _decided_loop(self, step_id, complete=True, loop=loop)
            if decided is None:
                raise
        print(
            f"step {step_id} (loop {decided}) was already approved (from the run view or "
            "another cell); nothing new was recorded",
            file=sys.stderr,
        )
        return decided

    def reject(
        self,
        step_id: str,
        *,
        feedback: str,
        missing: tuple[str, ...] | list[str] = (),
        loop: int | None = None,
    ) -> int:
        """Reject like :meth:`Run.reject`; the same rejection already journaled is reported.

        Raises:
            GateDecisionRefused: the step is not waiting and no person rejected it so.
            UsageError: no feedback was given.
        """
        try:
            return super().reject(step_id, feedback=feedback, missing=missing, loop=loop)
        except GateDecisionRefused:
            decided = _decided_loop(self, step_id, complete=False, loop=loop, feedback=feedback)
            if decided is None:
                raise
        print(
            f"step {step_id} (loop {decided}) was already rejected with this feedback; "
            "nothing new was recorded",
            file=sys.stderr,
        )
        return decided


def _decided_loop(
    run: Run, step_id: str, *, complete: bool, loop: int | None, feedback: str | None = None
) -> int | None:
    """The loop of the step's latest person's verdict when it says the same (else None)."""
    verdicts = [
        a
        for a in run.attempts()
        if a.step_id == step_id and a.phase == "gate" and a.status == "succeeded"
    ]
    if not verdicts:
        return None
    latest = max(verdicts, key=lambda a: (a.loop, a.attempt_pk))
    verdict = json.loads(latest.output_json or "{}")
    same = (
        latest.runner == "human"
        and isinstance(verdict, dict)
        and bool(verdict.get("complete")) == complete
        and (feedback is None or verdict.get("feedback") == feedback)
        and (loop is None or loop == latest.loop)
    )
    return latest.loop if same else None
