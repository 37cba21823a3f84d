"""The two doors of the Store (a read, a write) that its query mixins go through."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from .cellstarts import Event
    from .scrub import Scrubber

T = TypeVar("T")


class StoreAccess:
    """Base of the Store's query mixins: each named query or write calls ``_read`` or ``_write``.

    The Store (store/store.py) overrides both; the mixins (``queries_*.py``) only need to
    know that they exist, so the connections, the write lock and group commit stay in one
    class.
    """

    scrubber: Scrubber
    """Redacts every text column a named write is about to write (store/scrub.py)."""

    def _read(
        self,
        fn: Callable[[sqlite3.Connection], T],
        run_id: str | None = None,
        *,
        flush: bool = True,
    ) -> T:
        """Run ``fn`` on a reader connection (``run_id``: the run named by its errors), after
        the deferred writes it may read commit (``flush=False``: none it reads is deferred)."""
        raise NotImplementedError

    def _write(self, fn: Callable[[sqlite3.Connection], T], run_id: str | None = None) -> T:
        """Run ``fn`` in one ``BEGIN IMMEDIATE`` transaction of the writer."""
        raise NotImplementedError

    def _defer_write(
        self,
        run_id: str,
        fn: Callable[[sqlite3.Connection], object],
        events: Sequence[Event] = (),
    ) -> None:
        """Run ``fn`` (then append ``events``) in the next write transaction."""
        raise NotImplementedError

    def _defers_inputs(self, input_hashes: Sequence[str]) -> bool:
        """Whether a deferred finish is of an attempt of one of ``input_hashes``."""
        return True

    def _fresh(self, run_id: str) -> bool:
        """Whether ``run_id`` is known here to have no attempt yet (a fresh run driven under
        its lock, nothing written for it since): its journal reads answer empty unread."""
        return False

    def _fresh_stop_answer(self, run_id: str) -> bool:
        """Whether the first stop poll of a fresh run is answered by the read that found it
        fresh (True once; then the poll reads)."""
        return False
