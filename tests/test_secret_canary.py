"""A secret canary is found nowhere (issue 31, "Tests must show").

One canary value reaches wf_magic through each door a secret comes in by: a secret param
(``--param``, ``WF_PARAM_*``, ``params=``), a sweep's secret param, an agent's prompt, a URL
(a library index and source URL with ``?api_key=``) and a person's feedback
(``wf reject --feedback "password: …"``). After each, the canary is looked for

- as bytes in every file under the state dir, with a driver's connection still open (so the
  SQLite WAL and shm files are there and read too) and again after it closed;
- in what the ``wf`` verbs print of the run: ``status``, ``list``, ``journal``, ``events``,
  ``tokens``, ``export-cassette`` and ``show`` of every unit (tests/helpers_secrets.py), and
  the output of the command that took the secret;
- in every other process's argv (``/proc/*/cmdline``) while an agent unit runs;
- in a ``pg_dump`` of the schema, when ``WF_MAGIC_TEST_PG`` names a PostgreSQL server.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.agent_fakes.bins import make_bins
from tests.backends import PgState, pg_server
from tests.conftest import ROOT, db_rows, write_file
from tests.helpers_http import LoopbackHTTPServer, isolate_loopback_env
from tests.helpers_secrets import cli_shown, forms, leaks, wf
from wf_magic import Engine
from wf_magic.hashing import sha256_text

CANARY = "cnry7Kq2Xw9Lm4Tz"
"""16 characters of no known credential shape: only the door it came by can mask it."""

FLOW = """
name: canary-flow
params:
  api_token: {type: string}
  topic: {type: string, default: owls}
runner: scripted
runners:
  scripted:
    rules:
      - {match: ".", reply: "echo: {{ prompt }}"}
steps:
  - id: ask
    prompt: "use {{ params.api_token }} for {{ params.topic }}"
  - id: again
    prompt: "and again with {{ params.api_token }}"
"""


def _wf_process(
    state: os.PathLike[str], *args: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """The real ``wf`` in a subprocess (``--debug``): its exit code and all it printed."""
    done = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "python"),
            "-m",
            "wf_magic",
            "--db",
            str(state),
            "--debug",
            *args,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def _run_ids(state: Path) -> list[str]:
    return [str(r) for (r,) in db_rows(state, "SELECT run_id FROM runs ORDER BY created_at")]


def _nowhere(state: Path, texts: list[str], *, canary: str = CANARY) -> None:
    """The canary is in no file under ``state`` (WAL and shm included, read while a driver's
    connection is open, and again after), and in none of ``texts`` nor the ``wf`` verbs'
    output of any run of the state."""
    for run_id in _run_ids(state):
        texts = [*texts, cli_shown(state, run_id)]
    with Engine(state) as engine:
        engine.list_runs(include_children=True)  # a read: the connection is open
        open_files = sorted(p.name for p in state.iterdir())
        assert "state.db-wal" in open_files and "state.db-shm" in open_files, open_files
        while_open = leaks(canary, state, [])
    assert while_open == []
    assert leaks(canary, state, texts) == []


# -- a secret param, by each door --------------------------------------------------------------
@pytest.mark.parametrize("door", ["--param", "WF_PARAM_API_TOKEN", "params="])
def test_a_secret_param_canary_is_found_nowhere(
    tmp_path: Path, door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    flow = write_file(tmp_path, "flow.yaml", FLOW)
    texts: list[str] = []
    if door == "params=":
        with Engine(state) as engine:
            run = engine.run(str(flow), params={"api_token": CANARY})
            assert run.status == "completed"
            texts.append(repr(run) + str(run.result))
    else:
        given = ["--param", f"api_token={CANARY}"] if door == "--param" else []
        env = {door: CANARY} if door != "--param" else {}
        code, out = _wf_process(state, "run", str(flow), *given, env=env)
        assert code == 0, out
        assert "echo: and again with ***" in out
        texts.append(out)
    [run_id] = _run_ids(state)
    monkeypatch.setenv("WF_PARAM_API_TOKEN", CANARY)
    texts.append(wf(state, "--debug", "resume", run_id)[1])
    _nowhere(state, texts)


# -- a person's feedback -----------------------------------------------------------------------
GATED = """
name: canary-gate
runner: scripted
runners:
  scripted:
    rules:
      - {match: ".", reply: "echo: {{ prompt }}"}
