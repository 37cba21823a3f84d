"""Figures display themselves: a matplotlib Figure a cell evaluates to shows as ``image/png``
once the extension is loaded, without ``%matplotlib inline``, and stays so in the saved file;
loading the extension does not import matplotlib."""

from __future__ import annotations

import base64
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tests.helpers_notebook import execute_notebook

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SWEEP = """\
%%sweep --grid style=a,b --grid topic=x,y --as s
name: fig-sweep
params:
  style: {type: string}
  topic: {type: string}
runner: scripted
steps:
  - id: write
    prompt: "{{ params.style }} {{ params.topic }}"
"""

FIGURES = {
    "heatmap": "s.heatmap('tokens_paid', x='style', y='topic')",
    "timeline": "run.timeline()",
    "token_chart": "run.token_chart()",
    "a plain Figure": (
        "from matplotlib.figure import Figure\nfig = Figure()\nfig.add_subplot().plot([1, 2])\nfig"
    ),
}


def test_loading_the_extension_does_not_import_matplotlib() -> None:
    code = (
        "import sys\nfrom IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'wf_magic')\n"
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> nbformat.NotebookNode:
    """A notebook whose last expressions are figures, executed in a kernel and saved."""
    tmp = tmp_path_factory.mktemp("figures")
    nb = new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}
        }
    )
    nb.cells = [
        new_code_cell(f"%env WF_MAGIC_HOME={tmp / 'home'}\n%load_ext wf_magic"),
        new_code_cell(SWEEP),
        new_code_cell(
            "from wf_magic import Engine\nimport os\n"
            "run = Engine(os.environ['WF_MAGIC_HOME']).run("
            "'name: t\\nrunner: scripted\\nsteps:\\n  - id: a\\n    prompt: hi\\n')"
        ),
        *(new_code_cell(src) for src in FIGURES.values()),
    ]
    execute_notebook(nb, tmp)
    path = tmp / "saved.ipynb"
    nbformat.write(nb, path)
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize("name", list(FIGURES))
def test_a_figure_as_a_cells_last_expression_is_saved_as_a_png(
    saved: nbformat.NotebookNode, name: str
) -> None:
    node = next(c for c in saved.cells if c.source == FIGURES[name])
    results = [o for o in node.outputs if o.output_type == "execute_result"]
    assert len(results) == 1, node.outputs
    data = results[0]["data"]
    assert "image/png" in data
    assert base64.b64decode(data["image/png"]).startswith(PNG_MAGIC)
    assert data["text/plain"].startswith("<")  # the repr stays beside it, for text front ends
    assert not [o for o in node.outputs if o.output_type == "display_data"]  # shown once
