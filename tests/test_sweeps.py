"""Sweeps: grid × rows × repeat expand to exactly their cells, mismatches are one-line errors,
the sweep is one durable definition (same definition, same sweep), the frame's columns, and
re-paying only changed cells."""

from __future__ import annotations

import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import db_execute, db_rows
from tests.helpers_flow import run_cli, use_runner
from wf_magic import Engine
from wf_magic.errors import PlanIntegrityError, UsageError
from wf_magic.hashing import sha256_text
from wf_magic.spec.freeze import load_workflow
from wf_magic.spec.stored import plan_warning
from wf_magic.sweeps.expand import definition, expand

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

WORKFLOW = """
name: sweep-demo
params:
  style: {type: string, default: terse}
  model: {type: string, default: m1}
  topic: {type: string, default: cats}
  n: {type: integer, default: 1}
runner: scripted
runners:
  scripted:
    rules:
      - {match: "long", reply: "a long answer", tokens_in: 10, tokens_out: 10}
      - {match: ".*", reply: "short", tokens_in: 3, tokens_out: 2}
steps:
  - id: write
    prompt: "Write {{ params.style }} about {{ params.topic }} x{{ params.n }} on {{ params.model }} (take {{ sweep.repeat }})"
"""

FRAME_FIXED = [
    "row",
    "repeat",
    "run_id",
    "status",
    "result",
    "tokens_paid",
    "tokens_original",
    "cost_paid",
    "cost_original",
    "duration_s",
]


def charged(state_dir: Path) -> int:
    """Charged attempts in the whole state database (every dispatch that cost something)."""
    return int(db_rows(state_dir, "SELECT COUNT(*) FROM attempts WHERE charged = 1")[0][0])


PLAN = load_workflow(WORKFLOW).plan

axis_values = {
    "style": st.lists(
        st.sampled_from(["terse", "long", "odd"]), min_size=1, max_size=3, unique=True
    ),
    "model": st.lists(st.sampled_from(["m1", "m2", "m3"]), min_size=1, max_size=3, unique=True),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    grid=st.dictionaries(st.sampled_from(["style", "model"]), st.just(None), max_size=2).flatmap(
        lambda keys: st.fixed_dictionaries({k: axis_values[k] for k in keys})
    ),
    rows=st.one_of(
        st.none(),
        st.lists(
            st.fixed_dictionaries(
                {"topic": st.sampled_from(["a", "b", "c"]), "n": st.integers(0, 9)}
            ),
            min_size=1,
            max_size=4,
        ),
    ),
    repeat=st.integers(1, 3),
)
def test_grid_rows_repeat_expand_to_exactly_the_expected_cells(
    grid: dict[str, list[str]], rows: list[dict[str, Any]] | None, repeat: int
) -> None:
    cells = expand(PLAN, definition(PLAN, grid=grid, rows=rows, repeat=repeat))
    points = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    row_list: list[tuple[int | None, dict[str, Any]]] = (
        [(None, {})] if rows is None else list(enumerate(rows))
    )
    expected = [
        (p, ri, rep, {**p, **row})
        for p, (ri, row), rep in itertools.product(points, row_list, range(repeat))
    ]
    assert len(cells) == len(points) * len(row_list) * repeat
    assert [c.index for c in cells] == list(range(len(cells)))
    got = [(c.point, c.row_index, c.repeat, c.params) for c in cells]
    for (point, ri, rep, given_params), (gp, gri, grep, params) in zip(expected, got, strict=True):
        assert (gp, gri, grep) == (point, ri, rep)
        assert {k: params[k] for k in given_params} == given_params
        # sweep.repeat is a param only when the sweep repeats.
        assert params.get("sweep") == ({"repeat": rep} if repeat > 1 else None)


