"""Long ``IN (...)`` lists bound in chunks: one statement per 500 values.

SQLite bounds the host parameters of one statement (32 766 since 3.32, 999 before), and a
few hundred per statement keep PostgreSQL's plans cheap: every query over "these units" or
"these hashes" walks its values through :func:`in_chunks`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

CHUNK = 500
"""Values bound per statement."""

V = TypeVar("V")


def in_chunks(values: Sequence[V]) -> Iterator[tuple[Sequence[V], str]]:
    """``values`` in chunks of :data:`CHUNK`, each with its placeholders (``?, ?, …``)."""
    for start in range(0, len(values), CHUNK):
        chunk = values[start : start + CHUNK]
        yield chunk, ", ".join("?" * len(chunk))
