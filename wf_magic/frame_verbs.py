"""The Engine's frames as a mixin: ``runs``, ``journal``, ``calls``, ``scores``, ``tokens``,
``events``, ``budget``, ``limits`` and ``compare`` (pandas is imported when one is asked for)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .run import RunRef
from .store import Store

if TYPE_CHECKING:
    import pandas as pd

    from .comparison import RunComparison


class FrameVerbs:
    """The frame verbs; the Engine provides the attributes declared here."""

    store: Store

    def resolve_run_id(self, run_id: RunRef) -> str:
        raise NotImplementedError

    def runs(self, *, include_deleted: bool = False) -> pd.DataFrame:
        """All runs; ``include_deleted`` adds gc receipts and journal totals per run (see
        :func:`wf_magic.store.frames.runs_frame`)."""
        return self.store.runs_frame(include_deleted=include_deleted)

    def journal(self, run_id: RunRef | None = None) -> pd.DataFrame:
        """One row per attempt (see :func:`wf_magic.store.frames.journal_frame`)."""
        return self.store.journal_frame(self.resolve_run_id(run_id) if run_id else None)

    def calls(self, run_id: RunRef, *, unit: str | None = None) -> pd.DataFrame:
        """One row per model call of the run's agent attempts, made through the bridge (see
        :func:`wf_magic.store.callframes.calls_frame`); ``unit``: only that unit's.

        Raises:
            UsageError: no such run, or ``unit`` is no unit of it (its units are named).
        """
        resolved = self.resolve_run_id(run_id)
        frame = self.store.calls_frame(resolved, unit_id=unit)
        if unit is not None and frame.empty:
            from .inspection import unit_attempts

            unit_attempts(self.store, resolved, unit)  # a mistyped unit is named, not empty
        return frame

    def scores(self, run_id: RunRef) -> pd.DataFrame:
        """One row per score of the run (see :meth:`wf_magic.Run.scores`)."""
        return self.store.scores_frame([self.resolve_run_id(run_id)])

    def tokens(self, run_id: RunRef | None = None, *, by: str = "step") -> pd.DataFrame:
        """Token accounting grouped ``by`` step/model/runner/loop/run/phase."""
        return self.store.tokens_frame(self.resolve_run_id(run_id) if run_id else None, by=by)

    def events(self, run_id: RunRef) -> pd.DataFrame:
        """The run's events (see :func:`wf_magic.store.frames.events_frame`)."""
        return self.store.events_frame(self.resolve_run_id(run_id))

    def budget(self, run_id: RunRef) -> pd.DataFrame:
        """Used vs limit per ceiling (the root run's), what reuse saved, and what LLM judges
        spent outside the budget: on the ``tokens`` row ``used``, ``saved`` and ``judge`` are
        the run's paid, reused and judge tokens, as every view of it reads them."""
        return self.store.budget_frame(self.resolve_run_id(run_id))

    def limits(self) -> pd.DataFrame:
        """The model endpoints this process calls, one row each (drive/limiter.py): current
        and maximum calls in flight, calls, throttles, seconds waited, known rpm/tpm."""
        from .drive.limiter import LIMITERS, limits_frame

        return limits_frame(LIMITERS.states())

    def compare(self, run_a: RunRef, run_b: RunRef, *, show_all: bool = False) -> RunComparison:
        """Two runs unit by unit: both outputs (every loop), what changed, token/cost deltas.

        ``run_a`` is the earlier run, ``run_b`` the later one. The result prints as text,
        renders as HTML in a notebook and has a ``frame()`` (one row per unit).

        Raises:
            UsageError: either run does not exist.
        """
        from .comparison import compare_runs

        a, b = self.resolve_run_id(run_a), self.resolve_run_id(run_b)
        return compare_runs(self.store, a, b, show_all=show_all)
