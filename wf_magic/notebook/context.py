"""What the command functions read from the magics: settings, Engine, drives and views."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..engine import Engine
    from ..spec.workflow import Workflow
    from .drives import Drives
    from .sweepfollow import SweepOutput
    from .sweepview import SweepGridView
    from .widgets import RunView


class CommandContext(Protocol):
    """The magics as ``commands`` sees them (a :class:`~.magics.WorkflowMagics` is one).

    A protocol rather than the class, so that the magics import the commands and not the
    other way round.
    """

    library: dict[str, str]
    """Workflow name → YAML source: what cells and ``%workflow use`` taught the library."""
    library_origins: dict[str, str]
    """Name → where ``%workflow use`` found it (a run of it records this as source_path)."""
    drives: Drives

    @property
    def durability(self) -> str: ...

    @property
    def max_concurrency(self) -> int | None: ...

    @property
    def widgets(self) -> str: ...

    @property
    def watch_poll_s(self) -> float: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def user_ns(self) -> dict[str, Any]: ...

    @property
    def use_widgets(self) -> bool: ...

    def open_view(
        self, run_id: str, *, subscribe: bool = True, warnings: list[str] | None = None
    ) -> RunView: ...

    def settle_view(self, view: RunView) -> None: ...

    def settle_at_next_cell(self, view: SweepGridView) -> None: ...

    def follow_sweep(self, output: SweepOutput) -> None: ...

    def drive_in_background(
        self,
        run_id: str,
        *,
        max_steps: int | None = None,
        live_source: Workflow | None = None,
        is_followable: bool = False,
    ) -> None: ...
