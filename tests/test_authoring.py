"""Authoring verbs (issue 19 item 6): `wf check FILE…` and `wf new NAME [--kind K] [--force]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import db_rows, run_wf, wf_inproc, write_file
from wf_magic.spec.authoring import FileCheck, check_file
from wf_magic.spec.starters import STARTERS, starter_text
from wf_magic.verbs import VERBS

GOOD = """\
name: good
params:
  topic: {type: string, default: tides}
steps:
  - id: a
    prompt: "About {{ params.topic }}"
  - id: b
    map: "{{ [1, 2] }}"
    prompt: "{{ steps.a.output }} #{{ item }}"
"""

# (case, source, expected output line after "FILE"): one row per class of bad input.
BAD_INPUTS: list[tuple[str, str, str]] = [
    (
        "yaml-syntax",
        "name: x\nsteps:\n  - id: a\n    prompt: [unclosed\n",
        ":5: error: invalid YAML: expected ',' or ']', but got '<stream end>'",
    ),
    (
        "unknown-key",
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n    promt: typo\n",
        ":5: error: steps[0].promt: unknown key; check its spelling against the format reference",
    ),
    (
        "template-later-step",
        "name: x\nsteps:\n  - id: a\n    prompt: '{{ steps.b.output }}'\n"
        "  - id: b\n    prompt: hi\n",
        ":4: error: steps[0].prompt: template refers to a later step 'b'; only earlier steps' "
        "outputs are in scope (earlier: none)",
    ),
    (
        "template-syntax",
        "name: x\nsteps:\n  - id: a\n    prompt: '{{ params. }}'\n",
        ":4: error: steps[0].prompt: invalid template: expected name or number (template line 1)",
    ),
    (
        "map-not-a-template",
        "name: x\nsteps:\n  - id: a\n    map: [1, 2]\n    prompt: '{{ item }}'\n",
        ":4: error: steps[0].map: Input should be a valid string",
    ),
    (
        "map-undeclared-param",
        "name: x\nsteps:\n  - id: a\n    map: '{{ params.files }}'\n    prompt: '{{ item }}'\n",
        ":4: error: steps[0].map: template refers to undeclared param 'files'; declare it under "
        "params: (declared: none)",
    ),
    (
        "item-outside-a-map",
        "name: x\nsteps:\n  - id: a\n    prompt: '{{ item }}'\n",
        ":4: error: steps[0].prompt: template names unknown variable(s) ['item']; in scope: "
        "['gate', 'params', 'steps', 'sweep']",
    ),
    (
        "duplicate-step-id",
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n  - id: a\n    prompt: hi\n",
        ":5: error: steps[1].id: duplicate step id 'a' (first at steps[0])",
    ),
    (
        "two-kinds-in-one-step",
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n    exec: [echo]\n",
        ":3: error: steps[0]: a step needs exactly one of prompt, exec, python, workflow, route, "
        "agent (got prompt, exec)",
    ),
    (
        "unknown-runner",
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n    runner: nosuch\n",
        ":5: error: steps[0].runner: unknown runner 'nosuch'; known runners: [",
    ),
    (
        "route-to-nowhere",
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n  - id: r\n    route:\n"
        "      on: '{{ steps.a.output }}'\n      cases: {x: nowhere}\n",
        ":8: error: steps[1].route.cases.x: route target 'nowhere' is not a step id",
    ),
    (
        "bad-param-schema",
        "name: x\nparams:\n  n: {type: integr}\nsteps:\n  - id: a\n    prompt: hi\n",
        ":3: error: params.n: invalid schema: 'integr' is not valid under any of the given schemas",
    ),
    (
        "expr-gate-without-check",
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n    gate: {judge: expr}\n",
        ":5: error: steps[0].gate: an expr judge needs `check:` (a Jinja boolean expression)",
    ),
    (
        "bad-workflow-name",
        "name: Bad Name\nsteps:\n  - id: a\n    prompt: hi\n",
        ":1: error: name: expected a name matching ^[a-z0-9][a-z0-9_-]*$ (got 'Bad Name')",
    ),
    ("no-steps", "name: x\nsteps: []\n", ":2: error: steps: must have at least 1 item(s)"),
    (
        "unknown-child-workflow",
        "name: x\nsteps:\n  - id: a\n    workflow: no-such-kid\n",
        ":4: error: steps[0].workflow: unknown child workflow 'no-such-kid': define it in the "
        "same file (a further YAML document), in an earlier %%workflow cell, as no-such-kid.yaml "
        "beside this file, or in the workflow library (docs/library.md)",
    ),
    (
        "error-in-a-child-document",
        "name: x\nsteps:\n  - id: a\n    workflow: kid\n---\nname: kid\nsteps:\n"
        "  - id: b\n    promt: x\n",
        ":9: error: steps[0].promt: in child workflow 'kid': unknown key; check its spelling "
        "against the format reference",
    ),
    (
        "not-a-mapping",
        "- just\n- a list\n",
        ":1: error: (top level): expected a mapping with name and steps (got list)",
    ),
    (
        "size-nesting-depth",
        "name: x\ndescription: " + "[" * 70 + "]" * 70 + "\nsteps:\n  - id: a\n    prompt: hi\n",
        ":2: error: values nest deeper than 64 levels; flatten the structure",
    ),
    (
        "size-integer-digits",
        "name: x\nsteps:\n  - id: a\n    prompt: hi\n    timeout: " + "9" * 4400 + "\n",
        ":5: error: steps[0].timeout: integer is too large; at most 4300 digits",
    ),
    (
        "size-step-id-length",
        "name: x\nsteps:\n  - id: " + "a" * 65 + "\n    prompt: hi\n",
        ":3: error: steps[0].id: String should have at most 64 characters",
    ),
    (
        "size-source-bytes",
        "name: x\ndescription: " + "x" * 1_000_001 + "\nsteps:\n  - id: a\n    prompt: hi\n",
        ": error: source is larger than 1000000 bytes (1000055 bytes)",
    ),
]


@pytest.fixture
def quiet_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no state dir anywhere: ./.wf_magic and $WF_MAGIC_HOME unset."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("WF_MAGIC_HOME")
    return work


def _nothing_written(tmp_path: Path, work: Path, *keep: str) -> None:
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "home").exists()
    # (a python target's module may leave __pycache__: Python's, not wf_magic's)
    assert sorted(p.name for p in work.iterdir() if p.name != "__pycache__") == sorted(keep)


@pytest.mark.parametrize(("case", "source", "expected"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_check_prints_the_line_of_each_class_of_bad_input_and_exits_2(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    quiet_dir: Path,
    case: str,
    source: str,
    expected: str,
) -> None:
    path = write_file(quiet_dir, f"{case}.yaml", source)

    done = wf_inproc(capsys, tmp_path / "state", "check", path.name)

    if expected.endswith("["):  # a list that tests may extend (registered runners): its head
        assert (done.returncode, done.stderr) == (2, "")
        assert done.stdout.startswith(f"{path.name}{expected}") and "'scripted'" in done.stdout
    else:
        assert (done.returncode, done.stdout, done.stderr) == (2, f"{path.name}{expected}\n", "")
    _nothing_written(tmp_path, quiet_dir, path.name)


def test_check_names_a_file_it_cannot_read_or_decode(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, quiet_dir: Path
) -> None:
    (quiet_dir / "latin1.yaml").write_bytes(b"name: x\nsteps:\n  - id: a\n    prompt: caf\xe9\n")

    done = wf_inproc(capsys, tmp_path / "state", "check", "missing.yaml", "latin1.yaml")

    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        "missing.yaml: error: cannot read workflow file: No such file or directory",
        "latin1.yaml:4: error: not UTF-8 (byte 0xe9); save the file as UTF-8",
    ]
    _nothing_written(tmp_path, quiet_dir, "latin1.yaml")


def test_check_of_good_files_prints_the_plan_hash_a_run_records_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, quiet_dir: Path
) -> None:
    good = write_file(quiet_dir, "good.yaml", GOOD)
    other = write_file(quiet_dir, "other.yaml", GOOD.replace("name: good", "name: other"))

    done = wf_inproc(capsys, tmp_path / "state", "check", "good.yaml", "other.yaml")

    assert (done.returncode, done.stderr) == (0, "")
    first, second = done.stdout.splitlines()
    assert first.startswith("good.yaml: ok ") and second.startswith("other.yaml: ok ")
    hashes = [first.split()[-1], second.split()[-1]]
    assert len(set(hashes)) == 2 and all(len(h) == 64 for h in hashes)
    _nothing_written(tmp_path, quiet_dir, "good.yaml", "other.yaml")

    ran = wf_inproc(capsys, tmp_path / "state", "run", str(good), "--quiet")
    assert ran.returncode == 0, ran.stderr
    assert db_rows(tmp_path / "state", "SELECT plan_hash FROM runs") == [(hashes[0],)]
    assert check_file(other) == FileCheck(path=str(other), plan_hash=hashes[1])


def test_check_reports_every_file_and_fails_if_one_fails(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, quiet_dir: Path
) -> None:
    write_file(quiet_dir, "good.yaml", GOOD)
    write_file(quiet_dir, "bad.yaml", "name: x\nsteps:\n  - id: a\n    prompt: hi\n    promt: x\n")

    done = wf_inproc(capsys, tmp_path / "state", "check", "bad.yaml", "good.yaml")

    assert done.returncode == 2
    bad, good = done.stdout.splitlines()
    assert bad.startswith("bad.yaml:5: error: steps[0].promt: unknown key")
    assert good == f"good.yaml: ok {check_file('good.yaml').plan_hash}"


def test_check_names_the_library_child_an_error_is_in(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, quiet_dir: Path
) -> None:
    write_file(quiet_dir, "parent.yaml", "name: parent\nsteps:\n  - id: a\n    workflow: kid\n")
    write_file(quiet_dir, "kid.yaml", "name: kid\nsteps:\n  - id: b\n    prompt: hi\n    x: 1\n")

    done = wf_inproc(capsys, tmp_path / "state", "check", "parent.yaml")

    assert done.returncode == 2
    assert done.stdout == (
        "parent.yaml: error: steps[0].x: in child workflow 'kid': unknown key; check its "
        "spelling against the format reference (in workflow kid, line 5)\n"
    )


def test_check_as_a_process_exits_2_and_creates_no_state_dir(tmp_path: Path) -> None:
    write_file(tmp_path, "bad.yaml", "name: x\nsteps: []\n")
    write_file(tmp_path, "good.yaml", GOOD)

    bad = run_wf(tmp_path / "state", "check", "bad.yaml", cwd=tmp_path)
    good = run_wf(tmp_path / "state", "check", "good.yaml", cwd=tmp_path)

    assert (bad.returncode, bad.stdout) == (
        2,
        "bad.yaml:2: error: steps: must have at least 1 item(s)\n",
    )
    assert (good.returncode, good.stdout.split()[:2]) == (0, ["good.yaml:", "ok"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "good.yaml"]


# -- wf new -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(STARTERS))
def test_each_starter_is_written_checks_and_runs_offline_to_completion(
    tmp_path: Path, kind: str
) -> None:
    state = tmp_path / "state"

    made = run_wf(state, "new", f"demo-{kind}", "--kind", kind, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    path = tmp_path / f"demo-{kind}.yaml"
    assert made.stdout == (
        f"wrote demo-{kind}.yaml (a {kind} starter); `wf check demo-{kind}.yaml` then "
        f"`wf run demo-{kind}.yaml`\n"
    )
    text = path.read_text(encoding="utf-8")
    assert text.startswith(f"# demo-{kind}: a starter workflow written by `wf new demo-{kind}")
    assert f"\nname: demo-{kind}\n" in text and "runner: scripted" in text
    assert "@NAME@" not in text and "@FILE@" not in text
    assert not state.exists()

    checked = run_wf(state, "check", path.name, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    ran = run_wf(state, "run", path.name, "--quiet", cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    [(status, plan_hash, result)] = db_rows(
        state, "SELECT status, plan_hash, result_json FROM runs"
    )
    assert (status, plan_hash) == ("completed", checked.stdout.split()[-1])
    assert json.loads(str(result))  # a real result, not an empty one
    attempts = db_rows(state, "SELECT runner, status FROM attempts WHERE phase = 'work'")
    assert attempts and set(attempts) == {("scripted", "succeeded")}


def test_the_gate_starter_loops_once_before_its_judge_accepts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert run_wf(state, "new", "gated", "--kind", "gate", cwd=tmp_path).returncode == 0

    assert run_wf(state, "run", "gated.yaml", "--quiet", cwd=tmp_path).returncode == 0

    verdicts = db_rows(
        state,
        "SELECT unit_id, output_json FROM attempts WHERE phase = 'gate' ORDER BY attempt_pk",
    )
    assert [(u, json.loads(str(o))["complete"]) for u, o in verdicts] == [
        ("abstract.gate:l1", False),
        ("abstract.gate:l2", True),
    ]


def test_new_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert run_wf(state, "new", "mine", cwd=tmp_path).returncode == 0
    (tmp_path / "mine.yaml").write_text("name: mine  # my edits\n", encoding="utf-8")

    again = run_wf(state, "new", "mine", "--kind", "map", cwd=tmp_path)

    assert (again.returncode, again.stdout) == (2, "")
    assert again.stderr == (
        "error: wf new: mine.yaml exists; pass --force to overwrite it, or pick another NAME\n"
    )
    assert (tmp_path / "mine.yaml").read_text(encoding="utf-8") == "name: mine  # my edits\n"

    forced = run_wf(state, "new", "mine", "--kind", "map", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "mine.yaml").read_text(encoding="utf-8") == starter_text(
        "mine", "map", file_name="mine.yaml"
    )
    assert not state.exists()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "Bad Name",
            "error: wf new: expected a workflow name matching ^[a-z0-9][a-z0-9_-]*$, at most 64 "
            "characters (got 'Bad Name'); the file is NAME.yaml\n",
        ),
        (
            "x" * 65,
            "error: wf new: expected a workflow name matching ^[a-z0-9][a-z0-9_-]*$, at most 64 "
            f"characters (got '{'x' * 65}'); the file is NAME.yaml\n",
        ),
        (
            "nodir/flow",
            "error: wf new: cannot write nodir/flow.yaml (No such file or directory)\n",
        ),
    ],
)
def test_new_refuses_a_bad_name_or_place_in_one_line(
    tmp_path: Path, name: str, message: str
) -> None:
    done = run_wf(tmp_path / "state", "new", name, cwd=tmp_path)

    assert (done.returncode, done.stdout, done.stderr) == (2, "", message)
    assert list(tmp_path.iterdir()) == []


def test_new_takes_a_path_whose_stem_names_the_workflow(tmp_path: Path) -> None:
    (tmp_path / "flows").mkdir()

    done = run_wf(tmp_path / "state", "new", "flows/digest.yml", "--kind", "map", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    text = (tmp_path / "flows" / "digest.yml").read_text(encoding="utf-8")
    assert "\nname: digest\n" in text and "wf check flows/digest.yml" in text
    assert check_file(tmp_path / "flows" / "digest.yml").ok


def test_the_kind_choices_of_wf_new_are_the_starter_table() -> None:
    [new] = [v for v in VERBS if v.name == "new"]
    [kind] = [o for o in new.options if getattr(o, "flag", None) == "--kind"]
    assert kind.choices == tuple(STARTERS)  # type: ignore[union-attr]


def test_check_pins_python_targets_beside_the_file_and_leaves_sys_path_as_it_was(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, quiet_dir: Path
) -> None:
    write_file(quiet_dir, "authoring_helpers_mod.py", "def shout(text):\n    return text.upper()\n")
    write_file(
        quiet_dir,
        "py.yaml",
        "name: py\nsteps:\n  - id: a\n    python: authoring_helpers_mod:shout\n"
        "    with: {text: hi}\n  - id: b\n    python: authoring_helpers_mod:nope\n",
    )
    before = list(sys.path)

    done = wf_inproc(capsys, tmp_path / "state", "check", "py.yaml")

    assert done.returncode == 2
    assert done.stdout.startswith("py.yaml:7: error: steps[1].python: ")
    assert "nope" in done.stdout and sys.path == before
    _nothing_written(tmp_path, quiet_dir, "authoring_helpers_mod.py", "py.yaml")


# (what the module does on import, how the failure reads): one row per way an import ends.
IMPORT_ENDINGS = [
    ("raise SystemExit(0)", "SystemExit: 0"),
    ("raise SystemExit(4)", "SystemExit: 4"),
    ("import sys; sys.exit('bye')", "SystemExit: bye"),
    ("raise SystemExit", "SystemExit"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    ("raise RuntimeError('no config')", "RuntimeError: no config"),
    ("1 / 0", "ZeroDivisionError: division by zero"),
]


@pytest.mark.parametrize(("body", "said"), IMPORT_ENDINGS, ids=[b for b, _ in IMPORT_ENDINGS])
def test_a_python_target_module_that_ends_its_import_is_a_one_line_definition_error(
    body: str, said: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, quiet_dir: Path
) -> None:
    # `wf check` and `wf run` agree: exit 2 and one line naming the step's field and line,
    # never the module's own exit code or a silent stop.
    module = f"ending_mod_{abs(hash(body))}"
    write_file(quiet_dir, f"{module}.py", f"{body}\n\ndef f(x):\n    return x\n")
    write_file(
        quiet_dir,
        "py.yaml",
        f"name: py\nsteps:\n  - id: a\n    python: {module}:f\n    with: {{x: 1}}\n",
    )
    problem = f"steps[0].python: importing python target '{module}:f' failed: {said}"

    checked = wf_inproc(capsys, tmp_path / "state", "check", "py.yaml")
    assert (checked.returncode, checked.stdout, checked.stderr) == (
        2,
        f"py.yaml:4: error: {problem}\n",
        "",
    )
    ran = wf_inproc(capsys, tmp_path / "state", "run", "py.yaml")
    assert (ran.returncode, ran.stdout) == (2, "")
    assert ran.stderr == f"error: {problem} (py.yaml, line 4)\n"
    assert module not in sys.modules


def test_an_error_no_layer_translated_in_an_authoring_verb_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(path: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("wf_magic.spec.authoring.check_file", broken)
    done = wf_inproc(capsys, tmp_path / "state", "check", "x.yaml")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: `wf check` failed with RuntimeError: boom")
    assert len(done.stderr.splitlines()) == 1


# (the model param's schema, what `wf check` and `wf run` both say): check agrees with run.
TEMPLATED_MODELS = [
    ({"type": "string", "default": "m-small"}, None),
    ({"type": "string", "default": "m-large"}, None),
    ({"type": "string"}, None),  # required: no default renders; the plan waits for params
    (
        {"type": "string", "default": ""},
        "expected a model id or alias (got an empty string)",
    ),
    (
        {"type": "string", "default": "a\nb"},
        "expected a model id on one line without surrounding spaces (got 'a\\nb')",
    ),
    (
        {"type": "string", "default": "x" * 201},
        "expected a model id of at most 200 characters (got 201)",
    ),
]


@pytest.mark.parametrize(("schema", "problem"), TEMPLATED_MODELS, ids=lambda v: repr(v)[:30])
def test_check_renders_a_templated_model_with_the_default_params_as_a_run_does(
    schema: dict[str, object],
    problem: str | None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    quiet_dir: Path,
) -> None:
    source = (
        f"name: tm\nparams:\n  model: {json.dumps(schema)}\nsteps:\n"
        '  - id: a\n    model: "{{ params.model }}"\n    prompt: hi\n'
    )
    write_file(quiet_dir, "tm.yaml", source)
    checked = wf_inproc(capsys, tmp_path / "state", "check", "tm.yaml")
    extra = () if "default" in schema else ("--param", "model=m-given")
    dry = wf_inproc(capsys, tmp_path / "state", "run", "tm.yaml", "--dry-run")
    if problem is None:
        assert checked.returncode == 0, checked.stdout
        plan_hash = checked.stdout.split()[-1]
        assert checked.stdout == f"tm.yaml: ok {plan_hash}\n"
        assert dry.returncode == 0 and f"hash {plan_hash[:16]}" in dry.stdout
        if "default" in schema:  # the run records the hash the check printed
            ran = wf_inproc(capsys, tmp_path / "state", "run", "tm.yaml", *extra)
            assert ran.returncode == 0, ran.stderr
            [(recorded,)] = db_rows(tmp_path / "state", "SELECT plan_hash FROM runs", ())
            assert recorded == plan_hash
        return
    said = (
        f"steps.a.model: '{{{{ params.model }}}}' rendered to an unusable model: {problem}; "
        "pass a model id or alias in the param"
    )
    assert (checked.returncode, checked.stdout) == (
        2,
        f"tm.yaml: error: {said} (with the default params)\n",
    )
    ran = wf_inproc(capsys, tmp_path / "state", "run", "tm.yaml")
    assert (ran.returncode, ran.stderr) == (2, f"error: {said}\n")
    assert dry.returncode == 2