MISMATCHES = [
    (
        dict(grid={"colour": ["red"]}),
        "sweep grid axis 'colour' is not a param of workflow 'sweep-demo'; declared: "
        "['model', 'n', 'style', 'topic']",
    ),
    (dict(grid={"style": []}), "sweep grid axis 'style' has no values; give at least one"),
    (
        dict(rows=[{"topic": "a", "topc": 3}]),
        "sweep rows: row 0 has column 'topc', which is not a param of workflow 'sweep-demo'; "
        "did you mean 'topic'? (declared: ['model', 'n', 'style', 'topic']; a column that is "
        "no param is kept as a row field only when its name is not that close to one)",
    ),
    (
        dict(grid={"topic": ["a"]}, rows=[{"topic": "b"}]),
        "sweep rows: column 'topic' is also a grid axis; keep it in one of the two",
    ),
    (dict(rows=[]), "sweep rows: no rows; give at least one or leave rows out"),
    (dict(rows=["topic"]), "sweep rows: row 0 is not an object (got str)"),
    (
        dict(rows={"topic": "a"}),
        "sweep rows: expected a DataFrame, a list of dicts or a path to a .csv or .jsonl file "
        "(got dict)",
    ),
    (dict(rows="nowhere.csv"), "sweep rows: no file 'nowhere.csv' (No such file or directory)"),
    (dict(repeat=0), "sweep repeat: expected an integer >= 1 (got 0)"),
    (
        dict(grid={"n": ["two"]}),
        "sweep cell 0 (point {'n': 'two'}, row None, repeat 0): "
        "param n: 'two' is not of type 'integer'",
    ),
    (
        dict(budget={"max_dollars": 3}),
        "sweep budget: unknown ceiling 'max_dollars'; expected one of "
        "('max_units', 'max_tokens', 'max_cost')",
    ),
    (dict(budget={"max_units": -1}), "sweep budget max_units: expected a number >= 0 (got -1)"),
]


@pytest.mark.parametrize(("kwargs", "message"), MISMATCHES)
def test_a_sweep_that_does_not_fit_the_workflow_is_a_one_line_error(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with Engine(tmp_path / "st") as engine, pytest.raises(UsageError) as caught:
        engine.sweep(WORKFLOW, **kwargs)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


def test_rows_come_from_csv_and_jsonl_files_coerced_to_the_param_types(tmp_path: Path) -> None:
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text("topic,n\ncats,2\ndogs,3\n")
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"topic": "cats", "n": 2}\n\n{"topic": "dogs", "n": 3}\n')
    for source in (csv_file, jsonl):
        cells = expand(PLAN, definition(PLAN, grid=None, rows=source, repeat=1))
        assert [(c.params["topic"], c.params["n"]) for c in cells] == [("cats", 2), ("dogs", 3)]
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"topic": "cats"}\nnot json\n')
    with pytest.raises(UsageError, match=r"^sweep rows: .*rows.jsonl line 2 is not JSON"):
        definition(PLAN, grid=None, rows=bad, repeat=1)


