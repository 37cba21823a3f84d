"""Unit outcomes (issue 20, class 2): whatever a unit returns or raises ends its attempt.

An output the journal cannot hold unchanged (a lone surrogate, NaN/inf at any depth, bytes,
sets, objects, non-string keys, a nest too deep, an int too wide, too big), a result with
unusable usage fields, and anything a unit raises (``SystemExit`` and the unit's own
``KeyboardInterrupt`` included) is a failed attempt with a one-line reason, for the python,
scripted (function) and exec runners alike; the run fails with that reason, and a second
drive fails the same way instead of crashing on a half-written row.
"""

from __future__ import annotations

import asyncio
import decimal
import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers_flow import use_runner
from wf_magic import Engine, UnitRequest, UnitResult, register_function, register_runner
from wf_magic.drive.outcomes import MAX_DEPTH, MAX_REASON_CHARS, output_problem

EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# -- values -----------------------------------------------------------------------------------
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT
)
GOOD = st.recursive(
    _LEAF,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_TEXT, kids, max_size=3),
    max_leaves=8,
)
"""JSON values the journal holds unchanged."""

_SURROGATE = st.builds(
    lambda head, code, tail: head + chr(code) + tail, _TEXT, st.integers(0xD800, 0xDFFF), _TEXT
)


class _Opaque:
    """An object of the unit's own class."""


BAD: dict[str, tuple[st.SearchStrategy[Any], str]] = {
    "surrogate": (_SURROGATE, "lone surrogate"),
    "surrogate key": (_SURROGATE.map(lambda k: {k: 1}), "lone surrogate"),
    "non-finite": (st.sampled_from([math.nan, math.inf, -math.inf]), "not a finite number"),
    "bytes": (st.binary(max_size=4), "bytes is not JSON"),
    "set": (st.frozensets(st.integers(), max_size=2), "is not JSON"),
    "object": (st.builds(_Opaque), "_Opaque is not JSON"),
    "decimal": (st.builds(decimal.Decimal, st.integers()), "Decimal is not JSON"),
    "complex": (st.builds(complex, st.integers(), st.integers()), "complex is not JSON"),
    "int key": (st.integers().map(lambda k: {k: "v"}), "dict key of type int"),
    "wide int": (st.integers(10_001, 20_000).map(lambda bits: 1 << bits), "too wide for JSON"),
    "deep": (st.integers(MAX_DEPTH + 1, MAX_DEPTH + 50).map(lambda n: _nest(n)), "nested deeper"),
}
"""Each kind of bad outcome: its strategy, and the words its failure must say."""


def _nest(depth: int) -> Any:
    value: Any = "core"
    for _ in range(depth):
        value = [value]
    return value


