"""The Store's reads for views, replay and the library: frames, tallies, recordings, cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import recordings, summary
from .access import StoreAccess
from .recordings import RecordingRow

if TYPE_CHECKING:
    import pandas as pd

    from .library_cache import LibraryCopy


class ViewQueries(StoreAccess):
    """Frames and run tallies (display), recorded attempts (replay), the library cache."""

    # -- frames ----------------------------------------------------------------------------
    def runs_frame(self, *, include_deleted: bool = False) -> pd.DataFrame:
        """All runs, with gc receipts too (see :func:`wf_magic.store.frames.runs_frame`)."""
        from . import frames  # pandas is imported only when a frame is asked for

        return self._read(lambda c: frames.runs_frame(c, include_deleted=include_deleted))

    def journal_frame(self, run_id: str | None = None) -> pd.DataFrame:
        """One row per attempt (see :func:`wf_magic.store.frames.journal_frame`)."""
        from . import frames

        return self._read(lambda c: frames.journal_frame(c, run_id), run_id)

    def tokens_frame(self, run_id: str | None = None, *, by: str = "step") -> pd.DataFrame:
        """Token accounting grouped ``by`` (see :func:`wf_magic.store.frames.tokens_frame`)."""
        from . import frames

        return self._read(lambda c: frames.tokens_frame(c, run_id, by=by), run_id)

    def events_frame(self, run_id: str | None = None) -> pd.DataFrame:
        """Events (see :func:`wf_magic.store.frames.events_frame`)."""
        from . import frames

        return self._read(lambda c: frames.events_frame(c, run_id), run_id)

    def budget_frame(self, run_id: str) -> pd.DataFrame:
        """Used vs limit per ceiling (see :func:`wf_magic.store.frames.budget_frame`)."""
        from . import frames

        return self._read(lambda c: frames.budget_frame(c, run_id), run_id)

    def scores_frame(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """One row per score unit of the runs (see
        :func:`wf_magic.store.scoreframes.scores_frame`)."""
        from . import scoreframes

        ids = list(run_ids)
        return self._read(
            lambda c: scoreframes.scores_frame(c, ids), ids[0] if len(ids) == 1 else None
        )

    # -- run views (display/) --------------------------------------------------------------
    def run_tally(self, run_id: str) -> summary.RunTally:
        """Per-step unit and token counts, gate verdicts and reuse of a run, counted in SQL."""
        return self._read(lambda c: summary.run_tally(c, run_id), run_id)

    # -- recordings (replay runner, cassette export) ---------------------------------------
    def latest_recording(
        self, *, phase: str, input_hash: str, workflow: str
    ) -> RecordingRow | None:
        """The newest succeeded attempt of ``phase`` with ``input_hash``, ``workflow``'s first."""
        return self._read(
            lambda c: recordings.latest_recording(
                c, phase=phase, input_hash=input_hash, workflow=workflow
            )
        )

    def run_recordings(self, run_id: str) -> list[RecordingRow]:
        """The succeeded and reused attempts of a run and its children, in journal order."""
        return self._read(lambda c: recordings.run_recordings(c, run_id), run_id)

    # -- workflow library cache ------------------------------------------------------------
    def library_copy(self, url: str) -> LibraryCopy | None:
        """The library cache's copy of ``url`` (an index or a workflow source), if any."""
        from . import library_cache

        return self._read(lambda c: library_cache.library_copy(c, url))

    def keep_library_copy(self, copy: LibraryCopy) -> None:
        """Write a fetched, verified copy into the library cache (over an older one)."""
        from . import library_cache

        self._write(lambda c: library_cache.keep_library_copy_txn(c, copy))
