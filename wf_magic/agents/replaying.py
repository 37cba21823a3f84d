"""An agent harness's replay (``runners: {NAME: {replay: PATH}}``): each attempt's model calls
answered through its bridge from the cassette's recorded calls of the same step, unit and
attempt, offline and at no cost (``bridge/tape.py``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from ..bridge.tape import Replay
from ..errors import RunnerError
from ..runners.base import UnitRequest
from ..runners.cassette_calls import AttemptKey, load_calls
from ..store.calls import RecordedCall
from .harness import AgentError, Failure, Outcome


class Cassette:
    """A cassette's agent calls, read on first use (once per runner)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path).expanduser()
        self._calls: dict[AttemptKey, list[RecordedCall]] | None = None
        self._lock = threading.Lock()

    def calls(self) -> dict[AttemptKey, list[RecordedCall]]:
        """The recorded calls by (step, unit, attempt).

        Raises:
            AgentError: permanent, the cassette cannot be read (its line named).
        """
        with self._lock:
            if self._calls is None:
                try:
                    self._calls = load_calls(self.path)
                except RunnerError as exc:
                    raise AgentError(str(exc), executed=False) from exc
            return self._calls


def option(value: Any, *, bridge: bool) -> str | None:
    """The ``replay:`` option of a harness (a cassette path), checked.

    Raises:
        ValueError: not a path, or the bridge is off (replay answers through it).
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"replay: expected a cassette path (got {value!r})")
    if not bridge:
        raise ValueError("replay: answers through the bridge; remove bridge: false")
    return value


def attempt_replay(cassette: Cassette | None, request: UnitRequest, name: str) -> Replay | None:
    """The recording that answers ``request``'s calls (None: the harness does not replay).

    Raises:
        AgentError: permanent, before the CLI starts: the cassette holds no call of the unit.
    """
    if cassette is None:
        return None
    calls = cassette.calls()
    step, unit, attempt = request.step_id, request.unit_id, request.attempt
    if not any(k[0] == step and k[1] == unit for k in calls):
        raise AgentError(
            f"{name}: replay cassette {cassette.path} has no recorded model calls of step "
            f"{step} unit {unit}; export it with `wf export-cassette RUN` from a run whose "
            "agent calls went through the bridge",
            executed=False,
        )
    where = f"cassette {cassette.path} (unit {unit}, attempt {attempt})"
    return Replay(calls.get((step, unit, attempt), []), where=where)


def check(replay: Replay, outcome: Outcome) -> None:
    """Fail ``outcome`` when the recording could not answer a call (exhausted, truncated)."""
    if replay.failure is not None:
        outcome.failure = Failure(error_class="replay", message=replay.failure)


def facts(replay: Replay) -> dict[str, Any]:
    """The attempt facts of a replay: what answered it and the differences found."""
    out: dict[str, Any] = {
        "replay": {"source": replay.where, "recorded": len(replay.calls), "served": replay.served}
    }
    if replay.warnings:
        out["replay_warnings"] = list(replay.warnings)
    return out
