"""Shared harnesses of the notebook tests (magics, widgets, demo notebooks).

Not a test module: the workflows several notebook tests share, an Engine and a run view over a
per-test state dir, an in-process IPython shell with the extension loaded, the magics pointed
at a per-test state dir, one live kernel fed cell by cell (``Kernel``), and a whole notebook
run top to bottom (``execute_notebook``). Every kernel runs this very Python from a kernel
spec written into the test's own directory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
from IPython.core.interactiveshell import InteractiveShell
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager, KernelManager
from nbclient import NotebookClient
from traitlets.config import Config

from wf_magic import Engine
from wf_magic.notebook.drives import Drives
from wf_magic.notebook.magics import WorkflowMagics
from wf_magic.notebook.widgets import RunView

REPO = Path(__file__).resolve().parent.parent


# -- shared workflows -----------------------------------------------------------------------------
CELL_DIGEST = """\
name: digest
params:
  topic: {type: string, default: owls}
  sections: {type: integer, default: 3, minimum: 1}
runner: scripted
steps:
  - id: outline
    prompt: "Outline {{ params.topic }} in {{ params.sections }} sections"
  - id: draft
    map: "{{ range(params.sections) | list }}"
    prompt: "Write section {{ item }} on {{ params.topic }}"
  - id: wrap
    prompt: "Wrap up {{ params.topic }}"
"""
"""Three steps (a map of ``sections`` units in the middle) over two params."""


def slow_digest(sleep_s: float) -> str:
    """CELL_DIGEST with 12 sections written one at a time, each taking ``sleep_s``: long
    enough for an interrupt to land mid-drive."""
    return CELL_DIGEST.replace(
        "runner: scripted\n",
        f"""\
runner: scripted
execution: {{max_concurrency: 1}}
runners:
  scripted:
    rules:
      - {{match: "Write section", reply: "text", sleep_s: {sleep_s}}}
""",
    ).replace("default: 3", "default: 12")


JUDGED = """\
name: judged
runner: scripted
runners:
  scripted:
    rules:
      - match: "Gate feedback"
        reply: "a long and detailed draft"
      - match: "(?s)^Judge.*long and detailed"
        reply: {complete: true, feedback: "", missing: []}
      - match: "(?s)^Judge"
        reply: {complete: false, feedback: "far too short", missing: [an example]}
steps:
  - id: draft
    prompt: "Write a draft"
    gate: {judge: llm, criteria: [detailed, has an example], max_loops: 3}
"""
"""An llm gate that rejects loop 1 ("far too short") and accepts loop 2's longer draft."""

HUMAN_DRAFT = """\
name: reviewed
runner: scripted
steps:
  - id: draft
    prompt: "Write a draft"
    gate: {judge: human}
"""
"""One step behind a human gate: the run blocks until somebody decides."""

SLOW = """\
name: slow
runner: scripted
execution: {max_concurrency: 1}
runners:
  scripted:
    rules:
      - {match: "unit", reply: "ok", sleep_s: 0.2}
steps:
  - id: fan
    map: "{{ range(10) | list }}"
    prompt: "unit {{ item }}"
"""
"""Ten units one at a time, 0.2 s each: a drive that is still running when looked at."""


# -- an Engine and its run views ------------------------------------------------------------------
def engine_at(state_dir: Path) -> Iterator[Engine]:
    """The body of a fixture: an Engine over ``state_dir``, closed after."""
    eng = Engine(state_dir)
    yield eng
    eng.close()


def drives_of(engine: Engine) -> Iterator[Drives]:
    """The body of a fixture: background drives of ``engine``, all stopped after."""
    d = Drives(lambda: engine)
    yield d
    d.stop_all()


def view_of(engine: Engine, run_id: str, drives: Drives | None = None, **kw: Any) -> RunView:
    """A run view of ``run_id``; with ``drives``, its buttons continue the run in the background."""
    return RunView(
        engine,
        run_id,
        continue_drive=(lambda r: drives.background(r)) if drives else None,
        is_driving=drives.is_driving if drives else None,
        **kw,
    )


def redraw_bound(view: RunView, elapsed_s: float) -> float:
    """The most redraws ``view`` can make over a drive of ``elapsed_s`` seconds and the flush
    after it: timed redraws start at least ``throttle.min_interval_s`` apart (so the first
    one and ``elapsed_s / min_interval_s`` more during the drive), one trailing redraw may
    start after the drive returned, then the flush."""
    return elapsed_s / view.throttle.min_interval_s + 3


def tick_bound(view: RunView, elapsed_s: float) -> float:
    """The most clock ticks of ``view`` over a drive of ``elapsed_s`` seconds: at least
    ``clock.interval_s`` apart from a start inside the drive, plus one between the drive's
    end and the flush that stops the clock."""
    return elapsed_s / view.clock.interval_s + 1


def driven_view(engine: Engine, source: str) -> tuple[str, RunView]:
    """Start ``source``, drive it to its end under a view, and return both, redrawn."""
    run_id = engine.start(source).run_id
    view = RunView(engine, run_id)
    engine.drive(run_id)
    view.flush()
    return run_id, view


