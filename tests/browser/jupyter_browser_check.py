#!/usr/bin/env python3
"""Check a notebook's ipywidgets in real JupyterLab, driven by headless Chromium.

Starts `jupyter lab` (from this Python's environment) on 127.0.0.1 in a temp
directory holding a copy of NOTEBOOK (outputs cleared), opens it in Playwright with the system
Chromium, runs all cells from the Run menu, waits for the widget button whose
label is BUTTON, clicks it, and waits for EXPECTED to appear in a cell output
(e.g. a Label or Output widget updated by the kernel-side click handler).
A screenshot is saved in every case. Exit status: 0 pass, 1 fail, 2 bad usage.

    python jupyter_browser_check.py demo_widget.ipynb Approve "approved by human"

Adapted for wf_magic from ../shared/tools/browser/ (ours to change): ``check_notebook`` can
wait for a text before the click (``before``) and type into the output's textarea
(``feedback``), so a human-gate run view is approved with a note, as a person would; it
returns the outputs' texts (Fork from here: the fork's view). ``check_saved_views`` reopens
saved run views without a kernel; ``check_drill_down`` measures a step's drill-down against
the step table; ``check_run_all_twice`` runs each of several notebooks twice in one kernel
and reads each saved file for errors.
"""

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil  # installed with ipykernel
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class CheckFailed(Exception):
    pass


def log(msg):
    print(f"[check] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_cleared(notebook, dest):
    """Copy `notebook` to `dest` without outputs, execution counts or widget state: saved
    outputs (the tours are committed with theirs) could show stale buttons or texts."""
    nb = json.loads(notebook.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    nb.get("metadata", {}).pop("widgets", None)
    dest.write_text(json.dumps(nb))


@contextlib.contextmanager
def jupyter_lab(notebook, extra_files=(), startup_timeout=90):
    """Serve a temp copy of `notebook` (and `extra_files`, notebooks among them cleared) with
    JupyterLab; yield the URL that opens it."""
    work = Path(tempfile.mkdtemp(prefix="jupyter-check-"))
    root, state = work / "root", work / "state"
    root.mkdir()
    write_cleared(notebook, root / notebook.name)
    for path in extra_files:
        if path.suffix == ".ipynb":
            write_cleared(path, root / path.name)
        else:
            (shutil.copytree if path.is_dir() else shutil.copy)(path, root / path.name)
    port, token = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    server_log = work / "jupyter.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=None",
        f"--LabApp.app_settings_dir={state / 'app-settings'}",
    ]
    # The settings default wf_magic's wheel installs (<prefix>/share/jupyter/lab/settings/
    # overrides.d/wf_magic.json; an editable install skips data files): saved widget state.
    overrides = state / "app-settings" / "overrides.d"
    overrides.mkdir(parents=True)
    shutil.copy(REPO / "jupyter-config" / "wf_magic.json", overrides / "wf_magic.json")
    # Fresh per-user Jupyter dirs: no stray config, kernelspecs, settings or workspaces from ~, so kernel
    # "python3" is this Python. Lab setting "never fetch news" keeps the news toast off the page.
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(state / "config"),
        JUPYTER_DATA_DIR=str(state / "data"),
        JUPYTER_RUNTIME_DIR=str(state / "runtime"),
    )
    settings = (
        state
        / "config/lab/user-settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    )
    settings.parent.mkdir(parents=True)
    settings.write_text('{"fetchNews": "false", "checkForUpdates": false}')
    with open(server_log, "wb") as out:
        server = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    log(f"jupyter lab pid {server.pid} on {base}")
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if server.poll() is not None:
                raise CheckFailed(
                    f"jupyter lab exited with code {server.returncode} during startup"
                )
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise CheckFailed(
                        f"jupyter lab did not answer on {base} within {startup_timeout}s"
                    ) from None
                time.sleep(0.5)
        yield f"{base}/lab/tree/{urllib.parse.quote(notebook.name)}?token={token}"
    except BaseException:
        tail = server_log.read_text(errors="replace").splitlines()[-25:]
        print("---- jupyter lab log (tail) ----", *tail, "--------", sep="\n", file=sys.stderr)
        raise
    finally:
        stop_server(server, base, token)
        shutil.rmtree(work, ignore_errors=True)


def stop_server(server, base, token):
    """Ask the server to shut down (it stops its kernels); then kill, by pid, whatever it started."""
    t0 = time.monotonic()
    try:
        started = psutil.Process(server.pid).children(recursive=True)  # kernels etc.
    except psutil.Error:
        started = []
    try:
        req = urllib.request.Request(
            f"{base}/api/shutdown", method="POST", headers={"Authorization": f"token {token}"}
        )
        urllib.request.urlopen(req, timeout=5).close()
    except OSError:
        pass
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)  # the group started with start_new_session
        server.wait()
    for proc in psutil.wait_procs(started, timeout=10)[1]:  # still alive after 10 s
        with contextlib.suppress(psutil.Error):
            proc.kill()
    log(f"jupyter lab stopped in {time.monotonic() - t0:.1f}s (exit code {server.returncode})")


