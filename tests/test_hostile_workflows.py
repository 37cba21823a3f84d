"""Hostile workflows through `wf run`: a one-line exit 2 with no run written, or a bounded run.

A grammar-aware strategy mixes hostile pieces (anchors, aliases, merge keys, tags, deep
nesting, huge integers, bad Unicode, path names, sandbox escapes, resource-bomb templates,
bad runner options) into otherwise valid workflows. No example may raise, print a
traceback or hang. ``WF_FUZZ_EXAMPLES`` raises the example count (60 by default).
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wf_magic.cli import main

EXAMPLE_DEADLINE_S = 60
"""A whole example (freeze and drive) past this is a hang."""


@dataclass
class Slots:
    """Where hostile pieces go in the workflow skeleton (see ``render``)."""

    head: list[str] = field(default_factory=list)
    top: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    runner_options: list[str] = field(default_factory=list)
    params: list[str] = field(default_factory=list)
    step: list[str] = field(default_factory=lambda: ['    prompt: "hello {{ params.topic }}"'])
    steps: list[str] = field(default_factory=list)
    raw: bytes = b""
    """Bytes spliced in at ``raw_at`` (a fraction of the text), for bad encodings."""
    raw_at: float = 0.0


def render(slots: Slots) -> bytes:
    lines = [
        *slots.head,
        "name: fuzz",
        *slots.top,
        "params:",
        "  topic: {type: string, default: cats}",
        *slots.params,
        "runners:",
        "  scripted:",
        *slots.runner_options,
        "    rules:",
        '      - match: "never-matches-anything"',
        "        reply: ok",
        *slots.rules,
        "steps:",
        "  - id: a",
        *slots.step,
        *slots.steps,
    ]
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    cut = int(len(data) * slots.raw_at)
    return data[:cut] + slots.raw + data[cut:]


def _q(text: str) -> str:
    """A YAML double-quoted scalar (JSON strings are YAML)."""
    return json.dumps(text)


# -- hostile pieces: each draws its parameters and edits the slots ---------------------------


@st.composite
def aliases(draw: st.DrawFn) -> Slots:
    s = Slots()
    shape = draw(st.sampled_from(["plain", "laughs", "self", "merge", "merge-alias", "scalar"]))
    if shape == "plain":
        s.top += ["shared: &x [1, 2]", "description: *x"]
    elif shape == "laughs":
        depth = draw(st.integers(2, 9))
        s.head.append('l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]')
        for i in range(1, depth):
            s.head.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    elif shape == "self":
        s.steps += ["  - &me", "    id: b", "    prompt: hi", "  - *me"]
    elif shape == "merge":
        s.step = ["    <<: {prompt: hi}"]
    elif shape == "merge-alias":
        s.top.append("base: &b {prompt: hi}")
        s.step = ["    <<: *b"]
    else:
        s.step = ["    prompt: &p hi"]
        s.steps += ["  - id: b", "    prompt: *p"]
    return s


@st.composite
def tags(draw: st.DrawFn) -> Slots:
    s = Slots()
    tag = draw(
        st.sampled_from(["!foo", "!!set", "!!omap", "!!binary", "!!python/object:os.system", "!"])
        | st.from_regex(r"\A!![a-z]{1,8}\Z")
    )
    where = draw(st.sampled_from(["steps", "params", "scalar", "runner"]))
    if where == "steps":
        s.step = [f"    prompt: {tag} hi"]
    elif where == "params":
        s.params.append(f"  other: {tag} {{type: string, default: x}}")
    elif where == "scalar":
        s.top.append(f"description: {tag} aGk=")
    else:
        s.rules += ['      - match: "x"', f"        reply: {tag} [1, 2]"]
    return s


@st.composite
def deep_nesting(draw: st.DrawFn) -> Slots:
    s = Slots()
    depth = draw(st.integers(1, 800))
    where = draw(st.sampled_from(["flow", "with", "schema", "jinja", "block"]))
    if where == "flow":
        s.top.append("description: " + "[" * depth + "]" * depth)
    elif where == "with":
        s.step = ["    python: json:dumps", "    with:", "      obj: " + "[" * depth + "]" * depth]
    elif where == "schema":
        s.params.append(
            "  deep: " + "{type: object, properties: {a: " * depth + "{type: string}" + "}}" * depth
        )
    elif where == "jinja":
        s.step = ["    prompt: " + _q("{{ " + "(" * depth + "1" + ")" * depth + " }}")]
    else:
        s.top += ["description:", *("  " * (i + 1) + f"k{i}:" for i in range(min(depth, 200)))]
    return s


@st.composite
def huge_ints(draw: st.DrawFn) -> Slots:
    s = Slots()
    digits = draw(st.integers(1, 6000))
    number = draw(st.sampled_from(["9", "1", "-9"])) + "0" * (digits - 1)
    if draw(st.booleans()):
        number = "0x" + "f" * digits
    where = draw(st.sampled_from(["budget", "tokens", "default", "timeout", "retry"]))
    if where == "budget":
        s.top += ["budget:", f"  max_tokens: {number}"]
    elif where == "tokens":
        s.rules += ['      - match: "hello"', f"        tokens_in: {number}"]
    elif where == "default":
        s.params.append(f"  n: {{type: integer, default: {number}}}")
    elif where == "timeout":
        s.step.append(f"    timeout: {number}")
    else:
        s.step.append(f"    retry: {{max_attempts: {number}}}")
    return s


@st.composite
def bad_unicode(draw: st.DrawFn) -> Slots:
    s = Slots()
    kind = draw(st.sampled_from(["byte", "surrogate", "control", "raw-surrogate", "text"]))
    if kind == "byte":
        s.raw = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xfe\xff"]))
        s.raw_at = draw(st.floats(0, 1))
    elif kind == "surrogate":
        s.step = ["    prompt: " + _q("x").replace("x", "\\ud800")]
    elif kind == "control":
        char = draw(st.sampled_from([chr(c) for c in [*range(0, 9), 11, 12, *range(14, 32), 127]]))
        s.step = [f"    prompt: hi{char}there"]
    elif kind == "raw-surrogate":
        s.raw = "\ud800".encode("utf-8", "surrogatepass")
        s.raw_at = draw(st.floats(0, 1))
    else:
        s.step = ["    prompt: " + _q(draw(st.text(max_size=200)))]
    return s


@st.composite
def path_names(draw: st.DrawFn) -> Slots:
    s = Slots()
    name = draw(
        st.sampled_from(["../outside/evil", "/etc/passwd", "..", "sub/child", "C:\\x", "~/x"])
        | st.text(max_size=30)
    )
    s.step = ["    workflow: " + _q(name)]
    return s


SANDBOX_PAYLOADS = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ lipsum.__globals__['os'].system('true') }}",
    "{{ self._TemplateReference__context }}",
    "{{ range.__self__ }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ params.__class__.__base__ }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{% include '/etc/passwd' %}",
    "{% extends '/etc/passwd' %}",
    "{% import 'os' as os %}",
]
RESOURCE_BOMBS = [
    "{{ 'x' * 10**10 }}",
    "{{ [1] * 10**9 }}",
    "{{ range(10**9) | length }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('x') }}",
    "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}",
    "{{ 'x'.center(10**9) }}",
    "{{ 'x' | center(10**9) }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ 10 ** 100000000 }}",
    "{{ ('x' * 100000).replace('x', 'y' * 1000) }}",
    "{{ lipsum(10**6) }}",
    "{{ [[[1] * 1000] * 1000] * 1000 }}",
    "{{ (('x' * 10**6) | list) | join('y' * 10**6) }}",
]


@st.composite
def templates(draw: st.DrawFn) -> Slots:
    s = Slots()
    source = draw(st.sampled_from(SANDBOX_PAYLOADS + RESOURCE_BOMBS))
    where = draw(st.sampled_from(["prompt", "map", "route", "check", "reply", "with"]))
    if where == "prompt":
        s.step = ["    prompt: " + _q(source)]
    elif where == "map":
        s.step = ["    map: " + _q(source), "    prompt: x"]
    elif where == "route":
        s.step = ["    route:", "      on: " + _q(source), "      cases: {default: b}"]
        s.steps += ["  - id: b", "    prompt: x"]
    elif where == "check":
        expr = source.removeprefix("{{").removesuffix("}}").strip()
        s.step += ["    gate:", "      judge: expr", "      check: " + _q(expr)]
    elif where == "reply":
        s.rules += ['      - match: "hello"', "        reply: " + _q(source)]
    else:
        s.step = ["    python: json:dumps", "    with:", "      obj: " + _q(source)]
    return s


RULE_OPTIONS = [
    "tokens_out: [1]",
    "tokens_in: 100000000000000000000",
    "tokens_in: -5",
    "tokens_out: 9223372036854775808",
    "tokens_in: true",
    "kind: bogus",
    "kind: [prompt]",
    "reply: '{{ oops'",
    "reply: '{{ x }}{% endfor %}'",
    "sleep_s: soon",
    "sleep_s: [1]",
    "model: {a: 1}",
    "error: sometimes",
    "match: '(unclosed'",
    "match: [1]",
    "bogus: 1",
]


@st.composite
def runner_options(draw: st.DrawFn) -> Slots:
    s = Slots()
    shape = draw(st.sampled_from(["rule", "rules", "replies", "model", "option"]))
    if shape == "rule":
        s.rules += ['      - match: "hello"', "        " + draw(st.sampled_from(RULE_OPTIONS))]
    elif shape == "rules":
        s.top += ["runner: other", "runners2: 1"] if draw(st.booleans()) else []
        s.runner_options.append("    replies: " + draw(st.sampled_from(["[a]", "7", "'x'"])))
    elif shape == "replies":
        s.runner_options.append("    replies: {hello: " + _q("{{ oops") + "}")
    elif shape == "model":
        s.runner_options.append("    model: " + draw(st.sampled_from(["[1]", "{a: b}", "7"])))
    else:
        s.runner_options.append("    " + draw(st.sampled_from(["colour: red", "api_key: sk-x"])))
    return s


@st.composite
def python_targets(draw: st.DrawFn) -> Slots:
    s = Slots()
    target = draw(
        st.sampled_from([":system", "../../x:y", "os:", ":", "a b:c", "x:y:z", "os.path:nope"])
        | st.text(max_size=20)
    )
    s.step = ["    python: " + _q(target)]
    return s


@st.composite
def long_values(draw: st.DrawFn) -> Slots:
    s = Slots()
    size = draw(st.integers(1000, 600_000))
    where = draw(st.sampled_from(["on_error", "runner", "key", "id"]))
    if where == "on_error":
        s.step.append("    on_error: " + "x" * size)
    elif where == "runner":
        s.step.append("    runner: " + "x" * size)
    elif where == "key":
        s.step.append("    " + "k" * size + ": 1")
    else:
        s.step = ["    prompt: hi"]
        s.steps += ["  - id: " + "y" * size, "    prompt: hi"]
    return s


def _merge(parts: list[Slots]) -> Slots:
    out = Slots()
    for part in parts:
        out.head += part.head
        out.top += part.top
        out.rules += part.rules
        out.runner_options += part.runner_options
        out.params += part.params
        out.steps += part.steps
        if part.step != Slots().step:
            out.step = part.step
        if part.raw:
            out.raw, out.raw_at = part.raw, part.raw_at
    return out


PIECES = [
    aliases(),
    tags(),
    deep_nesting(),
    huge_ints(),
    bad_unicode(),
    path_names(),
    templates(),
    runner_options(),
    python_targets(),
    long_values(),
]
hostile_workflows = st.lists(st.one_of(PIECES), min_size=1, max_size=3).map(_merge).map(render)


# -- the property -------------------------------------------------------------------------


class _Hang(Exception):
    pass


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise _Hang(f"example ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _run_rows(db: Path) -> int:
    if not (db / "state.db").exists():
        return 0
    with sqlite3.connect(db / "state.db") as conn:
        return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    runs: int


def run_wf(folder: Path, source: bytes) -> Outcome:
    """``wf run`` in-process on ``source``; a hang or an escaped exception raises."""
    path = folder / "hostile.yaml"
    path.write_bytes(source)
    db = Path(tempfile.mkdtemp(dir=folder))
    out, err = io.StringIO(), io.StringIO()
    with _deadline(EXAMPLE_DEADLINE_S), redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(["run", str(path), "--db", str(db)])
        except SystemExit as exc:
            code = int(exc.code or 0)
    return Outcome(code, out.getvalue(), err.getvalue(), _run_rows(db))


def classify(outcome: Outcome) -> str:
    """``clean error`` or ``run``; raises AssertionError for anything else."""
    assert "Traceback" not in outcome.stderr + outcome.stdout
    if outcome.code == 2:
        lines = outcome.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr
        assert len(lines[0]) < 1200, lines[0][:200]
        assert outcome.runs == 0
        return "clean error"
    assert outcome.code in (0, 1, 3), (outcome.code, outcome.stderr[-500:])
    assert outcome.runs >= 1
    return "run"


def _record(kind: str) -> None:
    report = os.environ.get("WF_FUZZ_REPORT")
    if report:
        with open(report, "a", encoding="utf-8") as fh:
            fh.write(kind + "\n")


@settings(
    max_examples=int(os.environ.get("WF_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(source=hostile_workflows)
def test_hostile_workflows_end_cleanly(source: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        try:
            outcome = run_wf(Path(folder), source)
        except _Hang:
            _record("hang")
            raise
        except BaseException:
            _record("traceback")
            raise
        try:
            kind = classify(outcome)
        except AssertionError:
            _record("traceback")
            raise
    _record(kind)


def test_the_skeleton_without_hostile_pieces_runs(tmp_path: Path) -> None:
    outcome = run_wf(tmp_path, render(Slots()))
    assert classify(outcome) == "run" and outcome.code == 0, outcome.stderr
