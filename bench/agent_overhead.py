"""The overhead of an agent attempt through wf_magic over the same CLI invoked directly.

Both sides run the same CLI against the same loopback fake backend (tests/agent_backends.py):
directly with the argv and quiet environment wf_magic would use, and as a one-step ``agent:``
workflow (start, freeze, journal, worktree-less attempt, facts). Interleaved reps; medians.

    .venv/bin/python bench/agent_overhead.py              # the pinned real Claude Code
    .venv/bin/python bench/agent_overhead.py --fake       # the fake harness (no npm needed)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.agent_backends import start_backend  # noqa: E402
from tests.agent_fakes.bins import make_bins  # noqa: E402
from wf_magic import Engine  # noqa: E402
from wf_magic.agents.claude import ClaudeHarness  # noqa: E402
from wf_magic.agents.harness import AgentCall  # noqa: E402


def _cli(fake: bool, tmp: Path) -> Path:
    if fake:
        return make_bins(tmp / "bin")["claude"]
    cache = Path(os.environ.get("WF_AGENTS_CACHE") or Path.home() / ".cache" / "wf_magic-agents")
    path = Path(
        os.environ.get("WF_AGENT_CLAUDE_BIN")
        or cache / "claude-2.1.197" / "node_modules" / ".bin" / "claude"
    )
    if not path.exists():
        sys.exit(f"no Claude Code at {path}: run scripts/ci_agents.sh, or pass --fake")
    return path


def _direct(cli: Path, folder: Path, home: Path, env: dict[str, str]) -> float:
    call = AgentCall(
        prompt="Say hello.",
        model="claude-sonnet-4-5",
        permission="edits",
        max_turns=None,
        cwd=str(folder),
        home=str(home),
        scratch=str(home),
        session_id=str(uuid.uuid4()),
    )
    harness = ClaudeHarness()
    full = {**env, "HOME": str(home), **harness.quiet_env(call)}
    started = time.perf_counter()
    done = subprocess.run(
        [str(cli), *harness.argv(call)],
        cwd=folder,
        env=full,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"direct run failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    return took


def _through_wf(engine: Engine, path: Path) -> float:
    started = time.perf_counter()
    run = engine.run(str(path), new=True)
    took = time.perf_counter() - started
    if run.status != "completed":
        sys.exit(f"wf run failed: {run.status}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--fake", action="store_true", help="the fake harness, not the real CLI")
    args = parser.parse_args()
    backend = start_backend()
    try:
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            cli = _cli(args.fake, tmp)
            folder, home = tmp / "work", tmp / "home"
            folder.mkdir()
            home.mkdir(mode=0o700)
            env = {
                "PATH": os.environ["PATH"],
                "LANG": "C.UTF-8",
                "ANTHROPIC_BASE_URL": backend.url,
                "ANTHROPIC_API_KEY": "sk-ant-fake-0123456789",
            }
            os.environ.update({k: v for k, v in env.items() if k.startswith("ANTHROPIC")})
            path = folder / "bench.yaml"
            path.write_text(
                "name: agentbench\nsteps:\n  - id: hello\n    agent: claude\n"
                "    prompt: Say hello.\n    model: claude-sonnet-4-5\n"
                "    pass_env: [ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY]\n"
                f"runners:\n  claude: {{bin: {cli}}}\n"
            )
            engine = Engine(tmp / "state")
            _direct(cli, folder, home, env), _through_wf(engine, path)  # warm-up
            direct, wf = [], []
            for _ in range(args.reps):
                direct.append(_direct(cli, folder, home, env))
                wf.append(_through_wf(engine, path))
            engine.close()
    finally:
        backend.stop()
    d, w = statistics.median(direct), statistics.median(wf)
    print(
        json.dumps(
            {
                "cli": "fake" if args.fake else "claude-2.1.197",
                "reps": args.reps,
                "direct_s": round(d, 4),
                "wf_magic_s": round(w, 4),
                "overhead_ms": round((w - d) * 1000, 1),
                "ratio": round(w / d, 3),
                "direct_min_max": [round(min(direct), 4), round(max(direct), 4)],
                "wf_min_max": [round(min(wf), 4), round(max(wf), 4)],
            }
        )
    )


if __name__ == "__main__":
    main()
