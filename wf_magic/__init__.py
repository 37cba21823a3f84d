"""wf_magic: durable LLM-agent workflows for Jupyter — frozen plans, a SQLite journal, gates.

The engine is plain Python (no IPython import); ``%load_ext wf_magic`` adds the magics.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from .bus import Event
from .drive.executors import dask_executor, thread_executor
from .engine import Engine
from .errors import (
    BudgetExceeded,
    DefinitionError,
    GateDecisionRefused,
    MigrationError,
    PlanIntegrityError,
    PlanVersionError,
    RunLockHeld,
    RunnerError,
    UsageError,
    WorkflowError,
)
from .frames import budget, events, journal, runs, tokens
from .run import Run
from .runners.base import Runner, RunnerContext, UnitRequest, UnitResult
from .runners.functions import register_function
from .runners.registry import register_runner
from .runners.scripted import ScriptedRunner
from .spec.freeze import Workflow, load_workflow

__all__ = [
    "BudgetExceeded",
    "DefinitionError",
    "Engine",
    "Event",
    "GateDecisionRefused",
    "MigrationError",
    "PlanIntegrityError",
    "PlanVersionError",
    "Run",
    "RunLockHeld",
    "Runner",
    "RunnerContext",
    "RunnerError",
    "ScriptedRunner",
    "UnitRequest",
    "UnitResult",
    "UsageError",
    "Workflow",
    "WorkflowError",
    "budget",
    "dask_executor",
    "events",
    "journal",
    "load_ipython_extension",
    "load_workflow",
    "register_function",
    "register_runner",
    "runs",
    "thread_executor",
    "tokens",
]

try:
    # The one version literal is [project] version in pyproject.toml.
    __version__ = importlib.metadata.version("wf_magic")
except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext wf_magic``: register ``%%workflow`` and ``%workflow``."""
    from .notebook.magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext wf_magic``."""
    from .notebook.magics import unload_ipython_extension as _unload

    _unload(ipython)
