"""Registers the built-in runners through the same ``register_runner`` plugins use."""

from __future__ import annotations

from .function import FunctionRunner
from .process import ExecRunner
from .registry import register_runner
from .scripted import ScriptedRunner

register_runner("scripted", ScriptedRunner.from_context)
register_runner("exec", ExecRunner.from_context)
register_runner("python", FunctionRunner.from_context)

try:  # the openai/replay runners live in their own module (optional dependency inside)
    from .builtin_openai import register as _register_more
except ImportError:  # pragma: no cover - module absent in a partial install
    pass
else:
    _register_more()