def placed(bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``bad`` at a random place inside a random JSON value (the top, a list, a dict)."""
    return st.recursive(
        bad,
        lambda inner: st.builds(lambda a, x, b: [*a, x, *b], st.lists(GOOD, max_size=2), inner,
                                st.lists(GOOD, max_size=2))
        | st.builds(lambda d, k, x: {**d, k: x}, st.dictionaries(_TEXT, GOOD, max_size=2),
                    _TEXT, inner),
        max_leaves=3,
    )  # fmt: skip


KINDS = sorted(BAD)


def bad_outcome() -> st.SearchStrategy[tuple[str, Any]]:
    return st.sampled_from(KINDS).flatmap(
        lambda kind: st.tuples(st.just(kind), placed(BAD[kind][0]))
    )


# -- runs -------------------------------------------------------------------------------------
def assert_fails_for_good(engine: Engine, run_id: str, words: str) -> str:
    """The run failed on its one unit with a one-line reason naming ``words``, and a second
    drive fails the very same way (the journal and the rows stay readable)."""
    run = engine.status(run_id)
    [attempt] = engine.attempts(run_id)
    failure = attempt.failure or ""
    assert (run.status, attempt.status) == ("failed", "failed"), (run.status, failure)
    assert words in failure, failure
    assert "\n" not in failure and failure.encode("utf-8")
    assert failure in (run.reason or "")
    again = engine.drive(run_id)  # the resume: re-dispatched, failing the same way
    assert (again.status, again.reason) == ("failed", run.reason)
    assert [(a.status, a.failure) for a in engine.attempts(run_id)] == [("failed", failure)] * 2
    assert repr(engine.status(run_id)).encode("utf-8")  # the rows render
    return failure


def python_run(engine: Engine, value: Callable[..., Any], *, extra: str = "") -> str:
    register_function("outcome_under_test", value)
    src = f"name: outcome\nsteps:\n  - id: s\n    python: outcome_under_test\n{extra}"
    return engine.run(src).run_id


def scripted_run(engine: Engine, value: Callable[..., Any], *, extra: str = "") -> str:
    use_runner("outcome_fn", lambda request: value())
    src = f"name: outcome\nrunner: outcome_fn\nsteps:\n  - id: s\n    prompt: go\n{extra}"
    return engine.run(src).run_id


RUNNERS = {"python": python_run, "scripted": scripted_run}


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@EXAMPLES
@given(case=bad_outcome())
def test_a_bad_output_anywhere_fails_its_attempt_and_every_resume_alike(
    runner: str, case: tuple[str, Any]
) -> None:
    kind, value = case
    with tempfile.TemporaryDirectory() as tmp, Engine(Path(tmp)) as engine:
        run_id = RUNNERS[runner](engine, lambda: value)
        failure = assert_fails_for_good(engine, run_id, BAD[kind][1])
        assert failure.startswith("output")  # names where in the output the problem is


_EXEC_BAD: dict[str, tuple[st.SearchStrategy[str], str]] = {
    "surrogate": (_SURROGATE.map(lambda s: json.dumps(s)), "lone surrogate"),
    "overflow": (st.sampled_from(["1e999", "-1e999", "[1e400]"]), "not a finite number"),
    "deep": (st.integers(MAX_DEPTH + 1, MAX_DEPTH + 40).map(lambda n: "[" * n + "]" * n),
             "nested deeper"),
}  # fmt: skip
"""Bad outcomes an exec unit can print as JSON text (its stdout decoded under ``output:``)."""


@EXAMPLES
@given(
    case=st.sampled_from(sorted(_EXEC_BAD)).flatmap(
        lambda kind: st.tuples(st.just(kind), _EXEC_BAD[kind][0], GOOD)
    )
)
def test_an_exec_unit_printing_a_bad_json_value_fails_like_the_others(
    case: tuple[str, str, Any],
) -> None:
    kind, text, around = case
    with tempfile.TemporaryDirectory() as tmp, Engine(Path(tmp) / "state") as engine:
        stdout = Path(tmp) / "stdout.json"
        stdout.write_text(json.dumps({"around": around, "bad": "@@"}).replace('"@@"', text))
        src = (
            "name: outcome\nsteps:\n  - id: s\n"
            f"    exec: [python3, -c, 'import sys; print(open(sys.argv[1]).read())', '{stdout}']\n"
            "    output: {type: object}\n"
        )
        run_id = engine.run(src).run_id
        assert_fails_for_good(engine, run_id, _EXEC_BAD[kind][1])


@settings(max_examples=40, deadline=None)
@given(value=GOOD)
def test_every_json_value_passes_the_check_unchanged(value: Any) -> None:
    assert output_problem(value) is None
    register_function("good_value", lambda: value)
    with tempfile.TemporaryDirectory() as tmp, Engine(Path(tmp)) as engine:
        run = engine.run("name: good\nsteps:\n  - id: s\n    python: good_value\n")
        assert (run.status, run.result) == ("completed", value)


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize(
    ("value", "words"),
    [
        pytest.param(lambda: "x" * 10_000_001, "over the bound of 10000000 bytes", id="huge"),
        pytest.param(lambda: ["y" * 1000] * 41_000, "over the bound", id="huge-list"),
        pytest.param(lambda: _cycle(), "nested deeper than", id="cycle"),
    ],
)
def test_huge_and_cyclic_outputs_fail_without_a_crash(
    tmp_path: Path, runner: str, value: Callable[[], Any], words: str
) -> None:
    with Engine(tmp_path) as engine:
        assert_fails_for_good(engine, RUNNERS[runner](engine, value), words)


def _cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


# -- what a runner hands back besides the output ----------------------------------------------
class _Handing:
    """A plugin runner handing back whatever it was built with."""

    def __init__(self, result: object) -> None:
        self.result = result

    def run(self, request: UnitRequest) -> object:
        return self.result

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("result", "words"),
    [
        ({"output": "x"}, "returned a dict, expected a UnitResult"),
        (None, "returned a NoneType, expected a UnitResult"),
        (UnitResult(output="x", tokens_in=math.nan), "tokens_in is nan"),
        (UnitResult(output="x", tokens_out=-1), "tokens_out is -1"),
        (UnitResult(output="x", tokens_in="3"), "tokens_in is a str"),  # type: ignore[arg-type]
        (UnitResult(output="x", tokens_out=2**70), "tokens_out is"),
        (UnitResult(output="x", cost=math.inf), "cost is inf"),
        (UnitResult(output="x", model="m\udc80"), "model is not a valid UTF-8 string"),
        (UnitResult(output="x", session_id=7), "session_id is not"),  # type: ignore[arg-type]
    ],
)
def test_a_runner_handing_back_an_unusable_result_fails_the_attempt(
    tmp_path: Path, result: object, words: str
) -> None:
    register_runner("handing", lambda ctx: _Handing(result), replace=True)
    with Engine(tmp_path) as engine:
        src = "name: hand\nrunner: handing\nsteps:\n  - id: s\n    prompt: go\n"
        run_id = engine.run(src).run_id
        assert_fails_for_good(engine, run_id, words)
        assert [a.tokens_in + a.tokens_out for a in engine.attempts(run_id)] == [0, 0]


# -- what a unit raises -------------------------------------------------------------------------
class _Custom(BaseException):
    """A BaseException of the unit's own."""


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


RAISED: list[tuple[str, Callable[[], BaseException], str]] = [
    ("SystemExit(7)", lambda: SystemExit(7), "raised SystemExit(7)"),
    ("SystemExit()", lambda: SystemExit(), "raised SystemExit;"),
    ("SystemExit(text)", lambda: SystemExit("bye\nnow"), "raised SystemExit(bye now)"),
    ("KeyboardInterrupt", lambda: KeyboardInterrupt(), "raised KeyboardInterrupt"),
    ("GeneratorExit", lambda: GeneratorExit(), "raised GeneratorExit"),
    ("CancelledError", lambda: asyncio.CancelledError(), "raised CancelledError"),
    ("custom", lambda: _Custom("mine"), "raised _Custom(mine)"),
    ("group", lambda: BaseExceptionGroup("g", [SystemExit(1)]), "raised BaseExceptionGroup"),
    ("surrogate text", lambda: ValueError("bad \ud800 text"), "bad \\ud800 text"),
    ("multi-line", lambda: ValueError("one\ntwo\n\tthree"), "one two three"),
    ("broken __str__", lambda: _Unprintable(), "_Unprintable whose message cannot be shown"),
    ("long", lambda: ValueError("z" * 50_000), "more characters"),
]
"""What a unit's code may raise, and the words its one-line failure must say."""

WHERE = {
    "python": (python_run, ""),
    "python+timeout": (python_run, "    timeout: 30\n"),
    "scripted": (scripted_run, ""),
    "scripted+timeout": (scripted_run, "    timeout: 30\n"),
}
"""Each runner kind, inline in the driver thread and on a worker thread (``timeout:``)."""


@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize(("raised", "words"), [(r[1], r[2]) for r in RAISED],
                         ids=[r[0] for r in RAISED])  # fmt: skip
def test_anything_a_unit_raises_is_a_failed_attempt_with_a_one_line_reason(
    tmp_path: Path, where: str, raised: Callable[[], BaseException], words: str
) -> None:
    def unit() -> Any:
        raise raised()

    build, extra = WHERE[where]
    with Engine(tmp_path) as engine:
        run_id = build(engine, unit, extra=extra)  # returns: nothing ended the drive
        failure = assert_fails_for_good(engine, run_id, words)
        assert len(failure) < MAX_REASON_CHARS + 200


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()], ids=repr)
def test_a_unit_raising_on_a_pool_thread_is_a_failed_attempt_not_a_driver_exit(
    tmp_path: Path, runner: str, raised: BaseException
) -> None:
    def unit(**kwargs: Any) -> Any:
        raise raised

    map_step = "    map: '{{ [1] }}'\nexecution: {max_concurrency: 2}\n"
    with Engine(tmp_path) as engine:
        run_id = RUNNERS[runner](engine, unit, extra=map_step)
        assert_fails_for_good(engine, run_id, f"raised {type(raised).__name__}")


