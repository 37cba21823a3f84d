"""The ``python`` runner: calls a frozen callable, refusing one whose source changed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import RunnerError
from . import functions
from .base import BaseRunner, RunnerContext, UnitRequest, UnitResult


class FunctionRunner(BaseRunner):
    """Runs ``python:`` units: ``fn(**kwargs)``; the return value must be JSON-serialisable."""

    def __init__(
        self, namespace: Mapping[str, Any] | None = None, *, source_dir: str | None = None
    ):
        self.namespace = namespace
        self.source_dir = source_dir

    @classmethod
    def from_context(cls, ctx: RunnerContext) -> FunctionRunner:
        """Factory: targets are looked up in ``ctx.namespace`` besides the registry."""
        return cls(ctx.namespace, source_dir=ctx.source_dir)

    def run(self, request: UnitRequest) -> UnitResult:
        target = request.target or ""
        try:
            fn = functions.resolve(target, self.namespace, search_dir=self.source_dir)
        except functions.TargetError as exc:
            raise RunnerError(str(exc), executed=False) from exc
        current = functions.source_hash(fn)
        if request.target_hash and current != request.target_hash:
            raise RunnerError(
                f"python target {target!r} changed since this run's plan was frozen "
                f"(source hash {request.target_hash[:12]} → {current[:12]}); the run will not "
                "silently run new code. Start a new run (--new) to use it, or restore the "
                "function.",
                executed=False,
            )
        try:
            output = fn(**dict(request.kwargs or {}))
        except Exception as exc:
            raise RunnerError(f"{target} raised {type(exc).__name__}: {exc}") from exc
        try:
            json.dumps(output, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise RunnerError(
                f"{target} returned a {type(output).__name__} that is not JSON-serialisable "
                f"({exc}); return dicts, lists, strings and finite numbers"
            ) from exc
        return UnitResult(output=output)
