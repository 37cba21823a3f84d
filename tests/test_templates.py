"""The Jinja sandbox: resource limits on ranges, repetition, output, loops and render time."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic import templates
from wf_magic.templates import TemplateError, evaluate, evaluate_expression, render_text


def _refused(source: str, match: str) -> None:
    started = time.monotonic()
    with pytest.raises(TemplateError, match=match) as info:
        evaluate(source, {"params": {}})
    assert time.monotonic() - started < templates.MAX_RENDER_S + 2
    assert "\n" not in str(info.value)
    assert len(str(info.value)) < 400


def test_range_is_capped() -> None:
    assert evaluate("{{ range(100000) | length }}", {}) == 100_000
    _refused("{{ range(100001) | length }}", r"range of 100001 items; at most 100000")
    _refused("{{ range(10**9) | length }}", r"range of 1000000000 items")


def test_nested_range_loops_stop_at_the_loop_budget() -> None:
    _refused(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        r"more than 1000000 loop iterations and calls",
    )


def test_string_repetition_is_bounded() -> None:
    assert len(render_text("{{ 'ab' * 1000 }}", {})) == 2000
    _refused("{{ 'x' * 10**10 }}", r"repetition would make 10000000000 items")
    _refused("{{ [1, 2] * 10**9 }}", r"repetition would make 2000000000 items")


def test_nested_list_repetition_counts_every_item() -> None:
    _refused("{{ [[[1] * 1000] * 1000] * 1000 }}", r"would make")


def test_huge_powers_are_refused() -> None:
    assert evaluate("{{ 2 ** 10 }}", {}) == 1024
    _refused("{{ 10 ** 100000000 }}", r"power would have about")


def test_rendered_output_is_capped() -> None:
    _refused(
        "{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}",
        r"more than 1000000 characters",
    )


def test_literal_text_in_a_macro_loop_counts_toward_the_output_cap() -> None:
    body = "y" * 500
    _refused(
        "{% macro m() %}{% for i in range(10000) %}" + body + "{% endfor %}{% endmacro %}"
        "{% set x = m() %}ok",
        r"more than 1000000 characters",
    )


def test_namespace_doubling_is_refused() -> None:
    _refused(
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        r"more than 1000000",
    )


def test_recursive_macro_doubling_is_refused() -> None:
    _refused(
        "{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% else %}{{ s | length }}"
        "{% endif %}{% endmacro %}{{ f('x', 40) }}",
        r"more than 1000000",
    )


def test_padding_methods_and_filters_are_bounded() -> None:
    _refused("{{ 'x'.center(10**9) }}", r"10\*\*9|1000000000")
    _refused("{{ 'x' | center(10**9) }}", r"1000000000")
    _refused("{{ ('x\\n' * 400000) | indent(100) }}", r"more than 1000000")
    _refused("{{ ('x' * 100000).replace('x', 'y' * 1000) }}", r"more than 1000000")
    _refused("{{ ('x' * 1000) | replace('x', 'y' * 10000) }}", r"more than 1000000")
    _refused("{{ ('x' * 100000) | join('y' * 1000) }}", r"more than 1000000")
    _refused("{{ '{:>999999999}'.format(1) }}", r"format width")
    _refused("{{ '%999999999d' % 1 }}", r"format width")
    _refused("{{ [1] | batch(10**9, 0) | list }}", r"1000000000")
    _refused("{{ lipsum(10**9) }}", r"lipsum")


def test_deep_recursion_is_a_template_error() -> None:
    _refused("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", r"recurs")


def test_deeply_nested_expressions_are_a_template_error() -> None:
    with pytest.raises(TemplateError, match="nest"):
        templates.references("{{ " + "(" * 2000 + "1" + ")" * 2000 + " }}")


def test_expression_results_are_bounded() -> None:
    with pytest.raises(TemplateError, match="would make"):
        evaluate_expression("'x' * 2000000", {})


def test_ordinary_templates_still_render() -> None:
    ctx = {"params": {"items": [1, 2, 3]}, "steps": {}}
    assert render_text("{% for x in params.items %}{{ x }},{% endfor %}", ctx) == "1,2,3,"
    assert evaluate("{{ params.items | map('string') | join('-') }}", ctx) == "1-2-3"
    assert evaluate("{{ 'a'.center(5) }}", ctx) == "  a  "
    assert evaluate("{{ '{:>4}'.format(7) }}", ctx) == "   7"
    assert evaluate("{{ '%3d' % 7 }}", ctx) == "  7"
    assert evaluate("{{ [1, 2] + [3] }}", ctx) == [1, 2, 3]
    assert evaluate("{{ 'ab' ~ 'cd' }}", ctx) == "abcd"
    ns = "{% set ns = namespace(n=0) %}{% for i in range(5) %}{% set ns.n = ns.n + i %}"
    assert render_text(ns + "{% endfor %}{{ ns.n }}", ctx) == "10"
    assert render_text("{% for x in params.items %}{{ loop.index }}{% endfor %}", ctx) == "123"


def test_limits_are_per_render_not_per_process() -> None:
    for _ in range(3):
        assert len(render_text("{% for i in range(10000) %}{{ i }}{% endfor %}", {})) == 38890


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_text_without_a_delimiter_renders_as_jinja_renders_it(source: str) -> None:
    """The no-delimiter fast path gives what compiling the text with Jinja gives (the
    generator mixes braces, newlines of every kind and Jinja's own syntax in)."""
    source = source.replace("x", "{").replace("y", "\r")
    try:
        expected: str | Exception = templates._env.from_string(source).render()
    except Exception as exc:  # noqa: BLE001  (a syntax error must stay one)
        expected = exc
    if isinstance(expected, Exception):
        with pytest.raises(TemplateError):
            render_text(source, {})
    else:
        assert render_text(source, {}) == expected


def test_literal_text_past_the_output_cap_is_refused() -> None:
    with pytest.raises(TemplateError, match="renders more than"):
        render_text("a" * (templates.MAX_OUTPUT + 1), {})
