"""CLI error messages: one bounded line naming the exception and the input; the state database
is blamed only when SQLite raised (issue 20).

Generators drive the real ``wf`` entry point with what users and bugs throw at it: any
exception from any verb (``MemoryError``, Unicode errors, SQLite's own errors, plain bugs,
with giant or multi-line messages), huge lists of undeclared params, giant values, and
command-line words that are not UTF-8 (``os.fsdecode`` of raw bytes: surrogateescape).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wf_magic import cli
from wf_magic.errors import MAX_MESSAGE_CHARS, clip_list, clip_message, count_text

from .conftest import CliResult, tamper, wf_inproc

CAP = len("error: ") + MAX_MESSAGE_CHARS
MISLEADING = ("Restore", "backup", "edited by hand", "cannot read the state database")
"""Advice about state.db that only an SQLite fault may give."""
FLOW = """\
name: msgs
params:
  topic: {type: string, default: tides}
  sections: {type: integer, default: 3}
  tone: {type: string, enum: [plain, warm], default: plain}
steps:
  - id: a
    prompt: "Write {{ params.sections }} on {{ params.topic }}, {{ params.tone }}."
"""
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
VERB_ARGS: dict[str, tuple[str, ...]] = {
    "run": ("run", "flow.yaml"),
    "list": ("list",),
    "status": ("status", "r-1"),
    "resume": ("resume", "r-1"),
    "fork": ("fork", "r-1", "--from", "a"),
    "abandon": ("abandon", "r-1"),
    "approve": ("approve", "r-1", "a"),
    "reject": ("reject", "r-1", "a", "--feedback", "no"),
    "stop": ("stop", "r-1"),
    "journal": ("journal", "r-1"),
    "tokens": ("tokens", "r-1"),
    "events": ("events", "r-1"),
    "show": ("show", "r-1", "a"),
    "diff": ("diff", "r-1", "r-2"),
    "gc": ("gc", "--older-than", "1d"),
    "export-cassette": ("export-cassette", "r-1"),
}


def one_bounded_line(result: CliResult) -> str:
    """The one ``error: ...`` line of stderr, checked to be under the cap."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[:2000]
    line = lines[0]
    assert line.startswith(("error: ", "wf: error: ")), line[:300]
    assert len(line) <= CAP, len(line)
    assert "Traceback" not in result.stderr
    return line


@pytest.fixture
def flow(tmp_path: Path) -> Path:
    path = tmp_path / "flow.yaml"
    path.write_text(FLOW)
    return path


# -- any exception from any verb -------------------------------------------------------------
messages = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=3000, max_size=20_000),
    st.lists(st.text(min_size=1, max_size=30), min_size=2, max_size=50).map("\n".join),
)


@st.composite
def exceptions(draw: st.DrawFn) -> BaseException:
    text = draw(messages)
    kind = draw(
        st.sampled_from(
            [
                "memory",
                "encode",
                "decode",
                "value",
                "key",
                "type",
                "runtime",
                "sqlite-operational",
                "sqlite-integrity",
                "sqlite-database",
                "sqlite-programming",
            ]
        )
    )
    surrogate = chr(draw(st.integers(0xD800, 0xDFFF)))
    made: dict[str, BaseException] = {
        "memory": MemoryError(text) if text else MemoryError(),
        "encode": UnicodeEncodeError(
            "utf-8",
            f"{text[:50]}{surrogate}x",
            len(text[:50]),
            len(text[:50]) + 1,
            "surrogates not allowed",
        ),
        "decode": UnicodeDecodeError("utf-8", b"ab\xffcd", 2, 3, "invalid start byte"),
        "value": ValueError(text),
        "key": KeyError(text),
        "type": TypeError(text),
        "runtime": RuntimeError(text),
        "sqlite-operational": sqlite3.OperationalError(text or "no such column: x"),
        "sqlite-integrity": sqlite3.IntegrityError(text or "CHECK constraint failed"),
        "sqlite-database": sqlite3.DatabaseError(text or "file is not a database"),
        "sqlite-programming": sqlite3.ProgrammingError(text or "Error binding parameter 1"),
    }
    return made[kind]


