"""Run ids (``drive/runrows.new_run_id``): readable, sortable, never repeated by a sweep that
starts thousands of cells in one second (a run id collision failed such a sweep's insert)."""

from __future__ import annotations

import os
import re
from unittest import mock

from wf_magic.drive import runrows

RUN_ID = re.compile(r"^r-\d{8}-\d{6}-[0-9a-f]{6}$")


def test_thousands_of_ids_in_one_second_are_all_distinct_and_readable() -> None:
    with mock.patch.object(runrows.time, "time", return_value=1_800_000_000.25):
        ids = [runrows.new_run_id() for _ in range(50_000)]
    assert len(set(ids)) == len(ids)
    assert all(RUN_ID.match(run_id) for run_id in ids)
    assert {run_id[:17] for run_id in ids} == {"r-20270115-080000"}


def test_the_suffix_wraps_around_instead_of_passing_six_hex_digits() -> None:
    with mock.patch.object(runrows.time, "time", return_value=1_800_000_001.0):
        first = runrows.new_run_id()
        runrows._ids_state[1] = (1 << 24) - 2  # the second's first suffix near the top
        runrows._ids_state[2] = 0
        tail = [runrows.new_run_id()[-6:] for _ in range(4)]
    assert RUN_ID.match(first)
    assert tail == ["fffffe", "ffffff", "000000", "000001"]


def test_a_new_second_draws_a_new_random_start() -> None:
    starts = set()
    for second in range(20):
        with mock.patch.object(runrows.time, "time", return_value=1_800_000_100.0 + second):
            starts.add(runrows.new_run_id()[-6:])
    assert len(starts) >= 19  # random starts: two equal of 2^24 in 20 draws is ~1e-5


def test_a_forked_child_does_not_continue_its_parents_suffixes() -> None:
    with mock.patch.object(runrows.time, "time", return_value=1_800_000_200.0):
        parent = [runrows.new_run_id() for _ in range(3)]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its next id, through the pipe
            try:
                os.write(write, runrows.new_run_id().encode())
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        child = os.read(read, 100).decode()
        os.close(read)
        nxt = runrows.new_run_id()
    assert RUN_ID.match(child)
    assert child not in parent
    # The parent goes on counting; the child drew its own start (equal only by a 1 in 2^24 chance).
    assert int(nxt[-6:], 16) == (int(parent[-1][-6:], 16) + 1) % (1 << 24)
    assert child != nxt
