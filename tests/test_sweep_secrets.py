"""A secret param in a sweep: given like a run's (``--param``, ``WF_PARAM_*``, ``params=``),
stored only as its seal, every cell driven with its value (on ``wf sweep-resume`` too, handed
back the way a run's resume gets it); as a grid axis or a rows column it is refused in one
line (a secret is not an axis)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import run_wf
from wf_magic import Engine
from wf_magic.errors import UsageError
from wf_magic.redact import is_secret_key
from wf_magic.spec.freeze import load_workflow
from wf_magic.sweeps.expand import definition

CANARY = "sk-canary-7f3a9c21e4"

HELPERS = """
import os


def check(key):
    return {"ok": key == os.environ.get("SWEEP_CANARY_EXPECT", "")}
"""

FLOW = """
name: secret-sweep
params:
  api_key: {type: string}
  topic: {type: string, default: cats}
runner: scripted
runners:
  scripted:
    rules:
      # a pattern of the canary, not the canary: the workflow's own text is stored
      - {match: "key sk-canary-7f3a9c2[1]e4 ", reply: "authorised", tokens_in: 2, tokens_out: 1}
      - {match: ".*", reply: "denied", tokens_in: 2, tokens_out: 1}
steps:
  - id: ask
    prompt: "key {{ params.api_key }} topic {{ params.topic }}"
  - id: verify
    python: sweep_secret_helpers:check
    with: {key: "{{ params.api_key }}"}
"""


def _project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "sweep_secret_helpers.py").write_text(HELPERS)
    (folder / "flow.yaml").write_text(FLOW)
    return folder / "flow.yaml"


def _assert_nowhere(state: Path) -> None:
    """The canary is in no file under the state dir and no row of the sweep tables."""
    for path in state.rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path
    conn = sqlite3.connect(state / "state.db")
    try:
        for table in ("sweeps", "sweep_cells", "runs", "attempts", "event_log"):
            for row in conn.execute(f"SELECT * FROM {table}"):  # noqa: S608
                assert CANARY not in repr(row), (table, row)
    finally:
        conn.close()


def test_a_secret_param_drives_every_cell_and_is_stored_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = _project(tmp_path)
    state = tmp_path / "state"
    monkeypatch.setenv("SWEEP_CANARY_EXPECT", CANARY)
    grid = ["--grid", "topic=a,b,c"]
    started = run_wf(
        state, "sweep", str(flow), *grid, "--param", f"api_key={CANARY}", "--max-units", "2"
    )
    assert started.returncode == 1, started.stdout + started.stderr  # stopped on its ceiling
    assert CANARY not in started.stdout + started.stderr
    sweep_id = started.stdout.split()[1]

    # A resume is handed the secret again, as a run's resume is; without it, one line.
    missing = run_wf(state, "sweep-resume", sweep_id, "--max-units", "20")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"error: sweep {sweep_id} has the secret param 'api_key', whose value is never stored; "
        f"pass it again to drive its cells: `wf sweep-resume {sweep_id} --param api_key=VALUE`, "
        "params={'api_key': ...} in Python, or the environment variable WF_PARAM_API_KEY"
    ]
    wrong = run_wf(state, "sweep-resume", sweep_id, "--param", "api_key=sk-other")
    assert wrong.returncode == 2, wrong.stderr
    assert "differs from the value the sweep started with" in wrong.stderr
    assert "sk-other" not in wrong.stderr

    monkeypatch.setenv("WF_PARAM_API_KEY", CANARY)
    resumed = run_wf(state, "sweep-resume", sweep_id, "--max-units", "20", "--quiet")
    monkeypatch.delenv("WF_PARAM_API_KEY")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    frame = json.loads(run_wf(state, "sweep-frame", sweep_id, "--format", "json").stdout)
    assert [r["status"] for r in frame] == ["completed"] * 3
    assert [r["ok"] for r in frame] == [True] * 3  # the python step got the value
    with Engine(state) as engine:
        for run_id in (r["run_id"] for r in frame):
            assert engine.handle(run_id).attempt("ask").output == "authorised"
    _assert_nowhere(state)

    # The same definition and secret is the same sweep; another secret is another sweep.
    again = run_wf(state, "sweep", str(flow), *grid, "--param", f"api_key={CANARY}", "--quiet")
    assert again.returncode == 0 and again.stdout.split()[1] == sweep_id, again.stderr


def test_engine_sweep_takes_params_and_a_new_engine_resumes_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = _project(tmp_path)
    monkeypatch.setenv("SWEEP_CANARY_EXPECT", CANARY)
    monkeypatch.syspath_prepend(str(flow.parent))
    state = tmp_path / "state"
    with Engine(state) as engine:
        sweep = engine.sweep(
            flow,
            grid={"topic": ["a", "b"]},
            params={"api_key": CANARY},
            budget={"max_units": 1},
        )
        assert sweep.status == "stopped"
        sweep_id = sweep.sweep_id
    with Engine(state) as engine:
        with pytest.raises(UsageError, match=r"has the secret param 'api_key'"):
            engine.sweep_resume(sweep_id, budget={"max_units": 10})
        done = engine.sweep_resume(sweep_id, budget={"max_units": 10}, params={"api_key": CANARY})
        assert done.status == "completed"
        assert done.frame()["ok"].tolist() == [True, True]
    _assert_nowhere(state)


REFUSED = [
    ("grid", {"grid": {"api_key": ["a", "b"]}}, "sweep grid axis 'api_key' is a secret param"),
    ("csv", {"rows": "rows.csv"}, "sweep rows column 'api_key' is a secret param"),
    ("list", {"rows": [{"api_key": "x"}]}, "sweep rows column 'api_key' is a secret param"),
    (
        "nested",
        {"rows": [{"topic": {"token": "x"}}]},
        "sweep rows column 'topic' holds a secret",
    ),
]


@pytest.mark.parametrize(("case", "kwargs", "expected"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_secret_param_as_an_axis_or_a_column_is_refused_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    kwargs: dict[str, object],
    expected: str,
) -> None:
    flow = _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.csv").write_text(f"api_key\n{CANARY}\n")
    with Engine(tmp_path / "state") as engine:
        with pytest.raises(UsageError) as caught:
            engine.sweep(flow, params={"api_key": CANARY}, **kwargs)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "a secret is not an axis" in message and "\n" not in message
    assert CANARY not in message


def test_wf_sweep_refuses_a_secret_grid_axis_with_exit_2(tmp_path: Path) -> None:
    flow = _project(tmp_path)
    done = run_wf(tmp_path / "state", "sweep", str(flow), "--grid", f"api_key={CANARY},b")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: sweep grid axis 'api_key' is a secret param, and a secret is not an axis: pass "
        "its one value with `--param api_key=VALUE`, params={'api_key': ...} or WF_PARAM_API_KEY"
    ]
    assert CANARY not in done.stderr


NB_FLOW = """name: nb-secret-sweep
params:
  api_key: {type: string}
  topic: {type: string, default: cats}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "key sk-canary-7f3a9c2[1]e4 ", reply: "authorised", tokens_in: 2, tokens_out: 1}
      - {match: ".*", reply: "denied", tokens_in: 2, tokens_out: 1}
