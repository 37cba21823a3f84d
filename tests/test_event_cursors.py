"""Event cursors for followers and the child tree of `wf status` (issue 19 item 7)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.conftest import db_rows, spawn_wf, wait_for, wf_inproc, write_file
from tests.helpers_flow import children_of
from tests.helpers_notebook import ipython_shell, magics_in
from wf_magic import Engine, follow
from wf_magic.display.children import ChildRun, child_tree, children_lines, next_command

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

THREE = """
name: three
steps:
  - id: a
    prompt: one
  - id: b
    prompt: two
  - id: c
    prompt: three
"""

SLOW_STEPS = 8


def slow_workflow(release: Path) -> str:
    """Eight prompt steps of a fifth of a second around an exec step that waits (up to a
    minute) for the file ``release``: the test decides when the run goes on."""
    wait = (
        "import os, sys, time\n"
        "deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(release)!r}):\n"
        "    if time.monotonic() > deadline: sys.exit(1)\n"
        "    time.sleep(0.02)\n"
        "print('released')"
    )
    prompts = [f"  - id: s{i}\n    prompt: step {i}\n" for i in range(SLOW_STEPS)]
    half = SLOW_STEPS // 2
    return (
        "name: slow\nrunner: scripted\nrunners:\n  scripted:\n    rules:\n"
        "      - {match: '^step', reply: done, sleep_s: 0.2}\nsteps:\n"
        + "".join(prompts[:half])
        + f"  - id: wait\n    exec: {json.dumps([sys.executable, '-c', wait])}\n"
        + "".join(prompts[half:])
    )


HUMAN_CHILD = """
name: waits
steps:
  - id: sub
    workflow: reviewed
  - id: after
    prompt: "after {{ steps.sub.output }}"
---
name: reviewed
steps:
  - id: draft
    prompt: draft
    gate: {judge: human}
"""

NESTED = """
name: top
steps:
  - id: fan
    map: "{{ ['a', 'b'] }}"
    workflow: mid
    with: {x: "{{ item }}"}
---
name: mid
params:
  x: {type: string}
steps:
  - id: inner
    workflow: leaf
    with: {x: "{{ params.x }}"}
---
name: leaf
params:
  x: {type: string}
steps:
  - id: w
    prompt: "leaf {{ params.x }}"
    gate: {judge: human}
"""


def event_ids(state_dir: Path, run_id: str) -> list[int]:
    rows = db_rows(state_dir, "SELECT event_id FROM events WHERE run_id = ? ORDER BY 1", (run_id,))
    return [int(str(r[0])) for r in rows]


def cursor_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


# -- Engine.events_after ------------------------------------------------------------------------
def test_events_after_returns_the_records_past_a_cursor(engine: Engine, state_dir: Path) -> None:
    run = engine.run(THREE)
    ids = event_ids(state_dir, run.run_id)

    assert [e.event_id for e in engine.events_after(run)] == ids
    assert [e.event_id for e in engine.events_after(run.run_id, ids[3])] == ids[4:]
    assert [e.event_id for e in engine.events_after(run.run_id[:-2], ids[3], limit=2)] == ids[4:6]
    assert engine.events_after(run, ids[-1]) == []
    first = engine.events_after(run)[0]
    assert (first.run_id, first.kind) == (run.run_id, "run_created")


def test_events_after_pages_through_every_event_exactly_once(
    engine: Engine, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = engine.run(THREE)
    monkeypatch.setattr(follow, "PAGE", 2)

    assert [e.event_id for e in engine.events_after(run)] == event_ids(state_dir, run.run_id)
    assert len(engine.events_after(run, limit=5)) == 5


def test_the_cursor_is_the_run_s_own_events_only(engine: Engine, state_dir: Path) -> None:
    first, second = engine.run(THREE), engine.run(THREE, new=True)
    interleaved = event_ids(state_dir, first.run_id)[0]

    assert {e.run_id for e in engine.events_after(second, interleaved)} == {second.run_id}
    assert [e.event_id for e in engine.events_after(first, 0)] == event_ids(state_dir, first.run_id)


# -- following: when a run settles ----------------------------------------------------------------
class FakeTime:
    """A clock and a sleep for :func:`wf_magic.follow.follow_events` (no real waiting)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds


def test_following_a_finished_run_prints_its_events_and_ends_at_once(
    engine: Engine, state_dir: Path
) -> None:
    run = engine.run(THREE)
    fake = FakeTime()

    got = follow.follow_events(engine.store, run.run_id, clock=fake.clock, sleep=fake.sleep)

    assert [e.event_id for e in got] == event_ids(state_dir, run.run_id)
    assert fake.sleeps == 0


