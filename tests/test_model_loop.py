"""The model loop (issue 32 item 3): prompt and judge units of a runner with ``async def arun``
run as coroutines on one event loop, not one worker thread each; the journal is the same.

Which path a unit takes is decided by ``drive.modelloop.has_arun``; forcing it to say no
drives the same plan through ``run`` on worker threads, so the two journals can be compared
row by row. A runner that only has ``run`` (a third party's, or a subclass that overrides
``run`` alone) keeps the thread path.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from wf_magic import Engine, UnitRequest, UnitResult
from wf_magic.drive import modelloop
from wf_magic.drive.modelloop import MODEL_LOOP, has_arun
from wf_magic.runners.registry import register_runner
from wf_magic.runners.scripted import ScriptedRunner

EVAL = """
name: evalish
execution: {max_concurrency: 16}
budget: {max_tokens: 100000}
runners:
  scripted:
    rules:
      - {match: '^judge', reply: {complete: true, feedback: "", missing: []}}
      - {match: 'row 3$', error: permanent}
      - {match: '^row', reply: "answer {{ item }}", sleep_s: 0.01, tokens_in: 7, tokens_out: 3}
steps:
  - id: rows
    map: "{{ range(12) | list }}"
    prompt: "row {{ item }}"
    on_error: continue
  - id: summary
    prompt: "summary of {{ steps.rows.output | length }} rows"
    gate: {criteria: ["is a summary"], max_loops: 2}
"""


def _journal(engine: Engine, run_id: str) -> list[tuple[Any, ...]]:
    """Every attempt's identity and outcome (no clock, no dispatch id), in unit order."""
    rows = [
        (
            a.step_id,
            a.unit_id,
            a.phase,
            a.loop,
            a.attempt,
            a.runner,
            a.model,
            a.status,
            a.input_hash,
            a.charged,
            a.tokens_in,
            a.tokens_out,
            a.cost,
            a.output_json,
            a.failure,
            a.transient,
        )
        for a in engine.attempts(run_id)
    ]
    return sorted(rows, key=lambda row: tuple(str(v) for v in row))


