"""The scripted runner's ``match`` regexes cannot hang a drive (catastrophic backtracking).

Python's ``re`` holds the GIL while it backtracks, so no timeout stops a search that started:
a pattern that could blow up is refused when the plan is frozen, naming the rule, and a
pattern that may take quadratic time searches bounded texts only. Every example below ends in
a clean error or a bounded result; the hostile-workflow suite's alarm turns a search that
would hang into a failure (``re`` checks signals while it backtracks in the main thread,
where these searches run).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_hostile_workflows import _deadline
from wf_magic import Engine
from wf_magic.errors import DefinitionError, RunnerError
from wf_magic.runners.base import RunnerContext, UnitRequest
from wf_magic.runners.scripted import QUADRATIC_TEXT_CHARS, ScriptedRunner

HANG_S = 60
"""A single example past this is a hang (the alarm's generous bound, not a timing check)."""

CLASSICS = [
    "(a+)+$",
    "(a*)*b",
    "(a|a)*b",
    "(a|aa)+$",
    r"(\w+\s?)+$",
    "(.*a){12}",
    "(a?){25}a{25}",
    "a?" * 25 + "a" * 25,
    "a*a*a*b",
    ".*a.*a.*b",
    r"(.*)\1b",
    r"^(\w+)*$",
    "(?:a{1,50}){1,50}b",
]
"""Patterns known to backtrack catastrophically on a long run of ``a``s."""

_atoms = st.sampled_from(["a", "b", ".", r"\w", r"\d", "[ab]", "[^!]", "(a|a)", "(?:ab|a)"])
_quantifiers = st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,30}", "{3,}", "*?", "+?"])
_pieces = st.recursive(
    st.tuples(_atoms, _quantifiers).map("".join),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, _quantifiers).map(lambda t: f"(?:{t[0]}){t[1]}"),
        st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
    ),
    max_leaves=6,
)
hostile_patterns = st.one_of(
    st.sampled_from(CLASSICS),
    st.tuples(st.sampled_from(["", "^", r"\A"]), _pieces, st.sampled_from(["", "$", "!"])).map(
        "".join
    ),
)
hostile_prompts = st.builds(
    lambda n, tail: "a" * n + tail,
    st.one_of(st.integers(0, 2_000), st.just(QUADRATIC_TEXT_CHARS + 1)),
    st.sampled_from(["", "!", "b", "ab!"]),
)


def _runner(pattern: str) -> ScriptedRunner:
    """The runner a plan's ``runners: {scripted: {rules: [...]}}`` builds."""
    ctx = RunnerContext(
        name="scripted",
        options={"rules": [{"match": pattern, "reply": "hit"}]},
        state_dir="",
        workflow="w",
    )
    return ScriptedRunner.from_context(ctx)


def _ask(runner: ScriptedRunner, prompt: str) -> object:
    request = UnitRequest(
        run_id="r", step_id="s", unit_id="s", dispatch_id="d", attempt=1, kind="prompt",
        prompt=prompt,
    )  # fmt: skip
    return runner.run(request).output


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(pattern=hostile_patterns, prompt=hostile_prompts)
def test_a_hostile_match_is_refused_naming_its_rule_or_answers_in_bounded_time(
    pattern: str, prompt: str
) -> None:
    with _deadline(HANG_S):
        try:
            runner = _runner(pattern)
        except RunnerError as exc:
            said = str(exc)
            assert said.startswith("runner 'scripted': scripted rule 0: ")
            assert any(why in said for why in ("exponential time", "to the power", "ways of"))
            return
        limit = runner.rules[0].text_limit
        if limit is not None and len(prompt) > limit:
            with pytest.raises(RunnerError, match=r"quadratic in the text's length") as info:
                _ask(runner, prompt)
            assert not info.value.transient  # the same prompt would fail the same way
            return
        output = _ask(runner, prompt)
        assert (output == "hit") == (re.search(pattern, prompt) is not None)


@pytest.mark.parametrize("pattern", CLASSICS)
def test_every_classic_catastrophic_pattern_is_refused_at_freeze_naming_the_rule(
    pattern: str, tmp_path: Path
) -> None:
    source = (
        "name: w\nrunners:\n  scripted:\n    rules:\n      - {match: 'never', reply: x}\n"
        f"      - {{match: '{pattern}', reply: x}}\nsteps:\n  - id: a\n    prompt: hi\n"
    )
    engine = Engine(tmp_path / "state")
    try:
        with pytest.raises(DefinitionError, match=r"scripted rule 1: match '") as info:
            engine.load(source)
        assert info.value.field == "runners.scripted"
        assert engine.list_runs() == []
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("pattern", "text_limit"),
    [
        ("^Outline", None),
        ("(?s)^Judge.*long and detailed", None),
        (r"^kid a (\w+) (\d)", None),
        ("Gate feedback", None),
        ("(?s)Judge.*better", QUADRATIC_TEXT_CHARS),
        (r"^Announce (\S+): (.*)", QUADRATIC_TEXT_CHARS),
        (r"\w+\W", QUADRATIC_TEXT_CHARS),
    ],
)
def test_everyday_patterns_are_kept_and_only_quadratic_ones_get_a_text_limit(
    pattern: str, text_limit: int | None
) -> None:
    assert _runner(pattern).rules[0].text_limit == text_limit


def test_a_linear_pattern_searches_a_prompt_of_any_length() -> None:
    runner = _runner("(?s)^Judge.*long and detailed")
    assert _ask(runner, "Judge " + "x" * 200_000 + " long and detailed") == "hit"


def test_a_quadratic_pattern_over_a_long_prompt_fails_the_attempt_naming_the_limit() -> None:
    runner = _runner(r"\w+\W")
    with pytest.raises(RunnerError) as info:
        _ask(runner, "a" * 50_000)
    assert str(info.value) == (
        r"scripted rule /\w+\W/ may take time quadratic in the text's length, and this one has "
        r"50,000 characters (over 10,000); anchor the pattern with ^ or \A, or drop a repeat"
    )
    assert _ask(runner, "a" * 5_000 + "!") == "hit"
