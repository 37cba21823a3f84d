"""Terminal progress of a drive: step lines everywhere, one rewritten unit line on a TTY."""

from __future__ import annotations

import io
import time

from wf_magic import Engine
from wf_magic.bus import Event
from wf_magic.progress import MAX_REDRAWS_PER_S, ProgressPrinter

FAN = """
name: fan
steps:
  - id: outline
    prompt: outline
  - id: draft
    map: "{{ range(5) | list }}"
    prompt: "draft {{ item }}"
"""


def _events(printer: ProgressPrinter, *events: Event) -> None:
    for event in events:
        printer(event)


def test_without_a_tty_each_step_transition_is_one_plain_line(engine: Engine) -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=False)
    engine.subscribe(printer)
    engine.run(FAN)
    assert out.getvalue().splitlines() == [
        "  ✓ outline completed",
        "  ✓ draft completed [5 done]",
    ]
    assert "\r" not in out.getvalue()


def test_on_a_tty_the_units_line_is_rewritten_in_place_then_replaced_by_the_step_line() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=True)
    start = Event(kind="step_started", run_id="r", step_id="s")
    unit = Event(kind="unit_started", run_id="r", step_id="s", unit_id="s[0]")
    done = Event(kind="unit_finished", run_id="r", step_id="s", data={"status": "succeeded"})
    failed = Event(kind="unit_finished", run_id="r", step_id="s", data={"status": "failed"})
    status = Event(
        kind="step_status", run_id="r", step_id="s", data={"status": "failed", "note": "boom"}
    )
    _events(printer, start, unit)
    assert out.getvalue() == "\r\x1b[2K  … s: 0 done, 1 running, 0 failed"
    _events(printer, unit)  # throttled: drawn at most 10 times a second
    assert out.getvalue().count("\r") == 1
    printer._drawn_at = 0.0  # the next draw is due
    _events(printer, done)
    assert out.getvalue().endswith("\r\x1b[2K  … s: 1 done, 1 running, 0 failed")
    _events(printer, failed, status)
    assert out.getvalue().endswith("\r\x1b[2K  ✗ s failed [1 done, 1 failed] — boom\n")


def test_unit_redraws_are_bounded_whatever_the_number_of_units() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=True)
    printer(Event(kind="step_started", run_id="r", step_id="s"))
    started = time.monotonic()
    for _ in range(5000):
        printer(Event(kind="unit_started", run_id="r", step_id="s"))
        printer(Event(kind="unit_finished", run_id="r", step_id="s", data={"status": "ok"}))
    elapsed = time.monotonic() - started
    # The first unit event draws; every later draw is at least 1/MAX_REDRAWS_PER_S after the
    # one before, so the 10 000 events draw by the clock, never by their number.
    assert out.getvalue().count("\r") <= 1 + elapsed * MAX_REDRAWS_PER_S


def test_gate_units_do_not_count_as_work_and_rejections_get_a_line() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=False)
    _events(
        printer,
        Event(kind="step_started", run_id="r", step_id="s"),
        Event(kind="unit_finished", run_id="r", step_id="s", data={"phase": "gate"}),
        Event(kind="gate_rejected", run_id="r", step_id="s", data={"loop": 1}),
        Event(kind="step_status", run_id="r", step_id="s", data={"status": "completed"}),
    )
    assert out.getvalue().splitlines() == ["  ↺ s loop 1 rejected", "  ✓ s completed"]
