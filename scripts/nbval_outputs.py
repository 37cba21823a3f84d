"""Re-execute the tours in notebooks/ offline and save them with their outputs, for nbval.

Usage: ``.venv/bin/python scripts/nbval_outputs.py [NAME.ipynb ...]`` (default: all).

Each notebook runs in a fresh temporary folder (its state dir, worktrees and stand-in CLIs
land there, never in the repository) on a kernel of this very Python, as
tests/test_notebooks_nbval.py runs it under ``pytest --nbval``: with
``WorkflowMagics.widgets = 'off'`` from an IPython profile of its own (nbval does not apply
``update_display_data``, so a live view would be compared as its first draw, not as the static
HTML it turns into when its drive ends). What is saved is what a learner sees with no
kernel: the static HTML and text/plain renderings, never a widget model (its id is random
and its state is not saved), and no volatile metadata (execution timings, widget state).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
KERNEL_CONFIG = "c.WorkflowMagics.widgets = 'off'\n"
"""The kernel's ``ipython_kernel_config.py`` under nbval (tests/test_notebooks_nbval.py)."""


def ipython_dir(folder: Path) -> Path:
    """An IPYTHONDIR whose default profile turns the live run views off."""
    profile = folder / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(KERNEL_CONFIG)
    return folder / "ipython"


def kernel_specs(folder: Path) -> KernelSpecManager:
    """Only a ``python3`` spec running this Python, with the repository importable."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True)
    scratch = folder / "tmp"
    scratch.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    env = {
        "PYTHONPATH": str(REPO),
        "TMPDIR": str(scratch),
        "IPYTHONDIR": str(ipython_dir(folder)),
        "JUPYTERHUB_USER": "learner",  # the owner the saved run lists show, on any machine
    }
    kernel = {"argv": argv, "display_name": "Python 3", "language": "python", "env": env}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    return KernelSpecManager(kernel_dirs=[str(folder / "kernels")])


def clean(nb: nbformat.NotebookNode) -> None:
    """Drop what changes on every run and what needs a live kernel to show."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.outputs:
            data = out.get("data")
            if data is not None:
                data.pop(WIDGET_VIEW, None)
                if not data:
                    continue  # a bare widget model: nothing a reader without a kernel sees
            if "metadata" in out:
                out["metadata"] = {}
            kept.append(out)
        cell.outputs = kept


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="wf-nbval-") as tmp:
        work = Path(tmp) / "notebooks"
        work.mkdir()
        for companion in NOTEBOOKS.glob("*.jsonl"):  # a tour's cassette travels with it
            shutil.copy(companion, work / companion.name)
        client = NotebookClient(
            nb,
            kernel_name="python3",
            kernel_manager_class="jupyter_client.manager.AsyncKernelManager",
            timeout=180,
            allow_errors=False,
            resources={"metadata": {"path": str(work)}},
        )
        client.km = client.kernel_manager_class(
            kernel_name="python3", kernel_spec_manager=kernel_specs(Path(tmp))
        )
        client.execute(cleanup_kc=True)
    clean(nb)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "language": "python",
        "display_name": "Python 3",
    }
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)
    shutil.rmtree(path.parent / ".ipynb_checkpoints", ignore_errors=True)


def main(names: list[str]) -> int:
    paths = [NOTEBOOKS / n for n in names] if names else sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        print(f"executing {path.name}", flush=True)
        execute(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