steps:
  - id: ask
    prompt: "key {{ params.api_key }} topic {{ params.topic }}"
"""


def test_the_sweep_cell_takes_a_secret_from_params_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers_notebook import ipython_shell, magics_in

    state = tmp_path / "state"
    for shell in ipython_shell():
        with magics_in(shell, state):
            shell.user_ns["creds"] = {"api_key": CANARY}
            done = shell.run_cell("%%sweep --grid topic=a,b --params creds --as s\n" + NB_FLOW)
            done.raise_error()
            sweep = shell.user_ns["s"]
            assert sweep.status == "completed"
            assert sweep.frame()["result"].tolist() == ["authorised", "authorised"]
            monkeypatch.setenv("WF_PARAM_API_KEY", CANARY)
            env = shell.run_cell("%%sweep --grid topic=c --as e\n" + NB_FLOW)
            env.raise_error()
            assert shell.user_ns["e"].frame()["result"].tolist() == ["authorised"]
            refused = shell.run_cell(f"%%sweep --grid api_key={CANARY}\n" + NB_FLOW)
            assert refused.error_in_exec is not None
            assert "a secret is not an axis" in str(refused.error_in_exec)
    _assert_nowhere(state)


# -- a generator of secret params given as axes or columns --------------------------------------
_SECRET_NAMES = st.builds(
    lambda head, word: f"{head}{word}",
    st.sampled_from(["", "api_", "db_", "gh_", "x", "openai_"]),
    st.sampled_from(["key", "token", "password", "secret", "api_key", "KEY", "Token"]),
).filter(is_secret_key)
_VALUES = st.text(st.characters(codec="utf-8", categories=["L", "N"]), min_size=12, max_size=20)


@settings(max_examples=60, deadline=None)
@given(
    name=_SECRET_NAMES,
    value=_VALUES,
    where=st.sampled_from(["axis", "column", "nested-axis", "nested-column"]),
)
def test_any_secret_as_an_axis_or_a_column_is_one_line_without_its_value(
    name: str, value: str, where: str
) -> None:
    plan = load_workflow(
        f"name: gen\nparams:\n  {name}: {{}}\n  topic: {{}}\nrunner: scripted\n"
        "steps:\n  - id: a\n    prompt: hi\n"
    ).plan
    nested = {"topic": {"auth": {name: value}}}
    kwargs: dict[str, object] = {
        "axis": {"grid": {name: [value, value + "2"]}},
        "column": {"rows": [{name: value}]},
        "nested-axis": {"grid": {"topic": [nested["topic"]]}},
        "nested-column": {"rows": [nested]},
    }[where]
    with pytest.raises(UsageError) as caught:
        definition(plan, repeat=1, grid=kwargs.get("grid"), rows=kwargs.get("rows"))  # type: ignore[arg-type]
    message = str(caught.value)
    held = "is a secret param" if where in ("axis", "column") else "holds a secret"
    assert message.startswith(f"sweep {'grid axis' if 'axis' in where else 'rows column'} ")
    assert held in message and "a secret is not an axis" in message, message
    assert value not in message and "\n" not in message
