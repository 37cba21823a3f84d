"""One agent attempt's bridge: open it, price and journal each call as it finishes, sum them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from ..runners.pricing import attempt_cost
from ..store.calls import CallBody, CallRow, CallTotals
from .server import Bridge, CallRecord, Limits
from .tape import HOME_MARK, WORKDIR_MARK, Replay


class CallJournal(Protocol):
    """Where calls are journaled (the Store)."""

    def record_call(self, row: CallRow, body: CallBody | None = None) -> int: ...

    def call_totals(self, run_id: str, dispatch_id: str) -> CallTotals: ...


class Allowance(Protocol):
    """The run's (and its sweep's) budget as a call sees it (drive/agentunits.py)."""

    def admit(
        self, *, run_id: str, unit_id: str, dispatch_id: str, tokens: int, cost: float, call: int
    ) -> str | bool:
        """May call number ``call`` of ``unit_id`` go now, the attempt having spent ``tokens``
        and ``cost`` so far? True: it goes (in flight until :meth:`left`); False: calls in
        flight may spend what is left, ask again; else the one-line ``Budget exceeded …``."""
        ...

    def spent(self, *, dispatch_id: str, tokens: int, cost: float | None, ok: bool) -> None:
        """A call finished: its spend counts against the ceilings until the attempt's charge."""
        ...

    def left(self) -> None:
        """A call :meth:`admit` let go ended (its spend, if any, was handed to :meth:`spent`)."""
        ...


class LimitsFor(Protocol):
    """The drive's endpoint limiters, as an attempt's bridge asks for one."""

    def limits(
        self,
        endpoint: str,
        identity: Mapping[str, Any],
        *,
        options: Mapping[str, Any] | None = None,
        model: str | None = None,
    ) -> Limits:
        """The limiter of ``endpoint``; its ``throttled`` events journaled under ``identity``
        (run_id, step_id, unit_id, dispatch_id). ``options``: the harness's ``runners:``
        section, whose ``limits:`` for ``model`` (or ``*``) set its concurrency and pacing."""
        ...


