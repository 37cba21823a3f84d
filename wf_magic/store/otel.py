"""The OpenTelemetry export cursor: which spans of a run were sent to an endpoint, in which form."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping


def sent_txn(conn: sqlite3.Connection, run_id: str, endpoint: str) -> dict[str, str]:
    """Span id (hex) → fingerprint of what was sent of ``run_id`` to ``endpoint``."""
    rows = conn.execute(
        "SELECT span_id, fingerprint FROM otel_sent WHERE run_id = ? AND endpoint = ?",
        (run_id, endpoint),
    ).fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


def mark_sent_txn(
    conn: sqlite3.Connection, run_id: str, endpoint: str, spans: Mapping[str, str]
) -> None:
    """Record ``spans`` (span id → fingerprint) as sent of ``run_id`` to ``endpoint``."""
    conn.executemany(
        "INSERT INTO otel_sent (run_id, endpoint, span_id, fingerprint) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (run_id, endpoint, span_id) DO UPDATE SET fingerprint = excluded.fingerprint",
        [(run_id, endpoint, span_id, fp) for span_id, fp in sorted(spans.items())],
    )
