"""Hostile workflow sources end as one-line DefinitionErrors naming the field and the line."""

from __future__ import annotations

import io
import sqlite3
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from wf_magic.cli import main
from wf_magic.errors import DefinitionError, clip
from wf_magic.spec.freeze import load_workflow

STEP = "steps:\n  - id: a\n    prompt: hi\n"


def _refused(source: str, match: str, *, line: int | None = None) -> DefinitionError:
    started = time.monotonic()
    with pytest.raises(DefinitionError, match=match) as info:
        load_workflow(source)
    assert time.monotonic() - started < 5
    assert "\n" not in str(info.value) and len(str(info.value)) < 800
    if line is not None:
        assert info.value.line == line, str(info.value)
    return info.value


ALIASES = "anchors and aliases are not supported in workflows; repeat the value"


def test_an_alias_is_refused_at_its_anchor() -> None:
    _refused("x: &a [1, 2]\nname: t\n" + STEP + "    with: *a\n", ALIASES, line=1)


def test_billion_laughs_is_refused_before_expanding() -> None:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    _refused("\n".join(lines) + "\nname: t\n" + STEP, ALIASES, line=1)


def test_a_self_referencing_anchor_is_refused() -> None:
    _refused("name: t\nsteps: &s\n  - id: a\n    prompt: hi\n  - *s\n", ALIASES, line=2)


def test_merge_keys_are_refused() -> None:
    source = "name: t\nsteps:\n  - <<: {prompt: hi}\n    id: a\n"
    err = _refused(source, r"merge keys \(<<\) are not supported", line=3)
    assert err.field == "steps[0]"


@pytest.mark.parametrize(
    ("text", "tag"),
    [
        ("name: t\nsteps: !foo\n  - id: a\n    prompt: hi\n", "'!foo'"),
        ("name: t\nsteps: !!set {a: null}\n", "'tag:yaml.org,2002:set'"),
        ("name: t\nsteps: !!omap\n  - a: 1\n", "'tag:yaml.org,2002:omap'"),
        ("name: t\ndescription: !!binary aGk=\n" + STEP, "'tag:yaml.org,2002:binary'"),
        ("name: t\ndescription: !!python/name:os.system ''\n" + STEP, ".*python/name"),
    ],
)
def test_tags_are_refused_not_ignored(text: str, tag: str) -> None:
    _refused(text, f"YAML tag {tag}.* is not supported in workflows; remove it", line=2)


def test_core_scalar_tags_still_work() -> None:
    wf = load_workflow("name: t\ndescription: !!str 12\n" + STEP)
    assert wf.plan.description == "12"


def test_bad_scalar_under_a_core_tag_names_its_line() -> None:
    _refused("name: t\nbudget:\n  max_cost: !!float abc\n" + STEP, "max_cost", line=3)


@pytest.mark.parametrize("depth", [65, 600, 5000])
def test_flow_nesting_is_capped(depth: int) -> None:
    source = "name: t\n" + STEP + "description: " + "[" * depth + "]" * depth + "\n"
    _refused(source, "values nest deeper than 64 levels; flatten the structure", line=5)


def test_deep_block_nesting_in_with_is_capped() -> None:
    body = "".join("  " * (3 + i) + f"k{i}:\n" for i in range(70))
    source = "name: t\nsteps:\n  - id: a\n    python: json:dumps\n    with:\n" + body
    _refused(source, "nest deeper than 64")


def test_a_deep_schema_is_capped() -> None:
    schema = "{type: object, properties: {a: " * 150 + "{type: string}" + "}}" * 150
    _refused("name: t\nparams:\n  p: " + schema + "\n" + STEP, "nest deeper than 64", line=3)


def test_nesting_under_the_cap_still_freezes() -> None:
    schema = "{type: object, properties: {a: " * 20 + "{type: string}" + "}}" * 20
    wf = load_workflow("name: t\nparams:\n  p: " + schema + "\n" + STEP)
    assert "p" in wf.plan.params


@pytest.mark.parametrize("digits", ["9" * 4301, "9" * 100_000, "0x" + "f" * 4000])
def test_huge_integers_are_refused(digits: str) -> None:
    err = _refused(
        f"name: t\nbudget:\n  max_units: {digits}\n" + STEP, "at most 4300 digits", line=3
    )
    assert err.field == "budget.max_units"


