"""Command-line params follow JSON number rules; integral floats are normalised before scoping."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wf_magic import Engine, UsageError
from wf_magic.spec.params import coerce, normalise

from .conftest import wf_inproc

NUMBER = """\
name: num
params:
  k: {type: number, default: 3}
steps:
  - id: a
    prompt: "take {{ params.k }} items"
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3", 3), ("-3", -3), ("3.5", 3.5), ("3.0", 3), ("1e3", 1000), ("2.5e-1", 0.25), (" 7 ", 7)],
)
def test_number_text_follows_json_number_rules(text: str, expected: float) -> None:
    value = coerce({"type": "number"}, text)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("text", ["1_000", "0x10", "nan", "inf", "+3", "03", "3.", ".5", ""])
def test_number_text_outside_json_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match=r"expected a number \(got "):
        coerce({"type": "number"}, text)


@pytest.mark.parametrize(("text", "expected"), [("4", 4), ("4.0", 4), ("4e1", 40)])
def test_integer_text_accepts_integral_json_numbers(text: str, expected: int) -> None:
    value = coerce({"type": "integer"}, text)
    assert value == expected and type(value) is int


@pytest.mark.parametrize("text", ["4.5", "1_000", "four"])
def test_integer_text_that_is_not_integral_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match=r"expected an integer \(got "):
        coerce({"type": "integer"}, text)


def test_normalise_turns_integral_floats_into_ints_deeply() -> None:
    assert normalise({"a": [1.0, 2.5, True, {"b": -0.0}], "c": "1.0"}) == {
        "a": [1, 2.5, True, {"b": 0}],
        "c": "1.0",
    }
    assert type(normalise(1.0)) is int and normalise(True) is True
    assert type(normalise(1e300)) is float  # beyond exact integers: left alone


@given(st.integers(min_value=-(2**53), max_value=2**53))
def test_an_integral_number_reads_the_same_as_text_or_float(n: int) -> None:
    assert coerce({"type": "number"}, str(n)) == normalise(float(n)) == n
    assert type(normalise(float(n))) is int


def test_param_k_3_is_the_default_scope_and_prompt(engine: Engine) -> None:
    default = engine.run(NUMBER)
    given_text = engine.run(NUMBER, params={"k": "3"}, params_from_strings=True)
    given_float = engine.run(NUMBER, params={"k": 3.0})
    assert given_text.run_id == given_float.run_id == default.run_id
    assert given_text.created is False and given_float.created is False
    assert default.params == {"k": 3}
    [attempt] = default.attempts()
    assert engine.store.input_of(attempt.input_hash)["prompt"] == "take 3 items"  # type: ignore[index]


def test_param_k_3_5_is_another_scope(engine: Engine) -> None:
    default = engine.run(NUMBER)
    other = engine.run(NUMBER, params={"k": "3.5"}, params_from_strings=True)
    assert other.run_id != default.run_id and other.params == {"k": 3.5}


def test_cli_param_k_3_continues_the_default_run(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "num.yaml"
    src.write_text(NUMBER)
    first = wf_inproc(capsys, state_dir, "run", str(src))
    again = wf_inproc(capsys, state_dir, "run", str(src), "--param", "k=3")
    assert first.returncode == 0 and again.returncode == 0, again.stderr
    assert "(new)" in first.stdout and "(existing)" in again.stdout
    assert first.stdout.split()[1] == again.stdout.split()[1]