class BridgedAttempt:
    """The bridge of one launch, with the identity its calls are journaled under."""

    def __init__(
        self,
        *,
        harness: str,
        options: Mapping[str, Any] | None,
        identity: Mapping[str, Any],
        journal: CallJournal | None,
        redact: Callable[[str], str],
        allowance: Allowance | None = None,
        limits: LimitsFor | None = None,
        replay: Replay | None = None,
        workdir: str | None = None,
        home: str | None = None,
    ) -> None:
        self.harness = harness
        self.replay = replay
        self.folders: dict[str, str | None] = {WORKDIR_MARK: workdir, HOME_MARK: home}
        """The agent's folder and HOME: recorded bodies keep them as marks, a replay writes
        this attempt's back (``bridge/tape.py``)."""
        if replay is not None:
            replay.folders = dict(self.folders)
        """Set: the calls are answered from this recording, never forwarded (``bridge/tape.py``)."""
        self.options = options
        self.identity = dict(identity)
        """run_id, step_id, unit_id, dispatch_id, attempt."""
        self.journal = journal
        self.redact = redact
        self.rows: list[CallRow] = []
        self._lock = threading.Lock()
        self.bridge: Bridge | None = None
        self.allowance = allowance
        self.limits_for = limits
        self.prior = CallTotals(calls=0, tokens_in=0, tokens_out=0, cost=None)
        """The calls an earlier launch of this attempt journaled (a reclaimed attempt)."""

    def open(self, upstream: str, *, model: str | None) -> str:
        """Start listening; the base URL the CLI is given.

        Raises:
            OSError: no loopback port could be bound.
        """
        if self.journal is not None:
            self.prior = self.totals()
        gate = self if self.allowance is not None else None
        limits = None
        if self.limits_for is not None and self.replay is None:
            limits = self.limits_for.limits(
                f"bridge {self.harness} {upstream}",
                self.identity,
                options=self.options,
                model=model,
            )
        self.bridge = Bridge.open(
            upstream=upstream,
            on_call=self.on_call,
            model=model,
            gate=gate,
            limits=limits,
            replay=self.replay,
        )
        return self.bridge.url

    @property
    def refusal(self) -> str | None:
        """The budget refusal that stopped the agent, if one did."""
        return self.bridge.refusal if self.bridge is not None else None

    def enter(self) -> str | bool:
        """The bridge's gate, asked on its loop before each call: in-memory sums only, no I/O
        (see :meth:`Allowance.admit`)."""
        if self.allowance is None:
            return True
        with self._lock:
            rows = list(self.rows)
        tokens = self.prior.tokens_in + self.prior.tokens_out
        tokens += sum(r.tokens_in + r.tokens_out for r in rows)
        cost = (self.prior.cost or 0.0) + sum(r.cost or 0.0 for r in rows)
        return self.allowance.admit(
            run_id=self.identity["run_id"],
            unit_id=self.identity["unit_id"],
            dispatch_id=self.identity["dispatch_id"],
            tokens=tokens,
            cost=cost,
            call=self.prior.calls + len(rows) + 1,
        )

    def leave(self) -> None:
        """A call the gate let through ended."""
        if self.allowance is not None:
            self.allowance.left()

    def close(self) -> None:
        """Close the port (calls still in flight end)."""
        if self.bridge is not None:
            self.bridge.close()

    def on_call(self, record: CallRecord) -> None:
        """Price ``record`` and journal it with what it sent and got back (runs on an executor
        thread, never the loop). A replayed call costs nothing: its source is ``replay``."""
        cost: float | None = 0.0
        source: str | None = "replay"
        if not record.replayed:
            cost, source = self._price(record)
        row = CallRow(
            **self.identity,
            model=record.model,
            status=record.status,
            tokens_in=record.tokens_in,
            tokens_out=record.tokens_out,
            cache_read=record.cache_read,
            cache_write=record.cache_write,
            cost=cost,
            price_source=source,
            latency_s=record.latency_s,
            started_at=record.started_at,
            error=self.redact(record.error) if record.error else None,
        )
        body = (
            record.capture.body(self.redact, folders=self.folders)
            if record.capture is not None
            else None
        )
        if self.allowance is not None:  # counted for every other agent's next call at once
            self.allowance.spent(
                dispatch_id=self.identity["dispatch_id"],
                tokens=row.tokens_in + row.tokens_out,
                cost=row.cost,
                ok=row.status == "ok",
            )
        with self._lock:
            if self.journal is not None:
                number = self.journal.record_call(row, body)
            else:
                number = len(self.rows) + 1
            self.rows.append(replace(row, call=number))

    def _price(self, record: CallRecord) -> tuple[float | None, str | None]:
        cost, source = attempt_cost(
            runner=self.harness,
            options=self.options,
            model=record.model,
            tokens_in=record.tokens_in,
            tokens_out=record.tokens_out,
            cache_read=record.cache_read,
            cache_write=record.cache_write,
            provider=record.provider,
        )
        if record.tokens_in == 0 and record.tokens_out == 0 and cost is None:
            return 0.0, "no tokens"
        return cost, source

    def totals(self) -> CallTotals:
        """The sums over the attempt's calls (a reclaimed attempt's earlier launches too)."""
        if self.journal is not None:
            return self.journal.call_totals(self.identity["run_id"], self.identity["dispatch_id"])
        with self._lock:
            rows = list(self.rows)
        unpriced = any(r.cost is None for r in rows)
        return CallTotals(
            calls=len(rows),
            tokens_in=sum(r.tokens_in for r in rows),
            tokens_out=sum(r.tokens_out for r in rows),
            cost=None if unpriced or not rows else sum(r.cost or 0.0 for r in rows),
        )

    def sources(self) -> list[str]:
        """The distinct price sources of this launch's calls."""
        with self._lock:
            return sorted({r.price_source for r in self.rows if r.price_source})
