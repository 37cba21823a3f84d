"""Model text shown on a terminal has its control characters and escape sequences made
visible, never acted on (issue 31, item 24): ``wf run``'s result, ``wf status``, ``wf show``,
``wf list`` and the progress lines."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wf_magic.bus import Event
from wf_magic.progress import ProgressPrinter
from wf_magic.visible import visible, visible_line

from .conftest import wf_inproc, write_file

SEQUENCES = (
    "\x1b[31m",  # SGR colour
    "\x1b[2J\x1b[H",  # clear the screen
    "\x1b]0;pwned\x07",  # OSC: window title, BEL-terminated
    "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",  # OSC 8 hyperlink, ST-terminated
    "\x1b]52;c;cHduZWQ=\x07",  # OSC 52: write the clipboard
    "\x1bP+q544e\x1b\\",  # DCS request
    "\x9b31m",  # 8-bit CSI
    "\x9d0;title\x9c",  # 8-bit OSC ... ST
    "\r\x1b[K",  # overwrite the line
    "\x08\x08\x08",  # backspaces
    "\x00",
    "\x7f",
    "\u202e",  # RIGHT-TO-LEFT OVERRIDE
    "\u2066",
    "\u2028",
)

FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
"""What must never reach the terminal: every control character but newline and tab."""


def hostile_text() -> st.SearchStrategy[str]:
    control = st.characters(
        min_codepoint=0, max_codepoint=0x9F, blacklist_characters="\n\t"
    ).filter(lambda c: FORBIDDEN.match(c) is not None)
    piece = st.one_of(
        st.sampled_from(SEQUENCES),
        control,
        st.sampled_from(["\u202a", "\u202b", "\u202c", "\u202d", "\u2067", "\u2068", "\u2069"]),
        st.text(alphabet="abc xyz\n\t{}%", max_size=6),
    )
    return (
        st.lists(piece, min_size=1, max_size=6)
        .map("".join)
        .filter(lambda t: FORBIDDEN.search(t) is not None and t.strip() != "")
    )


def test_visible_escapes_every_control_but_newline_and_tab() -> None:
    assert visible("a\x1b[31mred\x1b[0m") == "a\\x1b[31mred\\x1b[0m"
    assert visible("x\x9b2Jy\u202ez") == "x\\x9b2Jy\\u202ez"
    assert visible("one\n\ttwo\r") == "one\n\ttwo\\x0d"
    assert visible_line("one\n\ttwo") == "one\\n\\ttwo"
    assert visible("plain, ünïcödé ✓ — text") == "plain, ünïcödé ✓ — text"


@given(text=hostile_text())
def test_visible_leaves_no_control_and_is_idempotent(text: str) -> None:
    shown = visible(text)
    assert FORBIDDEN.search(shown) is None
    assert visible(shown) == shown
    assert FORBIDDEN.search(visible_line(text)) is None and "\n" not in visible_line(text)


ECHO = """\
name: echo
params:
  text: {type: string}
runner: scripted
runners:
  scripted:
    rules:
      - match: "(?s).*"
        reply: "{{ prompt }}"
steps:
  - id: say
    prompt: "{{ params.text }}"
"""


def _clean(stream: str) -> None:
    found = FORBIDDEN.search(stream)
    assert found is None, f"{found.group()!r} reached the terminal in {stream!r}"


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=hostile_text())
def test_wf_run_status_show_and_list_print_no_control_character(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / f"s{abs(hash(text))}"
    flow = write_file(tmp_path, "echo.yaml", ECHO)
    ran = wf_inproc(capsys, state, "run", str(flow), "--new", "--param", f"text={text}")
    assert ran.returncode == 0, ran.stderr
    _clean(ran.stdout + ran.stderr)
    assert f"result: {visible(text.strip())}" in ran.stdout or visible(text) in ran.stdout
    run_id = ran.stdout.split()[1]
    for args in (("status", run_id), ("show", run_id, "say"), ("list",)):
        shown = wf_inproc(capsys, state, *args)
        assert shown.returncode == 0, shown.stderr
        _clean(shown.stdout + shown.stderr)
    shown = wf_inproc(capsys, state, "show", run_id, "say")
    assert visible(text) in shown.stdout  # the text is there, escaped: nothing is hidden


def test_a_run_failing_with_an_escape_in_its_reason_shows_it_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flow = write_file(
        tmp_path,
        "fail.yaml",
        "name: fail\nsteps:\n  - id: boom\n"
        "    exec: [python3, -c, \"import sys; sys.exit('\\\\x1b]0;pwned\\\\x07\\\\x1b[2J')\"]\n",
    )
    ran = wf_inproc(capsys, tmp_path / "s", "run", str(flow))
    assert ran.returncode == 1
    _clean(ran.stdout + ran.stderr)
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in ran.stdout
    listed = wf_inproc(capsys, tmp_path / "s", "list")
    _clean(listed.stdout + listed.stderr)


@given(text=hostile_text())
def test_progress_lines_make_model_text_visible(text: str) -> None:
    for tty in (True, False):
        out = io.StringIO()
        printer = ProgressPrinter(out, tty=tty)
        printer(Event(kind="step_started", run_id="r", step_id="s"))
        printer(Event(kind="unit_started", run_id="r", step_id="s", unit_id="s[0]"))
        printer(Event(kind="unit_text", run_id="r", step_id="s", data={"text": "x" + text}))
        printer(Event(kind="warning", run_id="r", step_id="s", data={"message": text}))
        printer(
            Event(
                kind="step_status", run_id="r", step_id="s", data={"status": "failed", "note": text}
            )
        )
        printer.close()
        # The printer's own redraw ("\r" + erase line) is the only sequence it may send.
        _clean(out.getvalue().replace("\r\x1b[2K", ""))
        assert f"! s: {visible_line(text)}" in out.getvalue()


def test_wf_events_text_lines_show_controls_never_run_them() -> None:
    from wf_magic.display.events import event_text
    from wf_magic.store.records import EventRow

    row = EventRow(
        event_id=7,
        run_id="r-1",
        at=0.0,
        kind="unit_text",
        step_id="s",
        unit_id="s",
        dispatch_id=None,
        data_json='{"text": "\x1b]0;pwned\x07 hi"}',  # raw, as a hand-edited row may hold
    )
    line = event_text(row)
    assert "\x1b" not in line and "\x07" not in line
    assert "\\x1b]0;pwned\\x07 hi" in line


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=hostile_text())
def test_the_sweep_tables_print_no_control_character(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``wf sweep-frame`` and ``wf sweep-summary`` tables hold a model's words and the grid's
    values: made visible like every other table."""
    state = tmp_path / f"s{abs(hash(text))}"
    flow = write_file(
        tmp_path,
        "echo.yaml",
        ECHO.replace('prompt: "{{ params.text }}"', 'prompt: "{{ params.text }}"\n'
                     "    score:\n      - {name: said, contains: x}"),
    )  # fmt: skip
    ran = wf_inproc(capsys, state, "sweep", str(flow), "--grid", f"text={text}", "--quiet")
    assert ran.returncode == 0, ran.stderr
    sweep_id = wf_inproc(capsys, state, "sweeps").stdout.split()[0]
    for verb in ("sweep-frame", "sweep-summary"):
        shown = wf_inproc(
            capsys, state, verb, sweep_id, *(["--by", "text"] if "summary" in verb else [])
        )
        assert shown.returncode == 0, shown.stderr
        _clean(shown.stdout + shown.stderr)
