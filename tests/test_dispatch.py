"""Dispatch (wf_magic.drive.dispatch): each unit is reserved, run and finished exactly once.

The journal decides what is dispatched: a unit interrupted mid-run is reclaimed in place (same
attempt, same dispatch_id), units in flight share the token allowance, and whatever a runner
returns or raises ends as a finished attempt — never one left running.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from tests.helpers_flow import use_runner
from wf_magic import (
    DefinitionError,
    Engine,
    UnitRequest,
    UnitResult,
    register_function,
    register_runner,
)
from wf_magic.drive import interrupts

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL


def test_a_unit_interrupted_mid_run_is_reclaimed_in_place_with_its_dispatch_id(
    engine: Engine,
) -> None:
    interrupt = {"now": True}

    def reply(request: UnitRequest) -> object:
        if interrupt["now"]:
            interrupts.note_delivery()  # what a Ctrl-C's handler does, before it raises
            raise KeyboardInterrupt  # the driver is interrupted while the unit runs
        return "done"

    rec = use_runner("interruptible", reply)
    with pytest.raises(KeyboardInterrupt):
        engine.run("name: r\nrunner: interruptible\nsteps:\n  - id: a\n    prompt: x\n")
    [row] = engine.list_runs()
    [running] = engine.attempts(row.run_id)
    assert (running.unit_id, running.attempt, running.status) == ("a", 1, "running")

    interrupt["now"] = False
    done = engine.drive(row.run_id)

    assert (done.status, done.result) == ("completed", "done")
    assert [
        (a.unit_id, a.attempt, a.status, a.dispatch_id) for a in engine.attempts(row.run_id)
    ] == [("a", 1, "succeeded", running.dispatch_id)]
    assert [r.dispatch_id for r in rec.requests] == [running.dispatch_id] * 2


def test_the_runner_is_given_each_attempts_own_dispatch_id(engine: Engine) -> None:
    rec = use_runner("echo-dispatch", lambda request: request.dispatch_id)
    run = engine.run(
        "name: d\nrunner: echo-dispatch\nsteps:\n  - id: m\n    map: '{{ [1, 2, 3] }}'\n"
        "    prompt: 'n {{ item }}'\n"
    )
    journal = [a.dispatch_id for a in engine.attempts(run.run_id)]
    assert run.result == journal
    assert sorted(r.dispatch_id for r in rec.requests) == sorted(journal)
    assert len(set(journal)) == 3


def test_equal_inputs_in_one_run_are_both_dispatched(engine: Engine) -> None:
    run = engine.run("name: n\nsteps:\n  - id: a\n    map: '{{ [1, 1] }}'\n    prompt: same\n")
    assert [a.status for a in engine.attempts(run.run_id)] == ["succeeded", "succeeded"]


def test_concurrent_units_share_the_token_allowance_and_never_overshoot(engine: Engine) -> None:
    offers: list[int | None] = []
    lock = threading.Lock()

    class Greedy:
        """Spends exactly what it is offered, like a model writing up to max_tokens."""

        def run(self, request):  # type: ignore[no-untyped-def]
            with lock:
                offers.append(request.max_tokens)
            time.sleep(0.02)
            return UnitResult(output="x", tokens_in=0, tokens_out=request.max_tokens or 0)

        def close(self) -> None:
            return None

    register_runner("greedy-test", lambda ctx: Greedy(), replace=True)
    src = (
        "name: g\nrunner: greedy-test\nbudget: {max_tokens: 100}\nexecution: "
        "{max_concurrency: 4}\nsteps:\n  - id: a\n    map: '{{ range(12) | list }}'\n"
        "    prompt: 'unit {{ item }}'\n"
    )
    run = engine.run(src)
    assert run.status == "failed" and "max_tokens" in (run.reason or "")
    spent = sum(a.tokens_out for a in engine.attempts(run))
    assert spent <= 100
    assert all(o is not None and o >= 1 for o in offers)
    assert offers[:4] == [25, 25, 25, 25]  # four slots share the 100 tokens


def test_a_runner_that_cannot_be_built_never_leaves_a_running_attempt(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    source = """
name: badrules
runners:
  scripted:
    rules:
      - {match: '(', reply: x}
steps:
  - id: a
    prompt: hi
"""
    try:
        run = engine.run(source)
    except DefinitionError:  # rejected at freeze time: nothing may be written
        assert engine.list_runs() == []
        return
    assert run.status == "failed"
    assert "invalid regex" in (run.reason or "")
    assert [a.status for a in engine.attempts(run.run_id)] == ["failed"]


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_python_step_returning_nan_is_a_unit_failure(engine: Engine) -> None:
    register_function("returns_nan", lambda **kw: math.nan)
    src = "name: pynan\nsteps:\n  - id: a\n    python: returns_nan\n"
    try:
        run = engine.run(src)
    except ValueError as exc:
        pytest.fail(f"raw ValueError escaped the engine: {exc}")
    assert run.status == "failed"
    assert "a" in (run.reason or "")


def test_an_output_over_the_bound_fails_the_unit_naming_its_size(engine: Engine) -> None:
    register_function("ten_megabytes", lambda: "x" * 10_000_001)
    run = engine.run("name: big\nsteps:\n  - id: a\n    python: ten_megabytes\n")
    assert run.status == "failed"
    assert [(a.status, a.failure) for a in engine.attempts(run.run_id)] == [
        ("failed", "output is 10000003 bytes, over the bound of 10000000 bytes")
    ]


def test_a_runner_raising_an_unexpected_exception_fails_at_once_without_retry(
    engine: Engine,
) -> None:
    def reply(request: UnitRequest) -> object:
        raise ValueError("no")

    use_runner("raising", reply)
    run = engine.run(
        "name: vb\nrunner: raising\nsteps:\n  - id: a\n    prompt: x\n"
        "    retry: {max_attempts: 3}\n"
    )
    assert (run.status, run.reason) == (
        "failed",
        "step a: unit a failed: runner raised ValueError: no",
    )
    assert [(a.status, a.failure, a.transient) for a in engine.attempts(run.run_id)] == [
        ("failed", "runner raised ValueError: no", 0)
    ]
