"""Registers the built-in runners through the same ``register_runner`` plugins use."""

from __future__ import annotations

from .base import Runner, RunnerContext
from .function import FunctionRunner
from .process import ExecRunner
from .registry import register_runner
from .scripted import ScriptedRunner

register_runner("scripted", ScriptedRunner.from_context)
register_runner("exec", ExecRunner.from_context)
register_runner("python", FunctionRunner.from_context)


def _openai(ctx: RunnerContext) -> Runner:
    # Imported on first use: the openai package is an optional, slow-to-import extra.
    from .openai_chat import OpenAIChatRunner

    return OpenAIChatRunner.from_context(ctx)


def _replay(ctx: RunnerContext) -> Runner:
    from .replay import ReplayRunner  # imported on first use, like the openai runner

    return ReplayRunner.from_context(ctx)


register_runner("openai", _openai)
register_runner("replay", _replay)