def test_following_an_active_run_nobody_drives_ends_after_the_idle_time(engine: Engine) -> None:
    run = engine.start(THREE)
    engine.drive(run, max_steps=1)
    fake = FakeTime()

    got = list(
        follow.follow_events(
            engine.store,
            run.run_id,
            idle_s=1.0,
            poll_s=0.25,
            clock=fake.clock,
            sleep=fake.sleep,
        )
    )

    assert engine.get_run(run.run_id).status == "active"
    assert [e.event_id for e in got] == [e.event_id for e in engine.events_after(run)]
    assert (fake.sleeps, fake.now) == (4, 1.0)  # the first idle poll starts the clock


def test_a_held_lock_keeps_the_follower_on_a_settled_status_until_it_is_released(
    engine: Engine,
) -> None:
    run = engine.run(HUMAN_CHILD)
    child = children_of(engine, run.run_id)[0]
    lock = engine.store.run_lock(run.run_id).acquire()  # a driver (here) holds the root
    fake = FakeTime()

    def sleep(seconds: float) -> None:
        fake.sleep(seconds)
        if fake.sleeps == 3:
            lock.release()

    try:
        list(follow.follow_events(engine.store, run.run_id, sleep=sleep))
        assert fake.sleeps == 3  # blocked, but driven: followed until the lock went

        lock.acquire()
        fake.sleeps = 0
        list(follow.follow_events(engine.store, child, sleep=sleep))
        assert fake.sleeps == 3  # a child is driven by its root's driver
    finally:
        lock.release()


# -- wf events ------------------------------------------------------------------------------------
def test_events_since_a_cursor_print_one_line_each_and_the_cursor_last(
    capsys: pytest.CaptureFixture[str], engine: Engine, state_dir: Path
) -> None:
    run = engine.run(THREE)
    ids = event_ids(state_dir, run.run_id)

    text = wf_inproc(capsys, state_dir, "events", run.run_id, "--since", str(ids[1]))
    lines = text.stdout.splitlines()
    jsonl = wf_inproc(capsys, state_dir, "events", run.run_id, "--format", "json")
    objects = [json.loads(line) for line in jsonl.stdout.splitlines()]
    past = wf_inproc(capsys, state_dir, "events", run.run_id, "--since", str(ids[-1]))

    assert (text.returncode, text.stderr) == (0, f"cursor: {ids[-1]}\n")
    assert [int(line.split()[0]) for line in lines] == ids[2:]
    assert lines[-1].split()[2:4] == ["run_status", '{"reason":']
    assert [o["cursor"] for o in objects] == [o["event_id"] for o in objects] == ids
    assert set(objects[0]) == {
        "cursor",
        "event_id",
        "run",
        "at",
        "kind",
        "step",
        "unit",
        "dispatch_id",
        "data",
    }
    assert objects[0]["kind"] == "run_created" and objects[0]["data"]["workflow"] == "three"
    assert objects[0]["at"].endswith("Z") and objects[-1]["data"]["status"] == "completed"
    assert (past.returncode, past.stdout, past.stderr) == (0, "", f"cursor: {ids[-1]}\n")


def test_events_as_csv_rows_after_a_cursor(
    capsys: pytest.CaptureFixture[str], engine: Engine, state_dir: Path
) -> None:
    run = engine.run(THREE)
    ids = event_ids(state_dir, run.run_id)

    done = wf_inproc(
        capsys, state_dir, "events", run.run_id, "--since", str(ids[-3]), "--format", "csv"
    )

    header, *rows = done.stdout.splitlines()
    assert header == "event_id,run,at,kind,step,unit,dispatch_id,data_json"
    assert [int(r.split(",")[0]) for r in rows] == ids[-2:]
    assert done.stderr == f"cursor: {ids[-1]}\n"


def test_follow_of_a_run_stopped_by_max_steps_ends_after_the_idle_time(
    capsys: pytest.CaptureFixture[str], engine: Engine, state_dir: Path
) -> None:
    run = engine.start(THREE)
    engine.drive(run, max_steps=1)

    done = wf_inproc(capsys, state_dir, "events", run.run_id, "--follow", "--idle", "0.3")

    assert done.returncode == 0
    ids = event_ids(state_dir, run.run_id)
    assert [int(line.split()[0]) for line in done.stdout.splitlines()] == ids
    assert done.stderr == f"cursor: {ids[-1]}\n"


