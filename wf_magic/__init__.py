"""wf_magic: durable LLM-agent workflows for Jupyter — frozen plans, a SQLite journal, gates.

The engine is plain Python (no IPython import); ``%load_ext wf_magic`` adds the magics.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and IDEs
    from .agents.registry import register_harness
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
        PlanVersionTooNew,
        RunLockHeld,
        RunnerError,
        RunNotOwned,
        UsageError,
        WorkflowError,
    )
    from .frames import budget, events, journal, runs, tokens
    from .run import Run
    from .runners.base import Runner, RunnerContext, UnitRequest, UnitResult
    from .runners.functions import register_function
    from .runners.registry import register_runner
    from .runners.scripted import ScriptedRunner
    from .spec.freeze import load_workflow
    from .spec.workflow import Workflow

# Public names are imported on first use (PEP 562): `wf --help` and `import wf_magic` stay
# fast, and pydantic, Jinja and the engine load only when something needs them.
_LAZY = {
    "Event": ".bus",
    "dask_executor": ".drive.executors",
    "thread_executor": ".drive.executors",
    "Engine": ".engine",
    **dict.fromkeys(
        (
            "BudgetExceeded",
            "DefinitionError",
            "GateDecisionRefused",
            "MigrationError",
            "PlanIntegrityError",
            "PlanVersionError",
            "PlanVersionTooNew",
            "RunLockHeld",
            "RunNotOwned",
            "RunnerError",
            "UsageError",
            "WorkflowError",
        ),
        ".errors",
    ),
    **dict.fromkeys(("budget", "events", "journal", "runs", "tokens"), ".frames"),
    "Run": ".run",
    **dict.fromkeys(("Runner", "RunnerContext", "UnitRequest", "UnitResult"), ".runners.base"),
    "register_function": ".runners.functions",
    "register_harness": ".agents.registry",
    "register_runner": ".runners.registry",
    "ScriptedRunner": ".runners.scripted",
    "Workflow": ".spec.workflow",
    "load_workflow": ".spec.freeze",
}


_READY = {"Engine": (".lifecycle", ".drive.root")}
"""Modules loaded with a public name: ``wf_magic.Engine`` arrives ready to start and drive,
so a first drive pays no imports. (``wf status`` imports ``wf_magic.engine`` itself and
loads only what it reads.)"""


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _version()
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'wf_magic' has no attribute {name!r}")
    value = getattr(importlib.import_module(target, __name__), name)
    for module in _READY.get(name, ()):
        importlib.import_module(module, __name__)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, "__version__"])


def _version() -> str:
    import importlib.metadata  # ~30 ms: paid only by those who ask for the version

    try:
        # The one version literal is [project] version in pyproject.toml.
        return importlib.metadata.version("wf_magic")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0+unknown"


__all__ = [
    "BudgetExceeded",
    "DefinitionError",
    "Engine",
    "Event",
    "GateDecisionRefused",
    "MigrationError",
    "PlanIntegrityError",
    "PlanVersionError",
    "PlanVersionTooNew",
    "Run",
    "RunLockHeld",
    "RunNotOwned",
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
    "register_harness",
    "register_runner",
    "runs",
    "thread_executor",
    "tokens",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext wf_magic``: register ``%%workflow`` and ``%workflow``."""
    from .notebook.magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext wf_magic``."""
    from .notebook.magics import unload_ipython_extension as _unload

    _unload(ipython)
