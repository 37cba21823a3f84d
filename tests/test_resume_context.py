"""Resume of a large map: a recorded context vouches for done units while it is the only one.

A unit is owed unless it has a succeeded attempt for its current input hash (DESIGN.md §3,
invariant 4). A map's loop records the context hash it dispatches under; while that is the
only context ever recorded for the loop, its succeeded attempts answer their units without
rendering them. Anything else (a second context, no record, a nondeterministic template)
renders and compares every unit, as always.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from wf_magic import Engine
from wf_magic.bus import Event
from wf_magic.drive import loopcontext
from wf_magic.drive import units as units_module
from wf_magic.drive.units import Feedback, LoopUnits, build_units
from wf_magic.spec.freeze import load_workflow

from .conftest import db_rows, tamper

ITEMS = 12


def mapped(prompt: str = "unit {{ item }}") -> str:
    return (
        "name: big\nexecution:\n  max_concurrency: 1\n"
        "runners:\n  scripted:\n    rules:\n      - match: 'unit'\n        reply: 'ok {{ item }}'\n"
        "steps:\n  - id: s\n"
        f"    map: '{{{{ range({ITEMS}) | list }}}}'\n"
        f"    prompt: '{prompt}'\n"
    )


@pytest.fixture(autouse=True)
def small_maps_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Maps of a dozen units use the recorded context (the bound is 100 in production)."""
    monkeypatch.setattr(loopcontext, "CONTEXT_MIN_UNITS", 5)


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The unit ids rendered, in order."""
    seen: list[str] = []
    original = LoopUnits.render

    def counting(self: LoopUnits, unit: units_module.UnitPlan) -> units_module._Rendered:
        seen.append(unit.unit_id)
        return original(self, unit)

    monkeypatch.setattr(LoopUnits, "render", counting)
    yield seen


def stop_after(engine: Engine, finished: int) -> threading.Event:
    """A signal set once ``finished`` units have finished."""
    signal = threading.Event()
    count = 0

    def observe(event: Event) -> None:
        nonlocal count
        if event.kind == "unit_finished":
            count += 1
            if count >= finished:
                signal.set()

    engine.subscribe(observe)
    return signal


def recorded(state_dir: Path) -> list[str]:
    """The loop-context records (``first`` and ``mixed`` rows), as their values."""
    rows = db_rows(
        state_dir,
        "SELECT context_hash FROM loop_contexts ORDER BY created_at",
    )
    return [str(r[0]) for r in rows]


def dispatched(state_dir: Path) -> list[str]:
    rows = db_rows(state_dir, "SELECT unit_id FROM attempts ORDER BY attempt_pk")
    return [str(r[0]) for r in rows]


def expected_output() -> list[str]:
    return [f"ok {i}" for i in range(ITEMS)]


def test_resume_renders_only_the_units_still_owed(tmp_path: Path, renders: list[str]) -> None:
    engine = Engine(tmp_path)
    run = engine.run(mapped(), signal=stop_after(engine, 9))
    assert run.status == "active"
    assert len(recorded(tmp_path)) == 1
    renders.clear()

    resumed = Engine(tmp_path).drive(run.run_id)

    assert resumed.status == "completed"
    assert resumed.result == expected_output()
    assert renders == ["s[9]", "s[10]", "s[11]"]
    assert sorted(dispatched(tmp_path)) == sorted(f"s[{i}]" for i in range(ITEMS))
    assert len(recorded(tmp_path)) == 1  # the fast path writes nothing


def test_resume_builds_only_the_units_still_owed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(tmp_path)
    run = engine.run(mapped(), signal=stop_after(engine, 9))
    assert run.status == "active"
    built: list[str] = []
    original = units_module.UnitPlan.__init__

    def counting(self: units_module.UnitPlan, loop: LoopUnits, unit_id: str, *args: object) -> None:
        built.append(unit_id)
        original(self, loop, unit_id, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(units_module.UnitPlan, "__init__", counting)

    resumed = Engine(tmp_path).drive(run.run_id)

    assert resumed.status == "completed"
    assert resumed.result == expected_output()
    assert built == ["s[9]", "s[10]", "s[11]"]  # each once; none of the nine done


def test_a_loops_units_behave_as_a_sequence_built_on_demand() -> None:
    plan = load_workflow(mapped()).plan
    units = build_units(plan, plan.steps[0], params={}, outputs={}, loop=1, feedback=None)

    assert len(units) == ITEMS
    assert units[-1] is units[ITEMS - 1]  # one object per unit, however it is reached
    assert [u.unit_id for u in units[2:4]] == ["s[2]", "s[3]"]
    assert [u.item_index for u in units] == list(range(ITEMS))
    assert units[5].prompt == "unit 5"
    with pytest.raises(IndexError):
        units[ITEMS]
    single = load_workflow("name: one\nsteps:\n  - id: only\n    prompt: hi\n").plan
    alone = build_units(single, single.steps[0], params={}, outputs={}, loop=1, feedback=None)
    assert [(u.unit_id, u.item_index, u.item) for u in alone] == [("only", None, None)]


def test_a_loops_context_record_is_deleted_with_its_run(tmp_path: Path) -> None:
    engine = Engine(tmp_path)
    run = engine.run(mapped())
    assert run.status == "completed"
    assert len(recorded(tmp_path)) == 1
    assert engine.gc(older_than_s=0) == [run.run_id]
    assert recorded(tmp_path) == []
    engine.close()


def test_a_second_context_makes_the_loop_compare_every_unit_for_good(
    tmp_path: Path, renders: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = loopcontext._code_fingerprint()
    renderer = [original]
    monkeypatch.setattr(loopcontext, "_code_fingerprint", lambda: renderer[0])
    engine = Engine(tmp_path)
    run = engine.run(mapped(), signal=stop_after(engine, 4))
    renderer[0] = "another renderer"
    again = Engine(tmp_path)
    again.drive(run.run_id, signal=stop_after(again, 4))
    contexts = recorded(tmp_path)  # the first, then the mixed mark naming the other
    assert len(contexts) == len(set(contexts)) == 2
    renderer[0] = original
    renders.clear()

    done = Engine(tmp_path).drive(run.run_id)

    assert done.result == expected_output()
    assert sorted(renders) == sorted(f"s[{i}]" for i in range(ITEMS))  # no shortcut
    assert len(dispatched(tmp_path)) == ITEMS  # the hashes never changed: nothing re-ran
    assert len(recorded(tmp_path)) == 2  # already mixed: nothing more to record


def test_a_loop_with_attempts_but_no_record_is_compared_and_never_recorded(
    tmp_path: Path, renders: list[str]
) -> None:
    engine = Engine(tmp_path)
    run = engine.run(mapped(), signal=stop_after(engine, 6))
    engine.close()
    tamper(engine, "DELETE FROM loop_contexts")
    renders.clear()

    done = Engine(tmp_path).drive(run.run_id)

    assert done.result == expected_output()
    assert len(renders) == ITEMS
    assert recorded(tmp_path) == []  # it could not vouch for attempts made before it
    assert len(dispatched(tmp_path)) == ITEMS


def test_a_gate_loop_is_another_context(tmp_path: Path) -> None:
    engine = Engine(tmp_path)
    run = engine.run(mapped(), signal=stop_after(engine, 6))
    contexts = set(recorded(tmp_path))
    wf = load_workflow(mapped())
    step = wf.plan.steps[0]
    again = build_units(wf.plan, step, params={}, outputs={}, loop=1, feedback=None)
    looped = build_units(
        wf.plan, step, params={}, outputs={}, loop=2, feedback=Feedback(loop=1, feedback="more")
    )
    assert again.context_hash in contexts
    assert looped.context_hash not in contexts
    assert Engine(tmp_path).drive(run.run_id).result == expected_output()


@pytest.mark.parametrize(
    "prompt",
    ["pick {{ [1, 2] | random }} {{ item }}", "{{ lipsum(1) }} {{ item }}"],
)
def test_a_template_that_renders_differently_each_time_has_no_context(prompt: str) -> None:
    wf = load_workflow(mapped(prompt))
    units = build_units(wf.plan, wf.plan.steps[0], params={}, outputs={}, loop=1, feedback=None)
    assert units.context_hash is None


def test_the_context_names_outputs_read_and_their_order() -> None:
    source = mapped("{{ steps.a.output | tojson }} {{ item }}").replace(
        "steps:\n", "steps:\n  - id: a\n    prompt: 'unit 0'\n"
    )
    wf = load_workflow(source)
    step = wf.plan.steps[1]

    def context(outputs: dict[str, object]) -> str | None:
        built = build_units(wf.plan, step, params={}, outputs=outputs, loop=1, feedback=None)
        return built.context_hash

    assert context({"a": {"x": 1, "y": 2}}) == context({"a": {"x": 1, "y": 2}, "other": 3})
    assert context({"a": {"x": 1, "y": 2}}) != context({"a": {"y": 2, "x": 1}})
    assert context({"a": {"1": 1}}) != context({"a": {1: 1}})
    assert context({"a": [1]}) != context({"a": [True]})


def test_small_maps_and_single_steps_have_no_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loopcontext, "CONTEXT_MIN_UNITS", 100)
    wf = load_workflow(mapped())
    units = build_units(wf.plan, wf.plan.steps[0], params={}, outputs={}, loop=1, feedback=None)
    assert units.context_hash is None
    single = load_workflow("name: one\nsteps:\n  - id: a\n    prompt: hi\n")
    one = build_units(
        single.plan, single.plan.steps[0], params={}, outputs={}, loop=1, feedback=None
    )
    assert one.context_hash is None


def test_a_template_error_in_an_owed_unit_fails_the_step_before_anything_dispatches(
    tmp_path: Path,
) -> None:
    source = mapped("{{ [1][item] }}")  # item 0 renders; item 1 is out of range
    run = Engine(tmp_path).run(source)
    assert run.status == "failed"
    assert "unit s[1]: template failed" in str(run.reason)
    assert dispatched(tmp_path) == []


GATED = (
    "name: gated\nexecution:\n  max_concurrency: 1\n"
    "runners:\n  scripted:\n    rules:\n"
    "      - {match: 'fixed \\d', reply: {complete: true, feedback: '', missing: []}}\n"
    "      - {match: 'Artifact', reply: {complete: false, feedback: 'fix all', missing: []}}\n"
    "      - {match: 'Gate feedback', reply: 'fixed {{ item }}'}\n"
    "      - {match: 'unit', reply: 'ok {{ item }}'}\n"
    "steps:\n  - id: s\n"
    f"    map: '{{{{ range({ITEMS}) | list }}}}'\n"
    "    prompt: 'unit {{ item }}'\n"
    "    gate: {max_loops: 2}\n"
)


def test_a_resumed_gate_loop_replays_each_loop_from_its_own_record(
    tmp_path: Path, renders: list[str]
) -> None:
    engine = Engine(tmp_path)
    run = engine.run(GATED, signal=stop_after(engine, ITEMS + 4))
    assert run.status == "active"
    assert len(recorded(tmp_path)) == 2  # one per loop
    owed = ITEMS - len(
        db_rows(
            tmp_path,
            "SELECT 1 FROM attempts WHERE loop = 2 AND status = 'succeeded' AND phase = 'work'",
        )
    )
    renders.clear()

    done = Engine(tmp_path).drive(run.run_id)

    assert done.status == "completed"
    assert done.result == [f"fixed {i}" for i in range(ITEMS)]
    assert 0 < owed < ITEMS
    assert len(renders) == owed  # loop 1 and loop 2's done units are vouched for
    work = db_rows(
        tmp_path, "SELECT loop, count(*) FROM attempts WHERE phase = 'work' GROUP BY loop"
    )
    assert work == [(1, ITEMS), (2, ITEMS)]


def test_journal_rows_that_do_not_fit_the_units_make_the_loop_compare_every_unit(
    tmp_path: Path, renders: list[str]
) -> None:
    engine = Engine(tmp_path)
    run = engine.run(mapped(), signal=stop_after(engine, 6))
    engine.close()
    tamper(engine, "DROP TRIGGER attempts_terminal_immutable")  # a person with sqlite3
    tamper(engine, "UPDATE attempts SET item_index = NULL WHERE unit_id = 's[2]'")
    renders.clear()

    done = Engine(tmp_path).drive(run.run_id)

    assert done.result == expected_output()
    assert len(renders) == ITEMS  # no shortcut over rows it cannot place
    assert len(dispatched(tmp_path)) == ITEMS


@pytest.mark.parametrize(
    ("prompt", "reads_b"),
    [
        ("{{ params.a }} {{ item }}", False),  # b (a secret, say) is neither needed nor hashed
        ('{% for k in ["a", "b"] %}{{ params[k] }}{% endfor %} {{ item }}', True),
        ("{{ params | tojson }} {{ item }}", True),
    ],
)
def test_the_context_holds_the_params_the_templates_can_read(prompt: str, reads_b: bool) -> None:
    wf = load_workflow(mapped(prompt) + "params:\n  a: {type: string}\n  b: {type: string}\n")

    def context(params: dict[str, object]) -> str | None:
        step = wf.plan.steps[0]
        return build_units(
            wf.plan, step, params=params, outputs={}, loop=1, feedback=None
        ).context_hash

    assert context({"a": "1", "b": "2"}) != context({"a": "2", "b": "2"})
    assert (context({"a": "1", "b": "2"}) != context({"a": "1", "b": "3"})) is reads_b
