"""``wf run --replay CASSETTE``: a frozen workflow whose every runner answers from one cassette.

Each runner a prompt step, an ``llm`` judge or an ``llm`` score names (child workflows
included) becomes the ``replay`` runner of that cassette; each agent harness keeps its
settings and gets ``replay: CASSETTE`` (its calls answered through the bridge, which replay
turns on). The result is a new plan, hence a new run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..hashing import sha256_text
from .plan import Plan
from .workflow import Workflow


def replayed(wf: Workflow, cassette: str | Path) -> Workflow:
    """``wf`` with every runner answering from ``cassette`` (an absolute path is frozen).

    Raises:
        UsageError: ``cassette`` is not a file.
    """
    found = Path(cassette).expanduser()
    if found.exists() and not found.is_file():
        raise UsageError(
            f"--replay {cassette}: not a regular file (a directory, a FIFO or a device); "
            "give the cassette file `wf export-cassette RUN` wrote."
        )
    if not found.is_file():
        raise UsageError(
            f"--replay {cassette}: no such cassette file; write one with "
            f"`wf export-cassette RUN > {cassette}` after a run against the real runners."
        )
    path = str(found.resolve())
    data = _plan(wf.plan.model_dump(mode="json"), path)
    plan = Plan.model_validate(data)
    plan_json = plan.to_json()
    return replace(wf, plan=plan, plan_json=plan_json, plan_hash=sha256_text(plan_json))


def _plan(data: dict[str, Any], cassette: str) -> dict[str, Any]:
    runners = dict(data.get("runners") or {})
    names = {str(data.get("runner") or "scripted")}
    harnesses: set[str] = set()
    for step in data.get("steps") or []:
        if step.get("kind") == "agent":
            harnesses.add(str(step.get("runner")))
        elif step.get("runner"):
            names.add(str(step["runner"]))
        judges = [step.get("gate") or {}, *(step.get("score") or [])]
        names.update(str(j["runner"]) for j in judges if j.get("runner"))
    for name in names - harnesses:
        runners[name] = {"type": "replay", "cassette": cassette}
    for harness in harnesses:
        kept = {k: v for k, v in (runners.get(harness) or {}).items() if k != "bridge"}
        runners[harness] = {**kept, "replay": cassette}
    children = {k: _plan(v, cassette) for k, v in (data.get("children") or {}).items()}
    return {**data, "runners": runners, "children": children}
