"""Registers the `openai` and `replay` runners through `register_runner`, as plugins do."""

from __future__ import annotations

from .base import Runner, RunnerContext
from .registry import register_runner


def _openai(ctx: RunnerContext) -> Runner:
    # Imported on first use: the openai package is an optional, slow-to-import extra.
    from .openai_chat import OpenAIChatRunner

    return OpenAIChatRunner.from_context(ctx)


def _replay(ctx: RunnerContext) -> Runner:
    from .replay import ReplayRunner

    return ReplayRunner.from_context(ctx)


def register() -> None:
    """Register ``openai`` and ``replay``; calling it again is harmless."""
    register_runner("openai", _openai)
    register_runner("replay", _replay)
