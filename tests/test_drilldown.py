"""Drill-down in the live run view: a step row opens its units, loop by loop.

A click on a row's toggle reads the journal (never a redraw): each unit's input (the
rendered prompt with its gate feedback block), output, the gate's verdict and the diff to
the previous loop; a map step lists its units coloured by status, and a click opens one.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers_notebook import JUDGED, driven_view, engine_at
from wf_magic import Engine
from wf_magic.display import STATUS_COLOURS
from wf_magic.notebook.detail import MAP_BUTTONS, StepDetail
from wf_magic.notebook.widgets import RunView

SHORT_FIRST = JUDGED.replace(
    "steps:\n", '      - match: "^Write"\n        reply: "short"\nsteps:\n', 1
)
"""The judged workflow whose loop-1 draft is the text ``short``."""

MAPPED = """\
name: mapped
runner: scripted
runners:
  scripted:
    rules:
      - match: "odd"
        error: permanent
      - match: "^Section"
        reply: "text of {0}"
steps:
  - id: sections
    map: "{{ ['intro', 'odd one', 'results'] }}"
    prompt: "Section {{ item }}"
    on_error: continue
"""


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    yield from engine_at(tmp_path / "state")


def detail_of(view: RunView, step_id: str) -> StepDetail:
    detail = view.rows[step_id].detail
    assert detail is not None
    return detail


def test_clicking_a_row_shows_loop_2s_exact_prompt_with_its_feedback_and_the_diff(
    engine: Engine,
) -> None:
    run_id, view = driven_view(engine, SHORT_FIRST)
    second = engine.handle(run_id).attempt("draft", attempt=2)
    assert second.loop == 2 and second.input is not None
    prompt = second.input["prompt"]
    assert "Gate feedback (loop 1 was rejected):" in prompt

    view.rows["draft"].toggle.value = True  # the click
    detail = detail_of(view, "draft")
    shown = detail.unit_view.value

    assert detail.is_open
    assert html.escape(prompt, quote=False) in shown
    assert shown.index("<b>loop 1</b>") < shown.index("<b>loop 2</b>")
    assert "gate rejected</b> (llm): far too short<div>missing: an example</div>" in shown
    assert "gate passed</b> (llm)" in shown
    assert "<pre style='white-space:pre-wrap'>short</pre>" in shown
    assert "<pre style='white-space:pre-wrap'>a long and detailed draft</pre>" in shown
    assert "changes since loop 1" in shown and "class='wf-diff'" in shown
    assert html.escape("+Gate feedback (loop 1 was rejected):", quote=False) in shown
    assert html.escape("+a long and detailed draft", quote=False) in shown
    assert html.escape("-short", quote=False) in shown


def test_the_drill_down_reads_the_journal_on_click_not_on_redraw(engine: Engine) -> None:
    _run_id, view = driven_view(engine, SHORT_FIRST)
    detail = detail_of(view, "draft")
    for _ in range(3):
        view.redraw()
    assert detail.loads == 0 and detail.unit_view.value == ""
    view.rows["draft"].toggle.value = True
    view.redraw()
    assert detail.loads == 1
    view.rows["draft"].toggle.value = False
    assert not detail.is_open
    assert view.rows["draft"].toggle.icon == "chevron-right"


def test_a_map_step_lists_its_units_coloured_by_status(engine: Engine) -> None:
    _run_id, view = driven_view(engine, MAPPED)
    view.rows["sections"].toggle.value = True
    detail = detail_of(view, "sections")

    # A unit's colour is its status class, which the panel's own CSS colours.
    listed = [(b.description, b._dom_classes[-1]) for b in detail.units.children]
    assert listed == [
        ("sections[0]", "wf-sc-succeeded"),
        ("sections[1]", "wf-sc-failed"),
        ("sections[2]", "wf-sc-succeeded"),
    ]
    for status in ("succeeded", "failed"):
        assert f".wf-sc-{status}{{background:{STATUS_COLOURS[status]}" in detail.counts.value
    assert "<b>3 units</b>" in detail.counts.value
    assert "1 failed" in detail.counts.value and "2 succeeded" in detail.counts.value
    assert detail.unit_view.value == ""  # nothing opened yet

    detail.units.children[1].click()
    shown = detail.unit_view.value
    assert "<code>sections[1]</code>" in shown
    assert "Section odd one" in shown
    assert "scripted permanent error" in shown

    detail.units.children[2].click()
    assert "Section results" in detail.unit_view.value


def test_a_big_map_lists_its_first_units_and_finds_the_others(engine: Engine) -> None:
    _run_id, view = driven_view(
        engine,
        """\
name: big
runner: scripted
steps:
  - id: fan
    map: "{{ range(250) | list }}"
    prompt: "unit {{ item }}"
""",
    )
    view.rows["fan"].toggle.value = True
    detail = detail_of(view, "fan")
    assert len(detail.units.children) == MAP_BUTTONS
    assert detail.finder.layout.display == ""
    assert len(detail.finder.options) == 250
    detail.finder.value = "fan[249]"
    assert "unit 249" in detail.unit_view.value


PER_ITEM = """\
name: per-item-view
runner: scripted
runners:
  scripted:
    rules:
      - match: "Gate feedback"
        reply: "ok fixed"
      - match: "^Do 1"
        reply: "bad"
      - match: "^Do"
        reply: "ok"
steps:
  - id: m
    map: "{{ [0, 1] }}"
    prompt: "Do {{ item }}"
    gate: {per_item: true, judge: expr, check: "output.startswith('ok')", criteria: [ok],
           max_loops: 2}
"""


def test_a_per_item_gates_unit_shows_its_own_items_verdict(engine: Engine) -> None:
    _run_id, view = driven_view(engine, PER_ITEM)
    view.rows["m"].toggle.value = True
    detail = detail_of(view, "m")

    detail.units.children[0].click()
    first = detail.unit_view.value
    assert first.count("gate passed") == 1 and "gate rejected" not in first

    detail.units.children[1].click()
    second = detail.unit_view.value
    assert second.count("gate rejected") == 1 and second.count("gate passed") == 1
