"""Figures display themselves without the extension: in a kernel that never ran
``%load_ext wf_magic`` nor ``%matplotlib inline``, every figure a handle returns
(``Sweep.heatmap``, ``Run.timeline``, ``Run.token_chart``) is saved as ``image/png`` when it is
a cell's last expression — never ``<Figure size … with 2 Axes>`` alone."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from tests.helpers_notebook import execute_notebook, new_notebook

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SETUP = """\
import sys
from wf_magic import Engine
eng = Engine({home!r})
s = eng.sweep(
    "name: fig\\nparams:\\n  i: {{type: integer}}\\nrunner: scripted\\n"
    "steps:\\n  - id: a\\n    prompt: 'cell {{{{ params.i }}}}'\\n",
    grid={{"i": [1, 2]}},
    repeat=2,
)
run = eng.handle(s.cells()[0].run_id)
assert "wf_magic.notebook" not in sys.modules  # the extension was never loaded
"""

FIGURES = {
    "heatmap": "s.heatmap('tokens_paid', x='i', y='repeat')",
    "timeline": "run.timeline()",
    "token_chart": "run.token_chart()",
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> nbformat.NotebookNode:
    tmp = tmp_path_factory.mktemp("bare")
    nb = new_notebook()
    nb.cells = [
        new_code_cell(SETUP.format(home=str(tmp / "home"))),
        *(new_code_cell(src) for src in FIGURES.values()),
        new_code_cell("import sys\nprint('wf_magic.notebook' in sys.modules)"),
    ]
    execute_notebook(nb, tmp)
    path: Path = tmp / "saved.ipynb"
    nbformat.write(nb, path)
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize("name", list(FIGURES))
def test_a_figure_is_saved_as_a_png_in_a_kernel_without_the_extension(
    saved: nbformat.NotebookNode, name: str
) -> None:
    node = next(c for c in saved.cells if c.source == FIGURES[name])
    (result,) = [o for o in node.outputs if o.output_type == "execute_result"]
    data = result["data"]
    assert "image/png" in data, data.get("text/plain")
    assert base64.b64decode(data["image/png"]).startswith(PNG_MAGIC)
    assert not [o for o in node.outputs if o.output_type == "display_data"]  # shown once


def test_the_kernel_never_loaded_the_extension(saved: nbformat.NotebookNode) -> None:
    assert saved.cells[-1].outputs[0]["text"].strip() == "False"
