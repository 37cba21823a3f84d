"""The live grid of a ``%%sweep`` cell: an ipywidgets HTML box redrawn (throttled) as cells
settle; the finished cell keeps the sweep's static HTML grid as its output."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..store import Store
from ..sweeps.handle import Sweep, grid_html
from .throttle import Throttle

if TYPE_CHECKING:
    import ipywidgets


class SweepGridView:
    """Observes one sweep (reads its rows) and redraws its grid; it never drives."""

    def __init__(self, store: Store, sweep_id: str):
        import ipywidgets

        self.sweep = Sweep(store, sweep_id)
        self.widget: ipywidgets.HTML = ipywidgets.HTML(value="<i>sweep starting…</i>")
        self._throttle = Throttle(self._redraw)

    def poke(self, done: int, total: int) -> None:
        """A cell settled (called from the sweep's cell threads)."""
        self._throttle.poke()

    def _redraw(self) -> None:
        if self.sweep._store.get_sweep(self.sweep.sweep_id) is not None:
            self.widget.value = grid_html(self.sweep)

    def close(self) -> None:
        """Stop redrawing and close the widget (the cell's result shows the static grid)."""
        self._throttle.close()
        self.widget.close()
