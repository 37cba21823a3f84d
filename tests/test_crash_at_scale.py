"""kill -9 at 128 model calls in flight, then resume: nothing lost, nothing charged twice, and
every reclaimed unit goes out again under the dispatch id it had (issue 32, "Tests must show").

A real ``wf run`` (a map of 128 in flight) or ``wf sweep`` (128 cells in flight) drives the
``openai`` runner against the loopback chat server of tests/openai_server.py. The server
answers the first calls at once and then holds every reply, so the driver fills its 128 slots
with calls that never come back; once the server has 128 requests in flight the driver's
whole process group gets SIGKILL. The resume runs against a server that answers at once.

What is checked, from the server's side and the journal's (either backend):

- every unit ends with exactly one attempt row, ``succeeded``, attempt 1;
- the budget counted each unit once: charged attempts, the budget's units and tokens (the
  run's ``budget()``, the sweep's ``totals()``) equal what the server delivered for the
  journaled replies, each unit's tokens once;
- every request of a unit carried one ``Idempotency-Key``, the unit's journaled dispatch id,
  and the units re-sent by the resume are exactly those the kill left ``running``; every
  call held at the kill is among them, and no reply delivered before the kill is re-sent.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT, db_rows, wf_cmd
from tests.openai_server import (
    FakeChatServer,
    RecordedRequest,
    ScriptedResponse,
    completion_body,
    isolate_openai_env,
)
from wf_magic import Engine

pytestmark = pytest.mark.backends

KEY_ENV = "WF_TEST_SCALE_KEY"
IN_FLIGHT = 128
UNITS = 256
QUICK = 64
"""Calls answered at once before the server starts holding replies."""


def tokens_of(item: int) -> tuple[int, int]:
    """The usage the server reports for item ``item``: distinct enough that a unit charged
    twice, or one missed, changes every total."""
    return 3 + item % 7, 1 + item % 5


def expected_tokens() -> int:
    return sum(sum(tokens_of(i)) for i in range(UNITS))


@dataclass
class Holding:
    """The server's responder: the first ``QUICK`` requests are answered at once, later ones
    wait until :attr:`release` is set; counts the requests held in flight."""

    release: threading.Event = field(default_factory=threading.Event)
    seen: int = 0
    held: int = 0
    peak: int = 0
    held_keys: set[str] = field(default_factory=set)
    quick_keys: set[str] = field(default_factory=set)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, request: RecordedRequest) -> ScriptedResponse:
        with self.cond:
            self.seen += 1
            hold = self.seen > QUICK and not self.release.is_set()
            key = request.headers["idempotency-key"]
            # Which calls were held is decided here, under this lock: the server's request
            # list is appended under its own lock first, so its order can differ.
            if hold:
                self.held_keys.add(key)
            elif not self.release.is_set():  # answered before the kill, not by the resume
                self.quick_keys.add(key)
            if hold:
                self.held += 1
                self.peak = max(self.peak, self.held)
                self.cond.notify_all()
        if hold:
            self.release.wait(120)
            with self.cond:
                self.held -= 1
        item = item_of(request)
        tokens_in, tokens_out = tokens_of(item)
        return ScriptedResponse(
            200,
            completion_body(
                f"done {item}",
                model=str(request.body.get("model")),
                prompt_tokens=tokens_in,
                completion_tokens=tokens_out,
            ),
        )

    def wait_held(self, count: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self.held < count:
                if proc.poll() is not None:
                    _, err = proc.communicate()
                    raise AssertionError(f"the driver exited ({proc.returncode}): {err.decode()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"only {self.held} of {count} calls reached the server")
                self.cond.wait(0.05)


def item_of(request: RecordedRequest) -> int:
    found = re.search(r"item (\d+)", request.prompt)
    assert found is not None, request.prompt
    return int(found.group(1))


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_openai_env(monkeypatch, KEY_ENV, "sk-scale-test")


@pytest.fixture
def server() -> Iterator[tuple[FakeChatServer, Holding]]:
    holding = Holding()
    with FakeChatServer() as running:
        running.default = holding
        running.streams = False
        try:
            yield running, holding
        finally:
            holding.release.set()


def runner_head(url: str) -> str:
    return (
        "runner: openai\n"
        "runners:\n"
        f"  openai: {{base_url: '{url}', api_key_env: {KEY_ENV}, model: m1, timeout_s: 120}}\n"
    )


def spawn(state: Path, *args: str) -> subprocess.Popen[bytes]:
    """``wf ARGS`` in a process group of its own (so SIGKILL reaches every thread of it)."""
    return subprocess.Popen(
        wf_cmd(state, *args, "--quiet") if args[0] == "sweep" else wf_cmd(state, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
        start_new_session=True,
    )


def kill_at_full_flight(proc: subprocess.Popen[bytes], holding: Holding) -> None:
    """Wait until the server holds 128 calls, then SIGKILL the driver's process group."""
    try:
        holding.wait_held(IN_FLIGHT, proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert holding.peak == IN_FLIGHT  # the driver's slots, all held, never more


def finish(args: list[str], state: Path) -> None:
    proc = spawn(state, *args)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out.decode(), err.decode())


