"""The shapes that keep the engine fast: statements per unit, rows read on resume, plan length.

Structural checks only (counts, never wall-clock time): the timings live in ``bench/``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from wf_magic import Engine
from wf_magic.drive import spine
from wf_magic.store import journal_reads


def _map_source(units: int, *, fail_last: bool = False) -> str:
    rules = f"      - match: 'unit {units - 1}$'\n        error: permanent\n" if fail_last else ""
    return (
        "name: shapes\n"
        "runners:\n  scripted:\n    rules:\n"
        f"{rules}"
        "      - match: '.'\n        reply: ok\n"
        "steps:\n  - id: s\n"
        f"    map: '{{{{ range({units}) | list }}}}'\n"
        "    prompt: 'unit {{ item }}'\n"
    )


@contextmanager
def _writer_statements(engine: Engine) -> Iterator[list[str]]:
    engine.store.open()
    conn: sqlite3.Connection = engine.store._writer  # type: ignore[assignment]
    seen: list[str] = []
    # Trigger bodies are traced as "-- TRIGGER ..." lines: they are not statements sent.
    conn.set_trace_callback(lambda sql: None if sql.startswith("--") else seen.append(sql))
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


def test_a_no_op_unit_costs_at_most_thirteen_traced_statements_in_two_transactions(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path / "state")
    units = 200
    with _writer_statements(engine) as seen:
        run = engine.run(_map_source(units))
    assert run.status == "completed"
    begins = sum(1 for s in seen if s.startswith("BEGIN"))
    # 12 statements are sent per unit; the finishing UPDATE (a table with a trigger) is
    # traced twice, so 13 lines.
    assert len(seen) <= 13 * units + 60
    assert begins <= 2 * units + 10


def test_resume_reads_whole_attempt_rows_only_for_the_units_still_owed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(tmp_path / "state")
    first = engine.run(_map_source(600, fail_last=True))
    assert first.status == "failed"
    built: list[type] = []
    real = journal_reads.from_row

    def counting(cls: type[Any], row: sqlite3.Row) -> Any:
        built.append(cls)
        return real(cls, row)

    monkeypatch.setattr(journal_reads, "from_row", counting)
    again = engine.drive(first.run_id)
    assert again.status == "failed"
    assert len(built) <= 5  # the one owed unit's attempts, not the 599 done ones


def test_a_10000_step_plan_freezes_and_its_drive_never_rescans_the_plan_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = "".join(f"  - id: s{i}\n    prompt: 'p {i}'\n" for i in range(10_000))
    engine = Engine(tmp_path / "state")
    wf = engine.load(f"name: long\nsteps:\n{steps}")
    assert len(wf.plan.steps) == 10_000
    derived: list[int] = []
    real = spine.derive_run_status

    def counting(*args: Any, **kwargs: Any) -> Any:
        derived.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(spine, "derive_run_status", counting)
    run = engine.run(wf, max_steps=300)
    assert run.status == "active"
    assert len(engine.store.attempts_of(run.run_id)) == 300
    assert len(derived) <= 2  # the run status is derived from the whole plan only when it moves
