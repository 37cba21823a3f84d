"""Every output reopens: what a notebook saves of each view reads without a kernel.

Executed in a real kernel (nbclient applies the display updates, as JupyterLab does) and
saved: no output is a widget alone (it would read "model not found" or "Loading widget…"
once its model is gone), no text is a widget's repr (an untrusted copy shows text/plain or
text/html), and the one widget that stays while its kernel lives, a blocked gate's decision
panel, carries text and HTML that say the decision needs a running kernel and name
``wf approve`` / ``wf reject``.
"""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tests.helpers_notebook import execute_notebook

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
REPRS = ("VBox(", "HBox(", "ReviewPanel(", "RunView(", "GridBox(", "HTML(value", "Button(")

GATED = """\
name: gated
runner: scripted
steps:
  - id: draft
    prompt: "Write a draft"
  - id: review
    prompt: "Polish {{ steps.draft.output }}"
    gate: {judge: human, criteria: [ready to publish]}
"""

SWEEP = """\
name: outs-sweep
params:
  style: {type: string}
runner: scripted
steps:
  - id: write
    prompt: "{{ params.style }}"
"""

CELLS = {
    "run": "%%workflow --as a\nname: plain\nrunner: scripted\nsteps:\n  - id: s\n    prompt: hi\n",
    "rerun": "%%workflow --as b --new\nname: plain\nrunner: scripted\nsteps:\n"
    "  - id: s\n    prompt: hi there\n",
    "sweep": "%%sweep --grid style=a,b,c --as s\n" + SWEEP,
    "status": "%workflow status {a.run_id}",
    "show": "%workflow show {a.run_id} s",
    "compare": "%workflow compare {a.run_id} {b.run_id}",
    "gate": "%%workflow --as g\n" + GATED,
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, nbformat.NotebookNode]:
    tmp = tmp_path_factory.mktemp("outputs")
    nb = new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}
        }
    )
    nb.cells = [new_code_cell(f"%env WF_MAGIC_HOME={tmp / 'home'}\n%load_ext wf_magic")]
    nb.cells += [new_code_cell(CELLS[name]) for name in CELLS]
    execute_notebook(nb, tmp)
    path = tmp / "saved.ipynb"
    nbformat.write(nb, path)
    again = nbformat.read(path, as_version=4)
    return {name: again.cells[i + 1] for i, name in enumerate(CELLS)}


@pytest.mark.parametrize("name", list(CELLS))
def test_every_saved_output_reads_without_a_widget_model(
    saved: dict[str, nbformat.NotebookNode], name: str
) -> None:
    outputs = [o for o in saved[name].outputs if "data" in o]
    assert outputs, saved[name].outputs
    for out in outputs:
        data = out["data"]
        text = str(data.get("text/plain", ""))
        assert not any(text.startswith(r) for r in REPRS), text[:200]
        if WIDGET_VIEW in data:
            # Only the live decision panel of a blocked gate stays a widget; beside it, what
            # a front end without its model shows.
            assert name == "gate"
            for kind in ("text/plain", "text/html"):
                assert "needs a running kernel" in data[kind]
                assert "wf approve" in data[kind] and "wf reject" in data[kind]
            assert "<button" not in data["text/html"]


def test_the_sweep_cell_keeps_its_static_grid_and_no_live_grid(
    saved: dict[str, nbformat.NotebookNode],
) -> None:
    datas = [o["data"] for o in saved["sweep"].outputs if "data" in o]
    assert not any(WIDGET_VIEW in d for d in datas)
    assert any("completed · 3 cells" in d.get("text/html", "") for d in datas)


def test_the_status_view_is_static_html(saved: dict[str, nbformat.NotebookNode]) -> None:
    (shown,) = [o["data"] for o in saved["status"].outputs if "data" in o]
    assert "Run completed." in shown["text/html"]


def test_a_blocked_gates_run_view_is_static_and_says_blocked(
    saved: dict[str, nbformat.NotebookNode],
) -> None:
    view, decision = [o["data"] for o in saved["gate"].outputs if "data" in o]
    assert set(view) == {"text/plain", "text/html"}
    assert "Blocked: waiting on step <code>review</code>" in view["text/html"]
    assert WIDGET_VIEW in decision
