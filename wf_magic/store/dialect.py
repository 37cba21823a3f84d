"""Which SQL a connection speaks, for the few named queries whose text differs by database.

The Store's queries are written once, in SQL both SQLite and PostgreSQL read the same way;
store/pgconn.py translates placeholders and a few spellings mechanically. Where a query has
no common spelling that is as fast on SQLite (SQLite's "bare column beside max()" picks the
newest attempt of each unit in one pass; PostgreSQL says it with ``DISTINCT ON``), the query
site gives both texts through :func:`pick`, side by side, in that one place.
"""

from __future__ import annotations

from typing import Any


def pick(conn: Any, *, sqlite: str, postgresql: str) -> str:
    """The text of one query for ``conn``'s database."""
    return postgresql if getattr(conn, "dialect", "sqlite") == "postgresql" else sqlite
