"""Scores on any step (issue 34 item 1): the six scorers, journaled as ``<step>.score:<name>``
units of phase ``score``, reused by input, never gating, a failed score re-measured on resume."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import db_rows
from tests.openai_server import FakeChatServer, completion_body, isolate_openai_env
from wf_magic import DefinitionError, Engine, load_workflow
from wf_magic.gates.scorers import (
    ScoreError,
    parse_rubric_reply,
    python_score,
    score_contains,
    score_equals,
    score_json_schema,
    score_regex,
)

KEY_ENV = "WF_SCORES_TEST_KEY"


# -- the built-in scorers on hand-made outputs -------------------------------------------------
@pytest.mark.parametrize(
    ("output", "expected", "ignore_case", "value"),
    [
        ("Paris", "Paris", False, 1.0),
        ("Paris\n", "Paris", False, 1.0),  # surrounding whitespace is not the answer
        ("  Paris  ", " Paris", False, 1.0),
        ("paris", "Paris", False, 0.0),
        ("paris", "Paris", True, 1.0),
        ("STRASSE", "straße", True, 1.0),  # casefold, not lower
        ("Zürich", "Zürich", False, 1.0),
        ("Zürich", "Zurich", False, 0.0),
        ("", "", False, 1.0),
        ("", "x", False, 0.0),
        ("line one\nline two", "line one\nline two", False, 1.0),
        ("line one\nline two", "line one", False, 0.0),
        ({"a": 1}, {"a": 1}, False, 1.0),  # a non-string expected is compared as JSON
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, False, 1.0),
        (42, 42, False, 1.0),
        ("42", 42, False, 1.0),  # a model answers 42 as text: read as JSON for a JSON expected
        (" 42\n", 42, False, 1.0),
        ("42 apples", 42, False, 0.0),
        ('```json\n{"answer": 1}\n```', {"answer": 1}, False, 1.0),  # one code fence allowed
        ('{"answer": 2}', {"answer": 1}, False, 0.0),
        ("true", True, False, 1.0),
        ('"42"', 42, False, 0.0),  # a JSON string is no number
        (42, "42", False, 1.0),  # a string expected reads the output's text
        (True, True, False, 1.0),
    ],
)
def test_equals(output: Any, expected: Any, ignore_case: bool, value: float) -> None:
    assert score_equals(output, expected, ignore_case=ignore_case).value == value


@pytest.mark.parametrize(
    ("output", "needle", "ignore_case", "value"),
    [
        ("The capital is Paris.", "Paris", False, 1.0),
        ("The capital is paris.", "Paris", False, 0.0),
        ("The capital is PARIS.", "Paris", True, 1.0),
        ("日本の首都は東京です", "東京", False, 1.0),
        ("", "", False, 1.0),
        ("", "x", False, 0.0),
        ("first\nsecond\nthird", "second\nthird", False, 1.0),
        ({"answer": "Paris"}, '"answer":"Paris"', False, 1.0),  # a JSON output's text
        ("emoji 🎉 party", "🎉", False, 1.0),
    ],
)
def test_contains(output: Any, needle: str, ignore_case: bool, value: float) -> None:
    assert score_contains(output, needle, ignore_case=ignore_case).value == value


@pytest.mark.parametrize(
    ("output", "pattern", "value"),
    [
        ("Paris", "^[A-Z][a-z]+$", 1.0),
        ("Paris\n", "^[A-Z][a-z]+$", 1.0),  # `$` matches before a final newline
        ("paris", "^[A-Z][a-z]+$", 0.0),
        ("Two words", "^[A-Z][a-z]+$", 0.0),
        ("a\nParis", "^[A-Z][a-z]+$", 0.0),  # no MULTILINE unless the pattern asks
        ("a\nParis", "(?m)^[A-Z][a-z]+$", 1.0),
        ("Ürümqi", r"^\w+$", 1.0),
        ("", "^$", 1.0),
        ("", "x", 0.0),
        ("answer: 42", r"\d{2}", 1.0),
    ],
)
def test_regex(output: Any, pattern: str, value: float) -> None:
    assert score_regex(output, pattern).value == value


@pytest.mark.parametrize(
    ("output", "pattern", "problem"),
    [
        ("x", "(unclosed", "does not compile"),
        ("x", "(a+)+$", "may take exponential time"),
        ("x", "(a|aa)*b", "may take exponential time"),
        ("x", "a*a*a*b", "to the power 4"),
        ("x" * 10_001, "foo.*bar", "the output has 10,001 characters (at most 10,000)"),
    ],
)
def test_a_regex_that_cannot_search_within_bounds_is_a_score_error(
    output: str, pattern: str, problem: str
) -> None:
    """Python's re holds the GIL while it backtracks: no timeout could stop a runaway search."""
    with pytest.raises(ScoreError, match=re.escape(problem)):
        score_regex(output, pattern)


