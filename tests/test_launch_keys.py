"""Idempotent launches (issue 15 item 1): one launch key, one run, one request.

The first start with a key creates (or settles on) a run and records the key in the same
transaction; a later start with the same key and the same request (plan hash + params hash)
returns that run with ``created=False``; the same key with another request is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_notebook import ipython_shell, magics_in
from wf_magic import Engine, UsageError
from wf_magic.hashing import canonical_json, hash_value, sha256_text

from .conftest import db_rows, wf_inproc, write_file

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

FLOW = """\
name: nightly
params:
  day: {type: string, default: mon}
steps:
  - id: report
    prompt: "report for {{ params.day }}"
"""


def _request_hash(engine: Engine, run_id: str) -> str:
    row = engine.get_run(run_id)
    return hash_value({"plan_hash": row.plan_hash, "params_hash": row.params_hash})


def test_first_start_with_a_key_creates_the_run_and_records_the_key(
    engine: Engine, state_dir: Path
) -> None:
    run = engine.start(FLOW, key="cron-2024-06-01")
    assert run.created is True
    row = engine.get_run(run.run_id)
    assert db_rows(state_dir, "SELECT key, run_id, plan_hash, params_hash FROM launch_keys") == [
        ("cron-2024-06-01", run.run_id, row.plan_hash, row.params_hash)
    ]


def test_the_same_key_and_request_returns_that_run_even_with_new(engine: Engine) -> None:
    first = engine.start(FLOW, key="k1")
    again = engine.start(FLOW, key="k1", new=True)  # a cron re-fire: no second run
    given = engine.start(FLOW, key="k1", params={"day": "mon"})  # equal after defaults
    assert (again.run_id, again.created) == (first.run_id, False)
    assert (given.run_id, given.created) == (first.run_id, False)
    assert len(engine.list_runs()) == 1


def test_a_key_binds_to_the_scopes_existing_run(engine: Engine) -> None:
    done = engine.run(FLOW)
    keyed = engine.start(FLOW, key="late")
    assert (keyed.run_id, keyed.created) == (done.run_id, False)
    assert engine.start(FLOW, key="late", new=True).run_id == done.run_id


def test_the_same_key_with_other_params_is_refused_naming_both_requests(
    engine: Engine,
) -> None:
    first = engine.start(FLOW, key="k2")
    theirs = _request_hash(engine, first.run_id)
    params_hash = sha256_text(canonical_json({"day": "tue"}))
    ours = hash_value(
        {"plan_hash": engine.get_run(first.run_id).plan_hash, "params_hash": params_hash}
    )
    with pytest.raises(UsageError) as caught:
        engine.start(FLOW, key="k2", params={"day": "tue"})
    message = str(caught.value)
    assert f"Launch key 'k2' already launched run {first.run_id}" in message
    assert f"request {theirs}" in message and f"request {ours}" in message
    assert len(engine.list_runs()) == 1


def test_the_same_key_with_a_changed_workflow_is_refused(engine: Engine) -> None:
    engine.start(FLOW, key="k3")
    with pytest.raises(UsageError, match="Launch key 'k3' already launched run"):
        engine.start(FLOW.replace("report for", "summary for"), key="k3")
    assert len(engine.list_runs()) == 1


def test_an_empty_key_is_a_usage_error(engine: Engine) -> None:
    with pytest.raises(UsageError, match=r"expected a non-empty launch key of at most 200"):
        engine.start(FLOW, key="")


def test_concurrent_starts_with_one_key_make_one_run(state_dir: Path) -> None:
    barrier = threading.Barrier(12)
    seen: list[tuple[str, bool]] = []

    def racer(new: bool) -> None:
        eng = Engine(state_dir)
        try:
            wf = eng.load(FLOW)
            eng.store.open()
            barrier.wait(30)
            run = eng.start(wf, key="race", new=new)
            seen.append((run.run_id, run.created))
        finally:
            eng.close()

    threads = [threading.Thread(target=racer, args=(i % 2 == 0,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len({rid for rid, _ in seen}) == 1
    assert sorted(created for _, created in seen) == [False] * 11 + [True]
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs") == [(1,)]


def test_gc_of_the_keyed_run_frees_the_key(engine: Engine) -> None:
    first = engine.run(FLOW, key="k4")
    assert engine.gc(older_than_s=0) == [first.run_id]
    second = engine.start(FLOW, key="k4")
    assert second.created is True and second.run_id != first.run_id


def test_cli_run_key_returns_the_run_and_refuses_another_request(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_file(tmp_path, "nightly.yaml", FLOW)
    first = wf_inproc(capsys, state_dir, "run", str(path), "--key", "cron-1")
    again = wf_inproc(capsys, state_dir, "run", str(path), "--key", "cron-1", "--new")
    other = wf_inproc(capsys, state_dir, "run", str(path), "--key", "cron-1", "--param", "day=tue")
    assert (first.returncode, again.returncode, other.returncode) == (0, 0, 2)
    run_id = first.stdout.split()[1]
    assert first.stdout.startswith(f"run {run_id} (new)")
    assert again.stdout.startswith(f"run {run_id} (existing)")
    assert other.stderr.startswith(f"error: Launch key 'cron-1' already launched run {run_id}")


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


def test_workflow_cell_key_returns_the_run_on_re_execution(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    with magics_in(shell, tmp_path / "state"):
        first = shell.run_cell_magic("workflow", "--key nb-1", FLOW)
        again = shell.run_cell_magic("workflow", "--key nb-1 --new", FLOW)
        assert (again.run_id, again.created) == (first.run_id, False)
        with pytest.raises(IPythonUsageError, match="Launch key 'nb-1' already launched run"):
            shell.run_cell_magic("workflow", "--key nb-1 --param day=tue", FLOW)
