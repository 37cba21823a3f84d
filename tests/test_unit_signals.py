"""Runs that could never finish (issue 20, class 2), in real `wf` processes.

A python step raising ``SystemExit(7)`` or returning a lone surrogate fails its run with a
stated reason, and `wf resume` fails it the same way; a unit with no timeout that never
returns is ended by a second SIGTERM like by a second SIGINT (exit 130), leaving the run
``active`` and its attempt owed, reclaimed in place by the next drive.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import pytest

from tests.conftest import run_wf, write_file
from tests.helpers_flow import only_run_id, wait_for_journal, wf_process

UNITS = """
import time
from pathlib import Path

RELEASE = Path(__file__).with_name("release")


def forever(**kwargs):
    while not RELEASE.exists():  # no timeout: it returns only once released
        time.sleep(0.05)
    return "released"


def exits(**kwargs):
    raise SystemExit(7)


def surrogate(**kwargs):
    return {"text": "a\\ud800b"}
"""


def _rows(state: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(state / "state.db")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _workflow(tmp_path: Path, name: str, body: str) -> Path:
    write_file(tmp_path, "units.py", UNITS)
    return write_file(tmp_path, f"{name}.yaml", f"name: {name}\n{body}")


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("exits", "the unit's code raised SystemExit(7)"),
        ("surrogate", "output['text']: a string holds a lone surrogate U+D800 at index 1"),
    ],
)
def test_a_unit_that_exits_or_returns_a_surrogate_fails_its_run_and_every_resume(
    tmp_path: Path, target: str, words: str
) -> None:
    wf = _workflow(tmp_path, "ends", f"steps:\n  - id: s\n    python: units:{target}\n")
    state = tmp_path / "state"

    first = run_wf(state, "run", str(wf))
    run_id = only_run_id(state)
    again = run_wf(state, "resume", run_id)

    for done in (first, again):
        assert done.returncode == 1, done.stderr
        assert f"reason: step s: unit s failed: {words}" in done.stdout
        assert "cannot read the state database" not in done.stderr
    assert _rows(state, "SELECT status, status_reason FROM runs") == [
        ("failed", f"step s: unit s failed: {_rows(state, 'SELECT failure FROM attempts')[0][0]}")
    ]
    assert [r[0] for r in _rows(state, "SELECT status FROM attempts")] == ["failed", "failed"]


LAYOUTS = {
    "inline": "steps:\n  - id: s\n    python: units:forever\n",
    "pool": (
        "execution: {max_concurrency: 2}\nsteps:\n  - id: s\n    map: '{{ [1, 2] }}'\n"
        "    python: units:forever\n"
    ),
}
"""A never-returning unit in the driver's main thread, and two on the thread pool."""


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_ends_a_drive_stuck_in_a_unit_and_the_unit_stays_owed(
    tmp_path: Path, layout: str, signum: int
) -> None:
    wf = _workflow(tmp_path, "stuck", LAYOUTS[layout])
    state = tmp_path / "state"
    units = 1 if layout == "inline" else 2
    with wf_process(state, wf) as proc:
        wait_for_journal(
            proc, state, "SELECT COUNT(*) >= ? FROM attempts WHERE status = 'running'", (units,)
        )
        proc.send_signal(signum)
        time.sleep(1.0)  # the first asks for a graceful stop, which the unit never allows
        assert proc.poll() is None
        proc.send_signal(signum)
        started = time.monotonic()
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - started < 15
    assert proc.returncode == 130, err.decode()
    assert "stopping after the units in flight" in err.decode()
    assert "interrupted: the run stays active; `wf resume` continues it" in err.decode()
    run_id = only_run_id(state)
    assert _rows(state, "SELECT status FROM runs") == [("active",)]
    owed = _rows(state, "SELECT unit_id, attempt, status, dispatch_id FROM attempts")
    assert [(u, n, s) for u, n, s, _ in owed] == [(u, 1, "running") for u, *_ in owed]
    assert len(owed) == units

    (tmp_path / "release").touch()
    resumed = run_wf(state, "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert _rows(state, "SELECT status FROM runs") == [("completed",)]
    assert _rows(state, "SELECT unit_id, attempt, status, dispatch_id FROM attempts") == [
        (u, 1, "succeeded", d) for u, _, _, d in owed
    ]  # reclaimed in place: same attempt, same dispatch_id


def test_the_watch_counts_a_delivered_signal_and_puts_the_handler_back() -> None:
    """In-process: a delivered SIGINT is counted before the original handler raises."""
    from wf_magic.drive import interrupts

    def raising(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, raising)
    try:
        seen = interrupts.delivered()
        with interrupts.watching():
            assert signal.getsignal(signal.SIGINT) is not raising
            own = KeyboardInterrupt()
            assert not interrupts.is_real_interrupt(own, seen)  # raised, not delivered
            with pytest.raises(KeyboardInterrupt) as caught:
                signal.raise_signal(signal.SIGINT)
            assert interrupts.is_real_interrupt(caught.value, seen)
        assert signal.getsignal(signal.SIGINT) is raising
    finally:
        signal.signal(signal.SIGINT, previous)