def test_a_quadratic_regex_searches_an_output_up_to_its_bound() -> None:
    assert score_regex("x" * 9_990 + "foo-bar", "foo.*bar").value == 1.0


SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}


@pytest.mark.parametrize(
    ("output", "value", "explanation"),
    [
        ({"answer": "Paris"}, 1.0, "valid"),
        ('{"answer": "Paris"}', 1.0, "valid"),
        ('```json\n{"answer": "Paris"}\n```', 1.0, "valid"),  # JSON in a code fence
        ('```\n{"answer": "東京"}\n```', 1.0, "valid"),
        ('  {"answer": "Paris"}\n', 1.0, "valid"),
        ("Paris", 0.0, "not JSON: 'Paris'"),
        ("", 0.0, "not JSON: ''"),
        ('{"answer": 3}', 0.0, "answer: 3 is not of type 'string'"),
        ("{}", 0.0, "(root): 'answer' is a required property"),
        ("[1, 2]", 0.0, "(root): [1, 2] is not of type 'object'"),
    ],
)
def test_json_schema(output: Any, value: float, explanation: str) -> None:
    got = score_json_schema(output, SCHEMA)
    assert (got.value, got.explanation) == (value, explanation)


_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(text=_text)
def test_any_text_equals_itself_and_contains_itself(text: str) -> None:
    assert score_equals(text, text).value == 1.0
    assert score_equals(text.upper(), text.lower(), ignore_case=True).value == (
        1.0 if text.upper().strip().casefold() == text.lower().strip().casefold() else 0.0
    )
    assert score_contains(f"«{text}»", text).value == 1.0
    assert score_regex(f"x{text}y", re.escape(text)).value == 1.0


@settings(max_examples=150, deadline=None)
@given(answer=_text, fenced=st.booleans(), extra=st.dictionaries(_text, st.integers()))
def test_any_json_object_with_the_required_key_is_valid_fenced_or_not(
    answer: str, fenced: bool, extra: dict[str, int]
) -> None:
    body = json.dumps({**extra, "answer": answer}, ensure_ascii=False)
    output = f"```json\n{body}\n```" if fenced else body
    assert score_json_schema(output, SCHEMA).value == 1.0


# -- the llm rubric's reply, read strictly -----------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("four", "not JSON"),
        ("", "not JSON"),
        ("[4]", "not an object"),
        ('"4"', "not an object"),
        ({"explanation": "good"}, "lacks a finite number `value`"),
        ({"value": "4", "explanation": "good"}, "lacks a finite number `value`"),
        ({"value": True, "explanation": "good"}, "lacks a finite number `value`"),
        ({"value": None}, "lacks a finite number `value`"),
        ('{"value": NaN}', "lacks a finite number `value`"),
        ('{"value": Infinity}', "lacks a finite number `value`"),
        ({"value": 10**400}, "lacks a finite number `value`"),
        ({"value": 4, "explanation": 3}, "`explanation` is not text"),
        ({"value": 7, "explanation": "great"}, "judge value 7 is outside the scale [1, 5]"),
        ({"value": 0.99, "explanation": ""}, "judge value 0.99 is outside the scale [1, 5]"),
        ({"value": -1}, "outside the scale"),
    ],
)
def test_an_unreadable_or_out_of_scale_verdict_is_an_error_never_a_zero(
    reply: Any, problem: str
) -> None:
    with pytest.raises(ScoreError, match=re.escape(problem)):
        parse_rubric_reply(reply, (1.0, 5.0))


@pytest.mark.parametrize(
    ("reply", "value", "explanation"),
    [
        ({"value": 4, "explanation": "good"}, 4.0, "good"),
        ('{"value": 1, "explanation": "bad"}', 1.0, "bad"),
        (
            '```json\n{"value": 5, "explanation": "très bien\\nsur deux lignes"}\n```',
            5.0,
            "très bien\nsur deux lignes",
        ),
        ({"value": 2.5}, 2.5, ""),
    ],
)
def test_a_verdict_on_its_scale_is_read(reply: Any, value: float, explanation: str) -> None:
    got = parse_rubric_reply(reply, (1.0, 5.0))
    assert (got.value, got.explanation) == (value, explanation)


@settings(max_examples=200, deadline=None)
@given(
    lo=st.floats(-1e6, 1e6),
    width=st.floats(1e-3, 1e6),
    at=st.floats(-2.0, 3.0),
)
def test_a_value_is_accepted_exactly_when_it_lies_on_the_scale(
    lo: float, width: float, at: float
) -> None:
    hi = lo + width
    value = lo + at * width
    inside = lo <= value <= hi
    try:
        got = parse_rubric_reply({"value": value, "explanation": "x"}, (lo, hi))
    except ScoreError as exc:
        assert not inside and "outside the scale" in str(exc)
    else:
        assert inside and got.value == value


