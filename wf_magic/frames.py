"""Module-level frame functions (``wf_magic.journal(run)``…) over the default state dir."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .engine import Engine

if TYPE_CHECKING:
    import pandas as pd


def _engine(state_dir: str | Path | None) -> Engine:
    return Engine(state_dir)


def runs(*, state_dir: str | Path | None = None) -> pd.DataFrame:
    """All runs (see :meth:`Engine.runs`); ``state_dir`` defaults as for ``Engine()``."""
    with _engine(state_dir) as engine:
        return engine.runs()


def journal(run: str | None = None, *, state_dir: str | Path | None = None) -> pd.DataFrame:
    """One row per attempt (see :meth:`Engine.journal`)."""
    with _engine(state_dir) as engine:
        return engine.journal(run)


def tokens(
    run: str | None = None, *, by: str = "step", state_dir: str | Path | None = None
) -> pd.DataFrame:
    """Token accounting grouped ``by`` (see :meth:`Engine.tokens`)."""
    with _engine(state_dir) as engine:
        return engine.tokens(run, by=by)


def events(run: str, *, state_dir: str | Path | None = None) -> pd.DataFrame:
    """A run's events (see :meth:`Engine.events`)."""
    with _engine(state_dir) as engine:
        return engine.events(run)


def budget(run: str, *, state_dir: str | Path | None = None) -> pd.DataFrame:
    """Used vs limit per ceiling (see :meth:`Engine.budget`)."""
    with _engine(state_dir) as engine:
        return engine.budget(run)
