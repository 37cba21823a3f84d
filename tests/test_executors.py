"""Executors (DESIGN.md §8): units run on any concurrent.futures.Executor; the driver journals."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from wf_magic import Engine, UnitRequest, UnitResult, register_runner
from wf_magic.drive.executors import dask_executor, thread_executor
from wf_magic.errors import UsageError
from wf_magic.runners.base import BaseRunner, RunnerContext
from wf_magic.runners.registry import runner_factory

BARRIER_MAP = """
name: together
execution: {max_concurrency: 4}
steps:
  - id: meet
    map: "{{ [0, 1, 2, 3] }}"
    python: meet
"""
SCRIPTED_MAP = """
name: dask-map
execution: {max_concurrency: 4}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "^Shout (\\\\w+)", reply: "{{ groups[1] | upper }}", tokens_in: 3, tokens_out: 1}
steps:
  - id: shout
    map: "{{ ['a', 'b', 'c', 'd', 'e', 'f'] }}"
    prompt: "Shout {{ item }}"
"""


def test_an_injected_thread_pool_runs_a_map_concurrently_and_journals_each_unit_once(
    state_dir: Path,
) -> None:
    # Four units that each wait for the other three: they finish only if all run at once.
    barrier = threading.Barrier(4, timeout=5)
    threads: list[str] = []

    def meet(item: int) -> int:
        threads.append(threading.current_thread().name)
        barrier.wait()
        return item * 10

    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="injected") as pool:
        with Engine(state_dir, namespace={"meet": meet}, executor=pool) as engine:
            run = engine.run(BARRIER_MAP)
            assert run.status == "completed", run.reason
            assert run.result == [0, 10, 20, 30]
            attempts = engine.attempts(run.run_id)
        assert pool.submit(lambda: "still open").result() == "still open"  # the caller's pool
    assert sorted(a.unit_id for a in attempts) == ["meet[0]", "meet[1]", "meet[2]", "meet[3]"]
    assert {(a.status, a.attempt) for a in attempts} == {("succeeded", 1)}
    assert len(threads) == 4 and all(name.startswith("injected") for name in threads)


def test_thread_executor_is_a_named_pool_usable_per_drive(state_dir: Path) -> None:
    barrier = threading.Barrier(4, timeout=5)

    def meet(item: int) -> str:
        barrier.wait()
        return threading.current_thread().name

    with thread_executor(4) as pool, Engine(state_dir, namespace={"meet": meet}) as engine:
        _started = engine.start(BARRIER_MAP)
        run_id = _started.run_id
        run = engine.drive(run_id, executor=pool)
        assert run.status == "completed", run.reason
        assert all(name.startswith("wf-unit") for name in run.result)
        assert Counter(a.unit_id for a in engine.attempts(run_id)) == {
            f"meet[{i}]": 1 for i in range(4)
        }


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_thread_executor_refuses_a_pool_without_threads(bad: object) -> None:
    with pytest.raises(UsageError, match=r"expects max_workers >= 1 \(got "):
        thread_executor(bad)  # type: ignore[arg-type]


def test_dask_executor_without_dask_installed_is_a_clear_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed → ImportError
    with pytest.raises(UsageError, match=r"pip install 'wf_magic\[dask\]'"):
        dask_executor("tcp://127.0.0.1:8786")


def test_dask_executor_refuses_what_is_neither_a_client_nor_an_address() -> None:
    pytest.importorskip("distributed", reason="dask is the optional extra wf_magic[dask]")
    with pytest.raises(UsageError, match="expects a distributed.Client or a scheduler address"):
        dask_executor(42)  # type: ignore[arg-type]


def test_a_dask_client_executor_runs_a_map_on_the_scripted_runner(state_dir: Path) -> None:
    pytest.importorskip(
        "distributed", reason="dask is the optional extra wf_magic[dask]; not installed here"
    )
    from distributed import Client, LocalCluster, get_task_stream

    with (
        LocalCluster(
            processes=False, n_workers=1, threads_per_worker=4, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        executor = dask_executor(client)
        try:
            with Engine(state_dir, executor=executor) as engine, get_task_stream(client) as ts:
                run = engine.run(SCRIPTED_MAP)
                assert run.status == "completed", run.reason
                assert run.result == ["A", "B", "C", "D", "E", "F"]
                journal = engine.journal(run.run_id)
        finally:
            executor.shutdown()
    assert len(ts.data) == 6  # every unit ran as a task on the Dask worker
    assert sorted(journal["unit"]) == [f"shout[{i}]" for i in range(6)]
    assert journal["status"].tolist() == ["succeeded"] * 6
    assert journal["attempt"].tolist() == [1] * 6
    assert journal["dispatch_id"].is_unique
    assert int((journal["tokens_in"] + journal["tokens_out"]).sum()) == 24


def test_a_dask_executor_opened_on_an_address_closes_its_client_on_shutdown(
    state_dir: Path,
) -> None:
    distributed = pytest.importorskip(
        "distributed", reason="dask is the optional extra wf_magic[dask]; not installed here"
    )

    with distributed.LocalCluster(
        processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None
    ) as cluster:
        with dask_executor(cluster.scheduler_address) as executor:
            with Engine(state_dir, executor=executor) as engine:
                run = engine.run(SCRIPTED_MAP)
                assert run.status == "completed", run.reason
            assert len(connected_clients(cluster)) == 1
        deadline = time.monotonic() + 5
        while connected_clients(cluster) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert connected_clients(cluster) == []


def connected_clients(cluster: Any) -> list[str]:
    return [c for c in cluster.scheduler.clients if c != "fire-and-forget"]


def test_a_runner_that_does_not_pickle_fails_its_attempts_on_dask_instead_of_crashing(
    state_dir: Path,
) -> None:
    distributed = pytest.importorskip(
        "distributed", reason="dask is the optional extra wf_magic[dask]; not installed here"
    )

    class Pinned(BaseRunner):
        def __init__(self) -> None:
            self._lock = threading.Lock()  # a lock does not pickle

        def run(self, request: UnitRequest) -> UnitResult:
            return UnitResult(output="never sent")

    register_runner("executors_pinned", lambda ctx: Pinned(), replace=True)
    with (
        distributed.LocalCluster(
            processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
        dask_executor(client) as executor,
        Engine(state_dir, executor=executor) as engine,
    ):
        run = engine.run("""