@pytest.mark.parametrize(
    ("returned", "value", "explanation"),
    [
        (3, 3.0, ""),
        (0.25, 0.25, ""),
        (True, 1.0, ""),
        (False, 0.0, ""),
        ({"value": 2, "explanation": "two"}, 2.0, "two"),
        ({"value": False, "explanation": "no"}, 0.0, "no"),
    ],
)
def test_what_a_python_scorer_may_return(returned: Any, value: float, explanation: str) -> None:
    got = python_score(returned)
    assert (got.value, got.explanation) == (value, explanation)


@pytest.mark.parametrize(
    ("returned", "problem"),
    [
        ("3", "returned str"),
        (None, "returned NoneType"),
        ([1], "returned list"),
        (math.nan, "expected a finite number"),
        (math.inf, "expected a finite number"),
        (10**400, "expected a finite number"),
        ({"explanation": "no value"}, "without `value`"),
        ({"value": 1, "explanation": 2}, "`explanation` is not text"),
        ({"value": "1"}, "returned str"),
    ],
)
def test_what_a_python_scorer_may_not_return(returned: Any, problem: str) -> None:
    with pytest.raises(ScoreError, match=re.escape(problem)):
        python_score(returned)


# -- workflows ---------------------------------------------------------------------------------
@pytest.fixture
def helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module ``score_helpers`` importable by the workflows below."""
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "score_helpers.py").write_text(
        "import os\n"
        "def score(output, params):\n"
        "    return {'value': len(output), 'explanation': 'length of ' + output}\n"
        "def flag(output):\n"
        "    return output == 'Paris'\n"
        "def flaky(output):\n"
        "    if os.path.exists(os.environ['SCORE_FLAG']):\n"
        "        raise ValueError('scorer is broken today')\n"
        "    return 1\n"
        "def per_item(output, item, index):\n"
        "    return {'value': index, 'explanation': f'{item}->{output}'}\n"
        "def picky(output, item):\n"
        "    if item == 'Lyon' and os.path.exists(os.environ['SCORE_FLAG']):\n"
        "        raise ValueError('no Lyon today')\n"
        "    return 1\n"
        "def numpyish(output):\n"
        "    import numpy\n"
        "    return numpy.int64(3) if output == 'Paris' else numpy.bool_(True)\n"
        "def halves(output):\n"
        "    import numpy\n"
        "    return {'value': numpy.float32(0.5), 'explanation': 'half'}\n"
        "def named(answer, **extras):\n"
        "    return {'value': len(answer), 'explanation': ','.join(sorted(extras))}\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in ("score_helpers",):
        sys.modules.pop(name, None)


RULES = """
runners:
  scripted:
    rules:
      - match: "Score the output"
        reply: {value: 4, explanation: "mostly right"}
      - match: "capital"
        reply: "Paris"
"""

ALL_SIX = (
    """
name: six
params:
  expected: {type: string, default: Paris}
"""
    + RULES
    + """
steps:
  - id: answer
    prompt: "Answer in one word: the capital of France"
    score:
      - {name: exact, equals: "{{ params.expected }}"}
      - {name: mentions, contains: "{{ params.expected | lower }}", ignore_case: true}
      - {name: shape, regex: "^[A-Z][a-z]+$"}
      - {name: valid, json_schema: {type: object, required: [answer]}}
      - {name: quality, judge: llm, rubric: "How correct is the answer, given {{ params.expected }}?", scale: [1, 5]}
      - {name: mine, python: "score_helpers:score"}
"""
)


def _scores(run: Any) -> list[tuple[Any, ...]]:
    """run.scores() as (step, name, item, value, explanation, status) tuples."""
    return [
        (
            r["step"],
            r["name"],
            None if r["item"] is None else int(r["item"]),
            r["value"],
            r["explanation"],
            r["status"],
        )
        for r in run.scores().astype(object).where(run.scores().notna(), None).to_dict("records")
    ]


def test_the_six_scorers_measure_a_step_and_journal_one_unit_each(
    engine: Engine, helpers: Path
) -> None:
    run = engine.run(ALL_SIX)

    assert run.status == "completed", run.reason
    assert _scores(run) == [
        ("answer", "exact", None, 1.0, "equal", "succeeded"),
        ("answer", "mentions", None, 1.0, "contains 'paris'", "succeeded"),
        ("answer", "shape", None, 1.0, "matched 'Paris'", "succeeded"),
        ("answer", "valid", None, 0.0, "not JSON: 'Paris'", "succeeded"),
        ("answer", "quality", None, 4.0, "mostly right", "succeeded"),
        ("answer", "mine", None, 5.0, "length of Paris", "succeeded"),
    ]
    journal = run.journal()
    scored = journal[journal["phase"] == "score"]
    assert list(scored["unit"]) == [
        f"answer.score:{n}" for n in ("exact", "mentions", "shape", "valid", "quality", "mine")
    ]
    assert list(scored["runner"]) == [
        "equals",
        "contains",
        "regex",
        "json_schema",
        "scripted",
        "python",
    ]
    quality = scored[scored["unit"] == "answer.score:quality"].iloc[0]
    assert quality["tokens_in"] > 0 and not quality["charged"]  # a judge, not charged
    assert run.result == "Paris"  # a score never changes the output


def test_a_score_units_input_holds_the_rendered_fields_and_the_output(
    engine: Engine, helpers: Path
) -> None:
    run = engine.run(ALL_SIX)

    inputs = run.journal(inputs=True).set_index("unit")["input"]
    assert json.loads(inputs["answer.score:exact"]) == {
        "equals": "Paris",
        "output": "Paris",
        "scorer": "equals",
    }
    quality = json.loads(inputs["answer.score:quality"])
    assert quality["rubric"] == "How correct is the answer, given Paris?"
    assert quality["scale"] == [1.0, 5.0]
    assert quality["prompt"].startswith('Score the output of step "answer".')


def _rubric_flow(reply: Any) -> str:
    return f"""
