"""One token story: paid, reused and judge read the same in every view of one run."""

from __future__ import annotations

from pathlib import Path

import pytest

from wf_magic import Engine
from wf_magic.display import TokenSplit, run_html, token_text
from wf_magic.plots import token_chart

from .conftest import wf_inproc
from .helpers_notebook import view_of

STORY = """
name: story
runner: scripted
runners:
  scripted:
    rules:
      - {match: "Judge", kind: judge, reply: {complete: true, feedback: "", missing: []},
         tokens_in: 50, tokens_out: 5}
      - {match: "^Draft", reply: drafted, tokens_in: 8, tokens_out: 2}
      - {match: "^Sum", reply: summed, tokens_in: 20, tokens_out: 4}
steps:
  - id: draft
    map: "{{ ['a', 'b', 'c'] }}"
    prompt: "Draft {{ item }}"
    gate: {judge: llm, criteria: [complete]}
  - id: wrap
    prompt: "Sum up WHAT"
"""


def test_the_same_run_reads_the_same_in_all_five_views(
    engine: Engine, capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    engine.run(STORY.replace("WHAT", "the drafts"))
    run_id = engine.start(STORY.replace("WHAT", "it all"), params={}).run_id
    view = view_of(engine, run_id)
    engine.drive(run_id)
    view.flush()
    # The drafts and their verdict are reused (30 + 55 first cost); the new wrap is paid.
    expected = TokenSplit(paid=24, reused=85, judge=0)
    text = token_text(expected)
    assert text == "24 paid · 85 reused"

    frame = engine.tokens(run_id, by="step")  # 1. tokens()
    assert (
        token_text(
            TokenSplit(
                paid=int(frame.tokens_paid.sum()),
                reused=int(frame.tokens_reused.sum()),
                judge=int(frame.tokens_judge.sum()),
            )
        )
        == text
    )
    assert view.run_tokens_label.value == f"· run tokens: {text}"  # 2. the live view
    assert view.rows["wrap"].tokens.value == "24 paid"
    assert view.rows["draft"].tokens.value == "0 paid · 85 reused"
    assert f"tokens — {text}" in run_html(engine.status(run_id))  # 3. the static view
    status = wf_inproc(capsys, state_dir, "status", run_id)  # 4. wf status
    assert f"  tokens: {text}" in status.stdout.splitlines()
    assert "tokens 0 paid · 85 reused" in status.stdout
    (ax,) = token_chart(engine.status(run_id)).axes  # 5. the chart
    assert ax.get_title().endswith(f"tokens by step: {text}")
    assert engine.status(run_id).budget_use().tokens == expected.paid


def test_an_uncharged_judge_reads_as_judge_and_a_charged_one_as_paid(engine: Engine) -> None:
    free = engine.run(STORY.replace("WHAT", "x"))
    frame = engine.tokens(free.run_id, by="step")
    assert frame.set_index("step").loc["draft", ["tokens_paid", "tokens_judge"]].tolist() == [
        30,
        55,
    ]
    charged = engine.run(
        STORY.replace("WHAT", "y").replace(
            "criteria: [complete]", "criteria: [done], charged: true"
        )
    )
    frame = engine.tokens(charged.run_id, by="step")
    assert frame.set_index("step").loc["draft", ["tokens_paid", "tokens_judge"]].tolist() == [
        0 + 55,  # the drafts are reused from the first run; the new criteria's judge is paid
        0,
    ]
    assert "tokens: 79 paid · 30 reused" in engine.status(charged.run_id).__repr__()


def test_the_budget_frame_tells_the_same_token_story(engine: Engine) -> None:
    free = engine.run(STORY.replace("WHAT", "x"))  # 3 drafts (30) + wrap (24) paid; judge 55
    frame = engine.budget(free.run_id).set_index("ceiling")
    status = engine.status(free.run_id)
    assert f"tokens: {token_text(TokenSplit(paid=54, reused=0, judge=55))}" in repr(status)
    tokens = frame.loc["tokens"]
    assert (tokens["used"], tokens["saved"], tokens["judge"]) == (54.0, 0.0, 55.0)
    assert frame.loc["units", "judge"] == 1.0  # one uncharged verdict over the three drafts
    assert frame.loc["units", "used"] == 4.0

    again = engine.run(STORY.replace("WHAT", "y"))  # drafts + verdict reused; a new wrap
    tokens = engine.budget(again.run_id).set_index("ceiling").loc["tokens"]
    assert (tokens["used"], tokens["saved"], tokens["judge"]) == (24.0, 85.0, 0.0)
    assert "tokens: 24 paid · 85 reused" in repr(engine.status(again.run_id))

    charged = engine.run(
        STORY.replace("WHAT", "z").replace(
            "criteria: [complete]", "criteria: [done], charged: true"
        )
    )
    tokens = engine.budget(charged.run_id).set_index("ceiling").loc["tokens"]
    assert (tokens["used"], tokens["saved"], tokens["judge"]) == (79.0, 30.0, 0.0)


def test_the_notebook_budget_table_names_judge_tokens(engine: Engine) -> None:
    from wf_magic.notebook.frames import BudgetFrame

    run = engine.run(STORY.replace("WHAT", "x"))
    readable = BudgetFrame(engine.budget(run.run_id)).readable().set_index("ceiling")
    assert readable.loc["tokens", ["used", "saved", "judge"]].tolist() == ["54", "0", "55"]
