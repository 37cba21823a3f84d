"""``%%workflow`` and ``%workflow``: thin IPython shells over the Engine, set by traitlets."""

# IPython's magic decorators are untyped; everything else here is checked strictly.
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Bool, CaselessStrEnum, Float, Integer, Unicode

from ..arg_values import count_at_least, number_in
from ..engine import Engine
from ..errors import RunLockHeld, RunNotOwned, WorkflowError, clip_message
from ..run import Run
from ..spec.workflow import Workflow
from ..store.db import default_state
from ..store.location import PgLocation, parse_state
from . import commands
from .args import COMMANDS, cell_args, line_args, line_help
from .drives import Drives

if TYPE_CHECKING:
    from .sweepfollow import SweepOutput
    from .sweeps import SweepDrives
    from .sweepview import SweepGridView
    from .widgets import RunView

log = logging.getLogger("wf_magic")
_TERMINAL = ("completed", "abandoned")
_F = TypeVar("_F", bound=Callable[..., Any])


def _documented(doc: str) -> Callable[[_F], _F]:
    """Give a magic a docstring built at import time (before magic_arguments appends its own)."""

    def set_doc(func: _F) -> _F:
        func.__doc__ = doc
        return func

    return set_doc


@contextmanager
def _as_usage_errors(drives: Drives) -> Iterator[None]:
    """wf_magic errors become one-line IPython UsageErrors (no traceback wall)."""
    try:
        yield
    except RunLockHeld as exc:
        raise IPythonUsageError(_lock_message(exc, drives)) from None
    except RunNotOwned as exc:  # the notebook's own way to adopt it
        raise IPythonUsageError(exc.text(adopt=f"%workflow adopt {exc.run_id}")) from None
    except WorkflowError as exc:
        raise IPythonUsageError(clip_message(str(exc))) from None


def _lock_message(exc: RunLockHeld, drives: Drives) -> str:
    """The lock error, with how to stop the driver from this notebook."""
    run_id = exc.run_id or "RUN"
    if exc.run_id is not None and (drives.is_driving(exc.run_id) or exc.pid == os.getpid()):
        return (
            f"{exc} This kernel drives it in the background: `%workflow stop {run_id}` stops "
            "it between units."
        )
    return f"{exc} From this notebook: `%workflow stop {run_id}`."