@pytest.mark.backends  # the loop's journal on SQLite and PostgreSQL, the threads' on SQLite
def test_the_model_loop_and_worker_threads_write_the_same_journal(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_loop = engine
    loop_run = on_loop.run(EVAL, new=True)

    monkeypatch.setattr("wf_magic.drive.dispatch.has_arun", lambda runner: False)
    on_threads = Engine(tmp_path / "threads")
    thread_run = on_threads.run(EVAL, new=True)

    assert loop_run.status == thread_run.status == "completed"
    journal = _journal(on_loop, loop_run.run_id)
    assert journal == _journal(on_threads, thread_run.run_id)
    assert len(journal) == 14  # 12 rows, the summary, its judge
    assert [row[7] for row in journal if row[1] == "rows[3]"] == ["failed"]
    assert on_loop.status(loop_run.run_id).result == on_threads.status(thread_run.run_id).result


class _ThreadCounter:
    """The most threads alive at once while it samples (every millisecond)."""

    def __init__(self) -> None:
        self.most = threading.active_count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.most = max(self.most, threading.active_count())

    def __enter__(self) -> _ThreadCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


WIDE = """
name: wide
execution: {max_concurrency: 128}
runners:
  scripted:
    rules:
      - {match: '^item', reply: "out {{ item }}", sleep_s: 0.3}
steps:
  - id: m
    map: "{{ range(128) | list }}"
    prompt: "item {{ item }}"
"""


@pytest.mark.parametrize("path", ["loop", "threads"])
def test_128_calls_in_flight_hold_one_loop_thread_not_128_workers(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(tmp_path / "state")
    engine.run(WIDE.replace("range(128)", "range(2)"), new=True)  # the loop and registry warm
    if path == "threads":
        monkeypatch.setattr("wf_magic.drive.dispatch.has_arun", lambda runner: False)
    before = threading.active_count()
    with _ThreadCounter() as counter:
        run = engine.run(WIDE, new=True)
    assert run.status == "completed"
    assert engine.status(run.run_id).result == [f"out {i}" for i in range(128)]
    extra = counter.most - before
    if path == "loop":
        assert extra <= 4, extra  # the counter, a drive helper or two; no worker per call
    else:
        assert extra >= 64, extra  # the same plan through run(): a thread per call in flight


class _OwnRun(ScriptedRunner):
    """Overrides ``run`` alone: the inherited ``arun`` would skip what it adds."""

    def run(self, request: UnitRequest) -> UnitResult:
        result = super().run(request)
        return UnitResult(output=f"[{threading.current_thread().name}] {result.output}")


SLEEPY = [{"match": "x", "reply": "y", "sleep_s": 0.1}]
"""A rule with a latency: a scripted runner with one waits on the model loop."""


class _Both(ScriptedRunner):
    def run(self, request: UnitRequest) -> UnitResult:
        return super().run(request)

    async def arun(self, request: UnitRequest) -> UnitResult:
        return await super().arun(request)


class _SyncOnly:
    def run(self, request: UnitRequest) -> UnitResult:
        return UnitResult(output="sync")


class _NotACoroutine(_SyncOnly):
    def arun(self, request: UnitRequest) -> UnitResult:  # a plain def named arun
        return UnitResult(output="no")


def test_has_arun_takes_the_coroutine_only_where_it_is_runs_twin() -> None:
    assert has_arun(ScriptedRunner(SLEEPY))
    assert has_arun(_Both(SLEEPY))
    assert not has_arun(ScriptedRunner())  # replies that take no time: nothing to wait for
    assert not has_arun(_OwnRun(SLEEPY))
    assert not has_arun(_SyncOnly())
    assert not has_arun(_NotACoroutine())
    patched = ScriptedRunner(SLEEPY)
    patched.run = lambda request: UnitResult(output="patched")  # type: ignore[method-assign]
    assert not has_arun(patched)
    assert not has_arun(ScriptedRunner(SLEEPY, fn=lambda request: "a reply function's runner"))


@pytest.fixture
def own_run_runner() -> Iterator[str]:
    register_runner("own-run", lambda ctx: _OwnRun(), replace=True)
    yield "own-run"


def test_a_runner_that_overrides_run_alone_is_driven_through_it(
    tmp_path: Path, own_run_runner: str
) -> None:
    source = f"""
name: own
steps:
  - id: a
    runner: {own_run_runner}
    prompt: "hello"
"""
    engine = Engine(tmp_path / "state")
    run = engine.run(source, new=True)
    assert run.status == "completed"
    output = engine.status(run.run_id).result
    assert isinstance(output, str) and output.startswith("[") and "wf-model" not in output


def test_cancelling_a_call_on_the_model_loop_cancels_its_coroutine() -> None:
    cancelled = threading.Event()
    started = threading.Event()

    async def call() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    future = MODEL_LOOP.submit(call())
    assert started.wait(5)
    assert future.cancel() or future.done()
    assert cancelled.wait(5)


def test_the_model_loop_is_one_thread_named_for_it() -> None:
    async def name() -> str:
        return threading.current_thread().name

    first = modelloop.MODEL_LOOP.submit(name()).result(5)
    second = modelloop.MODEL_LOOP.submit(name()).result(5)
    assert first == second
    assert first.startswith("wf-model")


async def _fetch_twice(text: str) -> dict[str, str]:
    await asyncio.sleep(0.01)
    return {"upper": text.upper(), "loop": type(asyncio.get_running_loop()).__name__}


async def _async_boom(text: str) -> str:
    await asyncio.sleep(0)
    raise ValueError(f"no {text}")


def test_an_async_def_python_target_is_awaited_and_its_error_is_the_steps(tmp_path: Path) -> None:
    from wf_magic import register_function

    register_function("fetch_twice", _fetch_twice)
    register_function("async_boom", _async_boom)
    engine = Engine(tmp_path / "state")
    ok = engine.run(
        "name: a\nsteps:\n  - id: f\n    python: fetch_twice\n    with: {text: hi}\n", new=True
    )
    assert ok.status == "completed"
    assert engine.status(ok.run_id).result == {"upper": "HI", "loop": "_UnixSelectorEventLoop"}
    bad = engine.run(
        "name: b\nsteps:\n  - id: f\n    python: async_boom\n    with: {text: way}\n", new=True
    )
    assert bad.status == "failed"
    (attempt,) = engine.attempts(bad.run_id)
    assert attempt.failure is not None
    assert attempt.failure.startswith("async_boom raised ValueError: no way"), attempt.failure


def test_an_async_def_python_target_is_awaited_from_a_thread_that_runs_a_loop(
    tmp_path: Path,
) -> None:
    """A notebook kernel's thread runs an event loop: the target's coroutine gets its own."""
    from wf_magic import register_function

    register_function("fetch_twice", _fetch_twice)
    engine = Engine(tmp_path / "state")

    async def in_a_loop() -> Any:
        return engine.run(
            "name: c\nsteps:\n  - id: f\n    python: fetch_twice\n    with: {text: yo}\n",
            new=True,
        )  # a lone unit runs inline: in this thread, under this loop

    run = asyncio.run(in_a_loop())
    assert run.status == "completed"
    assert engine.status(run.run_id).result["upper"] == "YO"


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, ValueError])
def test_whatever_a_call_raises_reaches_its_future_and_the_loop_lives_on(
    raised: type[BaseException],
) -> None:
    async def call() -> str:
        await asyncio.sleep(0)
        raise raised("from the call")

    with pytest.raises(raised, match="from the call"):
        MODEL_LOOP.submit(call()).result(5)

    async def after() -> str:
        return "still here"

    assert MODEL_LOOP.submit(after()).result(5) == "still here"


def test_shared_clients_are_one_per_settings_and_loop_and_the_oldest_is_closed_later() -> None:
    from wf_magic.runners.asyncpath import SharedClients

    closed: list[str] = []

    async def close(client: str) -> None:
        closed.append(client)

    shared: SharedClients[str] = SharedClients(close, most=2, grace_s=0.0)
    made = iter(f"client-{i}" for i in range(10))

    async def clients() -> list[str]:
        loop = asyncio.get_running_loop()
        got = [
            shared.get(loop, "a", lambda: next(made)),
            shared.get(loop, "a", lambda: next(made)),  # the same settings: the same client
            shared.get(loop, "b", lambda: next(made)),
            shared.get(loop, "c", lambda: next(made)),  # a third: the oldest goes
        ]
        for _ in range(5):
            await asyncio.sleep(0)
        return got

    assert MODEL_LOOP.submit(clients()).result(5) == [
        "client-0",
        "client-0",
        "client-1",
        "client-2",
    ]
    assert closed == ["client-0"]
