"""Every numeric option and environment variable refuses nan, inf and out-of-range values with
exit 2 and its own name in one line, on both faces (issue 31, item 22)."""

from __future__ import annotations

import io
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wf_magic.arg_values import count_at_least, duration_s, env_number, number_in
from wf_magic.cli import main
from wf_magic.errors import UsageError
from wf_magic.notebook.args import line_args
from wf_magic.verbs import VERBS, OneOf, Option, Verb

from .backends import pg_server

NUMERIC_TYPES_NAMES = ("count_at_least", "number_in", "duration_s")


def _is_numeric(option: Option) -> bool:
    parse = option.type
    return parse is not None and (
        parse is duration_s
        or getattr(parse, "__qualname__", "").split(".")[0] in NUMERIC_TYPES_NAMES
    )


def _numeric_options() -> list[tuple[Verb, Option]]:
    """Every (verb, option) of the table whose value is a number, by the type that parses it."""
    out = []
    for verb in VERBS:
        for item in verb.options:
            for option in item.options if isinstance(item, OneOf) else (item,):
                if _is_numeric(option):
                    out.append((verb, option))
    return out


NUMERIC = _numeric_options()
NUMERIC_FLAGS = sorted({f"{verb.name} {option.flag}" for verb, option in NUMERIC})


def test_the_table_types_every_option_that_takes_a_number() -> None:
    # A new numeric option with a bare int/float type (which takes nan, inf, ' 5 ') fails here.
    bare = [
        f"{verb.name} {option.flag}"
        for verb in VERBS
        for item in verb.options
        for option in (item.options if isinstance(item, OneOf) else (item,))
        if option.type in (int, float)
    ]
    assert bare == []
    assert NUMERIC_FLAGS == sorted(
        [
            "events --idle",
            "events --since",
            "export-otel --timeout",
            "fork --max-steps",
            "gc --older-than",
            "gc --older-than-days",
            "list --limit",
            "resume --max-concurrency",
            "resume --max-retries",
            "resume --max-steps",
            "run --max-concurrency",
            "run --max-retries",
            "run --max-steps",
            "show --attempt",
            "sweep --max-concurrency",
            "sweep --max-cost",
            "sweep --max-tokens",
            "sweep --max-units",
            "sweep --repeat",
            "sweep --workers",
            "sweep-resume --max-concurrency",
            "sweep-resume --max-cost",
            "sweep-resume --max-tokens",
            "sweep-resume --max-units",
            "sweep-resume --workers",
            "approve --loop",
            "reject --loop",
            "watch --idle",
        ]
    )


def _argv(verb: Verb, option: Option, value: str, face: str) -> list[str]:
    """``VERB`` with placeholder positionals and required options, then ``OPTION=VALUE``."""
    argv = [verb.name]
    for item in verb.options:
        if isinstance(item, OneOf) or face not in item.faces or item is option:
            continue
        if not item.flag.startswith("-"):
            argv.append("x")
        elif item.required:
            argv += [item.flag, "x"]
    return [*argv, f"{option.flag}={value}"]


HOSTILE = (
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "Infinity",
    "1e999",
    "-1e999",
    "-1",
    "-0.5",
    str(10**400),
    "9" * 5000,
    "",
    " 5 ",
    "5 ",
    "\t5",
    "1_000",
    "0x10",
    "٥",  # ARABIC-INDIC DIGIT FIVE: int() takes it
    "５",  # FULLWIDTH DIGIT FIVE
    "5e",
    "five",
)


def _hostile_values() -> st.SearchStrategy[str]:
    unicode_digits = st.text(
        st.characters(whitelist_categories=("Nd",)).filter(lambda c: not c.isascii()),
        min_size=1,
        max_size=4,
    )
    non_finite = st.sampled_from(["nan", "inf", "infinity", "NAN", "INF", "-Inf", "+nan"])
    padded = st.tuples(
        st.sampled_from([" ", "\t", "\n", "\u00a0", "\u2003"]), st.integers(1, 99)
    ).map(lambda p: f"{p[0]}{p[1]}{p[0]}")
    negative = st.integers(max_value=-1).map(str)
    overflow = st.integers(min_value=400, max_value=5000).map(lambda e: f"1e{e}")
    huge = (
        st.integers(min_value=2**63, max_value=10**4000)
        .map(str)
        .filter(
            lambda s: len(s) > 320  # past float's range too, so no option may take it
        )
    )
    return st.one_of(
        st.sampled_from(HOSTILE), unicode_digits, non_finite, padded, negative, overflow, huge
    )


def _cli_refusal(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), pytest.raises(SystemExit) as exited:
        main(argv)
    return int(exited.value.code or 0), err.getvalue()


CLI_NUMERIC = [(v, o) for v, o in NUMERIC if "cli" in v.faces and "cli" in o.faces]
NOTEBOOK_NUMERIC = [(v, o) for v, o in NUMERIC if "notebook" in v.faces and "notebook" in o.faces]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pick=st.sampled_from(CLI_NUMERIC), value=_hostile_values())
def test_every_numeric_wf_option_refuses_hostile_values_with_exit_2_naming_it(
    pick: tuple[Verb, Option], value: str
) -> None:
    verb, option = pick
    code, err = _cli_refusal(_argv(verb, option, value, "cli"))
    assert code == 2
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"wf {verb.name}: error: argument {option.flag}: expected ")
    assert "\n" not in last and len(last) < 200


