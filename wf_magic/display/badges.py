"""The one status colour table and the HTML pieces coloured by it: badges, bars, good news."""

from __future__ import annotations

import html

STATUS_COLOURS = {
    "completed": "#1a7f37",
    "active": "#0969da",
    "pending": "#6e7781",
    "blocked": "#bf8700",
    "failed": "#cf222e",
    "skipped": "#8c959f",
    "abandoned": "#8c959f",
    # Attempt statuses (the plots' timeline bars): in flight reads like an active run, a
    # reused answer like skipped work, since nothing ran and nothing was charged for it.
    "running": "#0969da",
    "succeeded": "#1a7f37",
    "reused": "#8c959f",
    # A step that completed with failed units (a map under ``on_error: continue``): done,
    # but not all of it, so neither green nor red.
    "partial": "#bf8700",
}
"""The one colour of each run, step and attempt status: badges, the live view and the plots."""
UNKNOWN_STATUS_COLOUR = "#6e7781"
"""The colour of a status the table does not know."""


def badge(status: str, *, label: str | None = None) -> str:
    """A status as a coloured pill (HTML): run summaries and the live view's rows and header.

    ``label`` replaces the text (``completed · 2 failed``); the colour stays the status's.
    """
    colour = STATUS_COLOURS.get(status, UNKNOWN_STATUS_COLOUR)
    return (
        f'<span style="background:{colour};color:white;border-radius:8px;padding:1px 8px;'
        f'font-size:85%">{html.escape(label or status)}</span>'
    )


def step_state(status: str, *, running: int = 0, failed: int = 0, is_live: bool = True) -> str:
    """What a step row shows: its status, ``running`` while attempts of a live drive are in
    flight, ``partial`` when it completed with failed units (``on_error: continue``)."""
    if status == "pending" and running and is_live:
        return "running"
    if status == "completed" and failed:
        return "partial"
    return status


def step_badge(status: str, *, running: int = 0, failed: int = 0, is_live: bool = True) -> str:
    """The badge of a step row (see :func:`step_state`): a partial step says what failed."""
    state = step_state(status, running=running, failed=failed, is_live=is_live)
    label = f"completed · {failed} failed" if state == "partial" else None
    return badge(state, label=label)


def stacked_bar_html(done: int, running: int, failed: int, total: int | None) -> str:
    """A progress bar stacked left to right: done (green), in flight (blue), failed (red)."""
    whole = max(total or 0, done + running + failed, 1)
    parts = "".join(
        f'<div title="{count} {name}" style="width:{100 * count / whole:.3f}%;'
        f'background:{STATUS_COLOURS[key]}"></div>'
        for name, key, count in (
            ("done", "completed", done),
            ("in flight", "running", running),
            ("failed", "failed", failed),
        )
        if count
    )
    return (
        '<div class="wf-bar" style="display:flex;width:120px;height:10px;border-radius:3px;'
        f'overflow:hidden;background:#eaeef2">{parts}</div>'
    )


def good_news_html(text: str) -> str:
    """A line of good news (reuse, nothing to re-pay): green, with a check mark."""
    colour = STATUS_COLOURS["completed"]
    return f'<div style="color:{colour}">✓ {html.escape(text)}</div>'
