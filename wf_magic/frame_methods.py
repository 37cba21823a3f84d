"""The Engine's DataFrame methods (pandas is imported only when one is called)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")


class FrameMethods:
    """``runs``, ``journal``, ``tokens``, ``events``, ``budget`` over the engine's database."""

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:  # provided by Engine
        raise NotImplementedError

    def resolve_run_id(self, run_id: str) -> str:  # provided by Engine
        raise NotImplementedError

    def runs(self) -> pd.DataFrame:
        """All runs (see :func:`wf_magic.store.frames.runs_frame`)."""
        from .store import frames

        return self.read(frames.runs_frame)

    def journal(self, run_id: str | None = None) -> pd.DataFrame:
        """One row per attempt (see :func:`wf_magic.store.frames.journal_frame`)."""
        from .store import frames

        rid = self.resolve_run_id(run_id) if run_id else None
        return self.read(lambda c: frames.journal_frame(c, rid))

    def tokens(self, run_id: str | None = None, *, by: str = "step") -> pd.DataFrame:
        """Token accounting grouped ``by`` step/model/runner/loop/run/phase."""
        from .store import frames

        rid = self.resolve_run_id(run_id) if run_id else None
        return self.read(lambda c: frames.tokens_frame(c, rid, by=by))

    def events(self, run_id: str) -> pd.DataFrame:
        """The run's events (see :func:`wf_magic.store.frames.events_frame`)."""
        from .store import frames

        rid = self.resolve_run_id(run_id)
        return self.read(lambda c: frames.events_frame(c, rid))

    def budget(self, run_id: str) -> pd.DataFrame:
        """Used vs limit per ceiling, and what reuse saved (root run's ceilings)."""
        from .store import frames

        rid = self.resolve_run_id(run_id)
        return self.read(lambda c: frames.budget_frame(c, rid))
