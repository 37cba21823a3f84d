"""The engine end to end: prompt/exec/python steps, journal rows, re-runs and result reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wf_magic import Engine, UsageError, register_function
from wf_magic.drive import interrupts

from .conftest import db_rows, table_counts

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

THREE_KINDS = """\
name: three
params:
  topic: {type: string, default: tides}
steps:
  - id: ask
    prompt: "Write about {{ params.topic }}."
  - id: count
    exec: [python3, -c, "import os; print(len(os.environ['WF_RUN_ID']))"]
  - id: shout
    python: shout_text
    with: {text: "{{ steps.ask.output }}"}
"""


def shout_text(text: str) -> str:
    return text.upper()


register_function("shout_text", shout_text)


def _work(engine: Engine, run_id: str) -> list[tuple[str, int, str]]:
    return [(a.unit_id, a.attempt, a.status) for a in engine.attempts(run_id) if a.phase == "work"]


def test_prompt_exec_python_workflow_completes_with_one_attempt_per_unit(engine: Engine) -> None:
    run = engine.run(THREE_KINDS)
    assert run.status == "completed"
    assert _work(engine, run.run_id) == [
        ("ask", 1, "succeeded"),
        ("count", 1, "succeeded"),
        ("shout", 1, "succeeded"),
    ]
    ask = engine.attempts(run.run_id)[0]
    assert ask.tokens_in == 4 and ask.tokens_out > 0  # "Write about tides." = 3 words + "."
    assert run.output("count").strip() == str(len(run.run_id))
    assert run.result == json.loads(ask.output_json or "null").upper()
    assert {s.step_id: s.status for s in run.steps} == {
        "ask": "completed",
        "count": "completed",
        "shout": "completed",
    }


def test_rerunning_unchanged_dispatches_nothing(engine: Engine, state_dir: Path) -> None:
    first = engine.run(THREE_KINDS)
    before = table_counts(state_dir)
    again = engine.run(THREE_KINDS)
    assert again.run_id == first.run_id
    assert again.stats is not None and again.stats.dispatched == 0
    assert table_counts(state_dir) == before


def test_editing_one_prompt_redispatches_only_changed_units(engine: Engine) -> None:
    src = """\
name: chain
steps:
  - id: a
    prompt: "alpha"
  - id: b
    prompt: "beta"
  - id: c
    prompt: "uses {{ steps.b.output }}"
  - id: d
    prompt: "delta"
