"""In real JupyterLab + headless Chromium, a sweep's side-by-side table renders a row per dataset
row and a column per variant, shows hostile output as text, and reads the same once reopened."""

from __future__ import annotations

import contextlib
import importlib.util
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
CHROMIUM = Path("/usr/bin/chromium")
MISSING = [
    name
    for name in ("playwright", "jupyterlab", "psutil")
    if importlib.util.find_spec(name) is None
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's /usr/bin/chromium (scripts/ci_browser.sh VENV installs it)",
    ),
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"needs {', '.join(MISSING)} in this venv "
        "(scripts/ci_browser.sh VENV installs them)",
    ),
]

TABLE_JS = """() => {
    const box = document.querySelector('.jp-OutputArea-output .wf-side-by-side');
    if (!box) return null;
    const texts = (cells) => [...cells].map(c => c.textContent);
    return {
        headers: texts(box.querySelectorAll('thead th')),
        rows: [...box.querySelectorAll('tbody > tr')].map(r => texts(r.children)),
        tables: box.querySelectorAll('table').length,
        elements: [...box.querySelectorAll('*')].map(e => e.tagName.toLowerCase()),
        handlers: [...box.querySelectorAll('*')].flatMap(
            e => e.getAttributeNames().filter(n => n.startsWith('on'))),
        pwned: window.__wfPwned ?? null,
        control: window.__wfControl ?? null,
    };
}"""
"""What the page holds of the side-by-side output: header and cell texts, the element names
inside it, any on* attribute, and the globals the hostile output (``__wfPwned``) and the
control cell (``__wfControl``) would set."""
HOSTILE = {
    "script": '<script>window.__wfPwned="script"; alert(1)</script>Paris',
    "img": "<img src=x onerror=\"window.__wfPwned='img'; alert(2)\">4",
    "question": "<svg onload=\"window.__wfPwned='question'\"></svg> 2 + 2?",
    "breakout": '</pre></details></td></tr></table><script>window.__wfPwned="breakout"</script>',
}
"""The hostile texts the notebook's scripted models answer (and its rows file asks)."""
SAFE_TAGS = {"table", "thead", "tbody", "tr", "th", "td", "pre", "div", "details", "summary", "b"}


