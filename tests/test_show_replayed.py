"""`wf show` and the unit drill-down on an agent attempt answered from a recording: its bridged
calls cost nothing by design (price source ``replay``) while the CLI's own report still says
what the recorded conversation took, so the two differing is the replay, not a disagreement
between the CLI and the bridge. The end-to-end case (a real replayed run under ``wf show``)
is in tests/test_agent_replay.py."""

from __future__ import annotations

from typing import Any

from wf_magic.display.agent import agent_html, agent_lines

CLI = {"tokens_in": 240, "tokens_out": 16, "cost": 0.00096, "cost_source": "estimate: own table"}
SOURCE = "cassette /tmp/tape.jsonl (unit fix, attempt 1)"


def _replayed(*, served: int = 2, bridge: bool = True) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "harness": "claude",
        "replay": {"source": SOURCE, "recorded": 2, "served": served},
    }
    if bridge:
        facts["bridge"] = {
            "calls": served,
            "tokens_in": 0,
            "tokens_out": 0,
            "cost": 0.0,
            "cli_report": CLI,
        }
    return facts


def test_a_replayed_attempt_is_shown_as_a_replay_and_not_as_a_disagreement() -> None:
    lines = agent_lines(_replayed(), 0.0)
    assert "calls      2 through the bridge: 0 in / 0 out, $0.000000" in lines
    assert "cli report 240 in / 16 out, $0.000960 (estimate: own table)" in lines
    assert [line for line in lines if line.startswith("DISAGREE")] == []
    assert [line for line in lines if line.startswith("replayed")] == [
        f"replayed   2 of 2 recorded call(s) from {SOURCE}: nothing was paid; "
        "the CLI's report is the recording's"
    ]


def test_a_replay_that_served_fewer_calls_than_recorded_says_how_many() -> None:
    lines = agent_lines(_replayed(served=1), 0.0)
    assert [line for line in lines if line.startswith("replayed")] == [
        f"replayed   1 of 2 recorded call(s) from {SOURCE}: nothing was paid; "
        "the CLI's report is the recording's"
    ]


def test_a_replayed_attempt_whose_cli_made_no_call_still_names_its_recording() -> None:
    lines = agent_lines(_replayed(served=0, bridge=False))
    assert [line for line in lines if line.startswith("replayed")] == [
        f"replayed   0 of 2 recorded call(s) from {SOURCE}: nothing was paid; "
        "the CLI's report is the recording's"
    ]


def test_the_drill_down_shows_the_replay_escaped_and_no_disagreement() -> None:
    facts = _replayed()
    facts["replay"] = {**facts["replay"], "source": "cassette <a&b>.jsonl (unit fix, attempt 1)"}
    shown = agent_html(facts, 0.0)
    assert "DISAGREE" not in shown
    assert "replayed   2 of 2 recorded call(s) from cassette &lt;a&amp;b&gt;.jsonl" in shown


def test_a_live_attempt_whose_report_differs_is_still_flagged() -> None:
    """The replay word replaces the flag only for a replay; a bridged live attempt whose
    CLI reported other tokens than its calls counted keeps its DISAGREE line."""
    facts = _replayed()
    del facts["replay"]
    flagged = [line for line in agent_lines(facts, 0.0) if line.startswith("DISAGREE")]
    assert flagged == [
        "DISAGREE   the CLI's report and its calls differ in tokens and cost; the calls count"
    ]