name: pinned
runner: executors_pinned
steps:
  - id: say
    prompt: "Say hi"
""")
        attempts = engine.attempts(run.run_id)
    assert run.status == "failed"
    assert [(a.unit_id, a.status) for a in attempts] == [("say", "failed")]
    assert attempts[0].failure == (
        "Pinned cannot be sent to the Dask workers: it does not pickle (cannot pickle "
        "'_thread.lock' object). Run this step without the Dask executor, or make the runner "
        "picklable (create clients and locks on first use and leave them out of its pickled "
        "state)."
    )


@pytest.mark.parametrize(
    "name",
    [
        "scripted",
        "exec",
        "python",
        *(
            pytest.param(
                name,
            )
            for name in ("openai", "replay", "pydantic-ai", "llm")
        ),
    ],
)
def test_built_in_runners_pickle_so_dask_workers_can_run_them(tmp_path: Path, name: str) -> None:
    cloudpickle = pytest.importorskip(
        "cloudpickle", reason="cloudpickle comes with the optional extra wf_magic[dask]"
    )
    factory = runner_factory(name)
    assert factory is not None
    options = {"model": "m", "base_url": "http://127.0.0.1:9/v1"} if name == "openai" else {}
    runner = factory(
        RunnerContext(
            name=name,
            options=options,
            state_dir=str(tmp_path),
            workflow="w",
            namespace={"double": lambda x: 2 * x},
        )
    )
    try:
        assert type(cloudpickle.loads(cloudpickle.dumps(runner.run)).__self__) is type(runner)
    finally:
        runner.close()