def check_notebook(
    url, button, expected, screenshot, timeout_s, *, before=None, feedback=None, reopen=False
):
    """Open `url` in headless Chromium, run all cells, click `button`, wait for `expected`;
    returns the texts of the outputs then.

    `before`: a text that must show in an output before the click; `feedback`: typed into the
    (single) textarea of the outputs before the click; `reopen`: then save the notebook, shut
    its kernel down and reopen the page: `expected` must still show, with no widget error.
    """
    with (
        sync_playwright() as pw,
        tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile,
    ):
        browser = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )
        page = browser.pages[0] if browser.pages else browser.new_page()
        page.set_default_timeout(timeout_s * 1000)
        browser_errors = []
        page.on("console", lambda msg: msg.type == "error" and browser_errors.append(msg.text))
        page.on("pageerror", lambda err: browser_errors.append(str(err)))
        outputs = page.locator(".jp-OutputArea-output")
        try:
            step = "open the notebook and wait for an idle kernel"
            page.goto(url)
            # status bar "Python 3 (ipykernel) | Idle" (the notebook toolbar says idle before a kernel exists)
            idle = page.locator(
                "#jp-main-statusbar .jp-StatusBar-TextItem",
                has_text=re.compile(r"^(?!No Kernel).+ \| Idle$"),
            )
            kernel_dialog = page.locator(".jp-Dialog")
            idle.or_(kernel_dialog).first.wait_for()
            if (
                kernel_dialog.is_visible()
            ):  # notebook without kernelspec: accept the proposed kernel
                log("accepting the kernel proposed by the 'Select Kernel' dialog")
                kernel_dialog.locator(".jp-mod-accept").click()
            idle.wait_for()

            step = "run all cells from the Run menu"
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

            step = f"find the widget button {button!r}"
            # match the visible text, not the accessible name (an icon's glyph becomes part of that)
            target = outputs.locator("button", has_text=re.compile(rf"^\s*{re.escape(button)}\s*$"))
            target.wait_for()
            log("widget rendered")
            if before is not None:
                step = f"see {before!r} before the click"
                outputs.get_by_text(before).first.wait_for()
            if outputs.get_by_text(expected).count():
                raise CheckFailed(
                    f"{expected!r} is shown before the click, so the click would prove nothing"
                )
            if feedback is not None:
                step = "type the feedback"
                outputs.locator("textarea").first.fill(feedback)

            step = f"see {expected!r} after clicking {button!r}"
            target.click()
            outputs.get_by_text(expected).first.wait_for()
            log(f"clicked {button!r}; saw {expected!r}")
            if reopen:
                step = "save, shut the kernel down and reopen the notebook"
                page.keyboard.press("Control+s")
                page.locator(".jp-NotebookPanel .jp-mod-dirty").wait_for(state="detached")
                page.get_by_role("menuitem", name="Kernel", exact=True).click()
                page.get_by_role("menuitem", name="Shut Down Kernel", exact=True).click()
                page.locator(
                    "#jp-main-statusbar .jp-StatusBar-TextItem", has_text=re.compile(r"No Kernel")
                ).or_(page.locator("#jp-main-statusbar", has_text="Unknown")).first.wait_for()
                page.goto(url + "&reset")  # a fresh page: nothing kept from the session
                step = f"see {expected!r} in the reopened notebook"
                outputs.get_by_text(expected).first.wait_for()
                page.wait_for_timeout(1000)  # let any widget output try (and fail) to render
                if outputs.get_by_text("Error displaying widget").count():
                    raise CheckFailed("the reopened notebook shows 'Error displaying widget'")
                log(f"reopened without the kernel; saw {expected!r}")
            return [t.strip() for t in outputs.all_inner_texts()]
        except (PlaywrightError, CheckFailed) as exc:
            reason = (
                f"could not {step}: {str(exc).splitlines()[0]}"
                if isinstance(exc, PlaywrightError)
                else exc
            )
            with contextlib.suppress(PlaywrightError):
                reason = f"{reason}\ncell outputs: {[t.strip() for t in outputs.all_inner_texts()]}"
            raise CheckFailed(f"{reason}\nbrowser errors: {browser_errors[-5:]}") from None
        finally:
            with contextlib.suppress(PlaywrightError):
                page.screenshot(path=str(screenshot))
                log(f"screenshot: {screenshot}")
            browser.close()


