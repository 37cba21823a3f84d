"""Retries and timeouts (DESIGN.md §2, §9, issue 4): transient errors retry, permanent fail."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers_flow import use_runner
from wf_magic import Engine, RunnerError, UnitRequest

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL


def _flaky(failures: int, *, transient: bool = True):  # noqa: ANN202
    def body(request: UnitRequest) -> object:
        if request.prompt == "work" and request.attempt <= failures:
            raise RunnerError(f"hiccup on attempt {request.attempt}", transient=transient)
        return f"ok on attempt {request.attempt}"

    return body


RETRY = """
name: retrying
runner: flaky
steps:
  - id: s
    prompt: work
    retry: {max_attempts: 3, backoff_s: 0}
  - id: after
    prompt: after
"""


def rows(engine: Engine, run_id: str) -> list[tuple[str, int, str, str | None, int | None]]:
    return [
        (a.unit_id, a.attempt, a.status, a.failure, a.transient) for a in engine.attempts(run_id)
    ]


def test_transient_errors_retry_until_success_with_one_row_per_attempt(tmp_path: Path) -> None:
    rec = use_runner("flaky", _flaky(2))
    engine = Engine(tmp_path / "state")
    run = engine.run(RETRY)

    assert run.status == "completed"
    assert run.output("s") == "ok on attempt 3"
    assert rows(engine, run.run_id) == [
        ("s", 1, "failed", "hiccup on attempt 1", 1),
        ("s", 2, "failed", "hiccup on attempt 2", 1),
        ("s", 3, "succeeded", None, None),
        ("after", 1, "succeeded", None, None),
    ]
    dispatch_ids = [r.dispatch_id for r in rec.requests[:3]]
    assert len(set(dispatch_ids)) == 3  # every attempt has its own idempotency key
    assert run.budget_use().units == 4  # every attempt is charged


def test_retries_are_bounded_by_max_attempts(tmp_path: Path) -> None:
    use_runner("flaky", _flaky(5))
    engine = Engine(tmp_path / "state")
    run = engine.run(RETRY)

    assert run.status == "failed"
    assert run.reason == "step s: unit s failed: hiccup on attempt 3"
    assert [r[:3] for r in rows(engine, run.run_id)] == [
        ("s", 1, "failed"),
        ("s", 2, "failed"),
        ("s", 3, "failed"),
    ]


def test_a_permanent_error_fails_at_once_without_retry(tmp_path: Path) -> None:
    use_runner("flaky", _flaky(1, transient=False))
    engine = Engine(tmp_path / "state")
    run = engine.run(RETRY)

    assert run.status == "failed"
    assert rows(engine, run.run_id) == [("s", 1, "failed", "hiccup on attempt 1", 0)]


def test_backoff_waits_between_attempts(tmp_path: Path) -> None:
    use_runner("flaky", _flaky(2))
    engine = Engine(tmp_path / "state")
    started = time.monotonic()
    run = engine.run(RETRY.replace("backoff_s: 0", "backoff_s: 0.05"))
    elapsed = time.monotonic() - started

    assert run.status == "completed"
    attempts = [a for a in engine.attempts(run.run_id) if a.unit_id == "s"]
    gaps = [
        b.started_at - (a.finished_at or 0) for a, b in zip(attempts, attempts[1:], strict=False)
    ]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1  # doubles per further attempt
    assert elapsed >= 0.15


def test_scripted_transient_rule_retries_in_a_map(tmp_path: Path) -> None:
    seen: dict[object, int] = {}

    def body(request: UnitRequest) -> object:
        seen[request.item] = seen.get(request.item, 0) + 1
        if request.item == 1 and request.attempt == 1:
            raise RunnerError("first try of item 1 flakes", transient=True)
        return request.item

    use_runner("map_flaky", body)
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: map-retry
runner: map_flaky
execution: {max_concurrency: 2}
steps:
  - id: m
    map: "{{ [0, 1, 2] }}"
    prompt: "n {{ item }}"
    retry: {max_attempts: 2}
""")
    assert run.result == [0, 1, 2]
    assert seen == {0: 1, 1: 2, 2: 1}
    assert sorted((a.unit_id, a.attempt, a.status) for a in engine.attempts(run.run_id)) == [
        ("m[0]", 1, "succeeded"),
        ("m[1]", 1, "failed"),
        ("m[1]", 2, "succeeded"),
        ("m[2]", 1, "succeeded"),
    ]


def test_exec_timeout_kills_the_process_and_fails_the_attempt(tmp_path: Path) -> None:
    marker = tmp_path / "survived"
    engine = Engine(tmp_path / "state")
    started = time.monotonic()
    run = engine.run(f"""
name: slow-exec
steps:
  - id: slow
    exec: [python, -c, "import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).touch()"]
    timeout: 0.3
""")
    elapsed = time.monotonic() - started

    assert run.status == "failed"
    assert elapsed < 2.5
    [attempt] = engine.attempts(run.run_id)
    assert (attempt.status, attempt.failure) == (
        "failed",
        "timed out after 0.3s and was killed: python",
    )
    time.sleep(0.1)
    assert not marker.exists()


def test_exec_timeout_is_retried_when_retries_are_allowed(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: slow-exec-retry
steps:
  - id: slow
    exec: [python, -c, "import time; time.sleep(3)"]
    timeout: 0.2
    retry: {max_attempts: 2}
""")
    assert run.status == "failed"
    assert [(a.attempt, a.status) for a in engine.attempts(run.run_id)] == [
        (1, "failed"),
        (2, "failed"),
    ]


def test_resuming_a_failed_run_redispatches_only_the_failed_units(tmp_path: Path) -> None:
    broken = {"item": 1}

    def body(request: UnitRequest) -> object:
        if request.item == broken["item"]:
            raise RunnerError("item broke", transient=False)
        return request.item

    use_runner("fixable", body)
    engine = Engine(tmp_path / "state")
    run = engine.run("""
name: fixable
runner: fixable
steps:
  - id: m
    map: "{{ [0, 1, 2] }}"
    prompt: "n {{ item }}"
""")
    assert run.status == "failed"

    broken["item"] = -1
    again = engine.drive(run.run_id)

    assert again.status == "completed"
    assert again.result == [0, 1, 2]
    assert [(a.unit_id, a.attempt, a.status) for a in engine.attempts(run.run_id)] == [
        ("m[0]", 1, "succeeded"),
        ("m[1]", 1, "failed"),  # the failure halted the fan-out
        ("m[1]", 2, "succeeded"),
        ("m[2]", 1, "succeeded"),
    ]