def test_an_exec_unit_exiting_with_a_status_fails_naming_it(tmp_path: Path) -> None:
    src = "name: ex\nsteps:\n  - id: s\n    exec: [python3, -c, 'raise SystemExit(7)']\n"
    with Engine(tmp_path) as engine:
        assert_fails_for_good(engine, engine.run(src).run_id, "exited with status 7")


def test_on_error_continue_goes_past_a_unit_that_raised_system_exit(tmp_path: Path) -> None:
    def unit() -> Any:
        raise SystemExit(2)

    register_function("exits", unit)
    register_function("then", lambda: "after")
    with Engine(tmp_path) as engine:
        run = engine.run(
            "name: cont\nsteps:\n  - id: s\n    python: exits\n    on_error: continue\n"
            "  - id: t\n    python: then\n"
        )
        assert (run.status, run.result) == ("completed", "after")


# -- a judge is a unit too ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (lambda: {"complete": True, "feedback": "ok \ud800", "missing": []}, "lone surrogate"),
        (lambda: {"complete": True, "feedback": math.nan, "missing": []}, "not a finite number"),
        (lambda: _raise(SystemExit(4)), "the unit's code raised SystemExit(4)"),
        (lambda: _raise(KeyboardInterrupt()), "the unit's code raised KeyboardInterrupt"),
        (lambda: _raise(RuntimeError("judge \udc80 broke")), "judge \\udc80 broke"),
    ],
)
def test_a_judge_that_returns_a_bad_verdict_or_raises_blocks_its_step(
    tmp_path: Path, reply: Callable[[], Any], words: str
) -> None:
    use_runner("judge_fn", lambda request: reply() if request.kind == "judge" else "work")
    src = (
        "name: judged\nrunner: judge_fn\nsteps:\n  - id: s\n    prompt: go\n"
        "    gate: {judge: llm, criteria: [good]}\n"
    )
    with Engine(tmp_path) as engine:
        run = engine.run(src)
        gate = [a for a in engine.attempts(run.run_id) if a.phase == "gate"]
        assert (run.status, [a.status for a in gate]) == ("blocked", ["failed"])
        assert words in (gate[0].failure or "") and "\n" not in (gate[0].failure or "")
        again = engine.drive(run.run_id)  # re-judged, blocked the same way, no crash
        assert (again.status, again.reason) == ("blocked", run.reason)


def _raise(exc: BaseException) -> Any:
    raise exc