def open_browser(pw, profile, timeout_s):
    """A headless Chromium page (the system binary) with console errors collected."""
    browser = pw.chromium.launch_persistent_context(
        profile,
        executable_path=CHROMIUM,
        headless=True,
        args=CHROMIUM_ARGS,
        viewport={"width": 1280, "height": 900},
    )
    page = browser.pages[0] if browser.pages else browser.new_page()
    page.set_default_timeout(timeout_s * 1000)
    errors = []
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    page.on("pageerror", lambda err: errors.append(str(err)))
    return browser, page, errors


def wait_idle_kernel(page):
    """Wait for an idle kernel, accepting the proposed one if JupyterLab asks."""
    idle = page.locator(
        "#jp-main-statusbar .jp-StatusBar-TextItem",
        has_text=re.compile(r"^(?!No Kernel).+ \| Idle$"),
    )
    dialog = page.locator(".jp-Dialog")
    idle.or_(dialog).first.wait_for()
    if dialog.is_visible():
        dialog.locator(".jp-mod-accept").click()
    idle.wait_for()


def menu(page, top, item):
    page.get_by_role("menuitem", name=top, exact=True).click()
    page.get_by_role("menuitem", name=item, exact=True).click()


def server_api(url, path, method="GET"):
    """Call the REST API of the server behind `url` (its token taken from `url`); the JSON
    answer, or None for an empty one."""
    base = url.split("/lab/", 1)[0]
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["token"][0]
    request = urllib.request.Request(
        f"{base}/api/{path}", method=method, headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        body = r.read()
    return json.loads(body) if body else None


def interrupt_kernels(url):
    """Interrupt every kernel of the server behind `url` (POST /api/kernels/ID/interrupt)."""
    for kernel in server_api(url, "kernels"):
        server_api(url, f"kernels/{kernel['id']}/interrupt", method="POST")


def shut_down_kernels(url):
    """Shut down every kernel of the server behind `url` (DELETE /api/kernels/ID)."""
    for kernel in server_api(url, "kernels"):
        server_api(url, f"kernels/{kernel['id']}", method="DELETE")


def check_saved_views(
    url, texts, screenshot, timeout_s, *, interrupt_when, reopened_texts=None, panel_text=None
):
    """Run all cells; once one output shows every text of `interrupt_when` (the last cell's
    run name and its "driving…", so an earlier cell's passing "driving…" never triggers an
    interrupt that would cancel the cells still queued), interrupt the kernel; wait for every text of
    `texts`; save, shut the kernel down, reopen: every text of `reopened_texts` (default
    `texts`) must show, with no widget error. With `panel_text` (a gate panel's title), from
    the moment that panel paints in the reopened notebook and for the next 2 s, no button or
    text box may be visible in its output. Returns the outputs' texts of the reopened
    notebook."""
    with (
        sync_playwright() as pw,
        tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile,
    ):
        browser, page, errors = open_browser(pw, profile, timeout_s)
        outputs = page.locator(".jp-OutputArea-output")
        step = "open the notebook"
        try:
            page.goto(url)
            wait_idle_kernel(page)
            step = "run all cells"
            menu(page, "Run", "Run All Cells")
            step = f"see {interrupt_when!r} before interrupting"
            target = outputs
            for text in interrupt_when:
                target = target.filter(has_text=text)
            target.first.wait_for()
            page.wait_for_timeout(500)
            interrupt_kernels(url)  # what the toolbar's stop button asks the server
            for text in texts:
                step = f"see {text!r} in the live notebook"
                outputs.get_by_text(text).first.wait_for()
            step = "save, shut the kernel down and reopen"
            page.wait_for_timeout(1000)  # the last display updates land
            page.keyboard.press("Control+s")
            page.locator(".jp-NotebookPanel .jp-mod-dirty").wait_for(state="detached")
            menu(page, "Kernel", "Shut Down Kernel")
            page.locator(
                "#jp-main-statusbar .jp-StatusBar-TextItem", has_text=re.compile(r"No Kernel")
            ).or_(page.locator("#jp-main-statusbar", has_text="Unknown")).first.wait_for()
            page.goto(url + "&reset")
            if panel_text is not None:
                step = f"see the saved gate panel {panel_text!r} paint with no control"
                panel = outputs.filter(has_text=panel_text)
                panel.first.wait_for()
                assert_no_control(page, panel, for_ms=2000)
            for text in reopened_texts or texts:
                step = f"see {text!r} in the reopened notebook"
                outputs.get_by_text(text).first.wait_for()
            page.wait_for_timeout(1500)  # let any widget output try (and fail) to render
            if outputs.get_by_text("Error displaying widget").count():
                raise CheckFailed("the reopened notebook shows 'Error displaying widget'")
            return [t.strip() for t in outputs.all_inner_texts()]
        except (PlaywrightError, CheckFailed) as exc:
            reason = (
                f"could not {step}: {str(exc).splitlines()[0]}"
                if isinstance(exc, PlaywrightError)
                else exc
            )
            with contextlib.suppress(PlaywrightError):
                reason = f"{reason}\ncell outputs: {[t.strip() for t in outputs.all_inner_texts()]}"
            raise CheckFailed(f"{reason}\nbrowser errors: {errors[-5:]}") from None
        finally:
            with contextlib.suppress(PlaywrightError):
                page.screenshot(path=str(screenshot), full_page=True)
            browser.close()


def assert_no_control(page, outputs, *, for_ms):
    """No button or text box is visible in `outputs` now and for the next `for_ms` ms
    (sampled every 100 ms): a saved view must not look clickable from its first paint."""
    controls = outputs.locator("button, textarea, .widget-button, .widget-textarea")
    for _ in range(max(1, for_ms // 100)):
        shown = [
            clip(controls.nth(i).evaluate("e => e.outerHTML"), 160)
            for i in range(controls.count())
            if controls.nth(i).is_visible()
        ]
        if shown:
            raise CheckFailed(f"the saved view shows controls that look clickable: {shown}")
        page.wait_for_timeout(100)


def failure(exc, step, outputs, errors):
    """The one-line reason a check failed (what it could not do), with the cell outputs and
    the last browser errors on the lines after."""
    reason = (
        f"could not {step}: {str(exc).splitlines()[0]}" if isinstance(exc, PlaywrightError) else exc
    )
    with contextlib.suppress(PlaywrightError):
        shown = [clip(t.strip()) for t in outputs.all_inner_texts()]
        reason = f"{reason}\ncell outputs: {shown}"
    return CheckFailed(f"{reason}\nbrowser errors: {errors[-5:]}")


def clip(text, chars=400):
    """`text`, or its first `chars` characters and how many more there were."""
    return text if len(text) <= chars else f"{text[:chars]}… (+{len(text) - chars} chars)"


def box(locator):
    """`locator`'s bounding box once the layout settled (two reads in a row agree)."""
    last = None
    for _ in range(50):
        now = locator.bounding_box()
        if now is not None and now == last:
            return now
        last = now
        locator.page.wait_for_timeout(100)  # the next frame's layout, compared with this one
    raise CheckFailed(f"the layout did not settle: {locator} moved until {last}")


def check_drill_down(url, step, screenshot, timeout_s):
    """Run all cells; in the live run view of the last cell, open the drill-down of step
    `step` (its row's toggle) and return the bounding boxes, once the panel shows its units,
    of the step table (`grid`), the step's name cell (`row`), the panel (`panel`) and the
    name cell of the step after it (`next_row`)."""
    with (
        sync_playwright() as pw,
        tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile,
    ):
        browser, page, errors = open_browser(pw, profile, timeout_s)
        outputs = page.locator(".jp-OutputArea-output")
        step_name = "open the notebook"
        try:
            page.goto(url)
            wait_idle_kernel(page)
            step_name = "run all cells"
            menu(page, "Run", "Run All Cells")
            step_name = "see the live run view of the last cell"
            view = page.locator(".jp-Notebook .jp-CodeCell").last.locator(".wf-run-view")
            view.get_by_text("Run completed.").wait_for()
            grid = view.locator(".widget-gridbox").first
            names = grid.locator(".widget-hbox", has=page.locator("code"))
            row = names.filter(has=page.get_by_text(step, exact=True))
            panel = view.locator(".wf-step-detail").filter(has_text="units")
            if panel.count():
                raise CheckFailed(f"a drill-down panel shows before {step!r} was opened")
            shown = [t.strip() for t in names.all_inner_texts()]
            if step not in shown[:-1]:
                raise CheckFailed(f"step {step!r} is not a row followed by another in {shown}")
            index = shown.index(step)
            step_name = f"open the drill-down of step {step!r}"
            row.locator(".widget-toggle-button").click()
            panel.wait_for()
            panel.get_by_text("succeeded").first.wait_for()  # the units, read from the journal
            step_name = "measure the step table and the panel"
            boxes = {
                "grid": box(grid),
                "row": box(row),
                "panel": box(panel),
                "next_row": box(names.nth(index + 1)),
            }
            log(f"drill-down of {step!r}: {boxes}")
            return boxes
        except (PlaywrightError, CheckFailed) as exc:
            raise failure(exc, step_name, outputs, errors) from None
        finally:
            with contextlib.suppress(PlaywrightError):
                page.screenshot(path=str(screenshot), full_page=True)
            browser.close()


PROMPTS_JS = """() => [...document.querySelectorAll(
    '.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim())"""


def check_sweep_click(url, cells, index, screenshot, timeout_s):
    """Run all; once the sweep's grid shows `cells` squares and the sweep completed, click
    square `index`: its run view must open below the grid (the grid stays clickable until
    another cell runs). Returns the outputs' texts."""
    with (
        sync_playwright() as pw,
        tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile,
    ):
        browser, page, errors = open_browser(pw, profile, timeout_s)
        outputs = page.locator(".jp-OutputArea-output")
        step = "open the notebook and run all cells"
        try:
            page.goto(url)
            wait_idle_kernel(page)
            menu(page, "Run", "Run All Cells")
            step = f"see {cells} cell squares and the sweep completed"
            squares = outputs.locator("button.wf-sweep-cell")
            outputs.get_by_text(re.compile(r"completed · 6 cells")).first.wait_for()
            deadline = time.monotonic() + timeout_s
            while squares.count() != cells:
                if time.monotonic() > deadline:
                    raise CheckFailed(f"{squares.count()} squares, expected {cells}")
                page.wait_for_timeout(100)
            if outputs.get_by_text("Run completed.").count():
                raise CheckFailed("a run view shows before any click")
            step = f"click square {index} and see its run view"
            squares.nth(index).click()
            outputs.get_by_text(re.compile(rf"cell {index}\b")).first.wait_for()
            outputs.get_by_text("Run completed.").first.wait_for()
            log(f"clicked square {index}; its run view opened")
            return [t.strip() for t in outputs.all_inner_texts()]
        except (PlaywrightError, CheckFailed) as exc:
            raise failure(exc, step, outputs, errors) from None
        finally:
            with contextlib.suppress(PlaywrightError):
                page.screenshot(path=str(screenshot))
            browser.close()


def check_repaint(url, before, after, act, screenshot, timeout_s):
    """Run all; once an output shows `before`, call `act()` (another process moves the run)
    and, without running a cell, wait for an output to show `after`. Returns the outputs'
    texts."""
    with (
        sync_playwright() as pw,
        tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile,
    ):
        browser, page, errors = open_browser(pw, profile, timeout_s)
        outputs = page.locator(".jp-OutputArea-output")
        step = "open the notebook and run all cells"
        try:
            page.goto(url)
            wait_idle_kernel(page)
            menu(page, "Run", "Run All Cells")
            step = f"see {before!r}"
            outputs.get_by_text(before).first.wait_for()
            wait_idle_kernel(page)
            step = "act from another process"
            act()
            step = f"see {after!r} without running a cell"
            outputs.get_by_text(after).first.wait_for()
            return [t.strip() for t in outputs.all_inner_texts()]
        except (PlaywrightError, CheckFailed) as exc:
            raise failure(exc, step, outputs, errors) from None
        finally:
            with contextlib.suppress(PlaywrightError):
                page.screenshot(path=str(screenshot))
            browser.close()


def run_all_and_wait(page, first, cells):
    """Run All from the Run menu, then wait until it ended: the first code cell shows
    execution count `first` and no cell is still queued or running (``[*]:``). Returns the
    prompts then (a failing cell leaves the cells after it unrun)."""
    menu(page, "Run", "Run All Cells")
    page.wait_for_function(f"() => ({PROMPTS_JS})()[0] === '[{first}]:'")
    page.wait_for_function(
        f"() => {{ const p = ({PROMPTS_JS})(); return p.length === {cells} && "
        "!p.some(t => t === '[*]:'); }"
    )
    return page.evaluate(PROMPTS_JS)


def save_and_read(page, url, name, prompts, timeout_s):
    """Save the open notebook `name` (its toolbar's save button) and return the file as the
    server holds it (REST API) once its execution counts are those `prompts` show.

    The file is read only after a save's PUT answered: a read during the server's atomic
    write finds a half-written file, sets it aside as `.invalid` and restores the old one."""
    shown = [int(p[1:-2]) if re.fullmatch(r"\[\d+\]:", p) else None for p in prompts]
    path = f"contents/{urllib.parse.quote(name)}"
    deadline = time.monotonic() + timeout_s
    while True:
        with page.expect_response(
            lambda r: r.request.method == "PUT" and r.url.split("?")[0].endswith(path)
        ) as answer:
            page.locator(".jp-NotebookPanel-toolbar [data-jp-item-name='save']").click()
        if not answer.value.ok:
            raise CheckFailed(f"saving {name} answered HTTP {answer.value.status}")
        nb = server_api(url, f"{path}?content=1")["content"]
        saved = [c.get("execution_count") for c in nb["cells"] if c["cell_type"] == "code"]
        if saved == shown:
            return nb
        if time.monotonic() > deadline:
            raise CheckFailed(f"{name} saved with execution counts {saved}, shown {shown}")


def notebook_problems(nb):
    """What a teacher must not see in an executed notebook (a JSON dict): error outputs,
    stderr, a traceback or a run "not being driven" in any output, a code cell left unrun."""
    problems = []
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for number, cell in enumerate(code, 1):
        if cell.get("execution_count") is None:
            problems.append(f"cell {number} did not run")
        for out in cell.get("outputs", []):
            kind = out["output_type"]
            if kind == "error":
                problems.append(f"cell {number} raised {out['ename']}: {out['evalue'][:300]}")
                continue
            if kind == "stream" and out.get("name") == "stderr":
                problems.append(f"cell {number} wrote to stderr: {out['text'][:300]!r}")
            text = out.get("text", "") if kind == "stream" else json.dumps(out.get("data", {}))
            for word in ("Traceback", "not being driven"):
                if word in text:
                    problems.append(f"cell {number} shows {word!r}")
    return problems


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
BROKEN = ("Error displaying widget", "model not found", "Loading widget")
"""What an output must never read once reopened (its widget's model is gone)."""
REPRS = ("VBox(", "HBox(", "ReviewPanel(", "GridBox(", "Button(")
"""A widget's repr: what an untrusted copy shows of a widget output with no text beside it."""


def saved_size(nb):
    """The saved file's size in bytes and its widget-state model count."""
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return len(json.dumps(nb, indent=1)), len(state)


def reopen_problems(page, url, name, outputs, *, kernel):
    """Reopen `name` (its kernel shut down; `kernel`: a new one starts, else No Kernel) and
    return what is wrong in its outputs: a broken widget or a widget's repr."""
    base = url.split("/lab/tree/", 1)[0]
    query = urllib.parse.urlsplit(url).query
    shut_down_kernels(url)
    page.goto(f"{base}/lab/tree/{urllib.parse.quote(name)}?{query}&reset")
    wait_idle_kernel(page)
    if not kernel:  # the reopened notebook's kernel shut down from its menu, as a person does
        menu(page, "Kernel", "Shut Down Kernel")
    page.wait_for_timeout(3000)  # let every widget output try (and fail) to render
    shown = " ".join(outputs.all_text_contents())
    problems = [f"reads {word!r}" for word in BROKEN if word in shown]
    problems += [f"shows a repr {word!r}" for word in REPRS if word in shown]
    return [f"{name} reopened ({'kernel' if kernel else 'No Kernel'}) {p}" for p in problems]


def check_run_all_twice(url, names, screenshots, timeout_s, *, sizes=None, reopen=False):
    """For each notebook of `names` (served next to the one `url` opens), in one browser:
    open it, Run All, and Run All again in the same kernel; after each Run All, save and
    read the saved file (REST API): every code cell ran, and no output is an error, stderr,
    a traceback or a run "not being driven". With `sizes` (a dict), it gets {name: [(bytes,
    widget models) after each Run All]}; with `reopen`, the saved notebook is reopened with
    a new kernel and with No Kernel, and no output may read a broken widget or a repr. The
    kernel is then shut down before the next notebook. Returns {name: seconds both Run All
    took}; raises CheckFailed naming the notebook, the Run All and the problems, with the
    cells' outputs."""
    timings = {}
    with (
        sync_playwright() as pw,
        tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile,
    ):
        browser, page, errors = open_browser(pw, profile, timeout_s)
        outputs = page.locator(".jp-OutputArea-output")
        base = url.split("/lab/tree/", 1)[0]
        query = urllib.parse.urlsplit(url).query
        for name in names:
            step = f"open {name}"
            try:
                page.goto(f"{base}/lab/tree/{urllib.parse.quote(name)}?{query}&reset")
                wait_idle_kernel(page)
                nb = server_api(url, f"contents/{urllib.parse.quote(name)}?content=1")["content"]
                cells = sum(c["cell_type"] == "code" for c in nb["cells"])
                started = time.monotonic()
                for run in (1, 2):
                    step = f"Run All #{run} of {name}"
                    prompts = run_all_and_wait(page, (run - 1) * cells + 1, cells)
                    step = f"save {name} after Run All #{run}"
                    saved = save_and_read(page, url, name, prompts, timeout_s)
                    if sizes is not None:
                        sizes.setdefault(name, []).append(saved_size(saved))
                    problems = notebook_problems(saved)
                    shown = " ".join(outputs.all_text_contents())
                    if "Traceback" in shown:
                        problems.append("an output shows 'Traceback'")
                    if problems:
                        raise CheckFailed(
                            f"{name}, Run All #{run}: {'; '.join(problems)} (prompts {prompts})"
                        )
                timings[name] = time.monotonic() - started
                log(f"{name}: Run All twice in {timings[name]:.1f}s")
                if reopen:
                    step = f"reopen {name} with a kernel and with No Kernel"
                    problems = [
                        *reopen_problems(page, url, name, outputs, kernel=True),
                        *reopen_problems(page, url, name, outputs, kernel=False),
                    ]
                    if problems:
                        raise CheckFailed("; ".join(problems))
                step = f"shut the kernel of {name} down"
                shut_down_kernels(url)
            except (PlaywrightError, CheckFailed) as exc:
                failed = failure(exc, step, outputs, errors)
                with contextlib.suppress(PlaywrightError):
                    page.screenshot(path=str(screenshots / f"{Path(name).stem}.png"))
                browser.close()
                raise failed from None
        browser.close()
    return timings


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("notebook", type=Path, help=".ipynb to run")
    ap.add_argument("button", help="description (label) of the widget button to click")
    ap.add_argument("expected", help="text that must appear in a cell output after the click")
    ap.add_argument(
        "--screenshot", type=Path, default=Path("jupyter_browser_check.png"), help="PNG to write"
    )
    ap.add_argument(
        "--timeout", type=float, default=60, help="seconds allowed for each step (default 60)"
    )
    ap.add_argument(
        "--copy",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="file or folder the notebook needs, copied next to it (repeatable)",
    )
    args = ap.parse_args()
    for path in [args.notebook, *args.copy]:
        if not path.exists():
            ap.error(f"not found: {path}")
    if not Path(CHROMIUM).exists():
        ap.error(f"{CHROMIUM} not found: apt-get install -y chromium")

    signal.signal(
        signal.SIGTERM, lambda *_: sys.exit(143)
    )  # so the cleanup below runs on SIGTERM too
    started = time.monotonic()
    try:
        with jupyter_lab(args.notebook.resolve(), [p.resolve() for p in args.copy]) as url:
            check_notebook(url, args.button, args.expected, args.screenshot.resolve(), args.timeout)
    except CheckFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    log(f"PASS in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
