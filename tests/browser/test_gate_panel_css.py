"""In headless Chromium, the gate panel's kernel check (``live_controls_html``) as a browser
paints it: a panel drawn from saved state shows no button or text box from its first paint,
only the note that names ``wf approve`` / ``wf reject``; a ticking kernel shows the controls
(and hides the note); once the ticks stop, the controls go within ``STALE_AFTER_S``."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest

from wf_magic.notebook.review import STALE_AFTER_S, live_controls_html

CHROMIUM = Path("/usr/bin/chromium")
NOTE = "This decision needs a running kernel: `wf approve r-1 review` or `wf reject r-1 review`"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium"),
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None, reason="needs playwright in this venv"
    ),
]


def _panel(ticks: int) -> str:
    """A gate panel's DOM as ipywidgets draws it, its kernel line rendered at ``ticks``."""
    return (
        "<html><body><div class='widget-vbox wf-panel-p1'>"
        "<div class='widget-textarea'><textarea placeholder='Feedback'></textarea></div>"
        "<div class='widget-hbox'><button class='widget-button'>Approve</button>"
        "<button class='widget-button'>Reject</button></div>"
        f"<div id='line'>{live_controls_html(NOTE, css_class='wf-panel-p1', ticks=ticks)}</div>"
        "</div></body></html>"
    )


def test_the_panel_shows_controls_only_while_a_kernel_ticks() -> None:
    from playwright.sync_api import sync_playwright

    with (
        sync_playwright() as pw,
        tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile,
    ):
        browser = pw.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        page = browser.new_page()

        def shown() -> tuple[bool, bool, bool]:
            return (
                page.get_by_role("button", name="Approve").is_visible(),
                page.locator("textarea").is_visible(),
                page.get_by_text("needs a running kernel").is_visible(),
            )

        try:
            page.set_content(_panel(4242))  # saved state: nothing ticks it
            for _ in range(10):  # from the first paint on, never a control
                assert shown() == (False, False, True)
                page.wait_for_timeout(100)
            for ticks in range(4243, 4247):  # a live kernel's clock, about once a second
                page.evaluate(
                    "h => { document.getElementById('line').innerHTML = h }",
                    live_controls_html(NOTE, css_class="wf-panel-p1", ticks=ticks),
                )
                page.wait_for_timeout(50)
                assert shown() == (True, True, False)
                page.wait_for_timeout(900)
                assert shown() == (True, True, False)
            page.wait_for_timeout(STALE_AFTER_S * 1000 + 300)  # the kernel stopped ticking
            assert shown() == (False, False, True)
        finally:
            browser.close()