name: rubric
runners:
  scripted:
    rules:
      - match: "Score the output"
        reply: {json.dumps(reply)}
steps:
  - id: answer
    prompt: "Say something"
    score:
      - {{name: quality, judge: llm, rubric: "Is it good?", scale: [1, 5]}}
  - id: after
    prompt: "Then this"
"""


@pytest.mark.parametrize(
    ("reply", "failure"),
    [
        ({"value": 7, "explanation": "too kind"}, "judge value 7 is outside the scale [1, 5]"),
        ("no idea", "judge reply is not JSON: 'no idea'"),
        ({"complete": True}, "judge reply lacks a finite number `value`"),
    ],
)
def test_a_bad_verdict_fails_the_score_unit_but_not_the_step_or_the_run(
    engine: Engine, reply: Any, failure: str
) -> None:
    run = engine.run(_rubric_flow(reply))

    assert run.status == "completed", run.reason
    assert [s.status for s in run.steps] == ["completed", "completed"]
    frame = run.scores()
    assert frame["status"].tolist() == ["failed"]
    assert math.isnan(frame["value"].iloc[0])
    assert failure in frame["explanation"].iloc[0]
    # the judge answered: its failed unit keeps the tokens the answer cost
    judged = run.journal().set_index("unit").loc["answer.score:quality"]
    assert judged["tokens_in"] > 0 and judged["tokens_out"] > 0


def test_a_python_scorer_raising_fails_its_unit_and_is_measured_again_on_resume(
    engine: Engine, helpers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "broken"
    flag.write_text("1")
    monkeypatch.setenv("SCORE_FLAG", str(flag))
    src = """
name: flaky
steps:
  - id: answer
    prompt: "Say something"
    score:
      - {name: ok, python: "score_helpers:flag"}
      - {name: flaky, python: "score_helpers:flaky"}
"""
    run = engine.run(src)

    assert run.status == "completed", run.reason
    first = run.scores().set_index("name")
    assert first.loc["flaky", "status"] == "failed"
    assert (
        "score_helpers:flaky raised ValueError: scorer is broken today"
        in first.loc["flaky", "explanation"]
    )
    (kept,) = db_rows(
        engine.state_dir, "SELECT output_json FROM attempts WHERE unit_id = 'answer.score:flaky'"
    )[0]
    assert "raise ValueError('scorer is broken today')" in json.loads(str(kept))["traceback"]

    engine.resume(run.run_id)  # still broken: measured again, failed again
    flag.unlink()
    engine.resume(run.run_id)  # fixed: measured again, succeeded

    rows = db_rows(
        engine.state_dir,
        "SELECT unit_id, status FROM attempts WHERE phase = 'score' ORDER BY attempt_pk",
    )
    assert rows == [
        ("answer.score:ok", "succeeded"),
        ("answer.score:flaky", "failed"),
        ("answer.score:flaky", "failed"),
        ("answer.score:flaky", "succeeded"),
    ]
    assert engine.handle(run.run_id).scores().set_index("name")["value"].to_dict() == {
        "ok": 0.0,
        "flaky": 1.0,
    }
    engine.resume(run.run_id)  # nothing owed: nothing written
    assert len(db_rows(engine.state_dir, "SELECT 1 FROM attempts WHERE phase = 'score'")) == 4


def test_each_map_item_is_scored_alone(engine: Engine, helpers: Path) -> None:
    src = """
name: mapped
params:
  cities: {type: array, default: [Paris, Lyon, Nice]}
runners:
  scripted:
    rules:
      - match: "city (\\\\w+)"
        reply: "{{ groups[1] }}"
steps:
  - id: each
    map: "{{ params.cities }}"
    prompt: "city {{ item }}"
    score:
      - {name: same, equals: "{{ item }}"}
      - {name: where, python: "score_helpers:per_item"}
