"""Text and HTML renderings of runs and plans (no IPython): shared by CLI, reprs and widgets.

The package is the one import path; its modules split the renderings by what they show:

- ``badges``: the status colour table, badges and progress bars;
- ``facts``: what a run's renderings and the live view both read (rejections, counts, texts);
- ``run``: the text and HTML summaries of one run;
- ``review``: the review panel of a blocked gate (artifact cards, diffs, criteria);
- ``plan``: the text, HTML and Mermaid views of a frozen plan;
- ``agent``: the facts of an agent attempt (harness, session, turns, worktree).
"""

from __future__ import annotations

from .agent import agent_html, agent_lines
from .badges import (
    STATUS_COLOURS,
    UNKNOWN_STATUS_COLOUR,
    badge,
    good_news_html,
    stacked_bar_html,
    step_badge,
    step_state,
)
from .facts import (
    RESULT_CHARS,
    MapStep,
    Rejection,
    TokenSplit,
    budget_text,
    gate_rejections,
    loop_text,
    merge_rejections,
    origin_text,
    result_text,
    reuse_text,
    shown_note,
    shown_reason,
    token_text,
    unit_counts,
    unit_total,
)
from .plan import plan_html, plan_mermaid, plan_rows, plan_text
from .review import (
    ArtifactUnit,
    artifact_cards_html,
    criteria_html,
    diff_lines_html,
    rich_text_html,
    text_diff,
    value_text,
)
from .run import GATES_STYLE, Run, gates_html, result_html, run_html, run_text

__all__ = [
    "GATES_STYLE",
    "RESULT_CHARS",
    "STATUS_COLOURS",
    "UNKNOWN_STATUS_COLOUR",
    "ArtifactUnit",
    "MapStep",
    "Rejection",
    "Run",
    "TokenSplit",
    "agent_html",
    "agent_lines",
    "artifact_cards_html",
    "badge",
    "budget_text",
    "criteria_html",
    "diff_lines_html",
    "gate_rejections",
    "gates_html",
    "good_news_html",
    "loop_text",
    "merge_rejections",
    "origin_text",
    "plan_html",
    "plan_mermaid",
    "plan_rows",
    "plan_text",
    "result_html",
    "result_text",
    "reuse_text",
    "rich_text_html",
    "run_html",
    "run_text",
    "shown_note",
    "shown_reason",
    "stacked_bar_html",
    "step_badge",
    "step_state",
    "text_diff",
    "token_text",
    "unit_counts",
    "unit_total",
    "value_text",
]