steps:
  - id: draft
    prompt: "write the draft"
    gate: {judge: human, max_loops: 3}
"""


def test_a_canary_in_a_persons_feedback_is_found_nowhere(tmp_path: Path) -> None:
    state = tmp_path / "state"
    flow = write_file(tmp_path, "gated.yaml", GATED)
    texts = [wf(state, "--debug", "run", str(flow))[1]]
    [run_id] = _run_ids(state)
    code, out = _wf_process(state, "reject", run_id, "draft", "--feedback", f"password: {CANARY}")
    texts.append(out)
    assert code == 0, out
    code, out = wf(state, "--debug", "resume", run_id)  # loop 2 runs with the feedback
    texts.append(out)
    assert code == 3, out  # and blocks at the gate again
    with Engine(state) as engine:
        drafts = [a for a in engine.attempts(run_id) if a.unit_id == "draft"]
        assert [a.loop for a in drafts] == [1, 2]  # the feedback reached a second loop
        assert "password: ***" in str(engine.store.input_of(drafts[1].input_hash))
    code, out = wf(state, "--debug", "approve", run_id, "draft")
    texts.append(out)
    assert code == 0, out
    texts.append(wf(state, "--debug", "resume", run_id)[1])
    _nowhere(state, texts)


# -- a URL: the library's index and source URLs ------------------------------------------------
LIBRARY_FLOW = """\
name: review
params:
  topic: {type: string, default: owls}
runner: scripted
steps:
  - id: read
    prompt: "Review {{ params.topic }}"
"""


class _Site:
    """A loopback server of a library index and one workflow, whatever the query string."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = site.files.get(self.path.split("?", 1)[0])
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = LoopbackHTTPServer(Handler, name="canary-site")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.port}{path}"


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Site]:
    isolate_loopback_env(monkeypatch)
    for name in ("WF_MAGIC_PATH", "WF_MAGIC_INDEX", "WF_MAGIC_LIBRARY_TTL"):
        monkeypatch.delenv(name, raising=False)
    served = _Site()
    yield served
    served.server.stop()


