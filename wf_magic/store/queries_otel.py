"""The Store's named reads and writes of the OpenTelemetry export cursor (store/otel.py)."""

from __future__ import annotations

from collections.abc import Mapping

from . import otel
from .access import StoreAccess


class OtelQueries(StoreAccess):
    """What a run's OpenTelemetry export has sent where (wf_magic/otel/)."""

    def otel_sent(self, run_id: str, endpoint: str) -> dict[str, str]:
        """Span id (hex) → fingerprint of the spans of ``run_id`` sent to ``endpoint``."""
        return self._read(lambda c: otel.sent_txn(c, run_id, endpoint), run_id)

    def mark_otel_sent(self, run_id: str, endpoint: str, spans: Mapping[str, str]) -> None:
        """Record ``spans`` (span id → fingerprint) as sent of ``run_id`` to ``endpoint``."""
        if spans:
            self._write(lambda c: otel.mark_sent_txn(c, run_id, endpoint, spans))
