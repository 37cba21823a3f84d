"""``wf run --replay CASSETTE`` reads the cassette before a run starts: a file that holds a
line no recording is, bytes that are not UTF-8, or no recording at all is one usage error
(exit 2) naming the flag and the file, and nothing is written — never a run whose every unit
then fails. A good cassette still replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import wf_inproc
from wf_magic import Engine
from wf_magic.runners.replay import export_cassette

WORKFLOW = """\
name: taped
runner: scripted
runners: {scripted: {rules: [{match: ".*", reply: "recorded"}]}}
steps:
  - id: a
    prompt: "say it"
"""

_line = st.one_of(
    st.text(min_size=1, max_size=40).filter(lambda t: "\n" not in t and "\r" not in t),
    st.builds(json.dumps, st.one_of(st.integers(), st.lists(st.integers()), st.none())),
    st.builds(json.dumps, st.fixed_dictionaries({"input_hash": st.integers()})),
    st.builds(json.dumps, st.fixed_dictionaries({"input_hash": st.text(max_size=8)})),
)
"""A line that is no recording: not JSON, not an object, a bad or missing field."""


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.one_of(
        st.lists(_line, min_size=1, max_size=3).map(lambda ls: "\n".join(ls) + "\n"),
        st.just(""),
        st.just("\n\n"),
    ),
    raw=st.one_of(st.none(), st.binary(min_size=1, max_size=16).filter(lambda b: b"\xff" in b)),
)
def test_a_cassette_that_cannot_replay_is_refused_before_a_run_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, body: str, raw: bytes | None
) -> None:
    import uuid

    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    (folder / "wf.yaml").write_text(WORKFLOW)
    tape = folder / "tape.jsonl"
    if raw is not None:
        tape.write_bytes(raw + body.encode())
    else:
        tape.write_text(body)
    state = folder / "state"
    done = wf_inproc(capsys, state, "run", "--replay", str(tape), str(folder / "wf.yaml"))
    assert done.returncode == 2, (body, raw, done.stderr)
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: --replay {tape}: ")
    assert "export-cassette" in line
    assert not state.exists()  # nothing written: no state dir, no run


def test_a_good_cassette_still_replays(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(WORKFLOW)
    with Engine(tmp_path / "rec") as engine:
        recorded = engine.run(str(path))
        tape = tmp_path / "tape.jsonl"
        tape.write_text("".join(f"{ln}\n" for ln in export_cassette(engine.store, recorded.run_id)))
    done = wf_inproc(capsys, tmp_path / "state", "run", "--replay", str(tape), str(path))
    assert done.returncode == 0, done.stderr
    with Engine(tmp_path / "state") as engine:
        [row] = engine.runs().itertuples()
        assert engine.status(row.run).result == "recorded"


def test_a_directory_or_fifo_as_the_cassette_is_named_as_such(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import os

    (tmp_path / "wf.yaml").write_text(WORKFLOW)
    fifo = tmp_path / "tape.fifo"
    os.mkfifo(fifo)
    for path in (tmp_path, fifo):
        done = wf_inproc(
            capsys, tmp_path / "state", "run", "--replay", str(path), str(tmp_path / "wf.yaml")
        )
        assert done.returncode == 2
        assert done.stderr == (
            f"error: --replay {path}: not a regular file (a directory, a FIFO or a device); "
            "give the cassette file `wf export-cassette RUN` wrote.\n"
        )