@dataclass(frozen=True)
class Journal:
    """(run, unit) → (attempt, status, dispatch id, tokens in, tokens out) of each attempt."""

    rows: dict[tuple[str, str], list[tuple[int, str, str, int | None, int | None]]]

    @classmethod
    def read(cls, state: Path) -> Journal:
        rows: dict[tuple[str, str], list[tuple[int, str, str, int | None, int | None]]]
        rows = defaultdict(list)
        for run_id, unit_id, attempt, status, dispatch_id, t_in, t_out, charged in db_rows(
            state,
            "SELECT run_id, unit_id, attempt, status, dispatch_id, tokens_in, tokens_out,"
            " charged FROM attempts WHERE phase = 'work' ORDER BY attempt_pk",
        ):
            assert charged in (1, True), (run_id, unit_id)
            rows[(str(run_id), str(unit_id))].append(
                (int(attempt), str(status), str(dispatch_id), t_in, t_out)  # type: ignore[arg-type]
            )
        return cls(dict(rows))

    def with_status(self, status: str) -> set[str]:
        return {rows[-1][2] for rows in self.rows.values() if rows[-1][1] == status}


def check_recovery(
    server: FakeChatServer,
    holding: Holding,
    before: Journal,
    after: Journal,
    before_kill: list[RecordedRequest],
) -> dict[str, int]:
    """The assertions both shapes share; returns what was measured."""
    # Nothing lost: one attempt per unit, succeeded, never a second attempt.
    assert len(after.rows) == UNITS
    for key, rows in after.rows.items():
        assert [(a, s) for a, s, *_ in rows] == [(1, "succeeded")], (key, rows)
    dispatch_of = {rows[0][2]: key for key, rows in after.rows.items()}
    assert len(dispatch_of) == UNITS  # distinct dispatch ids

    # The requests: each carries its unit's journaled dispatch id.
    keys_by_item: dict[int, set[str]] = defaultdict(set)
    sent = Counter()
    for request in server.requests:
        key = request.headers["idempotency-key"]
        assert request.headers["x-request-id"] == key
        assert key in dispatch_of, key
        keys_by_item[item_of(request)].add(key)
        sent[key] += 1
    assert len(keys_by_item) == UNITS
    assert all(len(keys) == 1 for keys in keys_by_item.values()), keys_by_item

    # Re-sent after the kill: exactly the attempts the kill left running, same ids.
    running_at_kill = before.with_status("running")
    before_kill_keys = {r.headers["idempotency-key"] for r in before_kill}
    held_at_kill = holding.held_keys & before_kill_keys
    delivered = holding.quick_keys & before_kill_keys
    assert len(held_at_kill) == IN_FLIGHT
    assert len(delivered) == QUICK
    assert held_at_kill <= running_at_kill  # reserved before sent: a held call is owed
    resent = {key for key, n in sent.items() if n > 1}
    assert resent == running_at_kill
    assert all(sent[key] == 2 for key in resent)
    assert delivered <= before.with_status("succeeded")  # durable before 128 were in flight
    assert not (delivered & resent)
    assert len(server.requests) == UNITS + len(resent)

    # Nothing charged twice: the journal's tokens are each unit's delivered usage, once.
    tokens = 0
    for (_, _), [(_, _, dispatch_id, t_in, t_out)] in after.rows.items():
        request = next(r for r in server.requests if r.headers["idempotency-key"] == dispatch_id)
        assert (t_in, t_out) == tokens_of(item_of(request))
        tokens += (t_in or 0) + (t_out or 0)
    assert tokens == expected_tokens()
    return {"resent": len(resent), "held": len(held_at_kill), "delivered": len(delivered)}


