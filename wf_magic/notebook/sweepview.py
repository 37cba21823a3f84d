"""The live grid of a ``%%sweep`` cell: one small button per cell, coloured by its run's status
and redrawn (throttled) as cells settle, the tokens paid against the sweep's ceiling above it;
a click on a cell opens its run view below the grid once the cell ended (the kernel is busy
until then). When another cell runs after the sweep ended, the live grid gives way to what a
saved notebook can show (the opened cell's static run view, or nothing: the static HTML grid
below it shows the sweep; under ``--background`` that static grid itself), every model it made
is closed, and the static grid follows the sweep (``sweepfollow.SweepOutput``)."""

from __future__ import annotations

import html
import logging
import threading
from typing import TYPE_CHECKING, Any

from ..errors import WorkflowError
from ..sweeps.handle import Sweep
from .detail import STATUS_CSS, status_classes
from .teardown import close_tree
from .throttle import Throttle

if TYPE_CHECKING:
    import ipywidgets

    from ..engine import Engine
    from ..store.sweeps import SweepCellRow
    from ..sweeps.background import BackgroundSweep
    from .sweepfollow import SweepOutput
    from .widgets import RunView

MAX_BUTTONS = 400
"""Past this many cells the grid is one HTML picture (thousands of buttons would slow the
browser); a cell is then opened by its number in the box beside it."""
MAX_MODELS = MAX_BUTTONS + 40
"""The most widget models a live grid holds, whatever the sweep's size: one per cell button
(they share one layout and one style; a status is a CSS class), ~20 for the rest, and one
opened cell's run view (its own bound: see ``RunView``)."""

log = logging.getLogger("wf_magic")


