"""Exec steps (side effects) are not reused across runs unless they opt in (DESIGN.md §9)."""

from __future__ import annotations

from pathlib import Path

from wf_magic import Engine, load_workflow

from .conftest import write_file

MAP_OVER_CHILD = """
name: fleet
steps:
  - id: each
    map: "{{ ['a', 'b', 'c'] }}"
    workflow: ci
    with: {repo: "{{ item }}"}
---
name: ci
params:
  repo: {type: string}
steps:
  - id: test
    exec: [python, -c, "open(LOG, 'a').write('x'); print('ok')"]
    CACHE
  - id: report
    prompt: "report {{ params.repo }}: {{ steps.test.output }}"
"""


def _fleet(cache_line: str, log: Path = Path("ran.log")) -> str:
    src = MAP_OVER_CHILD.replace("LOG", repr(str(log)))
    return src.replace("    CACHE\n", f"    {cache_line}\n" if cache_line else "")


def _statuses(engine: Engine, workflow: str, step_id: str) -> list[str]:
    rows = [r for r in engine.list_runs(include_children=True) if r.workflow == workflow]
    return sorted(a.status for r in rows for a in engine.attempts(r.run_id) if a.step_id == step_id)


def test_exec_steps_freeze_cache_false_unless_opted_in() -> None:
    def cache_of(line: str) -> bool:
        wf = load_workflow(_fleet(line))
        return wf.plan.children["ci"].step("test").cache

    assert (cache_of(""), cache_of("cache: true"), cache_of("cache: false")) == (False, True, False)
    prompt = load_workflow("name: p\nsteps:\n  - id: a\n    prompt: hi\n").plan.step("a")
    assert prompt.cache is True  # other kinds keep reuse on by default


def test_sibling_children_each_run_their_exec_step(engine: Engine, tmp_path: Path) -> None:
    run = engine.run(_fleet("", tmp_path / "ran.log"))
    assert run.status == "completed"
    assert (tmp_path / "ran.log").read_text() == "xxx"  # three children, three side effects
    assert _statuses(engine, "ci", "test") == ["succeeded"] * 3


def test_a_rerun_with_new_runs_the_exec_step_again(engine: Engine, tmp_path: Path) -> None:
    log = tmp_path / "count.log"
    src = (
        "name: once\nsteps:\n  - id: touch\n    exec: [python, -c, "
        f"\"open({str(log)!r}, 'a').write('x'); print(1)\"]\n"
    )
    first = engine.run(src)
    second = engine.run(src, new=True)
    assert (first.status, second.status) == ("completed", "completed")
    assert log.read_text() == "xx"
    assert [a.status for a in second.attempts()] == ["succeeded"]


def test_exec_step_with_cache_true_is_reused_across_siblings(
    engine: Engine, tmp_path: Path
) -> None:
    run = engine.run(_fleet("cache: true", tmp_path / "ran.log"))
    assert run.status == "completed"
    assert (tmp_path / "ran.log").read_text() == "x"  # ran once; the siblings reused it
    assert _statuses(engine, "ci", "test") == ["reused", "reused", "succeeded"]


def test_cache_true_exec_is_reused_by_a_new_run_of_the_file(engine: Engine, tmp_path: Path) -> None:
    log = tmp_path / "count.log"
    path = write_file(
        tmp_path,
        "once.yaml",
        "name: once\nsteps:\n  - id: touch\n    cache: true\n    exec: [python, -c, "
        f"\"open({str(log)!r}, 'a').write('x'); print(1)\"]\n",
    )
    engine.run(path)
    second = engine.run(path, new=True)
    assert log.read_text() == "x"
    assert [a.status for a in second.attempts()] == ["reused"]