def test_a_byte_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_bytes(b"name: t\nsteps:\n  - id: a\n    prompt: h\xffi\n")
    with pytest.raises(DefinitionError, match=r"not UTF-8 \(byte 0xff\)") as info:
        load_workflow(path)
    assert info.value.line == 4


def test_a_lone_surrogate_escape_is_refused() -> None:
    _refused('name: t\nsteps:\n  - id: a\n    prompt: "\\ud800"\n', "lone surrogate", line=4)


def test_a_lone_surrogate_in_notebook_text_is_refused() -> None:
    _refused("name: t\nsteps:\n  - id: a\n    prompt: x\ud800\n", "#xd800", line=4)


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\x7f"])
def test_control_characters_give_a_line_not_a_position(char: str) -> None:
    err = _refused(f"name: t\nsteps:\n  - id: a\n    prompt: hi{char}\n", "is not allowed", line=4)
    assert "position" not in str(err)


def test_echoed_values_are_clipped() -> None:
    source = "name: t\nsteps:\n  - id: a\n    prompt: hi\n    on_error: " + "x" * 500_000 + "\n"
    err = _refused(source, "got")
    assert "…" in str(err)
    assert clip("a\nb  c" + "d" * 200, 10) == "a b cdddd…"


@pytest.mark.parametrize("target", [":system", "../../x:y", "os:", "a b:c", "x:y:z"])
def test_python_targets_must_read_module_function(target: str) -> None:
    _refused(f"name: t\nsteps:\n  - id: a\n    python: '{target}'\n", "expected module:function")


@pytest.mark.parametrize(
    ("rule", "match"),
    [
        ("tokens_out: [1]", "tokens_out must be a whole number"),
        ("tokens_in: 100000000000000000000", "tokens_in must be a whole number"),
        ("tokens_in: -1", "tokens_in must be a whole number"),
        ("kind: bogus", "kind must be one of prompt, exec, python, judge"),
        ("reply: '{{ oops'", "reply: invalid template"),
        ("sleep_s: soon", "sleep_s must be a number"),
        ("model: [1]", "model must be a string"),
    ],
)
def test_scripted_rule_options_are_checked_at_freeze(rule: str, match: str) -> None:
    source = (
        f"name: t\nrunners:\n  scripted:\n    rules:\n      - match: x\n        {rule}\n" + STEP
    )
    _refused(source, match, line=3)


def test_scripted_rules_and_replies_must_have_their_shapes() -> None:
    runners = "name: t\nrunners:\n  scripted:\n    "
    _refused(runners + "rules: {match: x}\n" + STEP, "rules must be a list")
    _refused(runners + "replies: [a]\n" + STEP, "replies must map a prompt")
    _refused(runners + "rules: [1]\n" + STEP, "expected a mapping with match")
    _refused(runners + "replies: {hi: '{{ x }}{% if %}'}\n" + STEP, "invalid template")


@pytest.mark.parametrize(
    "name", ["../outside/evil", "/tmp/evil", "sub/child", "..", "Child", "a\\b", "x.yaml"]
)
def test_child_workflow_names_are_names_not_paths(name: str) -> None:
    _refused(
        f"name: t\nsteps:\n  - id: a\n    workflow: '{name}'\n",
        r"expected a child workflow name matching .* children are named, not paths",
        line=4,
    )


def test_a_child_file_outside_the_folder_is_not_loaded(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.yaml").write_text("name: evil\n" + STEP)
    folder = tmp_path / "wf"
    folder.mkdir()
    (folder / "evil.yaml").symlink_to(outside / "evil.yaml")
    (folder / "main.yaml").write_text("name: main\nsteps:\n  - id: a\n    workflow: evil\n")
    with pytest.raises(DefinitionError, match="links outside the workflow's folder"):
        load_workflow(folder / "main.yaml")


def test_a_child_beside_the_file_still_loads(tmp_path: Path) -> None:
    (tmp_path / "kid.yaml").write_text("name: kid\n" + STEP)
    (tmp_path / "main.yaml").write_text("name: main\nsteps:\n  - id: a\n    workflow: kid\n")
    assert "kid" in load_workflow(tmp_path / "main.yaml").plan.children


def test_the_cli_exits_2_with_one_line_and_writes_no_run(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("x: &a 1\nname: t\n" + STEP)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["run", str(path), "--db", str(tmp_path / "db")])
    assert code == 2
    assert err.getvalue() == f"error: (yaml): {ALIASES} ({path}, line 1)\n"
    db = tmp_path / "db" / "state.db"
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