def test_an_interrupted_follower_prints_the_cursor_to_resume_from(
    tmp_path: Path, engine: Engine, state_dir: Path
) -> None:
    run = engine.start(THREE)
    engine.drive(run, max_steps=1)
    ids = event_ids(state_dir, run.run_id)
    engine.close()

    proc = spawn_wf(state_dir, "events", run.run_id, "--follow", "--idle", "600", cwd=tmp_path)
    try:
        assert proc.stdout is not None
        printed = [proc.stdout.readline() for _ in ids]  # every event so far, then it waits
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode == 130
    assert [int(line.split()[0]) for line in printed] == ids and out == ""
    assert cursor_line(err) == f"cursor: {ids[-1]}"


def test_follow_of_a_run_driven_by_another_process_sees_each_event_once_across_a_restart(
    tmp_path: Path, state_dir: Path
) -> None:
    release = tmp_path / "release"
    path = write_file(tmp_path, "slow.yaml", slow_workflow(release))
    driver = spawn_wf(state_dir, "run", str(path), "--quiet", cwd=tmp_path)
    resumed: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: bool(db_rows(state_dir, "SELECT run_id FROM runs")), what="the run row")
        [(run_id,)] = db_rows(state_dir, "SELECT run_id FROM runs")
        first = spawn_wf(state_dir, "events", str(run_id), "--follow", "--format", "json")
        assert first.stdout is not None
        seen = [json.loads(first.stdout.readline()) for _ in range(3)]
        os.kill(first.pid, signal.SIGKILL)  # mid-way: the run goes on without this follower
        first.wait(timeout=30)
        # Read through the same buffered stream readline() used: communicate() would read the
        # pipe itself and drop lines readline() had already buffered.
        rest = first.stdout.read()
        first.stdout.close()
        if first.stderr is not None:
            first.stderr.close()
        seen += [json.loads(line) for line in rest.splitlines(keepends=True) if line.endswith("\n")]
        [(status_at_restart,)] = db_rows(state_dir, "SELECT status FROM runs")

        since = str(seen[-1]["cursor"])
        resumed = spawn_wf(
            state_dir, "events", str(run_id), "--since", since, "--follow", "--format", "json"
        )
        assert resumed.stdout is not None
        later = []
        while not later or (later[-1]["kind"], later[-1]["unit"]) != ("unit_started", "wait"):
            later.append(json.loads(resumed.stdout.readline()))
        release.touch()  # the rest of the run happens while this follower follows it
        resumed.wait(timeout=120)
        out = resumed.stdout.read()
        err = resumed.stderr.read() if resumed.stderr is not None else ""
        resumed.stdout.close()
        if resumed.stderr is not None:
            resumed.stderr.close()
        later += [json.loads(line) for line in out.splitlines()]
        [(status_at_end,)] = db_rows(state_dir, "SELECT status FROM runs")
        assert driver.wait(timeout=60) == 0
    finally:
        for proc in (driver, resumed):
            if proc is not None:
                _reap(proc)

    assert status_at_restart == "active"
    assert (resumed.returncode, status_at_end) == (0, "completed"), err
    union = [e["cursor"] for e in seen + later]
    assert union == event_ids(state_dir, str(run_id))  # all of them, each once, in order
    assert cursor_line(err) == f"cursor: {union[-1]}"
    assert later[-1]["kind"] == "run_status" and later[-1]["data"]["status"] == "completed"
    finished = [e["unit"] for e in seen + later if e["kind"] == "unit_finished"]
    assert sorted(finished) == sorted([*(f"s{i}" for i in range(SLOW_STEPS)), "wait"])


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


# -- the child tree of wf status ------------------------------------------------------------------
def test_status_shows_a_blocked_child_and_the_commands_that_resume_it(
    capsys: pytest.CaptureFixture[str], engine: Engine, state_dir: Path
) -> None:
    run = engine.run(HUMAN_CHILD)
    [child] = children_of(engine, run.run_id)
    root = run.run_id

    done = wf_inproc(capsys, state_dir, "status", root)

    assert done.returncode == 3
    tail = done.stdout.splitlines()[-3:]
    assert tail == [
        "  children:",
        f"    {child}  reviewed  [blocked]  step sub — step draft: waiting for a human "
        "verdict on loop 1",
        f"      next: wf approve {child} draft (or wf reject {child} draft --feedback TEXT), "
        f"then wf resume {root} (or wf resume {child} for the child alone)",
    ]

    engine.approve(child, "draft")
    assert wf_inproc(capsys, state_dir, "resume", root, "--quiet").returncode == 0
    after = wf_inproc(capsys, state_dir, "status", root).stdout.splitlines()
    assert after[-2:] == ["  children:", f"    {child}  reviewed  [completed]  step sub"]