@settings(max_examples=200, deadline=None)
@given(pick=st.sampled_from(NOTEBOOK_NUMERIC), value=_hostile_values())
def test_every_numeric_workflow_magic_option_refuses_hostile_values_naming_it(
    pick: tuple[Verb, Option], value: str
) -> None:
    verb, option = pick
    argv = _argv(verb, option, value, "notebook")
    with pytest.raises(UsageError) as refused:
        line_args(argv[0], argv[1:])
    assert f"argument {option.flag}: expected " in str(refused.value)


@pytest.mark.parametrize(
    ("argv", "value"),
    [
        (["events", "r", "--idle"], 2.5),
        (["events", "r", "--since"], 7),
        (["gc", "--older-than-days"], 0.5),
        (["sweep", "f.yaml", "--max-cost"], 12.25),
        (["list", "--limit"], 3),
        (["run", "f.yaml", "--max-concurrency"], 10_000),
    ],
)
def test_finite_in_range_values_still_parse(argv: list[str], value: float) -> None:
    from wf_magic.cli import build_parser

    ns = build_parser().parse_args([*argv, str(value)])
    dest = argv[-1].lstrip("-").replace("-", "_")
    got = getattr(ns, {"idle": "idle_s"}.get(dest, dest))
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 2592000.0), ("12h", 43200.0), ("45m", 2700.0), ("90s", 90.0), ("0", 0.0)],
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert duration_s(text) == seconds


@given(
    st.one_of(
        st.integers(1, 10**6).map(str), st.integers(1, 10**6).map(lambda n: f"{n / 1000:.3f}")
    )
)
def test_a_duration_without_its_unit_is_refused(text: str) -> None:
    """``wf gc --older-than 30`` deletes runs: 30 days or 30 seconds? A unit is required."""
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=r"with its unit, .*days or seconds\?"):
        duration_s(text)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (count_at_least(1), "0", "expected an integer from 1 to 9223372036854775807 (got 0)"),
        (count_at_least(0), str(2**63), "expected an integer from 0 to 9223372036854775807"),
        (number_in(0, 10.0), "10.5", "expected a finite number in [0, 10] (got '10.5')"),
        (number_in(0, low_open=True), "0", "expected a finite number > 0 (got '0')"),
        (duration_s, "101y", "expected a duration like 30d, 12h, 45m or 90s"),
    ],
)
def test_out_of_range_messages_name_the_range(parse, text: str, message: str) -> None:  # type: ignore[no-untyped-def]
    import argparse

    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    assert str(refused.value).startswith(message)


def test_events_follow_idle_nan_exits_2_at_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wf_magic.cli", "--db", str(tmp_path / "s"), "events", "r"]
        + ["--follow", "--idle", "nan"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "wf events: error: argument --idle: expected a finite number in [0, 2.592e+06] (got 'nan')"
    )


# -- environment variables ----------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(value=_hostile_values().filter(lambda v: v.strip() != ""))
def test_lease_ttl_refuses_hostile_values_naming_the_variable(value: str) -> None:
    from wf_magic.store.pgopen import LEASE_TTL_ENV, LEASE_TTL_RANGE_S

    low, high = LEASE_TTL_RANGE_S
    with pytest.raises(UsageError) as refused:
        env_number(LEASE_TTL_ENV, 30.0, number_in(low, high), environ={LEASE_TTL_ENV: value})
    assert str(refused.value).startswith(
        "$WF_MAGIC_LEASE_TTL: expected a finite number in [0.3, 86400] (got "
    )


@pytest.mark.parametrize("value", ["0", "0.2", "86401", "nan", "inf", " 30 "])
def test_lease_ttl_out_of_range_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from wf_magic.store.pgopen import lease_ttl_s

    monkeypatch.setenv("WF_MAGIC_LEASE_TTL", value)
    with pytest.raises(UsageError, match=r"^\$WF_MAGIC_LEASE_TTL: expected a finite number"):
        lease_ttl_s()


def test_lease_ttl_unset_or_in_range(monkeypatch: pytest.MonkeyPatch) -> None:
    from wf_magic.store.pgopen import lease_ttl_s

    monkeypatch.delenv("WF_MAGIC_LEASE_TTL", raising=False)
    assert lease_ttl_s() == 30.0
    monkeypatch.setenv("WF_MAGIC_LEASE_TTL", "0.3")
    assert lease_ttl_s() == 0.3


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "1e999"])
def test_wf_on_postgresql_with_a_bad_lease_ttl_exits_2_naming_it(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = pg_server()
    if server is None:
        pytest.skip("set WF_MAGIC_TEST_PG=postgresql://USER@HOST:PORT/DB")
    monkeypatch.setenv("WF_MAGIC_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("WF_MAGIC_LEASE_TTL", value)
    sep = "&" if "?" in server else "?"
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["--db", f"{server}{sep}schema=t_lease_ttl_bad", "list"])
    assert code == 2
    assert err.getvalue().splitlines() == [
        f"error: $WF_MAGIC_LEASE_TTL: expected a finite number in [0.3, 86400] (got {value!r})"
    ]


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e999"])
def test_library_ttl_refuses_non_finite_values_naming_the_variable(value: str) -> None:
    from wf_magic.library import Library

    with pytest.raises(UsageError, match=r"^WF_MAGIC_LIBRARY_TTL: expected a duration"):
        Library.from_environ(environ={"WF_MAGIC_LIBRARY_TTL": value})
