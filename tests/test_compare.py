"""Two runs side by side: `run.compare`, `engine.compare`, `wf compare`, `%workflow compare`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wf_magic import Engine, UsageError

from .conftest import wf_inproc

BASE = """
name: cmp
params:
  items: {type: array, default: [a, b]}
  want: {type: string, default: polished}
runners:
  scripted:
    rules:
      - {match: "Gate feedback", reply: "polished well"}
      - {match: "^Polish", reply: "polished"}
      - {match: "^Draft", reply: "draft"}
      - {match: "^Intro", reply: "intro"}
steps:
  - id: intro
    prompt: "Intro INTRO_TEXT"
  - id: draft
    map: "{{ params.items }}"
    prompt: "Draft {{ item }}"
  - id: polish
    prompt: "Polish the draft"
    gate: {judge: expr, check: "output == params.want", criteria: ["polish it well"], max_loops: 3}
"""


def _runs(engine: Engine) -> tuple[str, str]:
    first = engine.run(BASE.replace("INTRO_TEXT", "please"))
    second = engine.run(
        BASE.replace("INTRO_TEXT", "briefly"),
        params={"items": ["a", "b", "c"], "want": "polished well"},
    )
    assert (first.status, second.status) == ("completed", "completed")
    return first.run_id, second.run_id


def test_compare_lists_exactly_the_edited_the_added_and_the_looped_unit(engine: Engine) -> None:
    a, b = _runs(engine)
    comparison = engine.compare(a, b)
    kinds = {u.unit_id: u.change for u in comparison.units}
    assert kinds == {
        "intro": "changed",
        "draft[0]": "reused",
        "draft[1]": "reused",
        "draft[2]": "new",
        "polish": "changed",
    }
    assert [u.unit_id for u in comparison.differing()] == ["intro", "draft[2]", "polish"]
    assert comparison.counts() == {
        "changed": 2,
        "new": 1,
        "removed": 0,
        "reused": 2,
        "unchanged": 0,
    }


def test_each_unit_carries_both_runs_loops_and_paid_tokens(engine: Engine) -> None:
    a, b = _runs(engine)
    units = {u.unit_id: u for u in engine.compare(a, b).units}
    polish = units["polish"]
    assert [(lp.loop, lp.output) for lp in polish.before] == [(1, "polished")]
    assert [(lp.loop, lp.status, lp.output) for lp in polish.after] == [
        (1, "reused", "polished"),
        (2, "succeeded", "polished well"),
    ]
    journal_a = engine.journal(a)
    journal_b = engine.journal(b)

    def paid(frame, unit: str) -> int:  # type: ignore[no-untyped-def]
        rows = frame[(frame.unit == unit) & (frame.phase == "work") & (frame.status != "reused")]
        return int((rows.tokens_in + rows.tokens_out).sum())

    for unit in ("intro", "draft[2]", "polish", "draft[0]"):
        assert units[unit].tokens_before == paid(journal_a, unit)
        assert units[unit].tokens_after == paid(journal_b, unit)
    assert units["draft[0]"].tokens_after == 0
    assert units["draft[0]"].tokens_reused == units["draft[0]"].tokens_before > 0
    assert units["draft[2]"].before == () and units["draft[2]"].tokens_before == 0


def test_a_run_compared_with_itself_differs_nowhere(engine: Engine) -> None:
    a, _ = _runs(engine)
    comparison = engine.handle(a).compare(a)
    assert comparison.differing() == []
    assert comparison.tokens_delta == 0
    assert "(no unit differs; --all lists every unit)" in comparison.text()


def test_removed_units_are_listed_when_the_later_run_has_fewer(engine: Engine) -> None:
    a, b = _runs(engine)
    kinds = {u.unit_id: u.change for u in engine.compare(b, a).units}
    assert kinds["draft[2]"] == "removed"
    assert engine.compare(b, a).units[-1].unit_id == "draft[2]"


def test_the_frame_has_one_row_per_unit_with_outputs_and_deltas(engine: Engine) -> None:
    a, b = _runs(engine)
    frame = engine.compare(a, b).frame()
    assert list(frame.unit) == ["intro", "draft[0]", "draft[1]", "draft[2]", "polish"]
    row = frame.set_index("unit").loc["polish"]
    assert (row.loops_a, row.loops_b, row.output_a, row.output_b) == (
        1,
        2,
        "polished",
        "polished well",
    )
    assert int(row.tokens_delta) == int(row.tokens_b) - int(row.tokens_a)
    assert str(frame.cost_delta.dtype) == "float64"


def test_text_and_html_show_both_outputs_side_by_side(engine: Engine) -> None:
    a, b = _runs(engine)
    comparison = engine.compare(a, b)
    text = comparison.text()
    assert text.splitlines()[0] == (
        f"compare {a} → {b}: 2 changed, 1 new, 0 removed, 2 reused, 0 unchanged; "
        f"tokens {comparison.tokens_delta:+d} paid"
    )
    assert "  l2  —" in text and "│ polished well" in text
    assert "draft[0]" not in text  # reused units are counted, not listed
    assert "draft[0]" in engine.compare(a, b, show_all=True).text()
    page = comparison._repr_html_()
    assert "<table" in page and "polished well" in page and "rowspan='2'" in page


def test_wf_compare_prints_text_or_json(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    with Engine(state_dir) as engine:
        a, b = _runs(engine)
    text = wf_inproc(capsys, state_dir, "compare", a, "cmp")  # a name: its newest run
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"compare {a} → {b}: 2 changed")
    out = wf_inproc(capsys, state_dir, "compare", a, b, "--format", "json")
    rows = json.loads(out.stdout)
    assert [r["change"] for r in rows] == ["changed", "reused", "reused", "new", "changed"]
    missing = wf_inproc(capsys, state_dir, "compare", a, "r-nope")
    assert missing.returncode == 2 and "r-nope" in missing.stderr


def test_compare_refuses_an_unknown_run(engine: Engine) -> None:
    a, _ = _runs(engine)
    with pytest.raises(UsageError, match="r-missing"):
        engine.handle(a).compare("r-missing")
