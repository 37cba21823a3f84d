"""A fake coding-agent CLI in each real CLI's shape (claude, codex, opencode, gemini), offline.

Its argv, JSON/JSONL output, error shapes, exit codes, preset and resumed sessions follow
the measurements in the harness notes; what it does comes from directives in the prompt:

- ``[[write NAME TEXT]]``: write ``TEXT`` to ``NAME`` in its cwd (when the permission allows).
- ``[[sleep S]]``: sleep ``S`` seconds after its first line (the session id is out by then);
  ``[[sleep-once S]]``: only the first launch in this HOME sleeps (its pid is in
  ``$HOME/.fake-agent/slept-once``).
- ``[[fail STATUS]]`` / ``[[fail-once STATUS]]``: an API error with that HTTP status (once:
  only the first launch in this HOME fails).
- ``[[echo-env NAME]]``: put the value of ``$NAME`` in its answer and its streamed lines.
- ``[[max-turns]]`` (claude): ``error_max_turns``. ``[[deny]]`` (claude): deny the write.
- ``[[spawn-sleep]]``: start a ``sleep 120`` child in its process group; ``[[hold-stdout]]``:
  one that keeps its stdout open after it exits. Every launch appends
  its pid (and that child's) to ``$HOME/.fake-agent/pids``.
- ``[[json]]``: answer ``{"status": ..., "turn": n}`` as JSON text.
- ``[[print-file PATH]]``: copy PATH's bytes to stdout after the first line (hostile lines);
  ``[[long-line MIB]]``: then print MIB MiB on one line without a newline, and exit 0.
- ``[[raw-cost TEXT]]`` / ``[[raw-tokens TEXT]]``: TEXT, as is, is the reported cost / output
  token count in every line that reports one (``NaN``, ``-1``, ``1e400``, ``"12"``, ``true``).

The prompt is read from stdin (as the real CLIs do when wf_magic gives it there), else from
argv. ``--version`` appends what it saw (HOME, cwd, the environment's names) to
``version-probes.jsonl`` in the fake's bin folder.

The answer is ``FIXED`` when the prompt carries a gate feedback block, else ``TRIED``, then
``turn=N`` (the session's turn count) and ``prompt_chars=K``. Sessions live in
``$HOME/.fake-agent/sessions/<id>.json`` with the cwd they started in; claude, opencode and
gemini resume only from that cwd (as the real ones do); codex from anywhere.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

VERSIONS = {
    "claude": "2.1.197 (Claude Code)",
    "codex": "codex-cli 0.171.0",
    "opencode": "1.18.33",
    "gemini": "0.61.0",
}


STDIN_PROMPT = ""
"""What stdin said (the prompt), read once by main()."""
_RAW_COST = re.compile(r'"(total_cost_usd|cost)": [^,}\n]+')
_RAW_TOKENS = re.compile(r'"(output_tokens|output|candidates)": [^,}\n]+')


def _patch(text: str) -> str:
    """``text`` with the ``[[raw-cost]]`` / ``[[raw-tokens]]`` values spliced in, as is."""
    cost = re.search(r"\[\[raw-cost ([^\]\s]+)\]\]", STDIN_PROMPT)
    if cost:
        text = _RAW_COST.sub(lambda m: f'"{m.group(1)}": {cost.group(1)}', text)
    tokens = re.search(r"\[\[raw-tokens ([^\]\s]+)\]\]", STDIN_PROMPT)
    if tokens:
        text = _RAW_TOKENS.sub(lambda m: f'"{m.group(1)}": {tokens.group(1)}', text)
    return text


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(_patch(json.dumps(obj)) + "\n")
    sys.stdout.flush()
    _hostile()


_HOSTILE_DONE = False


def _hostile() -> None:
    """After the first line: the ``[[print-file]]`` bytes and the ``[[long-line]]``."""
    global _HOSTILE_DONE
    if _HOSTILE_DONE:
        return
    _HOSTILE_DONE = True
    for path in re.findall(r"\[\[print-file (\S+)\]\]", STDIN_PROMPT):
        sys.stdout.flush()
        sys.stdout.buffer.write(Path(path).read_bytes())
        sys.stdout.buffer.flush()
    m = re.search(r"\[\[long-line (\d+)\]\]", STDIN_PROMPT)
    if m:
        chunk = b"x" * (1 << 20)
        sys.stdout.flush()
        sys.stdout.buffer.write(b'{"type": "pad", "text": "')
        for _ in range(int(m.group(1))):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        os._exit(0)


def _prompt(given: str | None) -> str:
    """The prompt: stdin's, else the one in argv."""
    return STDIN_PROMPT or given or ""


