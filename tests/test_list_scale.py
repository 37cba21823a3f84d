"""``wf list`` and ``%workflow list`` at scale (issue 33 item 7): the newest 50 entries by
default and a count of the rest, a sweep's cells on one line per sweep, ``--all`` for every
run, ``--sweep SWEEP`` for one sweep's cells.

One state serves the module: 30 runs, then a sweep of 2 000 cells (10 of them fail), then 30
more runs: 61 entries, 2 060 runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_notebook import ipython_shell, magics_in
from wf_magic import Engine

from .conftest import wf_inproc

CELLS = 2000
FAILING = 10
EARLY, LATE = 30, 30
WORKFLOW = """\
name: evalbench
params:
  k: {type: integer, default: 0}
runners:
  scripted:
    rules:
      - {match: "^cell ([1-9]|10)!$", error: permanent}
steps:
  - id: say
    prompt: "cell {{ params.k }}!"
"""
LIST_BYTES = 8_000
"""What the default listing of this state may print: 50 lines of about 90 characters."""


class State:
    def __init__(self, path: Path, sweep_id: str, early: list[str], late: list[str]):
        self.path, self.sweep_id, self.early, self.late = path, sweep_id, early, late


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> State:
    path = tmp_path_factory.mktemp("scale") / "state"
    with Engine(path) as engine:
        early = [engine.run(WORKFLOW, params={"k": -i}).run_id for i in range(EARLY)]
        time.sleep(0.01)  # created_at orders the listing: the sweep comes strictly after
        sweep = engine.sweep(WORKFLOW, grid={"k": list(range(1, CELLS + 1))}, max_concurrency=4)
        time.sleep(0.01)
        late = [engine.run(WORKFLOW, params={"k": -100 - i}).run_id for i in range(LATE)]
        assert sweep.status == "failed"
    return State(path, sweep.sweep_id, early, late)


def _lines(capsys: pytest.CaptureFixture[str], state: State, *args: str) -> list[str]:
    result = wf_inproc(capsys, state.path, "list", *args)
    assert (result.returncode, result.stderr) == (0, "")
    return result.stdout.splitlines()


def _run_id(line: str) -> str:
    return line.split()[0]


SWEEP_LINE = "sweep {} evalbench: 2 000 cells · 1 990 completed · 10 failed"


# -- wf list ------------------------------------------------------------------------------------
def test_the_default_listing_is_the_newest_50_entries_and_a_count_of_the_rest(
    capsys: pytest.CaptureFixture[str], state: State
) -> None:
    result = wf_inproc(capsys, state.path, "list")
    lines = result.stdout.splitlines()
    assert len(result.stdout.encode()) < LIST_BYTES
    assert len(lines) == 51
    assert [_run_id(line) for line in lines[:LATE]] == state.late[::-1]
    assert lines[LATE] == SWEEP_LINE.format(state.sweep_id)  # one line for 2 000 cells
    assert [_run_id(line) for line in lines[LATE + 1 : 50]] == state.early[::-1][:19]
    assert lines[50] == "… and 11 older runs; --all shows every run"


@pytest.mark.parametrize(
    ("limit", "shown_runs", "older_runs", "older_sweeps"),
    [
        (1, 1, 59, 1),
        (30, 30, 30, 1),
        (31, 30, 30, 0),  # the 31st entry is the sweep
        (50, 49, 11, 0),
        (60, 59, 1, 0),
        (61, 60, 0, 0),
        (1000, 60, 0, 0),
    ],
)
def test_limit_n_shows_the_newest_n_entries_and_counts_exactly_what_it_left_out(
    capsys: pytest.CaptureFixture[str],
    state: State,
    limit: int,
    shown_runs: int,
    older_runs: int,
    older_sweeps: int,
) -> None:
    lines = _lines(capsys, state, "--limit", str(limit))
    rest = [line for line in lines if line.startswith("… and ")]
    entries = [line for line in lines if not line.startswith("… and ")]
    assert len(entries) == min(limit, EARLY + LATE + 1)
    assert sum(line.startswith("sweep ") for line in entries) == 1 - older_sweeps
    assert len(entries) - (1 - older_sweeps) == shown_runs
    parts = [
        f"{n} older {noun}{'' if n == 1 else 's'}"
        for n, noun in ((older_runs, "run"), (older_sweeps, "sweep"))
        if n
    ]
    expected = [f"… and {' and '.join(parts)}; --all shows every run"] if parts else []
    assert rest == expected


def test_all_lists_every_run_each_on_its_line_and_leaves_nothing_out(
    capsys: pytest.CaptureFixture[str], state: State
) -> None:
    lines = _lines(capsys, state, "--all")
    assert len(lines) == CELLS + EARLY + LATE
    ids = [_run_id(line) for line in lines]
    assert len(set(ids)) == len(ids)
    assert ids[:LATE] == state.late[::-1] and ids[-EARLY:] == state.early[::-1]
    assert sum(" failed " in line for line in lines) == FAILING
    assert not any(line.startswith(("sweep ", "… and ")) for line in lines)


def test_sweep_lists_its_newest_50_cells_and_counts_the_rest(
    capsys: pytest.CaptureFixture[str], state: State
) -> None:
    lines = _lines(capsys, state, "--sweep", state.sweep_id[:8])  # a unique prefix will do
    assert len(lines) == 51
    assert lines[-1] == "… and 1 950 older cells; --all shows every cell"
    for line in lines[:50]:
        assert re.fullmatch(r"r-\S+  evalbench\s+completed\s+\S+\s+k=\d+  cell \d+", line), line
    every = _lines(capsys, state, "--sweep", state.sweep_id, "--all")
    assert len(every) == CELLS
    cells = sorted(int(line.rsplit("cell ", 1)[1]) for line in every)
    assert cells == list(range(CELLS))
    failed = sorted(int(line.rsplit("k=", 1)[1].split()[0]) for line in every if " failed " in line)
    assert failed == list(range(1, FAILING + 1))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sweep", "sw-nope"), "error: No sweep 'sw-nope' in {where}. `wf sweeps` lists them."),
        (("--limit", "0"), "error: argument --limit: expected an integer from 1 to"),
        (("--limit", "-3"), "error: argument --limit: expected an integer from 1 to"),
        (("--limit", "many"), "error: argument --limit: expected an integer from 1 to"),
        (("--limit", "1.5"), "error: argument --limit: expected an integer from 1 to"),
        (("--sweep",), "error: argument --sweep: expected one argument"),
    ],
)
def test_bad_list_options_are_refused_in_one_line_naming_the_option(
    capsys: pytest.CaptureFixture[str], state: State, args: tuple[str, ...], message: str
) -> None:
    result = wf_inproc(capsys, state.path, "list", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert message.format(where=state.path / "state.db") in last


# -- %workflow list -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


def test_the_notebook_listing_shows_the_same_entries_as_wf_list(
    capsys: pytest.CaptureFixture[str], shell: InteractiveShell, state: State
) -> None:
    with magics_in(shell, state.path):
        shown = shell.run_line_magic("workflow", "list")
        cells = shell.run_line_magic("workflow", f"list --sweep {state.sweep_id}")
        every = shell.run_line_magic("workflow", "list --all")
    readable = shown.readable()
    assert len(shown) == 49 and len(readable) == 50  # 49 runs and the sweep's one line
    assert list(readable["run"][:LATE]) == state.late[::-1]
    assert readable["run"][LATE] == SWEEP_LINE.format(state.sweep_id)
    assert list(shown["run"]) == [*state.late[::-1], *state.early[::-1][:19]]
    html = shown._repr_html_()
    assert len(html.encode()) < 6 * LIST_BYTES
    assert html.endswith("<p>… and 11 older runs; --all shows every run</p>")
    assert repr(shown).endswith("\n… and 11 older runs; --all shows every run")
    assert len(cells) == 50 and set(cells["status"]) == {"completed"}
    assert repr(cells).endswith("\n… and 1 950 older cells; --all shows every cell")
    assert len(every) == CELLS + EARLY + LATE
    capsys.readouterr()


# -- both backends, small ------------------------------------------------------------------------
@pytest.mark.backends
def test_the_listing_pages_runs_and_sweeps_alike_on_both_backends(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    with Engine(state_dir) as engine:
        old = [engine.run(WORKFLOW, params={"k": -i}).run_id for i in range(3)]
        time.sleep(0.01)
        sweep = engine.sweep(WORKFLOW, grid={"k": [1, 11, 12]})
        time.sleep(0.01)
        new = [engine.run(WORKFLOW, params={"k": -10 - i}).run_id for i in range(2)]
    sweep_line = f"sweep {sweep.sweep_id} evalbench: 3 cells · 2 completed · 1 failed"
    lines = wf_inproc(capsys, state_dir, "list", "--limit", "2").stdout.splitlines()
    assert [_run_id(line) for line in lines[:2]] == new[::-1]
    assert lines[2:] == ["… and 3 older runs and 1 older sweep; --all shows every run"]
    lines = wf_inproc(capsys, state_dir, "list").stdout.splitlines()
    assert [*map(_run_id, lines[:2]), lines[2], *map(_run_id, lines[3:])] == [
        *new[::-1],
        sweep_line,
        *old[::-1],
    ]
    assert wf_inproc(capsys, state_dir, "list", "--mine").stdout.splitlines() == lines
    cells = wf_inproc(capsys, state_dir, "list", "--sweep", sweep.sweep_id, "--limit", "1")
    assert cells.stdout.splitlines()[1:] == ["… and 2 older cells; --all shows every cell"]
    every = wf_inproc(capsys, state_dir, "list", "--all").stdout.splitlines()
    assert len(every) == 8 and not any(line.startswith("sweep ") for line in every)


def test_mine_leaves_out_another_users_runs_and_sweeps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wf_magic.users import USER_ENV

    state = tmp_path / "state"
    monkeypatch.setenv(USER_ENV, "alice")
    with Engine(state) as engine:
        engine.run(WORKFLOW, params={"k": -1})
        sweep = engine.sweep(WORKFLOW, grid={"k": [11, 12]})
    assert len(wf_inproc(capsys, state, "list", "--mine").stdout.splitlines()) == 2
    monkeypatch.setenv(USER_ENV, "bob")
    assert (
        wf_inproc(capsys, state, "list", "--mine").stdout == f"no runs of bob in {state}/state.db\n"
    )
    listed = wf_inproc(capsys, state, "list").stdout.splitlines()
    assert listed[0] == f"sweep {sweep.sweep_id} evalbench: 2 cells · 2 completed"
    assert len(listed) == 2
