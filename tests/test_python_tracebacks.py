"""A failed python step keeps its traceback (its own frames) for `wf show` and the unit panel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wf_magic import Engine
from wf_magic.drive.attempts import TRACEBACK_CHARS

from .conftest import wf_inproc, write_file

HELPERS = """
def inner(n):
    return {"ratio": 1 / n}


def compute(n):
    return inner(n)


def shout(text):
    raise ValueError("bad " + str(text) * 20000)
"""

FLOW = """
name: tb
params:
  n: {type: integer, default: 0}
steps:
  - id: calc
    python: tbhelpers:compute
    with: {n: "{{ params.n }}"}
"""


def _run(engine: Engine, tmp_path: Path, source: str = FLOW) -> str:
    write_file(tmp_path, "tbhelpers.py", HELPERS)
    path = write_file(tmp_path, "tb.yaml", source)
    return engine.run(path).run_id


def test_the_traceback_names_the_steps_own_frames_only(engine: Engine, tmp_path: Path) -> None:
    run_id = _run(engine, tmp_path)
    record = engine.handle(run_id).attempt("calc")
    assert record.status == "failed"
    assert record.failure == "tbhelpers:compute raised ZeroDivisionError: division by zero"
    trace = record.traceback
    assert trace is not None
    lines = trace.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert "in compute" in trace and "in inner" in trace and 'return {"ratio": 1 / n}' in trace
    assert "wf_magic" not in trace  # none of the engine's frames


def test_wf_show_prints_the_traceback(
    capsys: pytest.CaptureFixture[str], state_dir: Path, tmp_path: Path
) -> None:
    with Engine(state_dir) as engine:
        run_id = _run(engine, tmp_path)
    out = wf_inproc(capsys, state_dir, "show", run_id, "calc").stdout
    assert "── traceback ──" in out and "in inner" in out
    shown = json.loads(
        wf_inproc(capsys, state_dir, "show", run_id, "calc", "--format", "json").stdout
    )
    assert shown["output"]["traceback"].endswith("ZeroDivisionError: division by zero")


def test_a_long_traceback_keeps_its_newest_part(engine: Engine, tmp_path: Path) -> None:
    run_id = _run(
        engine,
        tmp_path,
        FLOW.replace("tbhelpers:compute", "tbhelpers:shout").replace("{n: ", "{text: "),
    )
    trace = engine.handle(run_id).attempt("calc").traceback
    assert trace is not None
    head, _, rest = trace.partition("\n")
    assert head.startswith("… (") and head.endswith(" characters cut)")
    assert len(rest) == TRACEBACK_CHARS


def test_the_unit_panel_shows_the_traceback(engine: Engine, tmp_path: Path) -> None:
    from wf_magic.notebook.detail import StepDetail

    run_id = _run(engine, tmp_path)
    detail = StepDetail(engine.store, run_id, "calc", is_map=False)
    detail.open()
    assert "wf-traceback" in detail.unit_view.value and "in inner" in detail.unit_view.value