"""
    first = engine.run(src)
    second = engine.run(src.replace('"beta"', '"beta two"'))
    assert second.run_id != first.run_id
    rows = {a.unit_id: a for a in engine.attempts(second.run_id)}
    assert {u: a.status for u, a in rows.items()} == {
        "a": "reused",
        "b": "succeeded",
        "c": "succeeded",
        "d": "reused",
    }
    first_rows = {a.unit_id: a for a in engine.attempts(first.run_id)}
    assert rows["a"].reused_from == first_rows["a"].dispatch_id
    assert (rows["a"].tokens_in, rows["a"].tokens_out) == (0, 0)
    assert rows["a"].saved_tokens == first_rows["a"].tokens_in + first_rows["a"].tokens_out
    assert second.stats is not None and second.stats.reused == 2
    # the first run was complete, so it is not superseded
    assert engine.get_run(first.run_id).status == "completed"


def test_no_cache_dispatches_everything(engine: Engine) -> None:
    engine.run("name: n\nsteps:\n  - id: a\n    prompt: one\n")
    run = engine.run("name: n\nsteps:\n  - id: a\n    prompt: one\n", new=True, no_cache=True)
    assert [a.status for a in engine.attempts(run.run_id)] == ["succeeded"]


def test_step_cache_false_is_never_reused(engine: Engine) -> None:
    src = "name: n\nsteps:\n  - id: a\n    prompt: one\n    cache: false\n"
    engine.run(src)
    run = engine.run(src, new=True)
    assert [a.status for a in engine.attempts(run.run_id)] == ["succeeded"]


def test_reuse_needs_the_same_model_and_workflow(engine: Engine) -> None:
    base = "name: {n}\nsteps:\n  - id: a\n    prompt: hello world\n{extra}"
    engine.run(base.format(n="rx", extra=""))
    other_model = engine.run(base.format(n="rx", extra="    model: m2\n"))
    assert [a.status for a in engine.attempts(other_model.run_id)] == ["succeeded"]
    other_wf = engine.run(base.format(n="ry", extra=""))
    assert [a.status for a in engine.attempts(other_wf.run_id)] == ["succeeded"]
    same = engine.run(base.format(n="rx", extra="    timeout: 5\n"))
    assert [a.status for a in engine.attempts(same.run_id)] == ["reused"]


def test_changed_cell_supersedes_unfinished_run(engine: Engine) -> None:
    src = "name: s\nsteps:\n  - id: a\n    prompt: one\n  - id: b\n    prompt: two\n"
    first = engine.run(src, max_steps=1)
    assert first.status == "active" and first.stopped_by == "max_steps"
    second = engine.run(src.replace("two", "three"))
    old = engine.get_run(first.run_id)
    assert (old.status, old.status_reason) == ("abandoned", f"superseded by {second.run_id}")
    assert second.status == "completed"


def test_unchanged_rerun_resumes_unfinished_run(engine: Engine) -> None:
    src = "name: s\nsteps:\n  - id: a\n    prompt: one\n  - id: b\n    prompt: two\n"
    first = engine.run(src, max_steps=1)
    second = engine.run(src)
    assert second.run_id == first.run_id and second.status == "completed"
    assert [a.unit_id for a in engine.attempts(first.run_id)] == ["a", "b"]


def test_params_are_validated_and_scope_runs(engine: Engine) -> None:
    src = "name: p\nparams:\n  n: {type: integer, minimum: 1}\nsteps:\n  - id: a\n    prompt: 'n={{ params.n }}'\n"
    with pytest.raises(UsageError, match="param 'n' of workflow 'p' is required"):
        engine.run(src)
    with pytest.raises(UsageError, match="declares no param 'm'"):
        engine.run(src, params={"n": 1, "m": 2})
    with pytest.raises(UsageError, match="param n: 0 is less than the minimum of 1"):
        engine.run(src, params={"n": 0})
    one = engine.run(src, params={"n": "2"}, params_from_strings=True)
    two = engine.run(src, params={"n": 3})
    assert one.run_id != two.run_id and one.params == {"n": 2}


def test_abandon_and_stop(engine: Engine) -> None:
    src = "name: s\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n"
    run = engine.run(src, max_steps=1)
    engine.stop(run.run_id)
    assert db_rows(engine.state_dir, "SELECT stop_requested FROM runs")[0][0] == 1
    engine.abandon(run.run_id)
    assert engine.get_run(run.run_id).status == "abandoned"
    assert engine.drive(run.run_id).stats is not None


def test_budget_stop_names_figures(engine: Engine) -> None:
    src = "name: b\nbudget: {max_units: 2}\nsteps:\n  - id: a\n    map: '{{ [1,2,3] }}'\n    prompt: 'x {{ item }}'\n"
    run = engine.run(src)
    assert run.status == "failed"
    assert "max_units used 2 of 2" in (run.reason or "")
    assert len(engine.attempts(run.run_id)) == 2
    again = engine.drive(run.run_id)  # re-stops at once, dispatching nothing
    assert again.status == "failed" and len(engine.attempts(run.run_id)) == 2


def test_secret_env_values_never_reach_the_journal(
    engine: Engine, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = "canary-secret-value-12345"
    monkeypatch.setenv("MY_API_TOKEN", canary)
    eng = Engine(state_dir)
    src = (
        "name: s\nsteps:\n  - id: a\n    exec: [sh, -c, 'echo $MY_API_TOKEN; exit 3']\n"
        "    pass_env: [MY_API_TOKEN]\n"
    )
    run = eng.run(src)
    assert run.status == "failed"
    eng.close()
    for table in ("runs", "steps", "units", "attempts", "events"):
        for row in db_rows(state_dir, f"SELECT * FROM {table}"):  # noqa: S608
            assert canary not in json.dumps(row, default=str)


_FLAKY_CALLS: list[int] = []


def flaky_twice() -> str:
    _FLAKY_CALLS.append(1)
    if len(_FLAKY_CALLS) <= 2:
        raise RuntimeError(f"boom {len(_FLAKY_CALLS)}")
    return "ok"


register_function("flaky_twice", flaky_twice)


def test_max_retries_reopens_a_run_failed_on_a_unit(engine: Engine) -> None:
    _FLAKY_CALLS.clear()
    src = "name: r\nsteps:\n  - id: a\n    prompt: x\n  - id: f\n    python: flaky_twice\n"
    run = engine.run(src, max_retries=2)
    assert run.status == "completed"
    assert [(a.unit_id, a.attempt, a.status) for a in engine.attempts(run.run_id)] == [
        ("a", 1, "succeeded"),
        ("f", 1, "failed"),
        ("f", 2, "failed"),
        ("f", 3, "succeeded"),
    ]
    assert [w for w in run.warnings if w.startswith("run-level retry")] == [
        "run-level retry 1/2 after: step f: unit f failed: flaky_twice raised RuntimeError: boom 1",
        "run-level retry 2/2 after: step f: unit f failed: flaky_twice raised RuntimeError: boom 2",
    ]


def test_max_retries_never_reopens_after_a_budget_stop_or_a_unit_that_ran_nothing(
    engine: Engine,
) -> None:
    budget = engine.run(
        "name: b\nbudget: {max_units: 1}\nsteps:\n  - id: a\n    prompt: x\n"
        "  - id: b\n    prompt: y\n",
        max_retries=3,
    )
    assert budget.status == "failed" and len(engine.attempts(budget.run_id)) == 1
    missing = engine.run(
        "name: m\nsteps:\n  - id: a\n    exec: [no-such-program-wf]\n", max_retries=3
    )
    assert missing.status == "failed" and len(engine.attempts(missing.run_id)) == 1


def test_secret_looking_params_are_redacted_from_the_journal(engine: Engine) -> None:
    src = (
        "name: s\nparams:\n  api_key: {type: string}\nsteps:\n"
        "  - id: a\n    prompt: 'use {{ params.api_key }} now'\n"
    )
    run = engine.run(src, params={"api_key": "hunter2-very-secret"})
    attempt = engine.attempts(run.run_id)[0]
    assert "hunter2-very-secret" not in (attempt.output_json or "")
    assert "***" in (attempt.output_json or "")


def test_start_returns_a_typed_handle_and_every_verb_accepts_it(engine: Engine) -> None:
    src = "name: t\nsteps:\n  - id: a\n    prompt: x\n  - id: b\n    prompt: y\n"
    started = engine.start(src)
    assert (started.created, started.status, started.warnings) == (True, "active", [])
    again = engine.start(src)
    assert again.run_id == started.run_id and again.created is False
    done = engine.drive(started)
    assert done.status == "completed" and engine.status(done).run_id == started.run_id
    fork = engine.fork(done, from_step="b")
    assert fork.created and engine.drive(fork).status == "completed"
    assert [a.status for a in engine.attempts(fork)] == ["reused", "succeeded"]


class _Closing:
    """A runner that counts closes and can raise an interrupt mid-unit."""

    closed = 0

    def __init__(self, interrupt: bool) -> None:
        self.interrupt = interrupt

    def run(self, request):  # type: ignore[no-untyped-def]
        from wf_magic import UnitResult

        if self.interrupt:
            interrupts.note_delivery()  # what a Ctrl-C's handler does, before it raises
            raise KeyboardInterrupt  # the driver is interrupted while the unit runs
        return UnitResult(output="ok", tokens_in=1, tokens_out=1)

    def close(self) -> None:
        type(self).closed += 1


@pytest.mark.parametrize("interrupt", [False, True])
def test_runners_are_closed_on_every_exit_path(engine: Engine, interrupt: bool) -> None:
    from wf_magic import register_runner

    _Closing.closed = 0
    name = f"closing-{interrupt}"
    register_runner(name, lambda ctx: _Closing(interrupt), replace=True)
    src = f"name: c{int(interrupt)}\nrunner: {name}\nsteps:\n  - id: a\n    prompt: x\n"
    if interrupt:
        with pytest.raises(KeyboardInterrupt):
            engine.run(src)
        run_id = engine.list_runs()[0].run_id
        assert engine.get_run(run_id).status == "active"  # owed to the next drive
        assert [a.status for a in engine.attempts(run_id)] == ["running"]
    else:
        assert engine.run(src).status == "completed"
    assert _Closing.closed == 1


def test_scripted_runner_answers_from_a_mapping_and_refuses_unknown_options(engine: Engine) -> None:
    src = (
        "name: m\nrunners:\n  scripted:\n    replies:\n      'Say hello.': {greeting: hi}\n"
        "steps:\n  - id: a\n    prompt: 'Say hello.'\n"
    )
    run = engine.run(src)
    assert run.result == {"greeting": "hi"}
    from wf_magic import DefinitionError

    with pytest.raises(DefinitionError) as info:
        engine.run(
            "name: m2\nrunners:\n  scripted:\n    rule: []\nsteps:\n  - id: a\n    prompt: x\n"
        )
    assert str(info.value).startswith(
        "runners.scripted: runner options rejected: runner 'scripted': unknown option(s) ['rule']"
    )