"""
    run = engine.run(src)

    assert run.status == "completed", run.reason
    assert _scores(run) == [
        ("each", "same", 0, 1.0, "equal", "succeeded"),
        ("each", "same", 1, 1.0, "equal", "succeeded"),
        ("each", "same", 2, 1.0, "equal", "succeeded"),
        ("each", "where", 0, 0.0, "Paris->Paris", "succeeded"),
        ("each", "where", 1, 1.0, "Lyon->Lyon", "succeeded"),
        ("each", "where", 2, 2.0, "Nice->Nice", "succeeded"),
    ]
    assert run.scores()["unit"].tolist()[:3] == [
        "each.score:same[0]",
        "each.score:same[1]",
        "each.score:same[2]",
    ]


def _edited(rubric: str) -> str:
    return (
        """
name: edit
"""
        + RULES
        + f"""
steps:
  - id: answer
    prompt: "the capital of France"
    score:
      - {{name: exact, equals: Paris}}
      - {{name: quality, judge: llm, rubric: "{rubric}", scale: [1, 5]}}
      - {{name: other, judge: llm, rubric: "Is it short?", scale: [1, 5]}}
"""
    )


def test_editing_only_a_rubric_re_pays_only_that_scorers_units(engine: Engine) -> None:
    first = engine.run(_edited("Is it right?"))
    second = engine.run(_edited("Is it right, really?"))

    assert first.run_id != second.run_id and second.status == "completed"
    rows = db_rows(
        engine.state_dir,
        "SELECT unit_id, status, charged FROM attempts WHERE run_id = ? ORDER BY attempt_pk",
        (second.run_id,),
    )
    assert rows == [
        ("answer", "reused", 0),
        ("answer.score:exact", "reused", 0),
        ("answer.score:quality", "succeeded", 0),  # the only unit measured again
        ("answer.score:other", "reused", 0),
    ]
    assert second.scores()["value"].tolist() == [1.0, 4.0, 4.0]


def test_scores_run_after_the_gate_accepts_and_never_on_a_blocked_step(engine: Engine) -> None:
    src = """
name: gated
params:
  want: {type: string, default: Paris}
steps:
  - id: answer
    prompt: "the capital"
    gate: {judge: expr, check: "output == params.want", max_loops: 1}
    score:
      - {name: exact, equals: "{{ params.want }}"}
"""
    blocked = engine.run(src)
    assert blocked.status == "blocked"
    assert blocked.scores().empty

    rules = src.replace("name: gated\n", "name: gated\n" + RULES)
    passed = engine.run(rules)
    assert passed.status == "completed"
    units = passed.journal()[["unit", "phase"]].values.tolist()
    assert units == [
        ["answer", "work"],
        ["answer.gate:l1", "gate"],
        ["answer.score:exact", "score"],
    ]


def test_a_charged_llm_scorer_counts_against_the_budget(engine: Engine) -> None:
    src = _rubric_flow({"value": 3, "explanation": "ok"}).replace(
        "scale: [1, 5]}", "scale: [1, 5], charged: true}"
    )
    run = engine.run(src)

    journal = run.journal().set_index("unit")
    assert bool(journal.loc["answer.score:quality", "charged"]) is True


def test_a_template_failing_to_render_fails_the_score_unit(engine: Engine) -> None:
    src = """
name: tmpl
params:
  data: {type: object, default: {}}
steps:
  - id: answer
    prompt: "Say something"
    score:
      - {name: exact, equals: "{{ params.data.missing }}"}
"""
    run = engine.run(src)

    assert run.status == "completed"
    frame = run.scores()
    assert frame["status"].tolist() == ["failed"]
    assert frame["explanation"].iloc[0].startswith("equals failed to render:")


def test_an_llm_rubric_against_a_loopback_openai_server(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_openai_env(monkeypatch, KEY_ENV, "sk-test-not-a-secret-0123456789")
    with FakeChatServer() as server:
        server.push_reply("Paris", prompt_tokens=5, completion_tokens=1)
        server.push_reply(
            '```json\n{"value": 0.75, "explanation": "close enough"}\n```',
            prompt_tokens=40,
            completion_tokens=9,
        )
        server.push(200, completion_body('{"value": 9, "explanation": "off the scale"}'))
        src = f"""
name: remote
runner: openai
runners:
  openai: {{type: openai, base_url: '{server.url}', api_key_env: {KEY_ENV}, model: small}}
steps:
  - id: answer
    prompt: "The capital of France?"
    score:
      - {{name: quality, judge: llm, rubric: "Is it the capital?", model: large}}
      - {{name: strict, judge: llm, rubric: "Is it exactly one word?", scale: [0, 1]}}
