"""Shared harnesses of the notebook tests (magics, widgets, demo notebooks).

Not a test module: an in-process IPython shell with the extension loaded, the magics pointed
at a per-test state dir, one live kernel fed cell by cell (``Kernel``), and a whole notebook
run top to bottom (``execute_notebook``). Every kernel runs this very Python from a kernel
spec written into the test's own directory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
from IPython.core.interactiveshell import InteractiveShell
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager, KernelManager
from nbclient import NotebookClient
from traitlets.config import Config

from wf_magic.notebook.magics import WorkflowMagics

REPO = Path(__file__).resolve().parent.parent


# -- in-process shell -----------------------------------------------------------------------------
def ipython_shell() -> Iterator[InteractiveShell]:
    """The body of a module fixture: the shell with ``wf_magic`` loaded, unloaded after."""
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "wf_magic")
    yield ip
    ip.run_line_magic("unload_ext", "wf_magic")


@contextmanager
def magics_in(shell: InteractiveShell, state_dir: Path) -> Iterator[WorkflowMagics]:
    """The shell's magics writing to ``state_dir``; widgets back to 'auto' and closed after."""
    found = shell.magics_manager.registry["WorkflowMagics"]
    assert isinstance(found, WorkflowMagics)
    shell.run_line_magic("config", f"WorkflowMagics.state_dir = {str(state_dir)!r}")
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