def _is_sqlite_fault(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.ProgrammingError)


@SETTINGS
@given(verb=st.sampled_from(sorted(VERB_ARGS)), exc=exceptions())
def test_any_exception_from_any_verb_is_one_bounded_line_naming_it_and_blames_sqlite_only(
    verb: str, exc: BaseException, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(target: object, args: argparse.Namespace) -> int:
        raise exc

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(cli.HANDLERS, verb, fails)
        result = wf_inproc(capsys, state_dir, *VERB_ARGS[verb])
    assert result.returncode == 1
    line = one_bounded_line(result)
    assert type(exc).__name__ in line, line[:300]
    if _is_sqlite_fault(exc):
        assert "cannot read the state database" in line
        return
    for advice in MISLEADING:
        assert advice not in line, line[:300]
    assert f"`wf {VERB_ARGS[verb][0]}" in line  # the input: the command
    if isinstance(exc, UnicodeEncodeError):
        assert ascii(exc.object[exc.start])[1:-1] in line  # the character it choked on
    if isinstance(exc, MemoryError):
        assert "ran out of memory" in line


def test_a_memory_error_says_out_of_memory_not_restore_the_database(
    state_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flow: Path
) -> None:
    def exhausted(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr("wf_magic.engine.Engine.start", exhausted)
    result = wf_inproc(capsys, state_dir, "run", str(flow), "--quiet")
    assert result.returncode == 1
    assert result.stderr == (
        f"error: `wf run {flow}` ran out of memory (MemoryError); its "
        "input is too large for this machine: give it less (fewer params, smaller files). This "
        "is not a fault of the state database; `--debug` shows the traceback (please report "
        "it if the input is valid).\n"
    )


def test_an_unexpected_error_never_echoes_a_secret_param_or_an_option_value(
    state_dir: Path, flow: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-live-" + "q7Zr" * 6

    def fails(target: object, args: argparse.Namespace) -> int:
        raise RuntimeError(f"could not use {secret}")

    monkeypatch.setitem(cli.HANDLERS, "run", fails)
    result = wf_inproc(
        capsys, state_dir, "run", str(flow), "--param", f"api_key={secret}", "--key", secret
    )
    line = one_bounded_line(result)
    assert secret not in result.stderr and secret[:12] not in result.stderr
    head, masked, tail = line.partition("***")
    assert masked and head in (  # the redactor's mask of a credential shape keeps its kind
        f"error: `wf run {flow}` failed with RuntimeError: could not use ",
        f"error: `wf run {flow}` failed with RuntimeError: could not use sk-",
    )
    assert tail == (
        ". This is not a fault of the state database; `--debug` shows the traceback (please "
        "report it if the input is valid)."
    )


# -- command-line words that are not UTF-8 ----------------------------------------------------
def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


not_utf8 = st.binary(min_size=1, max_size=12).filter(lambda b: not _is_utf8(b) and b"\0" not in b)


@SETTINGS
@given(
    raw=not_utf8,
    where=st.sampled_from(
        ["param-value", "param-key", "file", "run-id", "feedback", "key", "db-subdir"]
    ),
)
def test_an_argument_that_is_not_utf8_is_refused_naming_it_and_its_byte(
    raw: bytes,
    where: str,
    state_dir: Path,
    flow: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    word = os.fsdecode(raw)  # what Python makes of such bytes in sys.argv
    argv = {
        "param-value": ("run", str(flow), "--param", f"topic={word}"),
        "param-key": ("run", str(flow), "--param", f"{word}=1"),
        "file": ("run", f"{word}.yaml"),
        "run-id": ("status", word),
        "feedback": ("reject", "r-1", "a", "--feedback", word),
        "key": ("run", str(flow), "--key", word),
        "db-subdir": ("--db", str(state_dir / word), "list"),
    }[where]
    result = wf_inproc(capsys, state_dir, *argv)
    assert result.returncode == 2
    line = one_bounded_line(result)
    bad = _undecodable_bytes(raw)[0]
    assert f"is not valid UTF-8 text (byte 0x{bad:02x} at character" in line, line
    for advice in MISLEADING:
        assert advice not in line
    assert not state_dir.exists() or where == "db-subdir"  # refused before the state dir opens


def _undecodable_bytes(raw: bytes) -> list[int]:
    word = os.fsdecode(raw)
    return [ord(c) - 0xDC00 for c in word if 0xDC80 <= ord(c) <= 0xDCFF]


def test_a_non_utf8_param_value_is_refused_before_the_state_database_is_touched(
    state_dir: Path, flow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = wf_inproc(capsys, state_dir, "run", str(flow), "--param", os.fsdecode(b"topic=\xff"))
    assert result.returncode == 2
    assert result.stderr == (
        "wf: error: argument 6 ('topic=…') is not valid UTF-8 text (byte 0xff at character "
        "6); pass it as UTF-8\n"
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (
            ("run", "f.yaml", "--param", "api_key=CANARYs3cret\udcff"),
            "('api_key=…') is not valid UTF-8",
        ),
        (
            ("reject", "r-1", "a", "--feedback", "token CANARYs3cret\udcff"),
            "(the value of --feedback) is not valid UTF-8",
        ),
    ],
)
def test_a_non_utf8_argument_is_named_without_the_value_it_carries(
    state_dir: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], named: str
) -> None:
    result = wf_inproc(capsys, state_dir, *argv)
    assert result.returncode == 2
    assert "CANARY" not in result.stderr and named in result.stderr, result.stderr
    assert not (state_dir / "state.db").exists()


def test_a_lone_surrogate_param_from_the_api_is_a_usage_error_naming_the_param(
    engine: object, flow: Path
) -> None:
    from wf_magic import Engine
    from wf_magic.errors import UsageError

    assert isinstance(engine, Engine)
    with pytest.raises(UsageError) as caught:
        engine.start(engine.load(flow), params={"topic": "a\ud800b"})
    assert str(caught.value) == (
        "param topic: not valid UTF-8 text (a lone surrogate U+D800 at character 1); pass it "
        "as UTF-8"
    )


def test_a_result_holding_a_lone_surrogate_prints_escaped_instead_of_failing(
    engine: object, state_dir: Path, flow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from wf_magic import Engine

    assert isinstance(engine, Engine)
    run = engine.run(engine.load(flow))
    assert run.status == "completed"
    tamper(engine, "UPDATE runs SET result_json = ? WHERE run_id = ?", ('"a\\ud800b"', run.run_id))
    result = wf_inproc(capsys, state_dir, "status", run.run_id)
    assert result.returncode == 0, result.stderr
    assert "a\\ud800b" in result.stdout and result.stderr == ""


# -- huge lists and giant values ----------------------------------------------------------------
param_names = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True).filter(
    lambda n: n not in ("topic", "sections", "tone")
)


@SETTINGS
@given(
    names=st.one_of(
        st.lists(param_names, min_size=1, max_size=30, unique=True),
        st.integers(11, 5000).map(lambda n: [f"p{i}" for i in range(n)]),
        st.integers(1, 5).map(lambda n: ["x" * 50_000 + str(i) for i in range(n)]),
    )
)
def test_any_number_of_undeclared_params_is_one_short_line_saying_how_many_more(
    names: list[str], state_dir: Path, flow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a for n in names for a in ("--param", f"{n}=1")]
    result = wf_inproc(capsys, state_dir, "run", str(flow), *argv)
    assert result.returncode == 2
    line = one_bounded_line(result)
    assert "declares no param" in line
    assert len(line) < 1500
    if len(names) > 10:
        assert line.endswith(
            f", … (and {count_text(len(names) - 10)} more); declared: 'sections', 'tone', 'topic'"
        )
    else:
        assert "more)" not in line


def test_one_hundred_thousand_undeclared_params_say_so_in_a_line_not_a_megabyte(
    state_dir: Path, flow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a for i in range(100_000) for a in ("--param", f"p{i:06d}=1")]
    result = wf_inproc(capsys, state_dir, "run", str(flow), *argv)
    assert result.returncode == 2
    shown = ", ".join(f"'p{i:06d}'" for i in range(10))
    assert result.stderr == (
        f"error: workflow 'msgs' declares no param {shown}, … (and 99 990 more); declared: "
        "'sections', 'tone', 'topic'\n"
    )


@SETTINGS
@given(
    param=st.sampled_from(["sections", "tone"]),
    value=st.text(
        alphabet=st.characters(blacklist_categories=["Cs", "Nd"]), min_size=1, max_size=200_000
    ),
)
def test_a_giant_wrong_value_is_echoed_clipped_in_one_line(
    param: str, value: str, state_dir: Path, flow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if param == "tone" and value in ("plain", "warm"):
        return
    result = wf_inproc(capsys, state_dir, "run", str(flow), "--param", f"{param}={value}")
    assert result.returncode == 2
    line = one_bounded_line(result)
    assert line.startswith(f"error: param {param}: ")
    assert len(line) < 1000


# -- the clipping helpers ----------------------------------------------------------------------
@given(items=st.lists(st.text(max_size=300), max_size=300), limit=st.integers(0, 20))
def test_clip_list_shows_at_most_limit_items_and_counts_the_rest(
    items: list[str], limit: int
) -> None:
    text = clip_list(items, limit)
    shown = min(len(items), limit)
    assert len(text) <= shown * 62 + 40
    if len(items) > limit:
        assert text.endswith(f"… (and {count_text(len(items) - limit)} more)")
    else:
        assert "more)" not in text or any("more)" in i for i in items)


@given(text=st.text(max_size=10_000), limit=st.integers(60, 3000))
def test_clip_message_is_one_line_under_the_limit_and_counts_what_it_left_out(
    text: str, limit: int
) -> None:
    clipped = clip_message(text, limit)
    assert "\n" not in clipped and len(clipped) <= limit
    line = " ".join(text.split())
    if len(line) <= limit:
        assert clipped == line
    else:
        kept = clipped.rsplit(" … (and ", 1)[0]
        assert line.startswith(kept)
        more = len(line) - len(kept)
        assert clipped.endswith(f" … (and {count_text(more)} more characters)")


def test_params_taken_out_before_argparse_keep_their_order_and_their_verbs(
    state_dir: Path, flow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    later_wins = wf_inproc(
        capsys, state_dir, "run", str(flow), "--param=topic=a", "--param", "topic=b", "--dry-run"
    )
    assert later_wins.returncode == 0, later_wins.stderr
    assert cli._take_params(["run", "f", "--param", "a=1", "--param=b=2", "--", "--param"]) == (
        ["run", "f", "--", "--param"],
        ["a=1", "b=2"],
    )
    no_such_option = wf_inproc(capsys, state_dir, "status", "r-1", "--param", "x=1")
    assert no_such_option.returncode == 2
    assert "unrecognized arguments: --param x=1" in no_such_option.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ("status", "r-nope"),
        ("run", "missing.yaml"),
        ("sweep", "missing.yaml", "--grid", "zz=1"),
        ("approve", "r-nope", "a"),
    ],
)
def test_debug_adds_the_traceback_and_keeps_the_exit_code_and_the_error_line(
    state_dir: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    plain = wf_inproc(capsys, state_dir, *argv)
    debug = wf_inproc(capsys, state_dir, "--debug", *argv)
    assert plain.returncode == debug.returncode != 0
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert debug.stderr.endswith(plain.stderr)  # the same one line, last
