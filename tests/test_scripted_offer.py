"""The offline runner honours the token offer (issue 22, item 6): a reply stops at
``UnitRequest.max_tokens`` as a real model's would, so a budget demo stops where a real run would."""

from __future__ import annotations

import json

import pytest

from wf_magic import Engine
from wf_magic.runners.base import UnitRequest
from wf_magic.runners.scripted import ScriptedRunner, count_tokens, truncate_tokens


def request(prompt: str, **fields: object) -> UnitRequest:
    return UnitRequest(
        run_id="r-1",
        step_id="a",
        unit_id="a",
        dispatch_id="d-1",
        attempt=1,
        kind="prompt",
        prompt=prompt,
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("offer", "output", "tokens_out"),
    [
        (None, "one, two three four", 5),
        (10, "one, two three four", 5),
        (5, "one, two three four", 5),
        (3, "one, two", 3),
        (1, "one", 1),
        (0, "", 0),
    ],
)
def test_a_reply_stops_at_the_offer(offer: int | None, output: str, tokens_out: int) -> None:
    runner = ScriptedRunner([{"match": "go", "reply": "one, two three four"}])
    result = runner.run(request("go", max_tokens=offer))
    assert (result.output, result.tokens_out) == (output, tokens_out)


def test_a_fixed_token_count_is_capped_too() -> None:
    runner = ScriptedRunner([{"match": "go", "reply": "short", "tokens_out": 500}])
    result = runner.run(request("go", max_tokens=100))
    assert (result.output, result.tokens_out) == ("short", 100)


def test_a_json_reply_cut_short_is_the_text_a_model_would_have_sent() -> None:
    runner = ScriptedRunner([{"match": "go", "reply": {"sections": ["a", "b", "c"]}}])
    schema = {"type": "object"}
    whole = runner.run(request("go", output_schema=schema))
    assert whole.output == {"sections": ["a", "b", "c"]}
    cut = runner.run(request("go", output_schema=schema, max_tokens=4))
    assert cut.output == '{"sections"'  # { " sections "
    with pytest.raises(ValueError):
        json.loads(cut.output)


def test_truncate_keeps_the_text_up_to_the_last_token() -> None:
    text = "  Hello,  world! How are you?"
    assert [truncate_tokens(text, n) for n in range(count_tokens(text) + 2)] == [
        "",
        "  Hello",
        "  Hello,",
        "  Hello,  world",
        "  Hello,  world!",
        "  Hello,  world! How",
        "  Hello,  world! How are",
        "  Hello,  world! How are you",
        text,
        text,
    ]


BUDGET_DEMO = """
name: demo
budget: {max_tokens: 100}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "^Write", tokens_in: 5, reply: "WORDS"}
steps:
  - id: draft
    map: "{{ ['a', 'b', 'c'] }}"
    prompt: "Write about {{ item }}"
"""


def test_an_offline_budget_demo_stops_as_a_real_run_would(engine: Engine) -> None:
    run = engine.run(BUDGET_DEMO.replace("WORDS", " ".join(["word"] * 60)))
    # draft[0]: offered 100, writes 60 (65 used); draft[1]: offered 35, stops at 35 (105
    # used: prompts are not capped); draft[2] is never dispatched.
    assert run.status == "failed"
    rows = [(a.unit_id, a.tokens_in, a.tokens_out) for a in engine.attempts(run.run_id)]
    assert rows == [("draft[0]", 5, 60), ("draft[1]", 5, 35)]
    assert "max_tokens used 105 of 100; unit draft[2] was not dispatched" in (run.reason or "")
