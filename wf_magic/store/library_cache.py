"""SQL for the workflow library's cache: remote documents (indexes, workflow sources) by URL."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal

from .records import from_row

CopyKind = Literal["index", "workflow"]
"""What a cached copy is:

- ``index``: a library index (name → source URL + sha256); refreshed after its TTL.
- ``workflow``: a workflow source, content-addressed by the sha256 its index promises.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class LibraryCopy:
    """A row of ``library_cache``: the last good copy of one remote document."""

    url: str
    kind: CopyKind
    body: str
    sha256: str
    """Hex sha256 of the body's UTF-8 bytes (as fetched)."""
    fetched_at: float
    """When the copy was fetched (epoch seconds); its age decides whether it is fresh."""


def library_copy(conn: sqlite3.Connection, url: str) -> LibraryCopy | None:
    """The cached copy of ``url``, if any."""
    row = conn.execute(
        "SELECT url, kind, body, sha256, fetched_at FROM library_cache WHERE url = ?", (url,)
    ).fetchone()
    return from_row(LibraryCopy, row) if row is not None else None


def keep_library_copy_txn(conn: sqlite3.Connection, copy: LibraryCopy) -> None:
    """Write ``copy`` over any earlier copy of its URL."""
    conn.execute(
        "INSERT INTO library_cache (url, kind, body, sha256, fetched_at) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (url) DO UPDATE SET kind = excluded.kind, body = excluded.body,"
        " sha256 = excluded.sha256, fetched_at = excluded.fetched_at",
        (copy.url, copy.kind, copy.body, copy.sha256, copy.fetched_at),
    )