class SweepGridView:
    """Observes one sweep (reads its rows) and redraws its grid; it never drives.

    Args:
        engine: the engine the sweep's runs are in (a click opens a run view on it).
        sweep_id: the sweep shown (its rows may not exist yet: the grid fills in once they do).
    """

    def __init__(self, engine: Engine, sweep_id: str):
        import ipywidgets as w

        self.engine = engine
        self.sweep = Sweep(engine.store, sweep_id)
        self.header = w.HTML(value="<i>sweep starting…</i>")
        self.grid = w.GridBox(
            layout=w.Layout(grid_template_columns="repeat(auto-fill, 16px)", grid_gap="2px")
        )
        self.picture = w.HTML()
        self.pick = w.BoundedIntText(
            value=0, min=0, max=0, description="open cell", layout=w.Layout(width="180px")
        )
        self.pick_button = w.Button(description="Open", layout=w.Layout(width="70px"))
        self.pick_button.on_click(lambda _: self.open_cell(int(self.pick.value)))
        self.opened = w.HTML()
        self.run_box = w.Output()
        self.widget: ipywidgets.VBox = w.VBox(
            [
                self.header,
                self.grid,
                self.picture,
                w.HBox([self.pick, self.pick_button]),
                self.opened,
                self.run_box,
            ]
        )
        self.handle: Any = None
        """The live grid's output (emptied when the sweep ends: see :meth:`finish`)."""
        self._layout = w.Layout(width="14px", height="14px", padding="0", margin="0")
        self._style = w.ButtonStyle()
        self.buttons: list[ipywidgets.Button] = []
        self.cells: list[SweepCellRow] = []
        self.view: RunView | None = None
        self.in_background = False
        """The sweep is driven on a thread while later cells run (``%%sweep --background``):
        the cell shows no static grid, so :meth:`settle` leaves one in the live grid's place."""
        self.is_settled = False
        self.follower: SweepOutput | None = None
        """A background sweep's static grid once settled, following the sweep."""
        self._drive: BackgroundSweep | None = None
        self._is_finished = False
        self._finish_lock = threading.Lock()
        self._throttle = Throttle(self._redraw)

    def poke(self, done: int, total: int) -> None:
        """A cell settled (called from the sweep's cell threads)."""
        self._throttle.poke()

    def _redraw(self) -> None:
        from ..sweeps.handle import grid_html

        if self.sweep._store.get_sweep(self.sweep.sweep_id) is None:
            return
        cells = self.sweep.cells()
        self.cells = cells
        self.pick.max = max(len(cells) - 1, 0)
        if len(cells) > MAX_BUTTONS:
            self.header.value = ""
            self.picture.value = grid_html(self.sweep)
            return
        self.header.value = f"<style>{STATUS_CSS}</style>{_header(self.sweep)}"
        while len(self.buttons) < len(cells):
            self.buttons.append(self._button(len(self.buttons)))
        if len(self.grid.children) != len(cells):
            self.grid.children = tuple(self.buttons[: len(cells)])
        for button, cell in zip(self.buttons, cells, strict=False):
            status = cell.run_status or "pending"
            classes = status_classes("wf-sweep-cell", status)
            if list(button._dom_classes) != classes:
                button._dom_classes = classes
            button.tooltip = f"cell {cell.cell_index} {_where(cell)}: {status} {cell.run_id or ''}"

    def _button(self, index: int) -> ipywidgets.Button:
        import ipywidgets as w

        button = w.Button(description="", layout=self._layout, style=self._style)
        button.add_class("wf-sweep-cell")
        button.on_click(lambda _: self.open_cell(index))
        return button

    def open_cell(self, index: int) -> None:
        """Show cell ``index``'s run view below the grid (a live one: it follows the run while
        the sweep drives it); a cell without a run yet says so."""
        from IPython.display import display

        from .widgets import RunView

        cell = next((c for c in self.sweep.cells() if c.cell_index == index), None)
        if cell is None:
            self.opened.value = f"<i>no cell {index} in this sweep</i>"
            return
        run_id, point = cell.run_id, html.escape(_where(cell))
        if run_id is None:
            self.opened.value = f"<i>cell {index} ({point}) has no run yet</i>"
            return
        if self.view is not None:
            self.view.close()
        self.opened.value = f"<b>cell {index}</b> ({point}): run <code>{run_id}</code>"
        self.view = RunView(self.engine, run_id)
        self.run_box.clear_output()
        with self.run_box:
            display(self.view)  # type: ignore[no-untyped-call]
        self.view.flush()

    def show(self) -> None:
        """Display the live grid (from the main thread) in an output :meth:`finish` empties.

        Beside the widget the output carries text and HTML, what a front end without the
        widget's model shows (an untrusted copy, nbconvert)."""
        from IPython.display import display

        bundle = dict(self.widget._repr_mimebundle_() or {})
        bundle["text/plain"] = "live sweep grid (shown while the sweep drives)"
        bundle["text/html"] = "<i>live sweep grid (shown while the sweep drives)</i>"
        self.handle = display(bundle, raw=True, display_id=True)  # type: ignore[no-untyped-call]

    @property
    def is_driving(self) -> bool:
        """Whether the background drive this grid follows is still going (the grid must stay
        live through later cells; :meth:`settle` waits for a cell after it ended)."""
        return self._drive is not None and self._drive.running

    def finish(self) -> None:
        """The sweep ended: one last draw; the grid stays clickable until :meth:`settle`.

        Idempotent (a background drive's thread and the next cell may both call it); what
        ended a background drive is said under the header, as nobody waits to raise it."""
        with self._finish_lock:
            if self._is_finished:
                return
            self._is_finished = True
            self._throttle.flush()
            self._throttle.close()
            error = self._drive.error if self._drive is not None else None
            if error is not None:
                said = html.escape(f"the background drive stopped: {error}")
                self.header.value += f"<div><b>{said}</b></div>"

    def follow(self, drive: BackgroundSweep) -> None:
        """Follow a background sweep: the grid draws its last state when ``drive`` ends (a
        daemon thread waits for it), and settles at the first cell after that."""
        self.in_background = True
        self._drive = drive

        def wait() -> None:
            try:
                drive.wait()
            except WorkflowError:  # kept on the drive; finish() says it in the grid
                pass
            except BaseException:  # a bug, not a refusal: logged, as a run's drive logs it
                log.exception("the background drive of sweep %s failed", drive.sweep_id)
            try:
                self.finish()
            except Exception:  # a thread of ours must not print a traceback into a cell
                log.exception("the last draw of sweep %s's grid failed", drive.sweep_id)

        threading.Thread(target=wait, name=f"wf-sweep-grid-{drive.sweep_id}", daemon=True).start()

    def settle(self) -> None:
        """Another cell runs: the live output gives way to what a saved notebook can show
        (the opened cell's static run view, else nothing: the cell's result is the static
        grid; a background sweep's cell has none, so its grid) and every model the grid made
        is closed."""
        self.finish()
        if self.handle is not None:
            shown = self.view.static_bundle() if self.view is not None else None
            if self.in_background:
                # The static grid in the live grid's place, following the sweep from now on
                # (a stopped sweep resumed by `wf sweep-resume` repaints it).
                from .sweepfollow import SweepOutput

                below = shown["text/html"] if shown is not None else ""
                self.follower = SweepOutput(self.sweep, below=below)
                self.follower.attach(self.handle)
            else:
                self.handle.update(shown or {"text/plain": ""}, raw=True)
        self.is_settled = True
        self.close()

    def close(self) -> None:
        """Stop redrawing and close every widget model of the grid."""
        with self._finish_lock:
            self._is_finished = True  # a drive ending later draws nothing more
            self._throttle.close()
        if self.view is not None:
            self.view.close()
        close_tree(self.widget)
        for widget in (*self.buttons, self._layout, self._style):  # shown or not
            close_tree(widget)


def _where(cell: SweepCellRow) -> str:
    """A cell's place in the sweep: its grid point, dataset row (if any) and repeat."""
    row = f" row {cell.row_index}" if cell.row_index is not None else ""
    return f"{cell.point_json}{row} repeat {cell.repeat}"


def _header(sweep: Sweep) -> str:
    """The sweep's name, status, cell count and tokens against its token ceiling."""
    row = sweep.row
    totals = sweep.totals()
    limit = sweep.budget.get("max_tokens")
    of = f" of {limit}" if limit is not None else ""
    reason = f" — {html.escape(row.status_reason)}" if row.status_reason else ""
    return (
        f"<b>sweep {html.escape(row.sweep_id)}</b> {html.escape(row.workflow)} · "
        f"{html.escape(row.status)}{reason} · {row.cells} cells · tokens "
        f"{int(totals['tokens'])}{of} · click a cell to open its run"
    )
