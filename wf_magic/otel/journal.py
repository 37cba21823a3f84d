"""Reads what the spans of one run are built from, through the Store."""

from __future__ import annotations

from ..errors import UsageError
from ..store import Store
from ..store.calls import CallRow
from .records import RunJournal


def read_run(store: Store, run_id: str, *, content: bool = False) -> RunJournal:
    """The rows of ``run_id`` the spans need (its inputs too with ``content``).

    Raises:
        UsageError: no run ``run_id`` in this state.
    """
    run = store.get_run(run_id)
    if run is None:
        raise UsageError(f"No run {run_id} in this state; `wf list` shows the runs.", run_id=run_id)
    steps = store.steps_of(run_id)
    attempts = store.attempts_of(run_id)
    events = []
    after = 0
    while True:  # every event, in pages
        page = store.events_after(run_id, after)
        events.extend(page)
        if len(page) < 10_000:
            break
        after = page[-1].event_id
    has_agents = any(s.kind == "agent" for s in steps)
    calls: dict[str, list[CallRow]] = {}
    for call in store.calls_of(run_id) if has_agents else ():  # read after the attempts
        calls.setdefault(call.dispatch_id, []).append(call)
    inputs = store.inputs_of({a.input_hash for a in attempts}) if content else {}
    return RunJournal(
        run=run,
        steps=steps,
        attempts=attempts,
        events=[e for e in events if e.kind in ("throttled", "warning")],
        kinds={s.step_id: s.kind for s in steps},
        agent_facts=store.agent_facts_of_run(run_id) if has_agents else {},
        inputs=inputs,
        calls={d: sorted(rows, key=lambda c: c.call) for d, rows in calls.items()},
    )