def test_a_canary_in_library_urls_is_found_nowhere(
    tmp_path: Path, site: _Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    source_url = site.url(f"/wf/review.yaml?api_key={CANARY}")
    site.files["/wf/review.yaml"] = LIBRARY_FLOW.encode()
    index = {"workflows": {"review": {"url": source_url, "sha256": sha256_text(LIBRARY_FLOW)}}}
    site.files["/index.json"] = json.dumps(index).encode()
    env = {"WF_MAGIC_INDEX": site.url(f"/index.json?access_token={CANARY}")}
    monkeypatch.chdir(tmp_path)
    code, out = _wf_process(state, "run", "review", env=env)
    assert code == 0, out
    texts = [out, _wf_process(state, "run", "review", "--refresh", env=env)[1]]
    _nowhere(state, texts)


# -- a sweep's secret param --------------------------------------------------------------------
def test_a_secret_param_canary_given_to_a_sweep_is_found_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    flow = write_file(tmp_path, "flow.yaml", FLOW)
    code, out = _wf_process(
        state, "sweep", str(flow), "--param", f"api_token={CANARY}", "--grid", "topic=owls,bats"
    )
    assert code == 0, out
    texts = [out]
    [(sweep_id,)] = db_rows(state, "SELECT sweep_id FROM sweeps")
    for verb in (
        ("sweeps",),
        ("sweep-status", str(sweep_id)),
        ("sweep-frame", str(sweep_id), "--format", "csv"),
        ("sweep-frame", str(sweep_id), "--format", "json"),
    ):
        texts.append(wf(state, *verb)[1])
    monkeypatch.setenv("WF_PARAM_API_TOKEN", CANARY)
    texts.append(wf(state, "--debug", "sweep-resume", str(sweep_id))[1])
    assert len(_run_ids(state)) == 2
    _nowhere(state, texts)


# -- an agent's prompt -------------------------------------------------------------------------
def _argvs() -> dict[int, str]:
    """Every other process's argv (``/proc/PID/cmdline``), as one line each."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        out[int(entry.name)] = argv.replace(b"\0", b" ").decode(errors="replace")
    return out


AGENT_FLOW = """
name: canary-agent
params:
  api_token: {{type: string}}
steps:
  - id: fix
    agent: claude
    prompt: "[[sleep 1.5]] log in with {{{{ params.api_token }}}} and say hello"
runners:
  claude: {{bin: {bin}}}
"""


def _drive_agent_watching_argv(tmp_path: Path) -> tuple[Path, dict[int, str], list[str]]:
    """Run an agent unit whose prompt holds the canary, reading every ``/proc/*/cmdline``
    while it runs. Returns the state dir, the agent processes' argv, and what was printed."""
    bins = make_bins(tmp_path / "bin")
    work = tmp_path / "work"
    work.mkdir()
    flow = write_file(work, "agent.yaml", AGENT_FLOW.format(bin=bins["claude"]))
    state = tmp_path / "state"
    outcome: dict[str, Any] = {}

    def drive() -> None:
        outcome["result"] = _wf_process(state, "run", str(flow), "--param", f"api_token={CANARY}")

    driver = threading.Thread(target=drive)
    driver.start()
    agents: dict[int, str] = {}
    while driver.is_alive():
        # ``wf run`` holds the canary in its own argv (the caller put it there); every
        # process the agent runner starts is the agent's.
        agents.update((pid, a) for pid, a in _argvs().items() if str(bins["claude"]) in a)
        time.sleep(0.02)
    driver.join()
    code, out = outcome["result"]
    assert code == 0, out
    return state, agents, [out]


def test_a_canary_in_an_agents_prompt_is_in_no_argv_and_no_file_of_wf_magic(
    tmp_path: Path,
) -> None:
    state, agents, texts = _drive_agent_watching_argv(tmp_path)
    assert any(" -p" in a or "--print" in a for a in agents.values()), agents  # it was seen
    assert [a for a in agents.values() if any(f.decode() in a for f in forms(CANARY))] == []
    for run_id in _run_ids(state):
        texts.append(cli_shown(state, run_id))
    # wf_magic's own files: the database (WAL, shm), sidecars, stream logs, locks. The
    # agent CLI's own HOME (its session transcripts) is the next test's.
    own = [p for p in leaks(CANARY, state, texts) if "/home/" not in p]
    assert own == []


def test_a_canary_in_an_agents_prompt_is_in_no_file_under_the_state_dir(tmp_path: Path) -> None:
    # The agent CLI's own session transcript in the run's isolated HOME included: the runner
    # masks it when the attempt ends (agents/sidecars.py scrub_home).
    state, _, texts = _drive_agent_watching_argv(tmp_path)
    homes = list(state.glob("agents/*/home"))
    assert homes and any(p.is_file() for h in homes for p in h.rglob("*"))  # it wrote there
    assert leaks(CANARY, state, texts) == []


# -- the PostgreSQL schema ---------------------------------------------------------------------
def test_a_secret_param_canary_is_not_in_a_pg_dump_of_the_schema(tmp_path: Path) -> None:
    server = pg_server()
    if server is None:
        pytest.skip("PostgreSQL leg: set WF_MAGIC_TEST_PG=postgresql://USER@HOST:PORT/DB")
    state = PgState(server, tmp_path / "pg-local")
    flow = write_file(tmp_path, "flow.yaml", FLOW)
    gated = write_file(tmp_path, "gated.yaml", GATED)
    env = {"WF_MAGIC_LOCAL_DIR": str(state.local)}
    code, out = _wf_process(state, "run", str(flow), "--param", f"api_token={CANARY}", env=env)
    assert code == 0, out
    _wf_process(state, "run", str(gated), env=env)
    [(gate_run,)] = db_rows(state, "SELECT run_id FROM runs WHERE workflow = 'canary-gate'")
    code, out = _wf_process(
        state, "reject", str(gate_run), "draft", "--feedback", f"password: {CANARY}", env=env
    )
    assert code == 0, out
    code, out = _wf_process(state, "resume", str(gate_run), env=env)
    assert code == 3, out  # loop 2 ran with the feedback and blocks again
    dump = subprocess.run(
        ["pg_dump", "--schema", state.schema, "--no-owner", server],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert dump.returncode == 0, dump.stderr
    assert f"CREATE TABLE {state.schema}.attempts".encode() in dump.stdout
    assert b"password: ***" in dump.stdout  # the rows are in the dump, masked
    assert not any(f in dump.stdout for f in forms(CANARY))
    local = [
        str(p)
        for p in state.local.rglob("*")
        if p.is_file() and any(f in p.read_bytes() for f in forms(CANARY))
    ]
    assert local == []