"""
        run = engine.run(src)
        sent = [(r.body["model"], r.prompt) for r in server.requests]

    assert run.status == "completed", run.reason
    assert [m for m, _ in sent] == ["small", "large", "small"]
    assert "Rubric: Is it the capital?" in sent[1][1] and "Output:\nParis" in sent[1][1]
    assert _scores(run)[0] == ("answer", "quality", None, 0.75, "close enough", "succeeded")
    strict = run.scores().set_index("name").loc["strict"]
    assert strict["status"] == "failed" and math.isnan(strict["value"])
    assert "judge value 9 is outside the scale [0, 1]" in strict["explanation"]
    journal = run.journal().set_index("unit")
    assert (
        journal.loc["answer.score:quality", "tokens_in"],
        journal.loc["answer.score:quality", "model"],
    ) == (40, "large")


# -- authoring errors --------------------------------------------------------------------------
BAD_SCORES = [
    (
        "{name: a}",
        "a score needs exactly one of equals, contains, regex, json_schema, judge, python (got none)",
    ),
    ("{name: a, equals: x, contains: y}", "(got equals, contains)"),
    (
        "{name: a, regex: x, ignore_case: true}",
        "`ignore_case:` is read only by `equals` and `contains` scores",
    ),
    ("{name: a, judge: llm}", "a `judge: llm` score needs `rubric:`"),
    (
        "{name: a, judge: llm, rubric: ok, scale: [5, 1]}",
        "expected `scale: [lo, hi]` with finite lo < hi",
    ),
    ("{name: a, equals: x, rubric: ok}", "`rubric:` is read only by `judge: llm` scores"),
    ("{name: a, contains: x, charged: true}", "`charged:` is read only by `judge: llm` scores"),
    ("{name: a, judge: human, rubric: ok}", "judge"),
    ("{name: 'a b', equals: x}", "name"),
    ("{name: a, regex: '(open'}", "invalid regex"),
    ("{name: a, regex: '(a+)+$'}", "regex '(a+)+$' may take exponential time"),
    ("{name: a, json_schema: {type: nothing}}", "invalid schema"),
    ("{name: a, judge: llm, rubric: ok, runner: nowhere}", "unknown runner 'nowhere'"),
    ("{name: a, equals: '{{ params.nope }}'}", "undeclared param 'nope'"),
    ("{name: a, equals: '{{ item }}'}", "unknown variable(s) ['item']"),
    ("{name: a, equals: '{{ steps.s.output }}'}", "refers to its own step 's'"),
    ("{name: a, equals: x, bogus: 1}", "bogus"),
    ("{name: a, python: 'no_such_module_xyz:f'}", "cannot import module 'no_such_module_xyz'"),
]


@pytest.mark.parametrize(("score", "message"), BAD_SCORES)
def test_a_bad_score_is_refused_when_the_workflow_is_frozen(score: str, message: str) -> None:
    src = f"name: bad\nsteps:\n  - id: s\n    prompt: hi\n    score:\n      - {score}\n"
    with pytest.raises(DefinitionError) as caught:
        load_workflow(src)
    assert message in str(caught.value)
    assert "line 6" in str(caught.value) or "score" in str(caught.value)


def test_two_scores_of_one_name_and_a_scored_route_are_refused() -> None:
    two = "name: bad\nsteps:\n  - id: s\n    prompt: hi\n    score:\n      - {name: a, equals: x}\n      - {name: a, contains: y}\n"
    with pytest.raises(
        DefinitionError, match=re.escape("score names must be unique within a step (twice: ['a'])")
    ):
        load_workflow(two)
    route = "name: bad\nsteps:\n  - id: r\n    route: {on: x, cases: {default: s}}\n    score: [{name: a, equals: x}]\n  - id: s\n    prompt: hi\n"
    with pytest.raises(DefinitionError, match="a route step takes no score"):
        load_workflow(route)


def test_a_plan_without_scores_keeps_its_hash() -> None:
    """Adding the score field did not change any existing plan's JSON (no plan_version bump)."""
    plan = load_workflow("name: same\nsteps:\n  - id: s\n    prompt: hi\n").plan_json
    assert '"score"' not in plan
    assert (
        load_workflow("name: same\nsteps:\n  - id: s\n    prompt: hi\n    score: []\n").plan_json
        == plan
    )


# -- the journal's phase ------------------------------------------------------------------------
def test_the_attempts_table_takes_phase_score_and_refuses_others(engine: Engine) -> None:
    engine.run(
        "name: p\nsteps:\n  - id: s\n    prompt: hi\n    score: [{name: a, contains: scripted}]\n"
    )
    engine.close()
    conn = sqlite3.connect(engine.state_dir / "state.db")
    try:
        assert conn.execute("SELECT DISTINCT phase FROM attempts ORDER BY phase").fetchall() == [
            ("score",),
            ("work",),
        ]
        insert = (
            "INSERT INTO attempts (run_id, workflow, step_id, unit_id, attempt, dispatch_id, phase,"
            " loop, runner, status, input_hash, charged, started_at) SELECT run_id, workflow,"
            " 's', 'x', 1, ?, ?, 1, 'r', 'running', 'h', 0, 0 FROM runs"
        )
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute(insert, ("d-x", "bogus"))
        conn.execute(insert, ("d-y", "score"))  # the phase m019 added is taken
        conn.rollback()
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()


