"""Where and with what an agent CLI is launched: its folder (under the workflow's, never
outside it) and its environment (the minimal env, the isolated HOME, the harness's quiet
settings, then the ``pass_env`` names as the user set them)."""

from __future__ import annotations

import os
from pathlib import Path

from ..runners.base import UnitRequest
from .harness import AgentCall, AgentError, Harness


def pass_env_names(request: UnitRequest) -> list[str]:
    return [str(n) for n in ((request.agent or {}).get("pass_env") or [])]


def launch_env(
    adapter: Harness, call: AgentCall, request: UnitRequest, *, isolated: bool
) -> dict[str, str]:
    """The minimal env, the isolated HOME, the harness's quiet defaults, then ``pass_env``
    names as the user set them (they win over the defaults)."""
    passed = pass_env_names(request)
    env = {k: v for k, v in request.env.items() if k not in passed}
    if isolated:
        env["HOME"] = call.home
    env.update(adapter.quiet_env(call))
    env.update({k: request.env[k] for k in passed if k in request.env})
    return env


def agent_workdir(source_dir: str | None, workdir: str, request: UnitRequest) -> Path:
    """The agent's folder: ``workdir`` under the workflow's folder, never outside it."""
    base = Path(source_dir or os.getcwd()).resolve()
    folder = (base / workdir).resolve()
    if not folder.is_relative_to(base):
        raise AgentError(
            f"step {request.step_id}: workdir {workdir!r} resolves to {folder}, outside the "
            f"workflow's folder {base}; use a folder inside it",
            executed=False,
        )
    if not folder.is_dir():
        raise AgentError(
            f"step {request.step_id}: workdir {folder} is not a folder; create it or fix workdir",
            executed=False,
        )
    return folder