def test_a_sweep_runs_every_cell_once_and_the_frame_has_the_contract_columns(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(
            WORKFLOW,
            grid={"model": ["m1", "m2"], "style": ["terse", "long"]},
            rows=[{"topic": "cats"}, {"topic": "dogs"}, {"topic": "owls"}],
        )
        assert sweep.status == "completed" and sweep.status_reason is None
        assert sweep.sweep_id.startswith("sw-")
        frame = sweep.frame()
        # the rows file's fields sit beside the axes (issue 34 item 2)
        assert list(frame.columns) == ["model", "style", "topic", *FRAME_FIXED]
        assert list(frame["topic"]) == ["cats", "dogs", "owls"] * 4
        assert len(frame) == 12 and set(frame["status"]) == {"completed"}
        assert charged(state) == 12
        longs = frame[frame["style"] == "long"]
        assert set(longs["result"]) == {"a long answer"}
        assert list(longs["tokens_paid"]) == [20] * 6
        assert (frame["tokens_paid"] == frame["tokens_original"]).all()
        assert list(frame["row"]) == [0, 1, 2] * 4
        assert frame["run_id"].nunique() == 12
        # The same definition again is the same sweep: nothing more is dispatched.
        again = engine.sweep(
            WORKFLOW,
            grid={"model": ["m1", "m2"], "style": ["terse", "long"]},
            rows=[{"topic": "cats"}, {"topic": "dogs"}, {"topic": "owls"}],
        )
        assert again.sweep_id == sweep.sweep_id
        assert charged(state) == 12
        assert list(engine.sweeps()["sweep_id"]) == [sweep.sweep_id]
        assert engine.sweep_handle(sweep.sweep_id[:8]).sweep_id == sweep.sweep_id
        # "score by model × style" is one line.
        table = sweep.pivot(values="tokens_paid", index="model", columns="style")
        assert table.loc["m1", "long"] == 20 and table.loc["m2", "terse"] == 5


def test_object_results_spread_into_columns(tmp_path: Path) -> None:
    source = """
name: scored
params:
  x: {type: integer}
steps:
  - id: score
    runner: scripted
    prompt: "{{ params.x }}"
    output: {type: object}
runners:
  scripted:
    rules:
      - {match: "1", reply: '{"score": 1, "label": "one"}'}
      - {match: ".*", reply: '{"score": 0, "label": "other"}'}
"""
    with Engine(tmp_path / "st") as engine:
        frame = engine.sweep(source, grid={"x": [1, 2]}).frame()
    assert list(frame.columns) == ["x", *FRAME_FIXED, "label", "score"]  # result keys sorted
    assert list(frame["score"]) == [1, 0] and list(frame["label"]) == ["one", "other"]


def test_repeats_are_fresh_calls_and_a_single_repeat_reuses_a_plain_run(tmp_path: Path) -> None:
    state = tmp_path / "st"
    with Engine(state) as engine:
        plain = engine.run(WORKFLOW, params={"topic": "cats"})
        assert plain.status == "completed" and charged(state) == 1
        once = engine.sweep(WORKFLOW, rows=[{"topic": "cats"}])
        assert once.frame()["run_id"].tolist() == [plain.run_id]  # the plain run's scope
        assert charged(state) == 1
        assert once.frame()["tokens_paid"].tolist() == [0]
        assert once.frame()["tokens_original"].tolist() == [5]
        thrice = engine.sweep(WORKFLOW, rows=[{"topic": "cats"}], repeat=3)
        frame = thrice.frame()
        assert frame["repeat"].tolist() == [0, 1, 2]
        assert charged(state) == 4
        hashes = {
            a.input_hash for rid in frame["run_id"] for a in engine.attempts(rid) if a.charged
        }
        assert len(hashes) == 3
    recorder = use_runner("sweep-recorder", lambda request: "ok")
    with Engine(tmp_path / "st2") as engine:
        engine.sweep(WORKFLOW.replace("runner: scripted", "runner: sweep-recorder"), repeat=2)
    assert [p.rsplit(" ", 2)[-2:] for p in recorder.prompts()] == [["(take", "0)"], ["(take", "1)"]]


def test_a_changed_sweep_repays_only_the_changed_cells(tmp_path: Path) -> None:
    state = tmp_path / "st"
    rows = [{"topic": "cats"}, {"topic": "dogs"}]
    with Engine(state) as engine:
        engine.sweep(WORKFLOW, grid={"model": ["m1", "m2"]}, rows=rows)
        assert charged(state) == 4
        # A new row: only its two cells (one per model) are paid.
        bigger = engine.sweep(
            WORKFLOW, grid={"model": ["m1", "m2"]}, rows=[*rows, {"topic": "owls"}]
        )
        assert charged(state) == 6
        assert bigger.totals()["units"] == 2
        assert bigger.frame()["tokens_paid"].tolist() == [0, 0, 5, 0, 0, 5]
        # A new model: only its three cells.
        engine.sweep(WORKFLOW, grid={"model": ["m1", "m2", "m3"]}, rows=[*rows, {"topic": "owls"}])
        assert charged(state) == 9
        # One prompt edited: every cell's unit changed, so every cell is paid again...
        edited = WORKFLOW.replace("Write {{", "Please write {{")
        engine.sweep(edited, grid={"model": ["m1", "m2", "m3"]}, rows=[*rows, {"topic": "owls"}])
        assert charged(state) == 18


def test_a_two_step_edit_repays_only_the_edited_step(tmp_path: Path) -> None:
    source = (
        WORKFLOW
        + """  - id: check
    prompt: "Check {{ params.model }} {{ params.topic }}: {{ steps.write.output }}"
"""
    )
    state = tmp_path / "st"
    with Engine(state) as engine:
        engine.sweep(source, grid={"model": ["m1", "m2"]}, rows=[{"topic": "a"}, {"topic": "b"}])
        assert charged(state) == 8
        edited = source.replace("Check {{", "Verify {{")
        sweep = engine.sweep(
            edited, grid={"model": ["m1", "m2"]}, rows=[{"topic": "a"}, {"topic": "b"}]
        )
        assert charged(state) == 12  # the four `check` units; `write` is reused
        assert sweep.totals()["units"] == 4
        frame = sweep.frame()
        assert frame["tokens_paid"].tolist() == [5] * 4
        assert frame["tokens_original"].tolist() == [10] * 4


def test_a_launch_key_names_one_definition(tmp_path: Path) -> None:
    with Engine(tmp_path / "st") as engine:
        first = engine.sweep(WORKFLOW, grid={"n": [1]}, key="nightly")
        assert engine.sweep(WORKFLOW, grid={"n": [1]}, key="nightly").sweep_id == first.sweep_id
        with pytest.raises(UsageError) as caught:
            engine.sweep(WORKFLOW, grid={"n": [2]}, key="nightly")
    assert str(caught.value) == (
        f"sweep key 'nightly' launched sweep {first.sweep_id}, of another definition; use "
        f"another key, or `wf sweep-resume {first.sweep_id}` to continue that one"
    )


def test_sweep_compare_lists_changed_cells_with_deltas(tmp_path: Path) -> None:
    with Engine(tmp_path / "st") as engine:
        a = engine.sweep(WORKFLOW, grid={"style": ["terse", "long"]}, rows=[{"topic": "x"}])
        b = engine.sweep(
            WORKFLOW.replace(
                "Write {{ params.style }}",
                "Write {{ 'long' if params.style == 'terse' else 'brief' }}",
            ),
            grid={"style": ["terse", "long"]},
            rows=[{"topic": "x"}],
        )
        diff = a.compare(b, on=["style", "row"])
    assert diff[["style", "result_a", "result_b", "tokens_delta"]].values.tolist() == [
        ["terse", "short", "a long answer", 15],
        ["long", "a long answer", "short", -15],
    ]
    assert diff["units_differing"].tolist() == [1, 1]


def test_the_cli_sweep_verbs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wf_file = tmp_path / "w.yaml"
    wf_file.write_text(WORKFLOW)
    rows = tmp_path / "rows.csv"
    rows.write_text("topic,n\ncats,1\ndogs,2\n")
    state = tmp_path / "st"
    code = run_cli(
        state,
        "sweep",
        str(wf_file),
        "--grid",
        "style=terse,long",
        "--rows",
        str(rows),
        "--repeat",
        "2",
        "--max-units",
        "5",
        "--quiet",
    )
    out = capsys.readouterr().out
    assert code == 1
    sweep_id = out.split()[1]
    assert (
        out.splitlines()[0]
        == f"sweep {sweep_id} sweep-demo: stopped · 8 cells · 5 units, 40 tokens paid"
    )
    assert out.splitlines()[1] == (
        f"  sweep budget max_units reached (used 5 of 5); 3 cell(s) owed; `wf sweep-resume "
        f"{sweep_id} --max-units N` sets a new ceiling"
    )
    assert run_cli(state, "sweep-resume", sweep_id, "--quiet") == 1
    assert charged(state) == 5
    assert run_cli(state, "sweep-resume", sweep_id, "--max-units", "8", "--quiet") == 0
    assert charged(state) == 8
    capsys.readouterr()
    assert run_cli(state, "sweeps") == 0
    assert capsys.readouterr().out.split()[:3] == [sweep_id, "sweep-demo", "completed"]
    assert run_cli(state, "sweep-status", sweep_id) == 0
    assert "  cells: 8 completed" in capsys.readouterr().out
    assert run_cli(state, "sweep-frame", sweep_id, "--format", "json") == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["style"] for r in records] == ["terse"] * 4 + ["long"] * 4
    assert [r["repeat"] for r in records] == [0, 1] * 4
    assert run_cli(state, "sweep-frame", sweep_id, "--format", "csv") == 0
    # the rows file's fields beside the axes (issue 34 item 2)
    assert capsys.readouterr().out.splitlines()[0] == ",".join(
        ["style", "n", "topic", *FRAME_FIXED]
    )
    assert run_cli(state, "sweep", str(wf_file), "--grid", "colour=red") == 2
    assert capsys.readouterr().err.strip() == (
        "error: sweep grid axis 'colour' is not a param of workflow 'sweep-demo'; "
        "declared: ['model', 'n', 'style', 'topic']"
    )
    assert run_cli(state, "sweep-status", "sw-nothing") == 2