def test_status_indents_grandchildren_and_names_the_map_unit_that_spawned_each(
    capsys: pytest.CaptureFixture[str], engine: Engine, state_dir: Path
) -> None:
    run = engine.run(NESTED)
    [mid] = children_of(engine, run.run_id)
    [leaf] = children_of(engine, mid)
    root = run.run_id

    lines = wf_inproc(capsys, state_dir, "status", root).stdout.splitlines()

    start = lines.index("  children:")
    assert lines[start + 1].startswith(f"    {mid}  mid  [blocked]  step fan (unit fan[0]) — ")
    assert lines[start + 2] == (
        f"      {leaf}  leaf  [blocked]  step inner — step w: waiting for a human verdict on loop 1"
    )
    assert lines[start + 3] == (
        f"        next: wf approve {leaf} w (or wf reject {leaf} w --feedback TEXT), then "
        f"wf resume {root} (or wf resume {leaf} for the child alone)"
    )
    assert len(lines) == start + 4  # the middle run is blocked by its child: no command of its own
    mid_status = wf_inproc(capsys, state_dir, "status", mid).stdout.splitlines()
    assert mid_status[-3] == "  children:" and mid_status[-2].startswith(f"    {leaf}  leaf")


def test_status_of_a_run_without_children_has_no_children_section(
    capsys: pytest.CaptureFixture[str], engine: Engine, state_dir: Path
) -> None:
    run = engine.run(THREE)

    assert "children" not in wf_inproc(capsys, state_dir, "status", run.run_id).stdout


# -- %workflow events --since ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


def test_the_events_line_magic_takes_a_cursor(shell: InteractiveShell, tmp_path: Path) -> None:
    with magics_in(shell, tmp_path / "nb") as magics:
        run = magics.engine.run(THREE)
        ids = [e.event_id for e in magics.engine.events_after(run)]

        frame = shell.run_line_magic("workflow", f"events {run.run_id} --since {ids[2]}")
        whole = shell.run_line_magic("workflow", f"events {run.run_id}")

    assert list(frame["event_id"]) == ids[3:]
    assert list(whole["event_id"]) == ids


def test_a_large_tree_is_cut_with_a_line_saying_how_to_list_every_run(engine: Engine) -> None:
    run = engine.run(NESTED)

    tree = child_tree(engine.store, run.run_id, limit=1)
    lines = children_lines(tree, limit=1)

    assert len(tree) == 2  # one past the limit: enough to know there are more
    assert lines[0] == "  children:" and lines[1].startswith(f"    {tree[0].row.run_id}  mid")
    assert lines[-1] == "    … more child runs: `wf list --all` lists every run"
    assert len(lines) == 3


@pytest.mark.parametrize(
    ("status", "step", "judge", "below", "expected"),
    [
        (
            "blocked",
            "d",
            "human",
            False,
            "next: wf approve C d (or wf reject C d --feedback TEXT), "
            "then wf resume R (or wf resume C for the child alone)",
        ),
        (
            "blocked",
            "d",
            "exhausted",
            False,
            "next: wf approve C d (or wf reject C d --feedback "
            "TEXT), then wf resume R (or wf resume C for the child alone)",
        ),
        ("blocked", "d", "failed", False, "next: wf resume R (or wf resume C for the child alone)"),
        ("blocked", None, None, False, "next: wf resume R (or wf resume C for the child alone)"),
        ("blocked", None, None, True, None),  # a run further down says what to do
        ("completed", None, None, False, None),
        ("failed", None, None, False, None),
        ("active", None, None, False, None),
    ],
)
def test_the_next_command_of_a_child_follows_what_blocks_it(
    engine: Engine,
    status: str,
    step: str | None,
    judge: str | None,
    below: bool,
    expected: str | None,
) -> None:
    row = replace(engine.get_run(engine.run(THREE).run_id), run_id="C", root_run_id="R")
    child = ChildRun(
        row=replace(row, status=status),
        depth=1,
        waiting_step=step,
        waiting_judge=judge,
        blocked_below=below,
    )

    assert next_command(child) == expected