# -- more places a score meets the drive ----------------------------------------------------------
def test_a_tolerant_map_scores_only_the_items_that_succeeded(engine: Engine) -> None:
    src = """
name: tolerant
runners:
  scripted:
    rules:
      - match: "item bad"
        error: permanent
steps:
  - id: each
    map: "{{ ['ok', 'bad', 'fine'] }}"
    prompt: "item {{ item }}"
    on_error: continue
    retry: {max_attempts: 1}
    score:
      - {name: said, contains: "item"}
"""
    run = engine.run(src)

    assert run.status == "completed", run.reason
    assert run.scores()["unit"].tolist() == ["each.score:said[0]", "each.score:said[2]"]


def test_a_no_cache_run_measures_its_scores_again(engine: Engine) -> None:
    src = _rubric_flow({"value": 2, "explanation": "meh"})
    engine.run(src)
    again = engine.run(src, new=True, no_cache=True)

    statuses = db_rows(
        engine.state_dir,
        "SELECT status FROM attempts WHERE run_id = ? AND phase = 'score'",
        (again.run_id,),
    )
    assert statuses == [("succeeded",)]


def test_a_python_scorer_is_reused_only_under_the_same_params(
    engine: Engine, helpers: Path
) -> None:
    src = """
name: byparams
params:
  n: {type: integer}
steps:
  - id: answer
    prompt: "fixed prompt"
    score:
      - {name: mine, python: "score_helpers:score"}
"""
    engine.run(src, params={"n": 1})
    other = engine.run(src, params={"n": 2})  # same output, other params: measured again
    same = engine.run(src, params={"n": 1}, new=True)  # same params: reused

    def status(run_id: str) -> list[tuple[object, ...]]:
        sql = "SELECT status FROM attempts WHERE run_id = ? AND phase = 'score'"
        return db_rows(engine.state_dir, sql, (run_id,))

    assert status(other.run_id) == [("succeeded",)]
    assert status(same.run_id) == [("reused",)]


def test_a_charged_scorer_the_budget_refuses_stays_owed_and_the_run_completes(
    engine: Engine,
) -> None:
    src = """
name: tight
budget: {max_units: 1}
steps:
  - id: answer
    prompt: "Say something"
    score:
      - {name: quality, judge: llm, rubric: "Is it good?", scale: [0, 1], charged: true}
"""
    run = engine.run(src)

    assert run.status == "completed", run.reason
    assert run.scores().empty  # never dispatched: no unit, no zero
    warnings = [
        json.loads(d)["message"]
        for (d,) in db_rows(engine.state_dir, "SELECT data_json FROM events WHERE kind = 'warning'")
    ]
    assert any("answer.score:quality" in w and "max_units" in w for w in warnings), warnings


def test_a_secret_param_in_a_score_never_reaches_the_journal(engine: Engine) -> None:
    secret = "hunter2-correct-horse-battery-staple"
    src = """
name: secretive
params:
  api_token: {type: string}
runners:
  scripted:
    rules:
      - match: "."
        reply: "the answer"
steps:
  - id: answer
    prompt: "Say it"
    score:
      - {name: leak, equals: "{{ params.api_token }}"}
      - {name: has, contains: "{{ params.api_token }}"}
"""
    run = engine.run(src, params={"api_token": secret})

    assert run.status == "completed", run.reason
    assert run.scores()["value"].tolist() == [0.0, 0.0]
    engine.close()
    dump = "\n".join(sqlite3.connect(engine.state_dir / "state.db").iterdump())
    assert secret not in dump


def test_a_child_workflow_step_is_scored_on_its_result(engine: Engine) -> None:
    src = """
name: parent
steps:
  - id: sub
    workflow: kid
    score:
      - {name: came, contains: "scripted reply"}
---
name: kid
steps:
  - id: k
    prompt: "anything"
"""
    run = engine.run(src)

    assert run.status == "completed", run.reason
    assert run.scores()[["unit", "value"]].values.tolist() == [["sub.score:came", 1.0]]


def test_the_scripted_runner_with_no_rule_rates_at_the_scales_low_end(engine: Engine) -> None:
    src = """
name: offline
steps:
  - id: answer
    prompt: "Say something"
    score:
      - {name: q, judge: llm, rubric: "Is it good?", scale: [2, 7]}
"""
    run = engine.run(src)

    frame = run.scores()
    assert (frame["status"].tolist(), frame["value"].tolist()) == (["succeeded"], [2.0])


