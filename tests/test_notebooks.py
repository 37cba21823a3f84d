"""The demo notebooks run offline, top to bottom, without errors, in a real kernel (nbclient)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def execute_notebook(
    nb: nbformat.NotebookNode, workdir: Path, *, timeout: float = 120
) -> nbformat.NotebookNode:
    """Execute ``nb`` in a kernel running this very Python (raises on the first error).

    The kernel spec is written into ``workdir`` and is the only one the manager sees, so a
    ``python3`` spec elsewhere on the machine (a user's, another venv's) cannot be picked up.
    """
    scratch = workdir / "tmp"  # the notebooks' tempfile.mkdtemp() state dirs land here
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
    manager = AsyncKernelManager(
        kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)])
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


def outputs_text(nb: nbformat.NotebookNode) -> str:
    """Every text/plain and stream output of ``nb``, joined."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out:
                parts.append(str(out["data"].get("text/plain", "")))
    return "\n".join(parts)


def test_the_four_demo_notebooks_exist() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.ipynb",
        "02_rerun_and_reuse.ipynb",
        "03_gates.ipynb",
        "04_budget_analysis.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_demo_notebook_runs_without_errors(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    started = time.monotonic()
    execute_notebook(nb, tmp_path)
    assert time.monotonic() - started < 120
    text = outputs_text(nb)
    assert "Traceback" not in text
    assert not (tmp_path / ".wf_magic").exists()  # each notebook uses its own state dir


def test_the_live_view_is_a_widget_in_a_kernel(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}
        }
    )
    nb.cells = [
        nbformat.v4.new_code_cell(src)
        for src in (
            f"%env WF_MAGIC_HOME={tmp_path / 'state'}\n%load_ext wf_magic",
            "%%workflow --as run\nname: tiny\nsteps:\n  - id: a\n    prompt: hi\n",
            "assert run.view.redraws >= 1 and run.status == 'completed'",
        )
    ]
    execute_notebook(nb, tmp_path)
    outputs = nb.cells[1].outputs
    widget_views = [
        o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert len(widget_views) == 1
    result = next(o for o in outputs if o.get("output_type") == "execute_result")
    assert result["data"] == {"text/plain": f"<Run {_run_id(nb)} (tiny)>"}


def _run_id(nb: nbformat.NotebookNode) -> str:
    text = nb.cells[1].outputs[-1]["data"]["text/plain"]
    return str(text.split()[1])