def test_the_readme_sweeps_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import shutil
    from contextlib import redirect_stdout

    root = Path(__file__).resolve().parent.parent
    section = (root / "README.md").read_text().split("## Sweeps", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    shutil.copytree(root / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - our own documentation
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["stopped", "completed"]
    assert lines[4].split() == ["long", "3.0", "3.0", "3.0"]
    assert lines[5].split() == ["terse", "1.0", "1.0", "1.0"]


def test_a_cell_driven_elsewhere_is_skipped_and_reported(tmp_path: Path) -> None:

    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(WORKFLOW, grid={"n": [1, 2, 3]}, budget={"max_units": 1})
        held = sweep.frame()["run_id"].tolist()[1]  # the cell the ceiling cut: active
        assert engine.get_run(held).status == "active"
        with engine.store.run_lock(held):
            again = engine.sweep_resume(sweep.sweep_id, budget={"max_units": 10})
            assert again.status == "running"
            assert again.status_reason == f"1 cell(s) owed; `wf sweep-resume {sweep.sweep_id}`"
            assert len(again.skipped) == 1
            assert again.skipped[0].startswith(
                f"cell 1 ({held}) skipped: Run {held} is being driven"
            )
            assert again.frame()["status"].tolist() == ["completed", "active", "completed"]
        done = engine.sweep_resume(sweep.sweep_id)
        assert done.status == "completed" and done.skipped == []
        assert charged(state) == 3


def test_a_templated_model_axis_sends_each_cell_to_its_model(tmp_path: Path) -> None:
    template = "{{ params.model }}"
    source = WORKFLOW.replace("  - id: write\n", f'  - id: write\n    model: "{template}"\n', 1)
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(source, grid={"model": ["m-small", "m-large"]})
        models = [
            [a.model for a in engine.attempts(rid) if a.charged] for rid in sweep.frame()["run_id"]
        ]
    assert models == [["m-small"], ["m-large"]]


def test_the_frame_has_a_gate_outcome_and_loops_per_gated_step_matching_the_journal(
    tmp_path: Path,
) -> None:
    source = (
        WORKFLOW
        + """    gate: {judge: expr, check: "params.n > 1", max_loops: 2}
"""
    )
    with Engine(tmp_path / "st") as engine:
        sweep = engine.sweep(source, grid={"n": [1, 2]})
        frame = sweep.frame()
        assert list(frame.columns) == ["n", *FRAME_FIXED, "gate_write", "gate_write_loops"]
        assert frame["gate_write"].tolist() == ["blocked", "passed"]
        assert frame["gate_write_loops"].tolist() == [2, 1]
        verdicts = [
            len([a for a in engine.attempts(rid) if a.phase == "gate"]) for rid in frame["run_id"]
        ]
        assert verdicts == frame["gate_write_loops"].tolist()
        assert frame["status"].tolist() == ["blocked", "completed"]
        assert sweep.status == "failed"


SLOW_MAP = """
name: sweep-slow-map
params:
  style: {type: string, default: a}
execution: {max_concurrency: 8}
steps:
  - id: each
    map: "{{ range(8) | list }}"
    python: slow
    with: {}
"""


@pytest.mark.parametrize("external", [False, True])
def test_max_concurrency_caps_the_units_in_flight_over_all_cells(
    tmp_path: Path, external: bool
) -> None:
    """Four cells of an 8-unit map under ``max_concurrency=4``: never more than 4 units at
    once in all (each cell alone would run 8), on the sweep's pool or a caller's larger one."""
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def slow(item: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.03)
        with lock:
            running[0] -= 1
        return item

    pool = ThreadPoolExecutor(max_workers=32) if external else None
    try:
        with Engine(tmp_path / "st", namespace={"slow": slow}, executor=pool) as engine:
            sweep = engine.sweep(
                SLOW_MAP.replace("    with: {}\n", ""),
                grid={"style": ["a", "b", "c", "d"]},
                max_concurrency=4,
            )
            assert sweep.status == "completed"
            assert sweep.totals()["units"] == 32
    finally:
        if pool is not None:
            pool.shutdown()
    assert 2 <= peak[0] <= 4


# -- the plan stored once per sweep (item 4) ------------------------------------------------------
def test_a_sweep_stores_its_plan_once_not_once_per_cell(state_dir: Path) -> None:
    template = "{{ params.model }}"
    source = WORKFLOW.replace("  - id: write\n", f'  - id: write\n    model: "{template}"\n', 1)
    with Engine(state_dir) as engine:
        sweep = engine.sweep(
            source, grid={"model": ["m-a", "m-b"], "style": ["terse", "long", "plain"]}
        )
        frame = sweep.frame()
        assert list(frame["status"]) == ["completed"] * 6
        # Each cell reads its own plan back (the model its params rendered).
        rows = [engine.get_run(rid) for rid in frame["run_id"]]
    assert [json.loads(r.plan_json)["steps"][0]["model"] for r in rows] == ["m-a"] * 3 + ["m-b"] * 3
    assert all(sha256_text(r.plan_json) == r.plan_hash for r in rows)
    # Six cells, two rendered plans: two copies, in `plans`; no cell row holds one.
    assert db_rows(state_dir, "SELECT COUNT(*) FROM plans") == [(2,)]
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs WHERE plan_json != ''") == [(0,)]
    stored = db_rows(state_dir, "SELECT plan_hash, plan_json FROM plans")
    assert all(sha256_text(text) == digest for digest, text in stored)


def test_a_cell_whose_shared_plan_was_edited_is_refused_like_any_run(state_dir: Path) -> None:
    with Engine(state_dir) as engine:
        sweep = engine.sweep(WORKFLOW, grid={"style": ["terse", "long"]}, budget={"max_units": 1})
        assert sweep.status == "stopped"
        frame = sweep.frame()
        owed = list(frame.loc[frame["status"] != "completed", "run_id"])
        db_execute(state_dir, "UPDATE plans SET plan_json = REPLACE(plan_json, 'Write', 'Erase')")
        row = engine.get_run(owed[0])
        assert "hash" in (plan_warning(row) or "")
        with pytest.raises(PlanIntegrityError):
            engine.drive(owed[0])


def test_gc_drops_a_shared_plan_with_the_last_run_reading_it(state_dir: Path) -> None:
    with Engine(state_dir) as engine:
        engine.sweep(WORKFLOW, grid={"style": ["terse", "long"]})
        assert db_rows(state_dir, "SELECT COUNT(*) FROM plans") == [(1,)]
        assert engine.gc(older_than_s=0) != []
    assert db_rows(state_dir, "SELECT COUNT(*) FROM runs") == [(0,)]
    assert db_rows(state_dir, "SELECT COUNT(*) FROM plans") == [(0,)]


LONE = """\
name: lone
params:
  style: {type: string}
steps:
  - id: one
    python: where
"""


@pytest.mark.parametrize("external", [False, True])
def test_a_cells_lone_unit_runs_on_its_cells_thread_unless_the_caller_gave_an_executor(
    tmp_path: Path, external: bool
) -> None:
    """On the sweep's own pool a one-unit step runs in the thread driving its cell (no
    hand-off to another thread of the pool); a caller's executor (a Dask cluster, say) still
    runs every unit. Either way the sweep's cap holds."""
    lock = threading.Lock()
    running, peak, threads = [0], [0], set()

    def where() -> str:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            threads.add(threading.current_thread().name.split("_")[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return "ok"

    pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="caller") if external else None
    try:
        with Engine(tmp_path / "st", namespace={"where": where}, executor=pool) as engine:
            sweep = engine.sweep(
                LONE, grid={"style": [f"s{i}" for i in range(12)]}, max_concurrency=4
            )
            assert sweep.status == "completed"
    finally:
        if pool is not None:
            pool.shutdown()
    assert threads == ({"caller"} if external else {"wf-cell"})
    assert 2 <= peak[0] <= 4