def test_a_fork_takes_the_scores_before_its_fork_step_from_its_source(engine: Engine) -> None:
    src = """
name: forked
steps:
  - id: first
    prompt: "one"
    score:
      - {name: q, judge: llm, rubric: "Is it good?", scale: [0, 1]}
  - id: second
    prompt: "two"
    score:
      - {name: q, judge: llm, rubric: "Is it good?", scale: [0, 1]}
"""
    source = engine.run(src, no_cache=True)
    fork = engine.drive(engine.fork(source.run_id, from_step="second"))

    rows = db_rows(
        engine.state_dir,
        "SELECT unit_id, status FROM attempts WHERE run_id = ? AND phase = 'score'"
        " ORDER BY attempt_pk",
        (fork.run_id,),
    )
    assert rows == [("first.score:q", "reused"), ("second.score:q", "reused")]


def test_a_per_item_gate_scores_each_item_on_the_output_it_accepted(engine: Engine) -> None:
    src = """
name: itemgated
runners:
  scripted:
    rules:
      - match: "fixed"
        reply: "GOOD"
      - match: "item b"
        reply: "bad"
      - match: "item a"
        reply: "GOOD"
steps:
  - id: each
    map: "{{ ['a', 'b'] }}"
    prompt: "item {{ item }}{% if gate.feedback %} fixed{% endif %}"
    gate: {judge: expr, check: "output == 'GOOD'", per_item: true, max_loops: 2, criteria: [good]}
    score:
      - {name: good, equals: GOOD}
"""
    run = engine.run(src)

    assert run.status == "completed", run.reason
    assert _scores(run) == [
        ("each", "good", 0, 1.0, "equal", "succeeded"),
        ("each", "good", 1, 1.0, "equal", "succeeded"),
    ]
    loops = run.journal().set_index("unit")["loop"]
    assert (loops["each.score:good[1]"], loops["each.score:good[0]"]) == (2, 2)


MAP_PICKY = """
name: picky
params:
  cities: {type: array, default: [Paris, Lyon, Nice]}
  style: {type: string, default: plain}
runners:
  scripted:
    rules:
      - match: "city (\\\\w+)"
        reply: "{{ groups[1] }}"
steps:
  - id: each
    map: "{{ params.cities }}"
    prompt: "city {{ item }} ({{ params.style }})"
    score:
      - {name: ok, python: "score_helpers:picky"}
"""


def test_a_map_cell_with_a_failed_item_score_is_missing_and_the_sweep_measures_it_again(
    engine: Engine, helpers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell's value over a map is the mean of all its items' scores: while one item's
    score failed the cell is NaN (counted ``missing``), never the mean of the items that
    happened to succeed; running the sweep again (or resuming it) measures the failed unit
    again, as a run's resume does."""
    flag = tmp_path / "broken"
    flag.write_text("1")
    monkeypatch.setenv("SCORE_FLAG", str(flag))
    sweep = engine.sweep(MAP_PICKY, grid={"style": ["plain", "terse"]})
    assert (sweep.status, sweep.status_reason) == (
        "completed",
        f"2 cell(s) hold a score that failed (NaN in the frame); `wf sweep-resume "
        f"{sweep.sweep_id}` measures them again",
    )
    assert sweep.frame()["score.each.ok"].isna().tolist() == [True, True]
    table = sweep.summary(by="style")
    assert (list(table["n"]), list(table["missing"])) == ([0, 0], [1, 1])

    flag.unlink()
    again = engine.sweep(MAP_PICKY, grid={"style": ["plain", "terse"]})
    assert again.sweep_id == sweep.sweep_id
    assert again.frame()["score.each.ok"].tolist() == [1.0, 1.0]
    assert (again.status, again.status_reason) == ("completed", None)
    failed = db_rows(
        engine.state_dir,
        "SELECT COUNT(*) FROM attempts WHERE phase = 'score' AND status = 'failed'",
    )
    assert failed == [(2,)]  # one per cell, measured again once each
    remeasured = db_rows(
        engine.state_dir,
        "SELECT COUNT(*) FROM attempts WHERE phase = 'score' AND unit_id = 'each.score:ok[1]'",
    )
    assert remeasured == [(4,)]
    assert engine.sweep_resume(sweep.sweep_id).frame()["score.each.ok"].tolist() == [1.0, 1.0]
    assert db_rows(engine.state_dir, "SELECT COUNT(*) FROM attempts WHERE phase = 'score'") == [
        (8,)
    ]  # nothing owed any more: nothing measured


def test_a_python_scorer_may_return_numpy_numbers_and_name_its_first_argument(
    engine: Engine, helpers: Path
) -> None:
    src = """
name: numbers
steps:
  - id: answer
    prompt: "Say something"
    score:
      - {name: count, python: "score_helpers:numpyish"}
      - {name: half, python: "score_helpers:halves"}
      - {name: named, python: "score_helpers:named"}
"""
    run = engine.run(src)
    assert run.status == "completed", run.reason
    rows = run.scores().set_index("name")
    assert rows["status"].tolist() == ["succeeded"] * 3, rows["explanation"].tolist()
    assert rows.loc["count", "value"] in (3.0, 1.0)
    assert rows.loc["half", "value"] == 0.5
    assert rows.loc["named", "explanation"] == "index,item,params"
