"""What each attempt was sent: journaled inputs, attempt records, loop and run diffs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from wf_magic import Engine, UsageError
from wf_magic.inspection import NOT_RECORDED

from .conftest import db_rows, tamper, wf_inproc

GATED = """
name: g
params:
  topic: {type: string, default: owls}
runners:
  scripted:
    rules:
      - {match: "Gate feedback", reply: "better text"}
      - {match: "^Write", reply: "draft text"}
steps:
  - id: w
    prompt: "Write about {{ params.topic }}"
    gate: {judge: expr, check: "output == 'better text'", criteria: ["must be better"], max_loops: 3}
"""

FAN = """
name: fan
steps:
  - id: outline
    prompt: "Outline {{ params.topic }}"
  - id: draft
    map: "{{ [1, 2, 3] }}"
    prompt: "Draft part {{ item }} of {{ params.topic }}"
params:
  topic: {type: string, default: owls}
"""


def test_each_attempt_records_the_prompt_it_was_sent_with_its_feedback_block(
    engine: Engine,
) -> None:
    run = engine.run(GATED)
    first, second = run.attempt("w", 1), run.attempt("w")
    assert first.input is not None and second.input is not None
    assert first.input["prompt"] == "Write about owls"
    assert second.attempt == 2 and second.loop == 2
    assert second.input["prompt"] == (
        "Write about owls\n\nGate feedback (loop 1 was rejected):\nmust be better\n"
        "Missing:\n- must be better"
    )
    assert (first.output, second.output) == ("draft text", "better text")
    verdict = run.attempt("w.gate:l1")
    assert verdict.input == {
        "check": "output == 'better text'",
        "criteria": ["must be better"],
        "judge": "expr",
        "model": None,
        "summary": '1 unit\n"draft text"',
    }


def test_inputs_are_kept_once_per_hash_across_loops_and_runs(engine: Engine) -> None:
    engine.run(FAN)
    kept = db_rows(engine.state_dir, "SELECT COUNT(*) FROM inputs")[0][0]
    attempts = db_rows(engine.state_dir, "SELECT COUNT(DISTINCT input_hash) FROM attempts")[0][0]
    assert kept == attempts == 4
    engine.run(FAN, new=True, no_cache=True)  # a second run sends exactly the same inputs
    assert db_rows(engine.state_dir, "SELECT COUNT(*) FROM inputs")[0][0] == 4
    assert db_rows(engine.state_dir, "SELECT COUNT(*) FROM attempts")[0][0] == 8


def test_the_journal_frame_carries_the_input_on_request(engine: Engine) -> None:
    run = engine.run(FAN)
    assert "input" not in run.journal().columns
    frame = run.journal(inputs=True)
    prompts = [json.loads(text)["prompt"] for text in frame["input"]]
    assert prompts == [
        "Outline owls",
        "Draft part 1 of owls",
        "Draft part 2 of owls",
        "Draft part 3 of owls",
    ]
    assert str(frame["input"].dtype) == "string"


def test_an_attempt_journaled_before_inputs_reads_as_not_recorded(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    run = engine.run(FAN)
    tamper(engine, "DELETE FROM inputs")  # what a journal written by an older version holds
    record = run.attempt("draft[1]")
    assert record.input is None and record.output is not None
    assert run.journal(inputs=True)["input"].isna().all()
    res = wf_inproc(capsys, engine.state_dir, "show", run.run_id, "draft[1]")
    code, out, _ = res.returncode, res.stdout, res.stderr
    assert code == 0 and NOT_RECORDED in out


def test_secret_params_are_masked_in_the_kept_input(tmp_path: Path) -> None:
    source = FAN.replace("topic", "api_token")
    engine = Engine(tmp_path / "state")
    try:
        run = engine.run(source, params={"api_token": "sk-canary-5a1e"})
        assert run.attempt("outline").input == {
            "feedback": None,
            "item": None,
            "kind": "prompt",
            "model": None,
            "output": None,
            "prompt": "Outline ***",
        }
        conn = sqlite3.connect(engine.db_path)
        try:
            kept = "".join(r[0] for r in conn.execute("SELECT input_json FROM inputs"))
        finally:
            conn.close()
        assert "sk-canary-5a1e" not in kept
    finally:
        engine.close()


def test_a_loop_diff_shows_what_the_feedback_changed(engine: Engine) -> None:
    run = engine.run(GATED)
    diff = run.diff("w", 1, 2)
    assert "+Gate feedback (loop 1 was rejected):" in diff
    assert "-draft text" in diff and "+better text" in diff
    assert "color:#1a7f37" in diff._repr_html_()
    assert run.diff("w.gate:l1", 1, 1) == ""
    with pytest.raises(UsageError, match="has no loop 7"):
        run.diff("w", 1, 7)


def test_wf_diff_names_the_units_an_edit_changed_and_their_token_delta(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    before = engine.run(FAN)
    after = engine.run(FAN.replace("Draft part", "Write part"))
    res = wf_inproc(capsys, engine.state_dir, "diff", before.run_id, after.run_id)
    code, out, _ = res.returncode, res.stdout, res.stderr
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"3 unit(s) differ between {before.run_id} and {after.run_id}")
    assert [line for line in lines if line.startswith("== ")] == [
        "== draft[0] (+0 tokens)",
        "== draft[1] (+0 tokens)",
        "== draft[2] (+0 tokens)",
    ]
    assert "-Draft part 1 of owls" in out and "+Write part 1 of owls" in out
    res = wf_inproc(
        capsys, engine.state_dir, "diff", before.run_id, after.run_id, "--unit", "outline"
    )
    code, out, _ = res.returncode, res.stdout, res.stderr
    assert out.strip() == f"no unit's input differs between {before.run_id} and {after.run_id}"


def test_wf_show_prints_text_or_json_and_names_the_units_on_a_typo(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    run = engine.run(GATED)
    res = wf_inproc(capsys, engine.state_dir, "show", run.run_id, "w", "--attempt", "1")
    code, out, _ = res.returncode, res.stdout, res.stderr
    assert code == 0
    assert out.splitlines()[0].startswith("w attempt 1 (loop 1, work) succeeded — scripted")
    assert "── input ──\nWrite about owls" in out and "── output ──\ndraft text" in out
    res = wf_inproc(capsys, engine.state_dir, "show", run.run_id, "w", "--format", "json")
    code, out, _ = res.returncode, res.stdout, res.stderr
    data = json.loads(out)
    assert (data["attempt"], data["output"], data["input"]["kind"]) == (2, "better text", "prompt")
    res = wf_inproc(capsys, engine.state_dir, "show", run.run_id, "nope")
    code, _, err = res.returncode, res.stdout, res.stderr
    assert code == 2
    assert err.strip().endswith(
        "has no attempts of unit 'nope'; its units: w, w.gate:l1, w.gate:l2"
    )


def test_gc_keeps_inputs_other_runs_still_use(engine: Engine) -> None:
    first = engine.run(FAN)
    engine.run(FAN.replace("Outline", "Sketch"), new=True)  # shares the three draft inputs
    tamper(engine, "UPDATE runs SET finished_at = 0 WHERE run_id = ?", (first.run_id,))
    assert engine.gc(older_than_s=60) == [first.run_id]
    prompts = sorted(
        json.loads(r[0])["prompt"]
        for r in db_rows(engine.state_dir, "SELECT input_json FROM inputs")
    )
    assert prompts == [
        "Draft part 1 of owls",
        "Draft part 2 of owls",
        "Draft part 3 of owls",
        "Sketch owls",
    ]


def test_the_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import shutil
    from contextlib import redirect_stdout

    root = Path(__file__).resolve().parent.parent
    section = (root / "README.md").read_text().split("## What each attempt was sent", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    shutil.copytree(root / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - our own documentation
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Write the section")
    assert lines[-1] == "True"
