"""Plans this version cannot drive (issue 19): read verbs report the run, driving verbs refuse.

A run's ``plan_json`` may stop decoding (hand-edited to JSON the plan models reject), or carry
a plan version outside ``OLDEST_PLAN_VERSION..PLAN_VERSION``. The read verbs (``wf status``,
``wf list``, ``wf show``, ``wf abandon``, ``Engine.handle``, ``%workflow status``) show such a
run from its row with one warning line and leave the row byte-identical (``abandon`` only
marks it abandoned); the driving verbs check the version first, then the hashes, then decode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from wf_magic import Engine, PlanIntegrityError, PlanVersionError, PlanVersionTooNew
from wf_magic.hashing import sha256_text
from wf_magic.spec.plan import OLDEST_PLAN_VERSION, PLAN_VERSION, Plan, PlanStep
from wf_magic.spec.stored import plan_warning, shape_problem
from wf_magic.users import current_user

from .conftest import db_rows, table_counts, tamper, wf_inproc, write_file

FLOW = "name: s\nsteps:\n  - id: a\n    prompt: one\n  - id: b\n    prompt: two\n"
NEWER = PLAN_VERSION + 1000
TOO_NEW = f"frozen by a newer wf_magic (plan version {NEWER} > {PLAN_VERSION}); upgrade"


def unsupported(version: int) -> str:
    return f"plan version {version} is no longer supported; start afresh with `wf run FILE --new`"


# -- the classes of plans this version cannot drive ---------------------------------------------
@dataclass(frozen=True)
class Corruption:
    """One way a run's stored plan stops being drivable, and what the warning says about it."""

    name: str
    plan: Callable[[dict[str, Any]], Any] | None
    """Edits the decoded plan (None: the plan_json is kept)."""
    rehash: bool = False
    """Also recompute plan_hash, as someone covering their tracks would."""
    version: int | None = None
    """Set the row's plan_version column."""
    needle: str = ""
    """What the warning line must say."""

    def apply(self, engine: Engine, run_id: str) -> None:
        (plan_json,) = db_rows(
            engine.state_dir, "SELECT plan_json FROM runs WHERE run_id = ?", (run_id,)
        )[0]
        new_json = str(plan_json)
        if self.plan is not None:
            edited = self.plan(json.loads(new_json))
            new_json = edited.text if isinstance(edited, Raw) else json.dumps(edited)
        sets, args = ["plan_json = ?"], [new_json]
        if self.rehash:
            sets.append("plan_hash = ?")
            args.append(sha256_text(new_json))
        if self.version is not None:
            sets.append("plan_version = ?")
            args.append(str(self.version))
        tamper(engine, f"UPDATE runs SET {', '.join(sets)} WHERE run_id = ?", (*args, run_id))  # noqa: S608


@dataclass(frozen=True)
class Raw:
    """plan_json text as is (not JSON at all)."""

    text: str


