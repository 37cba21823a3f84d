"""The harness registry: the four built-ins, ``register_harness`` and the ``wf_magic.harnesses``
entry point; each harness is also usable as the runner of its ``agent:`` steps."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from ..errors import UsageError
from ..runners.base import Runner, RunnerContext
from .harness import Harness

ENTRY_POINT_GROUP = "wf_magic.harnesses"
BUILTINS: dict[str, tuple[str, str]] = {
    "claude": (".claude", "ClaudeHarness"),
    "codex": (".codex", "CodexHarness"),
    "opencode": (".opencode", "OpencodeHarness"),
    "gemini": (".gemini", "GeminiHarness"),
}
"""The built-in harnesses: name → (module, class), imported on first use."""

_adapters: dict[str, Harness] = {}
_lock = threading.Lock()
_loaded_entry_points = False


def register_harness(name: str, adapter: Harness, *, replace: bool = False) -> None:
    """Register ``adapter`` so workflows may say ``agent: name``.

    Raises:
        UsageError: ``name`` is taken and ``replace`` is false, or the adapter lacks a
            method of the ``Harness`` protocol.
    """
    missing = [m for m in ("argv", "quiet_env", "watch", "outcome") if not hasattr(adapter, m)]
    if missing:
        raise UsageError(
            f"harness {name!r} lacks {', '.join(missing)}; see wf_magic.agents.harness.Harness"
        )
    with _lock:
        taken = name in _adapters or name in BUILTINS
        if taken and not replace and _adapters.get(name) is not adapter:
            raise UsageError(
                f"A harness named {name!r} is already registered; pass replace=True to override it."
            )
        _adapters[name] = adapter


def _load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _adapters or ep.name in BUILTINS:
            continue
        try:
            loaded: Any = ep.load()
            _adapters[ep.name] = loaded() if isinstance(loaded, type) else loaded
        except Exception as exc:  # a broken plugin must not break the built-ins
            import warnings

            warnings.warn(f"harness plugin {ep.name!r} failed to load: {exc}", stacklevel=2)


def known_harnesses() -> list[str]:
    """Sorted names of every harness an ``agent:`` step may name."""
    _load_entry_points()
    return sorted(set(BUILTINS) | set(_adapters))


def harness(name: str) -> Harness | None:
    """The adapter of ``name`` (None when unknown)."""
    with _lock:
        if name in _adapters:
            return _adapters[name]
    if name in BUILTINS:
        module, cls = BUILTINS[name]
        made: Harness = getattr(importlib.import_module(module, __package__), cls)()
        with _lock:
            return _adapters.setdefault(name, made)
    _load_entry_points()
    return _adapters.get(name)


def harness_runner_factory(name: str) -> Callable[[RunnerContext], Runner] | None:
    """The runner factory of harness ``name`` (None when unknown): what runs its units."""
    adapter = harness(name)
    if adapter is None:
        return None

    def factory(ctx: RunnerContext) -> Runner:
        from .runner import AgentRunner

        return AgentRunner.from_context(ctx, name=name, adapter=adapter)

    return factory
