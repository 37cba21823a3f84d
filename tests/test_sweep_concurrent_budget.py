"""One sweep budget over 32 cells in flight, each calling a loopback OpenAI-compatible server
through the ``openai`` runner: ``max_units`` is exact and ``max_tokens`` overshoots by at most
what the calls in flight use (docs/sweeps.md "One budget over the sweep"; issue 32).

The server answers after a short latency, so the sweep really holds 32 calls in flight, and
honours the ``max_tokens`` each request carries (the budget's offer) as a provider does: the
completion never exceeds it. Each cell is a map of a few units, so units of one cell and of
its neighbours compete for the same ceiling.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import db_rows
from tests.openai_server import (
    FakeChatServer,
    RecordedRequest,
    ScriptedResponse,
    completion_body,
    isolate_openai_env,
)
from wf_magic import Engine

KEY_ENV = "WF_TEST_BUDGET_KEY"
CELLS = 64
ITEMS = 4
CONCURRENCY = 32
PROMPT_TOKENS = 5
COMPLETION_TOKENS = 7
UNIT_TOKENS = PROMPT_TOKENS + COMPLETION_TOKENS
"""The most one call can use (less when the budget offers fewer completion tokens)."""
LATENCY_S = 0.15
"""Long enough for the sweep to hold 32 calls in flight on a 2-core machine."""


@dataclass
class Latency:
    """Answers every call after ``LATENCY_S``; counts calls in flight and their peak."""

    in_flight: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: RecordedRequest) -> ScriptedResponse:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            threading.Event().wait(LATENCY_S)
        finally:
            with self.lock:
                self.in_flight -= 1
        offer = request.body.get("max_tokens")
        completion = COMPLETION_TOKENS if offer is None else min(COMPLETION_TOKENS, int(offer))
        return ScriptedResponse(
            200,
            completion_body(
                "ok",
                model=str(request.body.get("model")),
                prompt_tokens=PROMPT_TOKENS,
                completion_tokens=completion,
            ),
        )


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_openai_env(monkeypatch, KEY_ENV, "sk-budget-test")


@pytest.fixture
def server() -> Iterator[tuple[FakeChatServer, Latency]]:
    latency = Latency()
    with FakeChatServer() as running:
        running.default = latency
        running.streams = False
        yield running, latency


def workflow(url: str) -> str:
    return (
        "name: shared-ceiling\n"
        "params:\n"
        "  i: {type: integer}\n"
        "runner: openai\n"
        "runners:\n"
        f"  openai: {{base_url: '{url}', api_key_env: {KEY_ENV}, model: m1}}\n"
        "steps:\n"
        "  - id: ask\n"
        f'    map: "{{{{ range({ITEMS}) | list }}}}"\n'
        '    prompt: "cell {{ params.i }} item {{ item }}"\n'
    )


def charged(state: Path) -> list[tuple[str, str, int, int]]:
    """(run, unit, attempt, tokens) of every charged attempt."""
    return [
        (str(r), str(u), int(a), int(t_in or 0) + int(t_out or 0))  # type: ignore[call-overload]
        for r, u, a, t_in, t_out in db_rows(
            state,
            "SELECT run_id, unit_id, attempt, tokens_in, tokens_out FROM attempts"
            " WHERE charged = 1",
        )
    ]


def reserved_past_the_ceiling(state: Path, max_tokens: int) -> list[str]:
    """The charged attempts reserved when the journal already held ``max_tokens`` paid
    tokens, in commit order (event ids): the sweep reserves none once the ceiling is met."""
    finished: list[tuple[int, int]] = []
    started: list[tuple[int, str]] = []
    for unit, run, start, end, t_in, t_out in db_rows(
        state,
        "SELECT unit_id, run_id, started_seq, finished_seq, tokens_in, tokens_out"
        " FROM attempts WHERE charged = 1",
    ):
        started.append((int(start), f"{run}/{unit}"))  # type: ignore[call-overload]
        if end is not None:
            finished.append((int(end), int(t_in or 0) + int(t_out or 0)))  # type: ignore[call-overload]
    late = []
    for start, unit in started:
        paid_then = sum(tokens for end, tokens in finished if end < start)
        if paid_then >= max_tokens:
            late.append(unit)
    return late


def check_paid_once(state: Path, chat: FakeChatServer, paid: dict[str, float]) -> None:
    """Each charged attempt is one call the server answered, charged once, and the sweep's
    totals are the journal's."""
    rows = charged(state)
    assert len({(r, u) for r, u, _, _ in rows}) == len(rows)  # no unit charged twice
    assert {a for _, _, a, _ in rows} <= {1}  # no retry was needed
    assert paid["units"] == len(rows) == len(chat.requests)
    assert paid["tokens"] == sum(t for *_, t in rows)
    keys = Counter(r.headers["idempotency-key"] for r in chat.requests)
    assert set(keys.values()) <= {1}
    sweep_charges = db_rows(state, "SELECT COUNT(*) FROM sweep_charges")[0][0]
    assert sweep_charges == len(rows)


