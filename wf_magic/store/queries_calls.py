"""The Store's named reads and writes of the ``calls`` table (store/calls.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import calls
from .access import StoreAccess
from .calls import CallBody, CallRow, CallTotals, RecordedCall

if TYPE_CHECKING:
    import pandas as pd


class CallQueries(StoreAccess):
    """Per-call rows of agent attempts made through the bridge."""

    def record_call(self, row: CallRow, body: CallBody | None = None) -> int:
        """Journal ``row`` (and what it sent and got back) as the next call of its attempt
        (committed now); its number. The run's secrets are scrubbed from the body too."""
        row = replace(row, error=self.scrubber.text(row.run_id, row.error))
        if body is not None:
            body = replace(
                body,
                request=self.scrubber.text(row.run_id, body.request),
                response=self.scrubber.text(row.run_id, body.response),
            )
        return self._write(lambda c: calls.insert_call_txn(c, row, body), row.run_id)

    def recorded_calls(self, run_id: str) -> list[RecordedCall]:
        """The calls of ``run_id`` and its child runs with what they sent and got back, attempt
        by attempt (for ``wf export-cassette``)."""
        return self._read(lambda c: calls.recorded_calls_txn(c, run_id), run_id)

    def call_totals(self, run_id: str, dispatch_id: str) -> CallTotals:
        """The sums over the calls journaled for ``dispatch_id`` so far."""
        return self._read(lambda c: calls.call_totals_txn(c, dispatch_id), run_id)

    def calls_of(self, run_id: str) -> list[CallRow]:
        """The journaled calls of ``run_id``, in the order they were made (for the
        OpenTelemetry export's ``chat`` spans under an agent attempt)."""
        return self._read(lambda c: calls.calls_of_txn(c, run_id), run_id)

    def calls_frame(self, run_id: str, *, unit_id: str | None = None) -> pd.DataFrame:
        """One row per model call of ``run_id`` (see :func:`store.callframes.calls_frame`)."""
        from . import callframes  # pandas is imported only when a frame is asked for

        return self._read(lambda c: callframes.calls_frame(c, run_id, unit_id=unit_id), run_id)