@magics_class
class WorkflowMagics(Magics):
    """Durable LLM-agent workflows in cells: ``%%workflow`` runs one, ``%workflow`` manages runs."""

    state_dir = Unicode(
        "",
        help="State directory (state.db and run locks); empty means "
        "$WF_MAGIC_HOME, else ./.wf_magic",
    ).tag(config=True)
    durability = CaselessStrEnum(
        ["normal", "full"],
        default_value="normal",
        help="SQLite durability: normal (WAL, synchronous=NORMAL) or full (synchronous=FULL)",
    ).tag(config=True)
    max_concurrency = Integer(
        None, allow_none=True, help="Cap on map units in flight (the plan's cap also applies)"
    ).tag(config=True)
    widgets = CaselessStrEnum(
        ["auto", "on", "off"],
        default_value="auto",
        help="Live run view: auto (when a kernel serves a front end), on, off (text/HTML only)",
    ).tag(config=True)
    watch_poll_s = Float(0.25, help="How often `%workflow watch` polls the events table").tag(
        config=True
    )
    close_finished_views = Bool(True, help="Stop observing once a shown run completed").tag(
        config=True
    )
    otlp_endpoint = Unicode(
        "",
        help="Live OpenTelemetry export of runs to this OTLP/HTTP endpoint (docs/otel.md); "
        "empty means $WF_MAGIC_OTLP_ENDPOINT, else off",
    ).tag(config=True)
    otlp_content = Bool(False, help="Live export attaches prompts and outputs (redacted)").tag(
        config=True
    )

    def __init__(self, shell: Any = None, **kwargs: Any):
        super().__init__(shell, **kwargs)
        self.library: dict[str, str] = {}
        self.library_origins: dict[str, str] = {}
        """Name → where ``%workflow use`` found it (a run of it records this as source_path)."""
        self._engine: Engine | None = None
        self._engine_otlp: tuple[str | None, bool] = (None, False)
        """The live export settings ``_engine`` was made with (another re-creates it)."""
        self.drives = Drives(lambda: self.engine)
        self.views: dict[str, RunView] = {}
        self._grids: list[SweepGridView] = []
        """Sweep grids still clickable, settled when a cell runs after their sweep ended."""
        self._sweep_drives: SweepDrives | None = None
        self._followers: list[RunView] = []
        """Older views of a run, retired by a newer one, that still follow it (see
        ``RunView.retire``); released with the rest."""
        self._finished: dict[str, RunView] = {}
        """Views whose background drive ended since the last cell (see publish_finished)."""
        self._sweep_outputs: list[SweepOutput] = []
        """Static sweep grids that follow their sweep (see ``SweepOutput``); stopped with the
        views."""
        self._finished_lock = threading.Lock()

    # -- state ------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        """This shell's Engine (re-created when the configured state dir changes)."""
        target = _state_key(self.state_dir) if self.state_dir else _state_key(default_state())
        engine = self._engine
        otlp = (self.otlp_endpoint or None, self.otlp_content)
        if (
            engine is None
            or _state_key(engine.location or engine.state_dir) != target
            or otlp != self._engine_otlp
        ):
            engine = Engine(
                target,
                namespace=self.user_ns,
                library=self.library,
                durability=self.durability,
                max_concurrency=self.max_concurrency,
                otlp_endpoint=otlp[0],
                otlp_content=otlp[1],
            )
            self._engine_otlp = otlp
            engine.library = self.library  # cells teach the library as they run
            self._forget_views()
            self._engine = engine
        return engine

    @property
    def user_ns(self) -> dict[str, Any]:
        """The notebook's namespace (``python:`` targets, ``--params``, ``--as``)."""
        if self.shell is None:
            raise RuntimeError("WorkflowMagics is used without an IPython shell")
        namespace: dict[str, Any] = self.shell.user_ns
        return namespace

    @property
    def use_widgets(self) -> bool:
        """Whether runs are shown as a live ipywidgets view."""
        if self.widgets == "auto":
            return getattr(self.shell, "kernel", None) is not None
        return bool(self.widgets == "on")

    def open_view(
        self, run_id: str, *, subscribe: bool = True, warnings: list[str] | None = None
    ) -> RunView:
        """Create, display (from this thread) and first draw a run view."""

        old = self.views.pop(run_id, None)
        if old is not None:
            # One view has the buttons; the older output, static, still follows the run.
            old.retire("a newer view of this run is below; this one shows it without buttons")
            self._followers = [v for v in self._followers if not v.throttle.is_closed]
            self._followers.append(old)
        view = self._new_view(run_id, subscribe=subscribe, warnings=warnings)
        view.show()
        view.flush()
        return view

    def _new_view(
        self, run_id: str, *, subscribe: bool = True, warnings: list[str] | None = None
    ) -> RunView:
        from .widgets import RunView

        view = RunView(
            self.engine,
            run_id,
            subscribe=subscribe,
            continue_drive=self.continue_after_decision,
            stop_drive=self.stop_drive,
            is_driving=self.drives.is_driving,
            warnings=warnings,
            open_fork=self.open_fork,
        )
        self.views[run_id] = view
        return view

    def open_fork(self, run_id: str, handle: Any) -> None:
        """Fork from here: show the fork's view in ``handle`` (an output of the forked
        run's cell) and drive it in the background, as Approve continues a run."""
        view = self._new_view(run_id)
        view.display_handle = handle
        view.flush()
        self.drive_in_background(run_id, is_followable=True)  # it shows the view live

    def settle_view(self, view: RunView) -> None:
        """Stop a view observing once its run can no longer change; older views of the run
        repaint now, in this cell (not at their next poll), so what is saved is the same
        however fast the kernel was."""
        for older in self._followers:
            if older.run_id == view.run_id and not older.throttle.is_closed:
                older.flush()
        if (
            self.close_finished_views
            and view.snapshot is not None
            and view.snapshot.status in _TERMINAL
            and not self.drives.is_driving(view.run_id)
        ):
            view.detach()
            if self.views.get(view.run_id) is view:
                del self.views[view.run_id]

    @property
    def sweep_drives(self) -> SweepDrives:
        """This kernel's background sweeps (``%%sweep --background``)."""
        if self._sweep_drives is None:
            from .sweeps import SweepDrives

            self._sweep_drives = SweepDrives()
        return self._sweep_drives

    def settle_at_next_cell(self, view: SweepGridView) -> None:
        """Settle a sweep's grid when a cell runs after the sweep ended (``pre_run_cell``)."""
        self._grids.append(view)

    def follow_sweep(self, output: SweepOutput) -> None:
        """Keep ``output`` following its sweep until it settles or this engine goes."""
        self._sweep_outputs = [o for o in self._sweep_outputs if o.is_following]
        self._sweep_outputs.append(output)

    def settle_grids(self, info: Any = None, *, force: bool = False) -> None:
        """Settle the grids of finished sweeps (see ``SweepGridView.settle``); the grid of a
        background sweep still driving stays live for a later cell, unless ``force``."""
        grids = self._grids
        self._grids = [g for g in grids if g.is_driving and not force]
        for grid in grids:
            if grid.is_driving and not force:
                continue
            try:
                grid.settle()
            except Exception:  # a display hook must not fail every later cell
                log.exception("settling a sweep grid failed")
            if grid.follower is not None:
                if force:
                    grid.follower.stop()  # this engine goes: the grid stays as last shown
                else:
                    self.follow_sweep(grid.follower)

    def continue_after_decision(self, run_id: str) -> None:
        """A view's Approve/Reject: continue the run in a thread that a cell may follow."""
        self.drive_in_background(run_id, is_followable=True)

    def drive_in_background(
        self,
        run_id: str,
        *,
        max_steps: int | None = None,
        live_source: Workflow | None = None,
        is_followable: bool = False,
    ) -> None:
        """Continue ``run_id`` in a thread; its view (if any) shows the outcome."""
        shown = self.views.get(run_id)

        def done(handle: Run | None, error: BaseException | None) -> None:
            # The cell may already have settled (forgotten) the view of a drive this quick.
            view = self.views.get(run_id) or shown
            if view is None:
                return
            for message in handle.warnings if handle is not None else ():
                view.add_warning(message)
            if error is not None:
                view.add_warning(f"the background drive stopped: {error}")
            view.flush()
            view.refresh()  # a saved notebook's text/HTML fallback shows the final state
            with self._finished_lock:
                self._finished[run_id] = view
            self.settle_view(view)

        self.drives.background(
            run_id,
            max_steps=max_steps,
            live_source=live_source,
            on_done=done,
            is_followable=is_followable,
        )
        if shown is not None:
            # A static view (after Approve, say) shows this drive live, unless it ended already:
            # go_live decides under the lock the drive's end repaints under (``done``).
            shown.go_live()

    def publish_finished(self, result: Any = None) -> None:
        """Re-publish the views whose background drive ended (a ``post_run_cell`` hook).

        The drive thread already updated them, but a client that only follows the running
        cell's messages (nbclient, ``nbconvert --execute``) drops an update sent between
        cells; sent again from inside the next cell, the saved fallback ends in the final state.
        """
        with self._finished_lock:
            views, self._finished = list(self._finished.values()), {}
        for view in views:
            try:
                view.refresh()
            except Exception:  # a display hook must not fail every later cell
                log.exception("re-publishing the view of %s failed", view.run_id)

    def stop_drive(self, run_id: str) -> None:
        """Stop a drive of this kernel, or ask another process's driver to stop."""
        self.drives.stop(run_id)
        self.engine.stop(run_id)

    def _forget_views(self) -> None:
        """Release every view (and older ones still following their run): their outputs
        keep the static HTML; no model, clock or subscription outlives this engine."""
        for view in [*self.views.values(), *self._followers]:
            view.release()
        self.views.clear()
        self._followers.clear()
        self.settle_grids(force=True)
        for output in self._sweep_outputs:
            output.stop()  # its output keeps the grid it last showed
        self._sweep_outputs.clear()
        with self._finished_lock:
            self._finished.clear()

    def close(self) -> None:
        """Stop drives and views, close the database (``%unload_ext``)."""
        self.drives.stop_all()
        if self._sweep_drives is not None:
            self._sweep_drives.stop_all()
        self._forget_views()
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    # -- magics -----------------------------------------------------------------------------
    @magic_arguments(name="%workflow")
    @argument("name", nargs="?", help="workflow name (fills a missing `name:` in the YAML)")
    @argument(
        "--param",
        action="append",
        default=[],
        metavar="K=V",
        help="a workflow param (repeatable); values are coerced to the declared type",
    )
    @argument("--params", metavar="VAR", help="a dict in the notebook holding params")
    @argument("--new", action="store_true", help="always start a fresh run")
    @argument("--resume", metavar="RUN", help="drive the given run (not the cell's latest)")
    @argument(
        "--max-steps", type=count_at_least(1), metavar="N", help="stop after N finished steps"
    )
    @argument("--dry-run", action="store_true", help="freeze and show the plan; dispatch nothing")
    @argument("--no-cache", action="store_true", help="no result reuse from earlier runs")
    @argument(
        "--key",
        metavar="K",
        help="a launch key: re-executing the cell with K and the same request returns its run",
    )
    @argument(
        "--background", action="store_true", help="drive in a thread; the notebook stays usable"
    )
    @argument("--as", dest="as_var", metavar="VAR", help="also store the Run handle in VAR")
    @cell_magic("workflow")  # type: ignore[arg-type]
    def workflow_cell(self, line: str, cell: str) -> Any:
        """Run the workflow written (in YAML) in this cell and show its live progress.

        The cell holds the workflow's YAML, or one line naming a ``.yaml`` file.

        Re-running an unchanged cell resumes its unfinished run (or shows the finished one and
        dispatches nothing); a changed cell starts a new run and abandons the old unfinished
        one ("superseded by ..."). Unchanged units of earlier runs are reused, not re-paid.
        A kernel interrupt stops the drive between units; the run stays active. The cell
        evaluates to the ``Run`` handle.
        """
        with _as_usage_errors(self.drives):
            ns = parse_argstring(self.workflow_cell, line)
            args = cell_args(ns, self.user_ns)
            return commands.run_cell(self, args, cell, key=ns.key)

    @magic_arguments(name="%sweep")
    @argument("--grid", action="append", metavar="K=V1,V2", help="a grid axis (repeatable)")
    @argument("--rows", metavar="VAR_OR_PATH", help="a DataFrame/list variable, or .csv/.jsonl")
    @argument("--param", action="append", default=[], metavar="K=V", help="a param all cells share")
    @argument("--params", metavar="VAR", help="a dict in the notebook: params every cell shares")
    @argument(
        "--repeat", type=count_at_least(1), default=1, metavar="N", help="run each cell N times"
    )
    @argument("--max-tokens", type=count_at_least(0), metavar="N", help="the sweep's token ceiling")
    @argument("--max-cost", type=number_in(0), metavar="X", help="the sweep's cost ceiling")
    @argument("--max-units", type=count_at_least(0), metavar="N", help="the sweep's unit ceiling")
    @argument(
        "--max-concurrency",
        type=count_at_least(1, 10_000),
        metavar="N",
        help="cells driven at once",
    )
    @argument(
        "--workers",
        type=count_at_least(1, 64),
        metavar="N",
        help="spread the cells over N processes (python targets must be module:function)",
    )
    @argument("--key", metavar="K", help="a launch key naming this sweep")
    @argument(
        "--background",
        action="store_true",
        help="drive in a thread; the cell returns at once, the grid follows the cells",
    )
    @argument("--as", dest="as_var", metavar="VAR", help="also store the Sweep handle in VAR")
    @cell_magic("sweep")  # type: ignore[arg-type]
    def sweep_cell(self, line: str, cell: str) -> Any:
        """Run the workflow in this cell (YAML, or a line naming a file) over a grid of params
        × dataset rows × repeats under one budget; shows the sweep's grid. Re-running the
        unchanged cell resumes (or shows) the same sweep. The cell evaluates to the ``Sweep``.

        ``--background`` returns at once and the live grid follows the cells while other cells
        run; ``%sweep stop`` (or the handle's ``stop()``) stops it after the units in flight.
        A kernel interrupt stops the cell it lands in, not a background sweep; re-running the
        cell while this kernel still drives its sweep starts no second driver.
        """
        from .sweeps import run_sweep_cell

        with _as_usage_errors(self.drives):
            ns = parse_argstring(self.sweep_cell, line)
            return run_sweep_cell(self, ns, cell, drives=self.sweep_drives)

    @magic_arguments(name="sweep")
    @argument("command", choices=("stop",), help="stop: stop a background sweep of this kernel")
    @argument("sweep", nargs="?", help="a sweep id or a unique prefix (default: every one)")
    @line_magic("sweep")  # type: ignore[arg-type]
    def sweep_line(self, line: str) -> Any:
        """``%sweep stop [SWEEP]``: ask this kernel's background drive of SWEEP (default: of
        every sweep it drives in the background) to stop after the units in flight, as
        ``%workflow stop`` asks a run's; the owed cells stay for re-running the cell or
        ``wf sweep-resume``."""
        from .sweeps import stop_sweeps

        with _as_usage_errors(self.drives):
            ns = parse_argstring(self.sweep_line, line)
            stop_sweeps(self, self.sweep_drives, ns.sweep)

    @magic_arguments(name="workflow")
    @argument(
        "command",
        nargs="?",
        default="list",
        choices=COMMANDS,
        metavar="COMMAND",
        help="what to do (default: list); one of " + ", ".join(COMMANDS),
    )
    @argument("args", nargs=argparse.REMAINDER, help="the command's arguments")
    @line_magic("workflow")  # type: ignore[arg-type]
    @_documented(line_help(cell_usage=workflow_cell.parser.format_usage()))
    def workflow_line(self, line: str) -> Any:
        with _as_usage_errors(self.drives):
            ns = parse_argstring(self.workflow_line, line)
            args = line_args(ns.command, ns.args)
            return commands.COMMANDS[args.command](self, args)


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and make their settings reachable by ``%config``."""
    from .figures import register_figure_png

    magics = WorkflowMagics(ipython)
    ipython.register_magics(magics)
    register_figure_png(ipython)
    ipython.events.register("post_run_cell", magics.publish_finished)
    ipython.events.register("pre_run_cell", magics.settle_grids)
    if magics not in ipython.configurables:
        ipython.configurables.append(magics)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the magics, stop this kernel's drives and close the database."""
    registry = ipython.magics_manager.registry
    magics = registry.pop("WorkflowMagics", None)
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("workflow", None)
        ipython.magics_manager.magics[kind].pop("sweep", None)
    from .figures import unregister_figure_png

    unregister_figure_png(ipython)
    if isinstance(magics, WorkflowMagics):
        ipython.events.unregister("post_run_cell", magics.publish_finished)
        ipython.events.unregister("pre_run_cell", magics.settle_grids)
        magics.close()
        if magics in ipython.configurables:
            ipython.configurables.remove(magics)


def _state_key(state: object) -> Path | PgLocation:
    """A configured state as the Engine opens it: a resolved folder, or a PostgreSQL schema."""
    parsed = parse_state(state if isinstance(state, PgLocation) else str(state))
    return parsed if isinstance(parsed, PgLocation) else parsed.expanduser().resolve()
