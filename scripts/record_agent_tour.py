"""Record notebooks/agent_fix.cassette.jsonl, the cassette the agent tour replays
(notebooks/06_agent_steps.ipynb): the tour's workflow driven once by the real, pinned Claude
Code through wf_magic's bridge, against a loopback stand-in for the Anthropic API that plays
the model's part (a first answer the gate rejects, then a Write that fixes calc.py, then
"fixed").

    .venv/bin/python scripts/record_agent_tour.py [--claude PATH]

The CLI: ``--claude``, else ``$WF_AGENT_CLAUDE_BIN``, else the pin scripts/ci_agents.sh
installs. Nothing leaves the machine (127.0.0.1 only); the cassette holds no key and no local
folder (the agent's folder is recorded as ``<wf_magic:workdir>``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CASSETTE = REPO / "notebooks" / "agent_fix.cassette.jsonl"
CLAUDE_PIN = "2.1.197"
MODEL = "claude-sonnet-4-5"
WORKFLOW = """name: agent-fix-demo
steps:
  - id: fix
    agent: claude
    prompt: "Fix the bug in calc.py: add(2, 2) must be 4."
    model: {model}
    workdir: {workdir}
    isolation: worktree
    session: continue
    pass_env: [ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY]
    timeout: 2m
    gate:
      judge: expr
      check: "'fixed' in output"
      criteria: ["change calc.py so that add(2, 2) == 4, then say fixed"]
      max_loops: 3
runners:
  claude: {{bin: {claude}}}
"""


def _texts(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_texts(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(_texts(v) for k, v in value.items() if k in ("content", "text"))
    return ""


def model_turn(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The model's next block (its start, its one delta) and stop reason, from the request:
    without the gate's feedback a wrong first answer; with it, Read calc.py, Edit it (Claude
    Code edits only a file it has read), then say fixed."""
    messages = body.get("messages") or []
    conversation = _texts(messages)
    system = json.dumps(body.get("system") or "")
    cwd = re.search(r"[Ww]orking directory: ([^\s\\\"]+)", system)
    results = json.dumps(messages).count('"tool_result"')
    if "Gate feedback" in conversation and cwd and results < 2:
        path = f"{cwd.group(1)}/calc.py"
        name, given = (
            ("Read", {"file_path": path})
            if results == 0
            else ("Edit", {"file_path": path, "old_string": "a - b", "new_string": "a + b"})
        )
        block = {"type": "tool_use", "id": f"toolu_tour{results + 1}", "name": name, "input": {}}
        return block, {"type": "input_json_delta", "partial_json": json.dumps(given)}, "tool_use"
    text = "fixed: add() now returns a + b" if results else "I read calc.py; add() looks fine to me"
    return {"type": "text", "text": ""}, {"type": "text_delta", "text": text}, "end_turn"


class Upstream(BaseHTTPRequestHandler):
    """The stand-in Anthropic Messages API: streamed answers, 404 for anything else."""

    def log_message(self, *_: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
            self.send_error(404)
            return
        block, delta, stop = model_turn(body)
        usage = {"input_tokens": 1200, "output_tokens": 40}
        events = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_tour",
                        "type": "message",
                        "role": "assistant",
                        "model": body.get("model") or MODEL,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {**usage, "output_tokens": 1},
                    },
                },
            ),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            ),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for name, data in events:
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def do_GET(self) -> None:  # noqa: N802
        self.send_error(404)

    do_HEAD = do_GET


def pinned_claude(given: str | None) -> Path:
    if given or os.environ.get("WF_AGENT_CLAUDE_BIN"):
        return Path(given or os.environ["WF_AGENT_CLAUDE_BIN"])
    cache = Path(os.environ.get("WF_AGENTS_CACHE") or Path.home() / ".cache" / "wf_magic-agents")
    path = cache / f"claude-{CLAUDE_PIN}" / "node_modules" / ".bin" / "claude"
    if not path.exists():
        sys.exit(f"no pinned Claude Code at {path}: run scripts/ci_agents.sh, or pass --claude")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claude", help="the Claude Code executable")
    parser.add_argument("--out", type=Path, default=CASSETTE)
    args = parser.parse_args()
    claude = pinned_claude(args.claude)
    from wf_magic import Engine
    from wf_magic.runners.replay import export_cassette

    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="wf-agent-tour-"))
    try:
        repo = work / "agent_demo"
        repo.mkdir()
        (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
        for argv in (
            ["init", "-q"],
            ["add", "calc.py"],
            ["-c", "user.name=demo", "-c", "user.email=demo@example.com", "commit", "-qm", "add()"],
        ):
            subprocess.run(["git", *argv], cwd=repo, check=True, capture_output=True)
        os.environ["ANTHROPIC_BASE_URL"] = f"http://127.0.0.1:{server.server_port}"
        os.environ["ANTHROPIC_API_KEY"] = "sk-ant-recording-stand-in"
        flow = work / "flow.yaml"
        flow.write_text(WORKFLOW.format(model=MODEL, workdir="agent_demo", claude=claude))
        with Engine(work / "state") as engine:
            run = engine.run(str(flow))
            if run.status != "completed":
                sys.exit(f"the recording run ended {run.status}: {run.reason}")
            worktree = Path(run.attempt("fix").agent["worktree"]["path"])
            if "a + b" not in (worktree / "calc.py").read_text():
                sys.exit(f"the agent did not fix calc.py in {worktree}; nothing recorded")
            lines = [
                line
                for line in export_cassette(engine.store, run.run_id)
                if json.loads(line).get("kind") == "agent_call"
            ]
            calls = engine.calls(run.run_id)
        args.out.write_text("".join(f"{line}\n" for line in lines))
        print(f"recorded {len(lines)} call(s) of run {run.run_id} into {args.out}")
        print(calls[["unit", "attempt", "call", "model", "status", "tokens_in", "tokens_out"]])
    finally:
        server.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
