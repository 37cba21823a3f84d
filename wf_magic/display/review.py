"""The review panel of a blocked gate: the artifact's units as cards, diffs, the criteria."""

from __future__ import annotations

import difflib
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .badges import STATUS_COLOURS


@dataclass(frozen=True, slots=True, kw_only=True)
class ArtifactUnit:
    """One unit of the artifact a gate waits on, with its output of the previous loop."""

    unit_id: str
    output: Any
    previous: Any = None
    has_previous: bool = False
    """The unit has an output in the previous loop (``previous`` may be None as a value)."""


def value_text(value: Any) -> str:
    """A unit's output as a person reads it: text as is, anything else as indented JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def text_diff(before: str, after: str, *, before_name: str, after_name: str) -> str:
    """A unified diff of two texts ('' when they are the same)."""
    return "\n".join(
        difflib.unified_diff(
            before.splitlines(),
            after.splitlines(),
            fromfile=before_name,
            tofile=after_name,
            lineterm="",
        )
    )


def diff_lines_html(diff: str) -> str:
    """A unified diff as HTML: additions green, removals red, hunk headers grey."""
    rows = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            style = "color:#57606a"
        elif line.startswith("+"):
            style = f"color:{STATUS_COLOURS['completed']};background:#dafbe1"
        elif line.startswith("-"):
            style = f"color:{STATUS_COLOURS['failed']};background:#ffebe9"
        elif line.startswith("@@"):
            style = "color:#8250df"
        else:
            style = ""
        attr = f' style="{style}"' if style else ""
        rows.append(f"<div{attr}>{html.escape(line) or '&nbsp;'}</div>")
    return (
        "<pre class='wf-diff' style='font-size:12px;margin:2px 0;white-space:pre-wrap'>"
        + "".join(rows)
        + "</pre>"
    )


def rich_text_html(text: str) -> str:
    """A string artifact rendered for reading: Markdown when markdown-it-py is installed
    (raw HTML in it is escaped, never run), else the text with its line breaks kept."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return f"<div style='white-space:pre-wrap'>{html.escape(text)}</div>"
    rendered: str = MarkdownIt("commonmark", {"html": False}).render(text)
    return f"<div class='wf-markdown'>{rendered}</div>"


def criteria_html(criteria: Sequence[str]) -> str:
    """The gate's criteria (rendered) as a checklist to judge against."""
    if not criteria:
        return "<div><i>No criteria written: judge whether the step did what it asked.</i></div>"
    items = "".join(f"<li>{html.escape(c)}</li>" for c in criteria)
    return f"<div class='wf-criteria'><b>Criteria</b><ul style='margin:2px 0'>{items}</ul></div>"


def artifact_cards_html(units: Sequence[ArtifactUnit], *, loop: int) -> str:
    """One card per unit of the artifact (text as Markdown, data as JSON), each with the
    diff against its output of the previous loop when there was one."""
    cards = []
    for unit in units:
        output = unit.output
        data = html.escape(value_text(output))
        body = (
            rich_text_html(output)
            if isinstance(output, str)
            else f"<pre style='margin:0;white-space:pre-wrap'>{data}</pre>"
        )
        diff = ""
        if unit.has_previous:
            text = text_diff(
                value_text(unit.previous),
                value_text(output),
                before_name=f"loop {loop - 1}",
                after_name=f"loop {loop}",
            )
            diff = (
                f"<details class='wf-card-diff'><summary>changes since loop {loop - 1}</summary>"
                f"{diff_lines_html(text)}</details>"
                if text
                else f"<div><small>unchanged since loop {loop - 1}</small></div>"
            )
        cards.append(
            "<div class='wf-card' style='border:1px solid #d0d7de;border-radius:6px;"
            "padding:4px 10px;margin:4px 0;max-height:20em;overflow:auto'>"
            f"<div><code>{html.escape(unit.unit_id)}</code></div>{body}{diff}</div>"
        )
    count = f"{len(units)} unit{'s' if len(units) != 1 else ''}"
    return f"<div class='wf-artifact'><b>Artifact</b> ({count}){''.join(cards)}</div>"