def test_kill9_with_128_map_units_in_flight_then_resume(
    state_dir: Path, tmp_path: Path, server: tuple[FakeChatServer, Holding]
) -> None:
    chat, holding = server
    wf_file = tmp_path / "map.yaml"
    wf_file.write_text(
        "name: scale-map\n"
        + runner_head(chat.url)
        + f"budget: {{max_units: 100000, max_tokens: 100000000}}\n"
        f"execution: {{max_concurrency: {IN_FLIGHT}}}\n"
        "steps:\n"
        "  - id: each\n"
        f'    map: "{{{{ range({UNITS}) | list }}}}"\n'
        '    prompt: "item {{ item }}"\n'
    )
    kill_at_full_flight(spawn(state_dir, "run", str(wf_file)), holding)
    before_kill = list(chat.requests)
    before = Journal.read(state_dir)
    holding.release.set()  # the held handlers answer a dead client
    [(run_id,)] = db_rows(state_dir, "SELECT run_id FROM runs")
    assert db_rows(state_dir, "SELECT status FROM runs") == [("active",)]

    finish(["resume", str(run_id)], state_dir)
    after = Journal.read(state_dir)
    measured = check_recovery(chat, holding, before, after, before_kill)
    assert measured["resent"] == IN_FLIGHT  # only the held calls went out twice
    with Engine(state_dir) as engine:
        assert engine.get_run(str(run_id)).status == "completed"
        budget = engine.budget(str(run_id)).set_index("ceiling")["used"].to_dict()
    assert budget["units"] == UNITS
    assert budget["tokens"] == expected_tokens()


def test_kill9_with_128_sweep_cells_in_flight_then_resume(
    state_dir: Path, tmp_path: Path, server: tuple[FakeChatServer, Holding]
) -> None:
    chat, holding = server
    wf_file = tmp_path / "cell.yaml"
    wf_file.write_text(
        "name: scale-sweep\n"
        "params:\n"
        "  i: {type: integer}\n" + runner_head(chat.url) + "steps:\n"
        "  - id: answer\n"
        '    prompt: "item {{ params.i }}"\n'
    )
    rows = tmp_path / "rows.csv"
    rows.write_text("i\n" + "".join(f"{i}\n" for i in range(UNITS)))
    budget = ["--max-units", "100000", "--max-tokens", "100000000"]
    concurrency = ["--max-concurrency", str(IN_FLIGHT)]
    proc = spawn(state_dir, "sweep", str(wf_file), "--rows", str(rows), *concurrency, *budget)
    kill_at_full_flight(proc, holding)
    before_kill = list(chat.requests)
    before = Journal.read(state_dir)
    holding.release.set()
    [(sweep_id,)] = db_rows(state_dir, "SELECT sweep_id FROM sweeps")

    finish(["sweep-resume", str(sweep_id), *concurrency], state_dir)
    after = Journal.read(state_dir)
    check_recovery(chat, holding, before, after, before_kill)
    assert len({run_id for run_id, _ in after.rows}) == UNITS  # one run per cell
    with Engine(state_dir) as engine:
        sweep = engine.sweep_handle(str(sweep_id))
        assert sweep.status == "completed", sweep.status_reason
        assert sweep.totals() == {"units": UNITS, "tokens": expected_tokens(), "cost": 0.0}
        frame = sweep.frame()
    assert frame["status"].tolist() == ["completed"] * UNITS
    assert frame["result"].tolist() == [f"done {i}" for i in range(UNITS)]
    assert int(frame["tokens_paid"].sum()) == expected_tokens()
    charges = db_rows(state_dir, "SELECT dispatch_id FROM sweep_charges")
    assert sorted(str(d) for (d,) in charges) == sorted(
        rows[0][2] for rows in after.rows.values()
    )  # each unit's one dispatch, charged to the sweep once