def _sessions() -> Path:
    folder = Path(os.environ["HOME"]) / ".fake-agent" / "sessions"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _load_session(session_id: str, *, anywhere: bool) -> dict[str, Any] | None:
    path = _sessions() / f"{session_id}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if not anywhere and data["cwd"] != os.getcwd():
        return None
    return data


def _save_session(session_id: str, data: dict[str, Any]) -> None:
    (_sessions() / f"{session_id}.json").write_text(json.dumps(data))


def _fails(prompt: str) -> int | None:
    m = re.search(r"\[\[fail (\d+)\]\]", prompt)
    if m:
        return int(m.group(1))
    m = re.search(r"\[\[fail-once (\d+)\]\]", prompt)
    if m:
        marker = Path(os.environ["HOME"]) / ".fake-agent" / f"failed-once-{m.group(1)}"
        marker.parent.mkdir(parents=True, exist_ok=True)
        if not marker.exists():
            marker.write_text("1")
            return int(m.group(1))
    return None


def _act(prompt: str, may_write: bool, deny: bool) -> tuple[list[str], list[str]]:
    """Do the prompt's writes; returns (files written, files denied)."""
    written, denied = [], []
    for name, text in re.findall(r"\[\[write (\S+) ([^\]]*)\]\]", prompt):
        if may_write and not deny:
            Path(name).write_text(text + "\n")
            written.append(name)
        else:
            denied.append(name)
    return written, denied


def _answer(prompt: str, turn: int, history: list[str]) -> str:
    status = "FIXED" if "Gate feedback" in prompt else "TRIED"
    extra = ""
    for name in re.findall(r"\[\[echo-env (\w+)\]\]", prompt):
        extra += f" {name}={os.environ.get(name, '')}"
    if "[[json]]" in prompt:
        return json.dumps({"status": status, "turn": turn})
    return f"{status} turn={turn} prompt_chars={len(prompt)} history={len(history)}{extra}"


def _sleep(prompt: str) -> None:
    m = re.search(r"\[\[sleep ([\d.]+)\]\]", prompt)
    if m:
        time.sleep(float(m.group(1)))
    m = re.search(r"\[\[sleep-once ([\d.]+)\]\]", prompt)
    marker = Path(os.environ["HOME"]) / ".fake-agent" / "slept-once"
    if m and not marker.exists():
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, marker)  # never seen empty
        time.sleep(float(m.group(1)))


