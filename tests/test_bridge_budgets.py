"""Budgets bind mid-agent across agents (issue 35 item 3): every call an agent's bridge would
forward asks the run's budget and its sweep's, counting the charged totals plus what every
agent in flight has spent and not been charged for yet; a call waits while the calls in
flight may spend what is left. So with calls of one size a ceiling is passed by less than one
call however many agents run at once, and never by more than the calls in flight when it is
reached (docs/agents.md, "Budgets bind mid-agent")."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agent_backends import USAGE_IN, USAGE_OUT, Backend, start_backend
from tests.agent_fakes.bins import git_repo
from tests.helpers_http import LoopbackHTTPServer, isolate_loopback_env
from wf_magic import Engine
from wf_magic.bridge.attempt import BridgedAttempt
from wf_magic.drive.agentunits import CallAllowance
from wf_magic.drive.budget import Budget, SharedBudget
from wf_magic.spec.models import BudgetSpec

API_AGENT = Path(__file__).with_name("agent_fakes") / "api_agent.py"
CALL = USAGE_IN + USAGE_OUT  # each call of the fake agent: 128 tokens


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    isolate_loopback_env(monkeypatch)
    served = start_backend()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", served.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-key-budgets-35")
    yield served
    served.stop()


@pytest.fixture
def claude_bin(tmp_path: Path) -> Path:
    """The fake Claude Code that calls its model through ``$ANTHROPIC_BASE_URL``: a Write
    tool call, then the answer (two calls of 128 tokens each)."""
    path = tmp_path / "bin" / "claude"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(API_AGENT)!r}, run_name='__main__')\n"
    )
    path.chmod(0o755)
    return path


def _workflow(repo: Path, claude_bin: Path, *, top: str, mapped: bool) -> Path:
    fan = "    map: '{{ [1, 2, 3] }}'\n" if mapped else ""
    path = repo / "wf.yaml"
    path.write_text(
        f"name: budgets\n{top}params:\n  x: {{default: 1}}\nsteps:\n  - id: fix\n"
        f'    agent: claude\n{fan}    prompt: "Make [[write hello.txt]]"\n'
        "    model: claude-sonnet-4-5\n    pass_env: [ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY]\n"
        f"runners:\n  claude: {{bin: {claude_bin}}}\n"
    )
    return path


def _forwarded(served: Backend) -> int:
    return len([r for r in served.requests if r["path"].startswith("/v1/messages")])


@pytest.mark.backends
def test_a_concurrent_map_of_agents_stops_at_the_run_budget_before_passing_it_by_a_call(
    engine: Engine, tmp_path: Path, upstream: Backend, claude_bin: Path
) -> None:
    path = _workflow(
        git_repo(tmp_path / "repo"),
        claude_bin,
        top="budget: {max_tokens: 200}\nexecution: {max_concurrency: 3}\n",
        mapped=True,
    )
    run = engine.run(str(path))
    calls = engine.calls(run.run_id)
    # The first call goes alone (no call size is known yet); the second fits beside nothing
    # in flight; every later one finds 256 of 200 spent. Three agents, six calls asked for.
    assert _forwarded(upstream) == 2
    assert int((calls["tokens_in"] + calls["tokens_out"]).sum()) == 2 * CALL  # < 200 + 128
    assert list(calls["status"]).count("ok") == 2
    assert set(calls["status"]) == {"ok", "refused"}
    assert run.status == "failed"
    said = (
        rf"step fix: Budget exceeded in run {run.run_id}: max_tokens used 256 of 200; "
        r"call [12] of unit fix\[[012]\] was refused by the bridge and the agent stopped\. "
        r"Raise budget\.max_tokens and start a new run \(--new\), or fork this one\."
    )
    assert run.reason is not None and re.fullmatch(said, run.reason), run.reason
    attempts = engine.journal(run.run_id)
    work = attempts[attempts["phase"] == "work"]
    assert int((work["tokens_in"] + work["tokens_out"]).sum()) == 2 * CALL  # charged once
    for row in work.itertuples():
        if row.status == "failed":
            facts = engine.store.agent_facts(str(row.dispatch_id))
            assert facts is not None and facts["error_class"] == "budget"


@pytest.mark.backends
def test_a_sweep_ceiling_stops_a_cells_agent_at_the_call_that_would_pass_it(
    engine: Engine, tmp_path: Path, upstream: Backend, claude_bin: Path
) -> None:
    path = _workflow(git_repo(tmp_path / "repo"), claude_bin, top="", mapped=False)
    sweep = engine.sweep(str(path), grid={"x": [1]}, budget={"max_tokens": 100})
    run_id = str(sweep.frame()["run_id"].iloc[0])
    calls = engine.calls(run_id)
    assert _forwarded(upstream) == 1  # call 2 never went upstream
    assert list(calls["status"]) == ["ok", "refused"]
    assert list(calls["tokens_in"] + calls["tokens_out"]) == [CALL, 0]
    run = engine.store.get_run(run_id)
    assert run is not None and run.status == "failed"
    sw = sweep.sweep_id
    assert run.status_reason == (
        f"step fix: Budget exceeded in sweep {sw}: max_tokens used 128 of 100; call 2 of unit "
        f"fix was refused by the bridge and the agent stopped. `wf sweep-resume {sw} "
        "--max-tokens N` sets a new ceiling."
    )
    assert sweep.status == "stopped"
    assert sweep.status_reason == (
        f"sweep budget max_tokens reached (used 128 of 100); 1 cell(s) owed; "
        f"`wf sweep-resume {sw} --max-tokens N` sets a new ceiling"
    )


# -- the per-call check, without a drive ------------------------------------------------------


def _budget(max_tokens: int | None = None, max_cost: float | None = None) -> Budget:
    return Budget(root_run_id="r-1", spec=BudgetSpec(max_tokens=max_tokens, max_cost=max_cost))


def _admit(allowance: CallAllowance, dispatch_id: str, tokens: int = 0) -> str | bool:
    return allowance.admit(
        run_id="r-1", unit_id="u", dispatch_id=dispatch_id, tokens=tokens, cost=0.0, call=1
    )


def test_another_agents_uncharged_calls_count_and_its_charge_does_not_count_them_twice() -> None:
    budget = _budget(max_tokens=300)
    allowance = CallAllowance(budget)
    assert _admit(allowance, "d-a") is True
    allowance.spent(dispatch_id="d-a", tokens=128, cost=None, ok=True)
    allowance.left()
    assert _admit(allowance, "d-b") is True  # 128 spent, nothing in flight
    allowance.spent(dispatch_id="d-b", tokens=128, cost=None, ok=True)
    allowance.left()
    said = _admit(allowance, "d-c")
    assert said is True  # 256 < 300
    allowance.left()
    allowance.spent(dispatch_id="d-a", tokens=64, cost=None, ok=True)
    said = _admit(allowance, "d-c")
    assert isinstance(said, str) and said.startswith(
        "Budget exceeded in run r-1: max_tokens used 320 of 300; call 1 of unit u"
    )
    budget.charge_usage(192, None)  # d-a's finish charges its calls, then settles them
    budget.settle("d-a")
    assert budget.ask_call("d-c", tokens=0, cost=0.0).used == 320  # once, not 512


def test_a_call_waits_while_calls_in_flight_may_spend_what_is_left() -> None:
    allowance = CallAllowance(_budget(max_tokens=250))
    assert _admit(allowance, "d-a") is True
    assert _admit(allowance, "d-b") is False  # no call size known yet: it waits
    allowance.spent(dispatch_id="d-a", tokens=128, cost=None, ok=True)
    allowance.left()
    assert _admit(allowance, "d-b") is True  # 128 + nothing in flight
    assert _admit(allowance, "d-c") is False  # 128 + 128 in flight would reach 250
    allowance.spent(dispatch_id="d-b", tokens=100, cost=None, ok=True)
    allowance.left()
    assert _admit(allowance, "d-c") is True  # 228 < 250, nothing in flight


def test_the_sweeps_ceiling_refuses_with_its_own_line_and_is_noted_as_reached() -> None:
    shared = SharedBudget(max_cost=0.01, cost=0.01)
    allowance = CallAllowance(_budget(), shared, sweep_id="sw-1")
    said = _admit(allowance, "d-a")
    assert said == (
        "Budget exceeded in sweep sw-1: max_cost used 0.01 of 0.01; call 1 of unit u was "
        "refused by the bridge and the agent stopped. `wf sweep-resume sw-1 --max-cost N` "
        "sets a new ceiling."
    )
    assert shared.reached == "max_cost"


def test_a_run_without_a_ceiling_never_holds_a_call_back() -> None:
    allowance = CallAllowance(_budget())
    assert all(_admit(allowance, f"d-{i}") is True for i in range(5))


# -- ceilings x concurrency x call sizes, through real bridges ----------------------------------


class _SizedUpstream:
    """A fake Anthropic upstream whose answer uses what the request asks: ``{"size": N}``
    tokens in, 0 out, after ``{"delay_s": S}``."""

    def __init__(self) -> None:
        self.served = 0
        self.lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with upstream.lock:
                    upstream.served += 1
                time.sleep(body["delay_s"])
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                start = {
                    "type": "message_start",
                    "message": {"model": "m", "usage": {"input_tokens": body["size"]}},
                }
                end = {"type": "message_delta", "usage": {"output_tokens": 0}}
                for name, data in (("message_start", start), ("message_delta", end)):
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self.server = LoopbackHTTPServer(Handler, name="sized-upstream")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


@pytest.fixture
def sized(monkeypatch: pytest.MonkeyPatch) -> Iterator[_SizedUpstream]:
    isolate_loopback_env(monkeypatch)
    served = _SizedUpstream()
    yield served
    served.server.stop()


def _agent(
    upstream: str, budget: Budget, index: int, sizes: list[int], delays: list[float]
) -> tuple[list[int], bool]:
    """One agent: its calls in order until one is refused, then its attempt charged as the
    drive charges it; (the tokens each forwarded call spent, whether it was refused)."""
    dispatch_id = f"d-{index}"
    bridged = BridgedAttempt(
        harness="claude",
        options={"local": True},
        identity={
            "run_id": "r-1",
            "step_id": "fix",
            "unit_id": f"fix[{index}]",
            "dispatch_id": dispatch_id,
            "attempt": 1,
        },
        journal=None,
        redact=lambda text: text,
        allowance=CallAllowance(budget),
    )
    url = bridged.open(upstream, model="m")
    refused = False
    try:
        for size, delay_s in zip(sizes, delays, strict=True):
            body = json.dumps({"model": "m", "size": size, "delay_s": delay_s})
            answer = httpx.post(f"{url}/v1/messages", content=body, timeout=30, trust_env=False)
            if answer.status_code == 400:
                refused = True
                break
            assert answer.status_code == 200
    finally:
        bridged.close()
    spent = [r.tokens_in + r.tokens_out for r in bridged.rows if r.status == "ok"]
    budget.charge_usage(sum(spent), None)
    budget.settle(dispatch_id)
    return spent, refused


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ceiling=st.integers(min_value=1, max_value=600),
    agents=st.integers(min_value=1, max_value=4),
    calls=st.integers(min_value=1, max_value=4),
    uniform=st.booleans(),
    size=st.integers(min_value=1, max_value=150),
    data=st.data(),
)
def test_the_ceiling_is_passed_by_less_than_one_call_of_one_size_and_never_by_more_than_the_calls_in_flight(
    sized: _SizedUpstream,
    ceiling: int,
    agents: int,
    calls: int,
    uniform: bool,
    size: int,
    data: st.DataObject,
) -> None:
    sizes = [
        [size] * calls
        if uniform
        else data.draw(st.lists(st.integers(1, 150), min_size=calls, max_size=calls))
        for _ in range(agents)
    ]
    delays = [
        data.draw(st.lists(st.sampled_from([0.0, 0.01, 0.03]), min_size=calls, max_size=calls))
        for _ in range(agents)
    ]
    budget = _budget(max_tokens=ceiling)
    with ThreadPoolExecutor(agents) as pool:
        done = list(
            pool.map(lambda i: _agent(sized.url, budget, i, sizes[i], delays[i]), range(agents))
        )
    total = sum(sum(spent) for spent, _ in done)
    assert budget.tokens == total and budget.bridged.by_attempt == {}
    assert budget.bridged.forwarding == 0
    assert sized.served == sum(len(spent) for spent, _ in done)
    largest = max(max(s) for s in sizes)
    # Never past the ceiling by more than the calls in flight when it was reached (at most
    # one per agent); with calls of one size, by less than one call.
    assert total <= ceiling - 1 + agents * largest
    if uniform:
        assert total <= ceiling - 1 + size
    # A call is refused only once the ceiling is reached; below it every call went.
    if any(refused for _, refused in done):
        assert total >= ceiling
    else:
        assert [len(spent) for spent, _ in done] == [calls] * agents
    sized.served = 0