@pytest.mark.parametrize("max_units", [1, 31, 32, 33, 97, 200])
def test_max_units_is_exact_over_32_cells_in_flight(
    tmp_path: Path, server: tuple[FakeChatServer, Latency], max_units: int
) -> None:
    chat, latency = server
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(
            workflow(chat.url),
            grid={"i": list(range(CELLS))},
            budget={"max_units": max_units},
            max_concurrency=CONCURRENCY,
        )
        assert sweep.status == "stopped"
        assert sweep.status_reason is not None
        assert sweep.status_reason.startswith(
            f"sweep budget max_units reached (used {max_units} of {max_units}); "
        )
        paid = sweep.totals()
        check_paid_once(state, chat, paid)
        assert paid["units"] == max_units
        assert latency.peak <= CONCURRENCY
        if max_units >= 2 * CONCURRENCY:
            assert latency.peak == CONCURRENCY  # the ceiling was shared by a full flight
        # A plain resume keeps the ceiling: not one more call.
        again = engine.sweep_resume(sweep.sweep_id, max_concurrency=CONCURRENCY)
        assert again.status == "stopped"
        assert len(chat.requests) == max_units
        assert again.totals() == paid


@pytest.mark.parametrize("max_tokens", [1, 100, 383, 1000, 2500])
def test_max_tokens_overshoots_by_at_most_the_calls_in_flight(
    tmp_path: Path, server: tuple[FakeChatServer, Latency], max_tokens: int
) -> None:
    chat, latency = server
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(
            workflow(chat.url),
            grid={"i": list(range(CELLS))},
            budget={"max_tokens": max_tokens},
            max_concurrency=CONCURRENCY,
        )
        assert sweep.status == "stopped", sweep.status_reason
        assert sweep.status_reason is not None
        assert sweep.status_reason.startswith("sweep budget max_tokens reached (used ")
        paid = sweep.totals()
        check_paid_once(state, chat, paid)
        # Reached, and passed by no more than the other calls in flight when it was: the
        # call that crossed it started under it, and CONCURRENCY - 1 others at most were out.
        assert max_tokens <= paid["tokens"] <= max_tokens - 1 + CONCURRENCY * UNIT_TOKENS
        assert reserved_past_the_ceiling(state, max_tokens) == []
        assert latency.peak <= CONCURRENCY
        again = engine.sweep_resume(sweep.sweep_id, max_concurrency=CONCURRENCY)
        assert again.status == "stopped"
        assert again.totals() == paid


@pytest.mark.parametrize(("max_units", "max_tokens"), [(40, 100_000), (200, 700), (64, 768)])
def test_units_and_tokens_together_stop_at_whichever_comes_first(
    tmp_path: Path, server: tuple[FakeChatServer, Latency], max_units: int, max_tokens: int
) -> None:
    chat, _ = server
    state = tmp_path / "st"
    with Engine(state) as engine:
        sweep = engine.sweep(
            workflow(chat.url),
            grid={"i": list(range(CELLS))},
            budget={"max_units": max_units, "max_tokens": max_tokens},
            max_concurrency=CONCURRENCY,
        )
        assert sweep.status == "stopped", sweep.status_reason
        paid = sweep.totals()
        check_paid_once(state, chat, paid)
        assert paid["units"] <= max_units
        assert paid["tokens"] <= max_tokens - 1 + CONCURRENCY * UNIT_TOKENS
        assert paid["units"] == max_units or paid["tokens"] >= max_tokens
        assert reserved_past_the_ceiling(state, max_tokens) == []