def _opt(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def claude(args: list[str]) -> int:
    prompt = _prompt(_opt(args, "-p"))
    if (
        "--output-format" in args
        and _opt(args, "--output-format") == "stream-json"
        and "--verbose" not in args
    ):
        print(
            "Error: When using --print, --output-format=stream-json requires --verbose",
            file=sys.stderr,
        )
        return 1
    mode = _opt(args, "--permission-mode") or "default"
    resume, preset = _opt(args, "--resume"), _opt(args, "--session-id")
    if resume:
        data = _load_session(resume, anywhere=False)
        if data is None:
            print(f"No conversation found with session ID: {resume}", file=sys.stderr)
            return 1
        session_id = resume
    else:
        session_id = preset or str(uuid.uuid4())
        if preset and (_sessions() / f"{preset}.json").exists():
            print(f"Error: Session ID {preset} is already in use.", file=sys.stderr)
            return 1
        data = {"cwd": os.getcwd(), "turns": 0, "prompts": []}
    data["turns"] += 1
    data["prompts"].append(prompt)
    _save_session(session_id, data)
    _emit(
        {
            "type": "system",
            "subtype": "init",
            "session_id": session_id,
            "cwd": os.getcwd(),
            "analytics_disabled": True,
        }
    )
    _sleep(prompt)
    usage = {
        "input_tokens": 120,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 8,
    }
    base = {
        "type": "result",
        "session_id": session_id,
        "duration_ms": 5,
        "num_turns": 1,
        "usage": usage,
        "permission_denials": [],
        "uuid": str(uuid.uuid4()),
    }
    status = _fails(prompt)
    if status is not None:
        text = {
            401: "Failed to authenticate. API Error: 401 invalid x-api-key",
            529: "API Error: 529 Overloaded. This is a server-side issue, usually temporary",
        }
        _emit(
            {
                **base,
                "subtype": "success",
                "is_error": True,
                "api_error_status": status,
                "result": text.get(status, f"API Error: {status}"),
                "total_cost_usd": 0,
                "usage": {**usage, "input_tokens": 0, "output_tokens": 0},
            }
        )
        return 1
    written, denied = _act(
        prompt, mode in ("acceptEdits", "bypassPermissions"), "[[deny]]" in prompt
    )
    for name in written + denied:
        _emit(
            {
                "type": "assistant",
                "session_id": session_id,
                "message": {
                    "content": [{"type": "tool_use", "name": "Write", "input": {"file_path": name}}]
                },
            }
        )
    if "[[max-turns]]" in prompt:
        _emit(
            {
                **base,
                "subtype": "error_max_turns",
                "is_error": True,
                "errors": ["Reached maximum number of turns (1)"],
                "total_cost_usd": 0.00048,
            }
        )
        return 1
    answer = _answer(prompt, data["turns"], data["prompts"][:-1])
    if "--max-budget-usd" in args:
        answer += f" budget={_opt(args, '--max-budget-usd')}"
    _emit(
        {
            "type": "assistant",
            "session_id": session_id,
            "message": {"content": [{"type": "text", "text": answer}]},
        }
    )
    result: dict[str, Any] = {
        **base,
        "subtype": "success",
        "is_error": False,
        "api_error_status": None,
        "result": answer,
        "total_cost_usd": 0.00048,
        "permission_denials": [
            {
                "tool_name": "Write",
                "tool_use_id": "t1",
                "tool_input": {"file_path": n, "content": "x"},
            }
            for n in denied
        ],
    }
    if "--json-schema" in args:
        result["structured_output"] = {"status": answer.split()[0], "turn": data["turns"]}
    _emit(result)
    return 0


def codex(args: list[str]) -> int:
    if not args or args[0] != "exec":
        print("error: unexpected argument", file=sys.stderr)
        return 2
    rest = args[1:]
    prompt = _prompt(None) if rest[-1] == "-" else rest[-1]
    sandbox = _opt(rest, "--sandbox")
    override = _opt(rest, "-c") or ""
    if override.startswith("sandbox_mode="):
        sandbox = override.split("=", 1)[1].strip('"')
    bypass = "--dangerously-bypass-approvals-and-sandbox" in rest
    print("Reading additional input from stdin...", file=sys.stderr)
    if rest[0] == "resume":
        if "--sandbox" in rest:
            print("error: unexpected argument '--sandbox' found", file=sys.stderr)
            return 2
        thread = rest[-2]
        data = _load_session(thread, anywhere=True)
        if data is None:
            print(
                f"Error: thread/resume: thread/resume failed: no rollout found for thread id {thread} (code -32600)",
                file=sys.stderr,
            )
            return 1
    else:
        thread = str(uuid.uuid4())
        data = {"cwd": os.getcwd(), "turns": 0, "prompts": []}
    data["turns"] += 1
    data["prompts"].append(prompt)
    _save_session(thread, data)
    _emit({"type": "thread.started", "thread_id": thread})
    _emit({"type": "turn.started"})
    _sleep(prompt)
    status = _fails(prompt)
    if status is not None:
        message = {
            401: "unexpected status 401 Unauthorized: fake backend: injected HTTP 401",
            529: "We're currently experiencing high demand, which may cause temporary errors.",
        }
        _emit({"type": "error", "message": "Reconnecting... 1/5"})
        _emit(
            {"type": "turn.failed", "error": {"message": message.get(status, f"status {status}")}}
        )
        return 1
    written, _ = _act(prompt, bypass or sandbox == "workspace-write", False)
    for name in written:
        _emit(
            {
                "type": "item.started",
                "item": {"type": "command_execution", "command": f"write {name}"},
            }
        )
        _emit({"type": "item.completed", "item": {"type": "command_execution", "exit_code": 0}})
    answer = _answer(prompt, data["turns"], data["prompts"][:-1])
    _emit(
        {
            "type": "item.completed",
            "item": {"id": "item_0", "type": "agent_message", "text": answer},
        }
    )
    n = data["turns"]  # usage is cumulative over the thread
    _emit(
        {
            "type": "turn.completed",
            "usage": {
                "input_tokens": 120 * n,
                "cached_input_tokens": 0,
                "cache_write_input_tokens": 0,
                "output_tokens": 8 * n,
                "reasoning_output_tokens": 0,
            },
        }
    )
    return 0


def opencode(args: list[str]) -> int:
    if not args or args[0] != "run":
        return 1
    rest = args[1:]
    prompt = _prompt(None)
    resume = _opt(rest, "--session")
    if resume:
        data = _load_session(resume, anywhere=False)
        if data is None:
            _emit(
                {
                    "type": "error",
                    "error": {
                        "name": "NotFoundError",
                        "data": {"message": f"Session not found: {resume}"},
                    },
                }
            )
            return 1
        session_id = resume
    else:
        session_id = "ses_" + uuid.uuid4().hex[:24]
        data = {"cwd": os.getcwd(), "turns": 0, "prompts": []}
    data["turns"] += 1
    data["prompts"].append(prompt)
    _save_session(session_id, data)
    _emit({"type": "step_start", "sessionID": session_id, "part": {"type": "step-start"}})
    _sleep(prompt)
    status = _fails(prompt)
    if status is not None:
        _emit(
            {
                "type": "error",
                "sessionID": session_id,
                "error": {
                    "name": "APIError",
                    "data": {
                        "message": f"injected HTTP {status}",
                        "statusCode": status,
                        "isRetryable": status >= 500,
                    },
                },
            }
        )
        return 1
    permission = json.loads(os.environ.get("OPENCODE_PERMISSION") or "{}")
    written, _ = _act(prompt, permission.get("edit", "allow") == "allow", False)
    for name in written:
        _emit(
            {
                "type": "tool_use",
                "sessionID": session_id,
                "part": {
                    "type": "tool",
                    "tool": "write",
                    "state": {"status": "completed", "input": {"filePath": name}},
                },
            }
        )
    answer = _answer(prompt, data["turns"], data["prompts"][:-1])
    _emit({"type": "text", "sessionID": session_id, "part": {"type": "text", "text": answer}})
    _emit(
        {
            "type": "step_finish",
            "sessionID": session_id,
            "part": {
                "type": "step-finish",
                "reason": "stop",
                "tokens": {
                    "total": 128,
                    "input": 120,
                    "output": 8,
                    "reasoning": 0,
                    "cache": {"write": 0, "read": 0},
                },
                "cost": 0.00048,
            },
        }
    )
    return 0


def gemini(args: list[str]) -> int:
    prompt = _prompt(_opt(args, "-p"))
    settings = Path(os.environ["HOME"]) / ".gemini" / "settings.json"
    if not settings.exists() or "selectedType" not in settings.read_text():
        print(
            json.dumps(
                {"error": {"type": "Error", "message": "Invalid auth method selected.", "code": 41}}
            ),
            file=sys.stderr,
        )
        return 41
    if os.environ.get("GEMINI_CLI_TRUST_WORKSPACE") != "true":
        print("Gemini CLI is not running in a trusted directory.", file=sys.stderr)
        return 55
    resume, preset = _opt(args, "--resume"), _opt(args, "--session-id")
    if resume:
        data = _load_session(resume, anywhere=False)
        if data is None:
            print(
                "Error resuming session: No previous sessions found for this project.",
                file=sys.stderr,
            )
            return 1
        session_id = resume
    else:
        session_id = preset or str(uuid.uuid4())
        if preset and (_sessions() / f"{preset}.json").exists():
            print(f'Error starting session: Session ID "{preset}" already exists.', file=sys.stderr)
            return 42
        data = {"cwd": os.getcwd(), "turns": 0, "prompts": []}
    data["turns"] += 1
    data["prompts"].append(prompt)
    _save_session(session_id, data)
    _sleep(prompt)
    status = _fails(prompt)
    if status is not None:
        inner = json.dumps({"type": "error", "error": {"message": f"injected HTTP {status}"}})
        print(
            json.dumps(
                {
                    "session_id": session_id,
                    "error": {"type": "Error", "message": inner, "code": status},
                }
            ),
            file=sys.stderr,
        )
        return status % 256
    written, _ = _act(prompt, _opt(args, "--approval-mode") in ("auto_edit", "yolo"), False)
    answer = _answer(prompt, data["turns"], data["prompts"][:-1])
    print(
        _patch(
            json.dumps(
                {
                    "session_id": session_id,
                    "response": answer,
                    "stats": {
                        "models": {
                            "gemini-2.5-flash": {
                                "tokens": {
                                    "input": 120,
                                    "prompt": 120,
                                    "candidates": 8,
                                    "total": 128,
                                    "cached": 0,
                                    "thoughts": 0,
                                    "tool": 0,
                                }
                            }
                        },
                        "tools": {"totalCalls": len(written)},
                        "files": {"totalLinesAdded": len(written)},
                    },
                },
                indent=2,
            )
        )
    )
    return 0


def _record_pids(args: list[str]) -> None:
    """Append this process's pid (and a ``[[spawn-sleep]]`` child's) to ``$HOME/.fake-agent/pids``."""
    import subprocess

    pids = [os.getpid()]
    if any("[[spawn-sleep]]" in a for a in args):
        pids.append(
            subprocess.Popen(
                ["sleep", "120"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ).pid
        )
    if any("[[hold-stdout]]" in a for a in args):  # a descendant keeping stdout open
        pids.append(subprocess.Popen(["sleep", "120"]).pid)
    folder = Path(os.environ["HOME"]) / ".fake-agent"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "pids").open("a") as f:
        f.write("".join(f"{p}\n" for p in pids))


def main(shape: str, bin_dir: str) -> int:
    global STDIN_PROMPT
    args = sys.argv[1:]
    if args == ["--version"]:
        seen = {"home": os.environ.get("HOME"), "cwd": os.getcwd(), "env": sorted(os.environ)}
        with (Path(bin_dir) / "version-probes.jsonl").open("a") as f:
            f.write(json.dumps(seen) + "\n")
        print(VERSIONS[shape])
        return 0
    if sys.stdin is not None and not sys.stdin.isatty():
        STDIN_PROMPT = sys.stdin.read()
    _record_pids([*args, STDIN_PROMPT])
    return {"claude": claude, "codex": codex, "opencode": opencode, "gemini": gemini}[shape](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv.pop(1), sys.argv.pop(1)))