def _step0(**change: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def edit(plan: dict[str, Any]) -> dict[str, Any]:
        first = {k: v for k, v in plan["steps"][0].items() if k not in change}
        first.update({k: v for k, v in change.items() if v is not _DROP})
        return {**plan, "steps": [first, *plan["steps"][1:]]}

    return edit


_DROP = object()
NOT_DECODED = "its stored plan does not decode"
EDITED = "does not match its plan_hash"

UNDECODABLE = [
    Corruption(
        "steps is a string", lambda p: {**p, "steps": "nope"}, needle="steps: expected a list"
    ),
    Corruption("the plan is a list", lambda p: [p], needle="expected a JSON object"),
    Corruption("name is a number", lambda p: {**p, "name": 5}, needle="name: expected a string"),
    Corruption("a step lost its kind", _step0(kind=_DROP), needle="steps[0].kind: expected one of"),
    Corruption("an unknown step kind", _step0(kind="teleport"), needle='(got "teleport")'),
    Corruption("a step id is a list", _step0(id=["a"]), needle="steps[0].id: expected a string"),
    Corruption("budget is a list", lambda p: {**p, "budget": []}, needle="budget: expected an"),
    Corruption("not JSON", lambda p: Raw('{"name": "s", "steps": ['), needle="not JSON ("),
]
"""JSON the plan models reject, of the shapes a run view can tell without decoding."""
REHASHED = [
    Corruption(f"{c.name} (rehashed)", c.plan, rehash=True, needle=c.needle) for c in UNDECODABLE
]
VALUE_LEVEL = [
    Corruption("an unknown key", lambda p: {**p, "bogus": 1}, needle=EDITED),
    Corruption("max_loops is a word", _step0(max_loops="many"), needle=EDITED),
    Corruption("retry is a number", _step0(retry=3), needle=EDITED),
]
"""JSON the plan models reject that looks like a plan: the stale hash is what gives it away."""
VALUE_LEVEL_REHASHED = [
    Corruption(
        "an unknown key (rehashed)",
        lambda p: {**p, "bogus": 1},
        rehash=True,
        needle=f"{NOT_DECODED} (1 problem(s), first bogus: Extra inputs are not permitted)",
    ),
    Corruption(
        "max_loops is a word (rehashed)",
        _step0(max_loops="many"),
        rehash=True,
        needle="first steps.0.max_loops: Input should be a valid integer",
    ),
    Corruption(
        "retry is a number (rehashed)",
        _step0(retry=3),
        rehash=True,
        needle="first steps.0.retry: Input should be an object",
    ),
    Corruption(
        "a step's unknown key (rehashed)",
        _step0(colour="red"),
        rehash=True,
        needle="first steps.0.colour: Extra inputs are not permitted",
    ),
]
"""The same with the hashes recomputed: only the plan models can tell, and they are asked."""
TOO_NEW_PLANS = [
    Corruption("newer plan_version column", None, version=NEWER, needle=TOO_NEW),
    Corruption("newer plan_version key", lambda p: {**p, "plan_version": NEWER}, needle=TOO_NEW),
    Corruption(
        "newer plan_version key (rehashed)",
        lambda p: {**p, "plan_version": NEWER},
        rehash=True,
        needle=TOO_NEW,
    ),
]
TOO_OLD_PLANS = [
    Corruption(f"plan_version {v}", None, version=v, needle=unsupported(v)) for v in (0, -1)
]
EVERY_CLASS = [
    *UNDECODABLE,
    *REHASHED,
    *VALUE_LEVEL,
    *VALUE_LEVEL_REHASHED,
    *TOO_NEW_PLANS,
    *TOO_OLD_PLANS,
]
ids = [c.name for c in EVERY_CLASS]


def test_every_undecodable_edit_in_the_tables_is_rejected_by_the_plan_models(
    engine: Engine,
) -> None:
    plan = json.loads(engine.get_run(engine.start(FLOW).run_id).plan_json)
    for corruption in [*UNDECODABLE, *VALUE_LEVEL, *VALUE_LEVEL_REHASHED]:
        assert corruption.plan is not None
        edited = corruption.plan(plan)
        with pytest.raises(ValidationError):
            Plan.model_validate_json(edited.text if isinstance(edited, Raw) else json.dumps(edited))


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture
def flow_file(tmp_path: Path) -> Path:
    return write_file(tmp_path, "flow.yaml", FLOW)


def half_run(engine: Engine, source: str | Path = FLOW) -> str:
    run = engine.run(source, max_steps=1)
    assert run.status == "active"
    return run.run_id


def run_row(state_dir: Path, run_id: str) -> tuple[object, ...]:
    """Every column of the run's row, as stored."""
    return db_rows(state_dir, "SELECT * FROM runs WHERE run_id = ?", (run_id,))[0]


def column(state_dir: Path, run_id: str, name: str) -> object:
    return db_rows(state_dir, f"SELECT {name} FROM runs WHERE run_id = ?", (run_id,))[0][0]  # noqa: S608


@pytest.fixture(params=EVERY_CLASS, ids=ids)
def bad_run(request: pytest.FixtureRequest, engine: Engine) -> Iterator[tuple[str, Corruption]]:
    run_id = half_run(engine)
    corruption: Corruption = request.param
    corruption.apply(engine, run_id)
    yield run_id, corruption


def one_warning(stderr: str, run_id: str, needle: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"warning: Run {run_id}")
    assert needle in lines[0]
    return lines[0]


# -- the read verbs ------------------------------------------------------------------------------
def test_wf_status_shows_the_run_from_its_row_with_one_warning(
    bad_run: tuple[str, Corruption], state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id, corruption = bad_run
    before = run_row(state_dir, run_id)
    result = wf_inproc(capsys, state_dir, "status", run_id)
    assert result.returncode == 0
    one_warning(result.stderr, run_id, corruption.needle)
    assert result.stdout.startswith(f"Run {run_id}  s  [active]\n")
    assert "warning" not in result.stdout  # said once, on stderr
    assert run_row(state_dir, run_id) == before


@pytest.mark.parametrize("verb", [("list",), ("status",), ("list", "--all")])
def test_wf_list_lists_the_run_with_one_warning(
    verb: tuple[str, ...],
    bad_run: tuple[str, Corruption],
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id, corruption = bad_run
    before = run_row(state_dir, run_id)
    result = wf_inproc(capsys, state_dir, *verb)
    assert result.returncode == 0
    one_warning(result.stderr, run_id, corruption.needle)
    assert result.stdout.split() == [run_id, "s", "active", current_user()]  # owner column
    assert run_row(state_dir, run_id) == before


def test_wf_show_shows_an_attempt_with_one_warning(
    bad_run: tuple[str, Corruption], state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id, corruption = bad_run
    before = run_row(state_dir, run_id)
    result = wf_inproc(capsys, state_dir, "show", run_id, "a")
    assert result.returncode == 0
    one_warning(result.stderr, run_id, corruption.needle)
    assert result.stdout.startswith("a attempt 1 (loop 1, work) succeeded")
    assert run_row(state_dir, run_id) == before


def test_wf_abandon_marks_the_run_abandoned_and_changes_nothing_else(
    bad_run: tuple[str, Corruption], state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id, corruption = bad_run
    keep = "plan_json, plan_hash, plan_version, params_json, params_hash, scope_key, result_json"
    before = db_rows(state_dir, f"SELECT {keep} FROM runs")  # noqa: S608
    attempts = table_counts(state_dir)["attempts"]
    result = wf_inproc(capsys, state_dir, "abandon", run_id)
    assert result.returncode == 0
    one_warning(result.stderr, run_id, corruption.needle)
    assert result.stdout == f"run {run_id} abandoned\n"
    assert column(state_dir, run_id, "status") == "abandoned"
    assert column(state_dir, run_id, "status_reason") == "abandoned by user"
    assert db_rows(state_dir, f"SELECT {keep} FROM runs") == before  # noqa: S608
    assert table_counts(state_dir)["attempts"] == attempts


def test_engine_handle_reads_every_row_level_fact_and_carries_the_warning(
    bad_run: tuple[str, Corruption], engine: Engine, state_dir: Path
) -> None:
    run_id, corruption = bad_run
    before = run_row(state_dir, run_id)
    handle = engine.handle(run_id)
    assert handle.status == "active" and engine.status(run_id).status == "active"
    (warning,) = handle.warnings
    assert warning.startswith(f"Run {run_id}") and corruption.needle in warning
    assert handle.workflow == "s" and handle.reason is None and handle.result is None
    assert [s.status for s in handle.steps] == ["completed", "pending"]
    assert handle.output("a") == json.loads(handle.attempts()[0].output_json or "")
    assert handle.tally().steps["a"].done == 1
    assert handle.exit_code == 0
    assert handle.budget_use().units == 1
    text = repr(handle)
    assert text.startswith(f"Run {run_id}  s  [active]") and f"warning: {warning}" in text
    assert handle.attempt("a").unit_id == "a"
    assert run_row(state_dir, run_id) == before


def test_run_plan_of_an_undecodable_run_is_a_clear_error(engine: Engine) -> None:
    run_id = half_run(engine)
    UNDECODABLE[0].apply(engine, run_id)
    with pytest.raises(PlanIntegrityError, match=f"Run {run_id}: its stored plan does not decode"):
        _ = engine.handle(run_id).plan
    TOO_NEW_PLANS[0].apply(engine, run_id)
    with pytest.raises(PlanVersionTooNew, match=r"plan version \d+ > 1"):
        _ = engine.handle(run_id).plan


def test_an_intact_run_has_no_warning(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = half_run(engine)
    assert engine.handle(run_id).warnings == []
    result = wf_inproc(capsys, engine.state_dir, "status", run_id)
    assert (result.returncode, result.stderr) == (0, "")


# -- the driving verbs ---------------------------------------------------------------------------
@pytest.mark.parametrize("corruption", TOO_NEW_PLANS, ids=[c.name for c in TOO_NEW_PLANS])
@pytest.mark.parametrize("verb", ["resume", "fork", "run"])
def test_driving_a_newer_plan_exits_2_and_leaves_the_row_byte_identical(
    verb: str,
    corruption: Corruption,
    engine: Engine,
    state_dir: Path,
    flow_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = half_run(engine, flow_file)
    corruption.apply(engine, run_id)
    before, counts = run_row(state_dir, run_id), table_counts(state_dir)
    argv = {
        "resume": ("resume", run_id),
        "fork": ("fork", run_id, "--from", "b"),
        "run": ("run", str(flow_file)),
    }[verb]
    result = wf_inproc(capsys, state_dir, *argv)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    if verb == "run" and corruption.rehash:  # another plan hash: `wf run` would supersede it
        assert line == (
            f"error: Run {run_id} of this scope was {TOO_NEW} wf_magic to drive it, or "
            f"`wf abandon {run_id}` and run again. Nothing was changed."
        )
    else:
        assert line == (
            f"error: Run {run_id} was {TOO_NEW} wf_magic to drive it. Nothing was changed."
        )
    assert run_row(state_dir, run_id) == before
    assert table_counts(state_dir) == counts


@pytest.mark.parametrize("version", [0, -1, OLDEST_PLAN_VERSION - 7])
@pytest.mark.parametrize("verb", ["resume", "run"])
def test_driving_a_plan_older_than_supported_abandons_it_and_dispatches_nothing(
    verb: str,
    version: int,
    engine: Engine,
    state_dir: Path,
    flow_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = half_run(engine, flow_file)
    Corruption("old", None, version=version).apply(engine, run_id)
    attempts = db_rows(state_dir, "SELECT * FROM attempts")
    argv = ("resume", run_id) if verb == "resume" else ("run", str(flow_file))
    result = wf_inproc(capsys, state_dir, *argv)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: Run {run_id}: {unsupported(version)}. Nothing was dispatched; "
        "the run was abandoned."
    ]
    assert column(state_dir, run_id, "status") == "abandoned"
    assert column(state_dir, run_id, "status_reason") == unsupported(version)
    assert db_rows(state_dir, "SELECT * FROM attempts") == attempts


def test_an_older_plan_version_in_the_plans_own_key_abandons_too(engine: Engine) -> None:
    run_id = half_run(engine)
    Corruption("old key", lambda p: {**p, "plan_version": 0}, rehash=True).apply(engine, run_id)
    with pytest.raises(PlanVersionError, match="plan version 0 is no longer supported"):
        engine.drive(run_id)
    assert engine.get_run(run_id).status_reason == unsupported(0)


def test_the_version_is_checked_before_the_hash(engine: Engine, state_dir: Path) -> None:
    # A newer wf_magic may hash differently: its plan is refused as newer, not as edited.
    run_id = half_run(engine)
    TOO_NEW_PLANS[1].apply(engine, run_id)  # plan_json edited, plan_hash stale
    with pytest.raises(PlanVersionTooNew):
        engine.drive(run_id)
    assert column(state_dir, run_id, "status") == "active"


@pytest.mark.parametrize(
    "corruption", [*REHASHED, *VALUE_LEVEL], ids=[c.name for c in [*REHASHED, *VALUE_LEVEL]]
)
def test_driving_an_undecodable_plan_is_refused_and_leaves_the_row_as_it_is(
    corruption: Corruption, engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = half_run(engine)
    corruption.apply(engine, run_id)
    before, counts = run_row(state_dir, run_id), table_counts(state_dir)
    result = wf_inproc(capsys, state_dir, "resume", run_id)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    expected = "does not decode" if corruption.rehash else "does not match its plan_hash"
    assert line.startswith(f"error: Run {run_id}: ") and expected in line
    assert run_row(state_dir, run_id) == before
    assert table_counts(state_dir) == counts


@pytest.mark.parametrize("corruption", VALUE_LEVEL_REHASHED, ids=lambda c: c.name)
def test_a_plan_rehashed_after_an_edit_the_models_reject_warns_on_read_and_refuses_to_drive(
    corruption: Corruption, engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Shape and hashes look intact; the read verbs ask the plan models (without using the
    # decoded plan) and name the problem; the drive refuses with the same first problem.
    run_id = half_run(engine)
    corruption.apply(engine, run_id)
    before = run_row(state_dir, run_id)
    for verb in (("status", run_id), ("list",)):
        result = wf_inproc(capsys, state_dir, *verb)
        assert result.returncode == 0
        warning = one_warning(result.stderr, run_id, corruption.needle)
        assert warning.endswith(
            "it was edited outside wf_magic and cannot be driven; start afresh with "
            "`wf run FILE --new`"
        )
    first = corruption.needle.split("first ", 1)[1].split(":", 1)[0]
    with pytest.raises(PlanIntegrityError, match=f"does not decode .*first {re.escape(first)}:"):
        engine.drive(run_id)
    assert run_row(state_dir, run_id) == before


# -- %workflow status ----------------------------------------------------------------------------
def test_magic_status_shows_the_text_view_with_the_warning(engine: Engine, state_dir: Path) -> None:
    from tests.helpers_notebook import ipython_shell, magics_in

    run_id = half_run(engine)
    UNDECODABLE[0].apply(engine, run_id)
    before = run_row(state_dir, run_id)
    shells = ipython_shell()
    shell = next(shells)
    try:
        for widgets in ("off", "on"):
            with magics_in(shell, state_dir, widgets=widgets):
                handle = shell.run_line_magic("workflow", f"status {run_id}")
                assert handle.status == "active"
                (warning,) = handle.warnings
                assert NOT_DECODED in warning
                assert f"  warning: {warning}" in repr(handle)
    finally:
        next(shells, None)
    assert run_row(state_dir, run_id) == before


# -- JSON edits the plan model rejects, generated -----------------------------------------------
PLAN_KEYS = sorted(set(Plan.model_fields) - {"plan_version"})
STEP_KEYS = sorted(PlanStep.model_fields)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
EDITS = st.one_of(
    st.tuples(st.just("plan"), st.sampled_from(PLAN_KEYS) | st.text(min_size=1, max_size=8)),
    st.tuples(st.just("step"), st.sampled_from(STEP_KEYS) | st.text(min_size=1, max_size=8)),
    st.tuples(st.just("drop"), st.sampled_from(["name", "steps", "step.id", "step.kind"])),
)


def _edit(plan: dict[str, Any], edit: tuple[str, str], value: Any) -> dict[str, Any]:
    where, key = edit
    plan = json.loads(json.dumps(plan))
    if where == "plan":
        plan[key] = value
    elif where == "step":
        plan["steps"][0][key] = value
    elif key.startswith("step."):
        del plan["steps"][0][key.removeprefix("step.")]
    else:
        del plan[key]
    return plan


@pytest.fixture(scope="module")
def generated_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, str]]:
    engine = Engine(tmp_path_factory.mktemp("generated") / "state")
    yield engine, half_run(engine)
    engine.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(edit=EDITS, value=JSON_VALUES, rehash=st.booleans())
def test_any_plan_edit_the_model_rejects_is_shown_and_refused_never_driven(
    generated_run: tuple[Engine, str], edit: tuple[str, str], value: Any, rehash: bool
) -> None:
    engine, run_id = generated_run
    original = engine.get_run(run_id)
    edited = json.dumps(_edit(json.loads(original.plan_json), edit, value))
    try:
        Plan.model_validate_json(edited)
        assume(False)  # the model accepts this edit: not an undecodable plan
    except ValidationError:
        pass
    plan_hash = sha256_text(edited) if rehash else original.plan_hash
    tamper(
        engine,
        "UPDATE runs SET plan_json = ?, plan_hash = ? WHERE run_id = ?",
        (edited, plan_hash, run_id),
    )
    try:
        before = run_row(engine.state_dir, run_id)
        handle = engine.handle(run_id)
        assert handle.status == "active"
        assert repr(handle).startswith(f"Run {run_id}  s  [active]")
        if not rehash or shape_problem(edited) is not None:
            (warning,) = handle.warnings
            assert warning == plan_warning(engine.get_run(run_id))
        with pytest.raises(PlanIntegrityError, match=f"Run {run_id}: "):
            engine.drive(run_id)
        assert run_row(engine.state_dir, run_id) == before
    finally:
        tamper(
            engine,
            "UPDATE runs SET plan_json = ?, plan_hash = ?, status = 'active' WHERE run_id = ?",
            (original.plan_json, original.plan_hash, run_id),
        )


# -- decisions: approve/reject are followed by a drive, so they refuse as it does ---------------
GATED = "name: s\nsteps:\n  - id: a\n    prompt: one\n    gate: {judge: human}\n"


@pytest.mark.parametrize("verb", ["approve", "reject"])
@pytest.mark.parametrize("corruption", EVERY_CLASS, ids=ids)
def test_a_decision_on_a_blocked_run_whose_plan_cannot_be_driven_is_refused_unwritten(
    verb: str,
    corruption: Corruption,
    engine: Engine,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = engine.run(GATED).run_id
    assert engine.handle(run_id).status == "blocked"
    corruption.apply(engine, run_id)
    before = run_row(state_dir, run_id)
    attempts = db_rows(state_dir, "SELECT * FROM attempts")
    feedback = ("--feedback", "redo") if verb == "reject" else ()
    result = wf_inproc(capsys, state_dir, verb, run_id, "a", *feedback)
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert db_rows(state_dir, "SELECT * FROM attempts") == attempts  # no verdict written
    if corruption in TOO_NEW_PLANS:
        assert result.returncode == 2
        assert (
            line == f"error: Run {run_id} was {TOO_NEW} wf_magic to drive it. Nothing was changed."
        )
        assert run_row(state_dir, run_id) == before  # byte-identical
    elif corruption in TOO_OLD_PLANS:
        assert result.returncode == 1
        assert corruption.needle in line and line.endswith("the run was abandoned.")
        assert column(state_dir, run_id, "status") == "abandoned"
    else:
        assert result.returncode == 1
        assert line.startswith(f"error: Run {run_id}: ")
        assert "edited outside wf_magic. Nothing was dispatched." in line
        assert run_row(state_dir, run_id) == before
