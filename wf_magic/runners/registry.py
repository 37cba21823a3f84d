"""The runner registry: built-ins, ``register_runner`` and the ``wf_magic.runners`` entry point."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from ..errors import UsageError
from .base import Runner, RunnerContext

RunnerFactory = Callable[[RunnerContext], Runner]
ENTRY_POINT_GROUP = "wf_magic.runners"


def _builtin(module: str, cls: str) -> RunnerFactory:
    """A built-in runner's factory that imports its module on first use (the ``openai``
    package and the exec machinery load only for plans that use them)."""

    def factory(ctx: RunnerContext) -> Runner:
        runner_class = getattr(importlib.import_module(module, __package__), cls)
        made: Runner = runner_class.from_context(ctx)
        return made

    def answer_options(options: Mapping[str, Any]) -> dict[str, Any]:
        # The class declares its split (runners/identity.py); read on first use.
        names = getattr(importlib.import_module(module, __package__), cls).ANSWER_OPTIONS
        return {k: v for k, v in options.items() if k in names}

    factory.__qualname__ = f"{cls}.from_context"
    factory.answer_options = answer_options  # type: ignore[attr-defined]
    return factory


BUILTINS: dict[str, RunnerFactory] = {
    "scripted": _builtin(".scripted", "ScriptedRunner"),
    "exec": _builtin(".process", "ExecRunner"),
    "python": _builtin(".function", "FunctionRunner"),
    "openai": _builtin(".openai_chat", "OpenAIChatRunner"),
    "replay": _builtin(".replay", "ReplayRunner"),
    "pydantic-ai": _builtin(".pydanticai", "PydanticAIRunner"),
    "llm": _builtin(".llm_models", "LLMRunner"),
}
"""The runners every plan may name; registered like plugins' (``replace=True`` overrides)."""

_factories: dict[str, RunnerFactory] = dict(BUILTINS)
_lock = threading.Lock()
_loaded_entry_points = False


def register_runner(name: str, factory: RunnerFactory, *, replace: bool = False) -> None:
    """Register ``factory`` under ``name`` so plans may say ``runner: name``.

    Raises:
        UsageError: ``name`` is taken and ``replace`` is false.
    """
    with _lock:
        if name in _factories and not replace and _factories[name] is not factory:
            raise UsageError(
                f"A runner named {name!r} is already registered; pass replace=True to override it."
            )
        _factories[name] = factory


def _load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _factories:
            try:
                _factories[ep.name] = ep.load()
            except Exception as exc:  # a broken plugin must not break the built-ins
                import warnings

                warnings.warn(f"runner plugin {ep.name!r} failed to load: {exc}", stacklevel=2)


def known_runners() -> list[str]:
    """Sorted names of every runner that can be used."""
    _load_entry_points()
    return sorted(_factories)


def runner_factory(name: str) -> RunnerFactory | None:
    """The factory for ``name``, or None when no such runner is known."""
    if name not in _factories:
        _load_entry_points()
    return _factories.get(name)