def check_side_by_side(url: str, screenshot: Path, timeout_s: float) -> dict[str, Any]:
    """Run all cells; read the side-by-side table live, open its folded output, then save,
    shut the kernel down, reopen the notebook and read it again. Returns ``live`` and
    ``reopened`` (``TABLE_JS``'s reading), ``expanded`` (the folded output's text once
    opened), ``broken`` (what the reopened outputs read of ``BROKEN``), ``dialogs`` (alerts
    the page opened) and ``errors`` (browser console errors)."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    from .jupyter_browser_check import (
        BROKEN,
        CheckFailed,
        failure,
        log,
        menu,
        open_browser,
        wait_idle_kernel,
    )

    found: dict[str, Any] = {}
    with (
        sync_playwright() as pw,
        tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile,
    ):
        browser, page, errors = open_browser(pw, profile, timeout_s)
        dialogs: list[str] = []

        def on_dialog(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)
        outputs = page.locator(".jp-OutputArea-output")
        table = outputs.locator(".wf-side-by-side table")
        control = outputs.locator("img[alt='control']")
        step = "open the notebook and run all cells"
        try:
            page.goto(url)
            wait_idle_kernel(page)
            menu(page, "Run", "Run All Cells")
            step = "see the side-by-side table and the control cell's output"
            table.wait_for()
            control.wait_for(state="attached")
            wait_idle_kernel(page)
            page.wait_for_timeout(1000)  # an injected handler or script would have run by now
            found["live"] = page.evaluate(TABLE_JS)
            step = "open the folded output"
            details = table.locator("details")
            found["expanded"] = None  # no fold (or an empty one): the assertions say so
            if details.count() == 1:
                details.locator("summary").click()
                page.wait_for_function(
                    "() => document.querySelector('.wf-side-by-side details').open"
                )
                folded = details.locator("pre")
                if folded.count() == 1:
                    found["expanded"] = folded.inner_text()
            log("side-by-side table rendered; folded output opened")

            step = "save, shut the kernel down and reopen the notebook"
            page.keyboard.press("Control+s")
            page.locator(".jp-NotebookPanel .jp-mod-dirty").wait_for(state="detached")
            menu(page, "Kernel", "Shut Down Kernel")
            page.locator(
                "#jp-main-statusbar .jp-StatusBar-TextItem", has_text=re.compile(r"No Kernel")
            ).or_(page.locator("#jp-main-statusbar", has_text="Unknown")).first.wait_for()
            page.goto(url + "&reset")  # a fresh page: nothing kept from the session
            step = "see the side-by-side table in the reopened notebook"
            table.wait_for()
            control.wait_for(state="attached")
            page.wait_for_timeout(1500)  # let any widget output try (and fail) to render
            found["reopened"] = page.evaluate(TABLE_JS)
            shown = " ".join(outputs.all_text_contents())
            found["broken"] = [word for word in BROKEN if word in shown]
            log("reopened without the kernel; the table shows")
        except (PlaywrightError, CheckFailed) as exc:
            raise failure(exc, step, outputs, errors) from None
        finally:
            with contextlib.suppress(PlaywrightError):
                page.screenshot(path=str(screenshot), full_page=True)
            browser.close()
    return {**found, "dialogs": dialogs, "errors": errors}


def test_side_by_side_shows_hostile_outputs_as_text_live_and_reopened(tmp_path: Path) -> None:
    """Two models × three rows: the table has the row, the question and one column per model;
    every hostile answer (a script, an img onerror, markup closing the table) and a hostile
    question read as their own text, create no element and run nothing, while the control
    cell's unescaped HTML does run; the page logs no console error; saved and reopened with no
    kernel, the same table shows and no output reads as a missing widget."""
    from .jupyter_browser_check import jupyter_lab

    started = time.monotonic()
    with jupyter_lab(HERE / "side_by_side.ipynb") as url:
        found = check_side_by_side(url, tmp_path / "side_by_side.png", timeout_s=90)
    elapsed = time.monotonic() - started
    assert found["live"]["control"] >= 1  # unescaped HTML in a trusted output runs here
    for when in ("live", "reopened"):
        table = found[when]
        assert table is not None, when
        assert table["pwned"] is None, (when, table["pwned"])
        assert table["handlers"] == [], (when, table["handlers"])
        assert set(table["elements"]) <= SAFE_TAGS, (when, set(table["elements"]) - SAFE_TAGS)
        assert table["tables"] == 1, when
        assert table["headers"] == ["row", "question", "small", "large"], when
        assert [row[:2] for row in table["rows"]] == [
            ["0", "Capital of France?"],
            ["1", HOSTILE["question"]],
            ["2", "Say hi"],
        ], when
        assert [len(row) for row in table["rows"]] == [4, 4, 4], when
        (france, sum_, hi) = table["rows"]
        assert france[2].startswith("Paris") and "answer.exact 1" in france[2], when
        assert france[3].startswith(HOSTILE["script"]), (when, france[3])
        assert "answer.exact 0" in france[3], when
        assert sum_[2].startswith(HOSTILE["img"]), (when, sum_[2])
        assert sum_[3].startswith("4") and "answer.exact 1" in sum_[3], when
        assert hi[2].startswith(HOSTILE["breakout"]), (when, hi[2])
        assert hi[3].startswith("hi"), when
    assert found["errors"] == []
    assert found["dialogs"] == []
    assert found["broken"] == []
    assert found["expanded"] is not None
    assert found["expanded"].startswith(HOSTILE["breakout"])
    assert found["expanded"].endswith("hi hi END")
    assert found["reopened"]["control"] >= 1  # reopened trusted: escaping is what holds
    print(f"side-by-side browser check: {elapsed:.1f}s")
    assert elapsed < 180
