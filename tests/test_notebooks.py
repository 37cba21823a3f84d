"""The demo notebooks run offline, top to bottom, without errors, in a real kernel (nbclient)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import nbformat
import pytest

from tests.helpers_notebook import execute_notebook

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def with_companions(folder: Path) -> Path:
    """``folder`` holding the tours' companion files (06's cassette), as notebooks/ does."""
    import shutil

    for companion in (REPO / "notebooks").glob("*.jsonl"):
        shutil.copy(companion, folder / companion.name)
    return folder


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


def test_the_demo_notebooks_exist() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.ipynb",
        "02_rerun_and_reuse.ipynb",
        "03_gates.ipynb",
        "04_budget_analysis.ipynb",
        "05_sweeps.ipynb",
        "06_agent_steps.ipynb",
        "07_evaluations.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_demo_notebook_runs_without_errors(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    started = time.monotonic()
    execute_notebook(nb, with_companions(tmp_path))
    assert time.monotonic() - started < 120
    text = outputs_text(nb)
    assert "Traceback" not in text
    assert not (tmp_path / ".wf_magic").exists()  # each notebook uses its own state dir


def test_the_live_view_is_a_widget_in_a_kernel(tmp_path: Path) -> None:
    """Live, the run is a widget; once its drive ended, the saved output is the static HTML
    run view (a notebook reopened without a kernel shows it), and no ``Out[n]`` follows it."""
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
            "import ipywidgets\nassert isinstance(run.view, ipywidgets.Widget)\n"
            "assert run.view.redraws >= 1 and run.status == 'completed'\nprint(run.run_id)",
        )
    ]
    execute_notebook(nb, tmp_path)
    outputs = nb.cells[1].outputs
    run_id = nb.cells[2].outputs[0]["text"].strip()
    assert [o["output_type"] for o in outputs] == ["display_data"]
    (shown,) = outputs
    assert "application/vnd.jupyter.widget-view+json" not in shown["data"]
    assert f"Run {run_id}  tiny  [completed]" in shown["data"]["text/plain"]
    assert "Run completed." in shown["data"]["text/html"] and run_id in shown["data"]["text/html"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_run_all_twice_in_one_kernel_runs_cleanly(path: Path, tmp_path: Path) -> None:
    """A teacher's Run All, then Run All again in the same kernel: the tours that reset their
    state folder in their first cell must reopen it, not fail on the deleted database."""
    import copy

    nb = nbformat.read(path, as_version=4)
    first = len(nb.cells)
    nb.cells = nb.cells + copy.deepcopy(nb.cells)
    execute_notebook(nb, with_companions(tmp_path))
    second = nbformat.v4.new_notebook(cells=nb.cells[first:])
    text = outputs_text(second)
    assert "Traceback" not in text
    assert "OperationalError" not in text and "unable to open database" not in text
    assert "not being driven" not in text


def sanitizers() -> list[tuple[re.Pattern[str], str]]:
    """The regexes of notebooks/nbval_sanitize.cfg, in order, with their replacements."""
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(REPO / "notebooks" / "nbval_sanitize.cfg")
    return [(re.compile(parser[s]["regex"]), parser[s]["replace"]) for s in parser.sections()]


def coalesced(outputs: list[nbformat.NotebookNode]) -> list[dict]:
    """``outputs`` with consecutive stream outputs of one name merged, as Jupyter shows them
    (and nbval compares them): a busy kernel may flush one ``print`` as two messages, the text
    and then its newline."""
    merged: list[dict] = []
    for out in outputs:
        last = merged[-1] if merged else None
        if (
            last is not None
            and out.get("output_type") == "stream"
            and last.get("output_type") == "stream"
            and last.get("name") == out.get("name")
        ):
            last["text"] = last.get("text", "") + out.get("text", "")
            continue
        merged.append(dict(out))
    return merged


def told(cells: list[nbformat.NotebookNode]) -> list[list[str]]:
    """What each code cell told, sanitized as nbval compares it: its streams, text and HTML
    (a widget's model id and a PNG's bytes are left out)."""
    rules = sanitizers()
    story = []
    for cell in cells:
        if cell.cell_type != "code":
            continue
        parts = []
        for out in coalesced(cell.get("outputs", [])):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            for kind in ("text/plain", "text/html"):
                parts.append(str(out.get("data", {}).get(kind, "")))
        text = "\n".join(parts)
        for pattern, replace in rules:
            text = pattern.sub(replace, text)
        story.append(text.splitlines())
    return story


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_run_all_twice_tells_the_same_story(path: Path, tmp_path: Path) -> None:
    """Each tour starts from its own fresh state: the second Run All in the same kernel gives
    the first one's sanitized outputs, cell by cell (05's budget stop stops both times)."""
    import copy

    nb = nbformat.read(path, as_version=4)
    first = len(nb.cells)
    nb.cells = nb.cells + copy.deepcopy(nb.cells)
    execute_notebook(nb, with_companions(tmp_path))
    once, twice = told(nb.cells[:first]), told(nb.cells[first:])
    for index, (a, b) in enumerate(zip(once, twice, strict=True)):
        assert a == b, f"code cell {index} told another story on the second Run All"
    if path.name == "05_sweeps.ipynb":
        stops = [c for c in once + twice if any("max_units reached" in line for line in c)]
        assert len(stops) >= 2  # the budget stop, in both passes


def test_the_agent_tours_cassette_is_a_bridge_recording_that_names_no_folder_or_key() -> None:
    """notebooks/agent_fix.cassette.jsonl (scripts/record_agent_tour.py): the real Claude Code's
    four calls of the tour's two loops, with the agent's folders as marks, never a local path
    of the recording or a key."""
    import json

    from wf_magic.bridge.tape import HOME_MARK, WORKDIR_MARK

    path = REPO / "notebooks" / "agent_fix.cassette.jsonl"
    text = path.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [(c["kind"], c["attempt"], c["call"]) for c in lines] == [
        ("agent_call", 1, 1),
        ("agent_call", 2, 1),
        ("agent_call", 2, 2),
        ("agent_call", 2, 3),
    ]
    assert {c["model"] for c in lines} == {"claude-sonnet-4-5"}
    assert f"{WORKDIR_MARK}/calc.py" in text and HOME_MARK in text
    assert "/tmp/" not in text  # the recording's checkout, worktree and HOME were temporary
    assert "sk-ant" not in text and "x-api-key" not in text


def test_a_print_flushed_as_two_messages_tells_the_same_story_as_one() -> None:
    """A busy kernel may send a ``print``'s text and its newline as two stream messages (seen
    in CI): the comparison merges them as Jupyter does, and still tells stdout from stderr."""
    one = nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output("stream", text="7 units\n")])
    two = nbformat.v4.new_code_cell(
        outputs=[
            nbformat.v4.new_output("stream", text="7 units"),
            nbformat.v4.new_output("stream", text="\n"),
        ]
    )
    mixed = nbformat.v4.new_code_cell(
        outputs=[
            nbformat.v4.new_output("stream", text="7 units"),
            nbformat.v4.new_output("stream", name="stderr", text="\n"),
        ]
    )
    assert told([two]) == told([one])
    assert told([mixed]) != told([one])