# -- in-process shell -----------------------------------------------------------------------------
def ipython_shell() -> Iterator[InteractiveShell]:
    """The body of a module fixture: the shell with ``wf_magic`` loaded, unloaded after."""
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "wf_magic")
    yield ip
    ip.run_line_magic("unload_ext", "wf_magic")


def cell(shell: InteractiveShell, line: str, body: str = CELL_DIGEST) -> Any:
    """Run ``%%workflow line`` over ``body``; what the cell evaluates to."""
    return shell.run_cell_magic("workflow", line, body)


@contextmanager
def magics_in(
    shell: InteractiveShell, state_dir: Path, *, widgets: str | None = None
) -> Iterator[WorkflowMagics]:
    """The shell's magics writing to ``state_dir`` (and showing ``widgets``, when given);
    widgets back to 'auto' and closed after."""
    found = shell.magics_manager.registry["WorkflowMagics"]
    assert isinstance(found, WorkflowMagics)
    shell.run_line_magic("config", f"WorkflowMagics.state_dir = {str(state_dir)!r}")
    if widgets is not None:
        shell.run_line_magic("config", f"WorkflowMagics.widgets = {widgets!r}")
    try:
        yield found
    finally:
        shell.run_line_magic("config", "WorkflowMagics.widgets = 'auto'")
        found.close()


# -- real kernels ---------------------------------------------------------------------------------
def kernel_spec_manager(workdir: Path) -> KernelSpecManager:
    """A manager that sees only a ``python3`` spec for this Python, written into ``workdir``.

    A ``python3`` spec elsewhere on the machine (a user's, another venv's) cannot be picked up;
    the kernel's temporary files (e.g. the notebooks' ``tempfile.mkdtemp()`` state dirs) land
    in ``workdir / "tmp"``.
    """
    scratch = workdir / "tmp"
    scratch.mkdir(exist_ok=True)
    kernels = workdir / "kernels"
    spec = kernels / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "wf_magic tests",
                "language": "python",
                "env": {"PYTHONPATH": str(REPO), "TMPDIR": str(scratch)},
            }
        )
    )
    return KernelSpecManager(kernel_dirs=[str(kernels)])


def new_notebook() -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}
        }
    )


def execute_notebook(
    nb: nbformat.NotebookNode, workdir: Path, *, timeout: float = 120
) -> nbformat.NotebookNode:
    """Execute ``nb`` in a kernel running this very Python (raises on the first error)."""
    manager = AsyncKernelManager(
        kernel_name="python3", kernel_spec_manager=kernel_spec_manager(workdir)
    )
    client = NotebookClient(
        nb,
        km=manager,
        timeout=timeout,
        allow_errors=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute(cleanup_kc=True)  # we own the manager: shut the kernel down after
    return nb


class Kernel:
    """A live ipykernel (this venv's Python) fed one cell at a time through nbclient."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.km = KernelManager(
            kernel_name="python3", kernel_spec_manager=kernel_spec_manager(workdir)
        )
        self.nb = new_notebook()
        self.client = NotebookClient(
            self.nb,
            km=self.km,
            timeout=90,
            allow_errors=False,
            resources={"metadata": {"path": str(workdir)}},
        )

    def run(self, source: str) -> nbformat.NotebookNode:
        """Execute one cell; raises CellExecutionError when the kernel replies with an error."""
        node = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(node)
        self.client.execute_cell(node, len(self.nb.cells) - 1)
        return node

    def interrupt(self) -> None:
        """What ``KernelManager.interrupt_kernel`` does for a signal-mode kernel: SIGINT to the
        kernel's process group (its sync wrapper would leak an event loop in a timer thread)."""
        provisioner = self.km.provisioner
        assert provisioner is not None
        pgid = getattr(provisioner, "pgid", None)
        if pgid:
            os.killpg(pgid, signal.SIGINT)
        else:
            os.kill(provisioner.pid, signal.SIGINT)  # type: ignore[attr-defined]

    def value(self, expr: str) -> Any:
        """The JSON value of ``expr`` evaluated in the kernel."""
        node = self.run(f"import json as _j; print(_j.dumps({expr}))")
        text = "".join(o.get("text", "") for o in node.outputs if o.get("name") == "stdout")
        return json.loads(text.strip().splitlines()[-1])

    def home(self, name: str) -> None:
        """Point the kernel's wf_magic at a fresh state dir (per test)."""
        state = self.workdir / name
        self.run(f"%config WorkflowMagics.state_dir = {str(state)!r}")


def cell_text(node: nbformat.NotebookNode) -> str:
    """Every stream and text/plain output of one executed cell, joined."""
    parts = []
    for out in node.outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        else:
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


class RecordingHandle:
    """A display handle that records what was published, in order, from any thread (no
    front end here)."""

    def __init__(self) -> None:
        self.published: list[Any] = []
        self.lock = threading.Lock()

    def update(self, obj: Any, **_kw: object) -> None:
        with self.lock:
            self.published.append(obj)

    def last(self) -> Any:
        with self.lock:
            return self.published[-1]

    def html(self) -> str:
        """The last bundle's HTML ("" before anything, or for a bundle without any)."""
        with self.lock:
            last = self.published[-1] if self.published else None
        return str(last.get("text/html", "")) if isinstance(last, dict) else ""


def until(check: Callable[[], object], timeout_s: float = 20.0) -> None:
    """Wait for ``check()`` to hold, polling; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
