"""Live export: a background thread sends a run's new spans, read from the journal, as it settles.

The drive only pokes (a set add and an event set, from the bus): it never waits for the
collector. The thread reads the journal through the Store and sends what the export cursor
says is missing, so spans lost to a crash or a dead collector go with the next poke, the next
drive or ``wf export-otel``. A failing collector is retried with a growing pause and said
once, on one line.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping

from ..bus import Event
from ..errors import WorkflowError
from ..redact import Redactor, mask_url
from ..store import Store
from .export import export_run

POKED_BY = frozenset(
    {"unit_finished", "unit_reused", "gate_verdict", "gate_rejected", "step_status", "run_status"}
)
"""Engine events after which a run may hold a new settled span."""
RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Pauses between tries while the collector fails (the last one repeats)."""


class LiveExporter:
    """Sends runs' new spans to one OTLP endpoint from a daemon thread (started on first poke).

    Args:
        store: where the journal and the export cursor are read and written.
        url: the OTLP/HTTP traces URL (``endpoint.traces_url``).
        headers: sent with every request (a collector's auth).
        redactor_of: the redactor of a run's texts.
        content: attach prompts and outputs.
        timeout_s: one request's deadline (the exporter's own retries included).
        warn: where the one warning line goes (default: stderr).
    """

    def __init__(
        self,
        store: Store,
        *,
        url: str,
        headers: Mapping[str, str],
        redactor_of: Callable[[str], Redactor],
        content: bool = False,
        timeout_s: float = 5.0,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.store, self.url, self.headers = store, url, dict(headers)
        self.redactor_of, self.content, self.timeout_s = redactor_of, content, timeout_s
        self._warn = warn or _stderr
        self._warned = False
        self._owed: dict[str, int] = {}
        """Run id → poke count not yet exported."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.failures = 0
        """Tries that failed (a try sends every owed run)."""
        self._healthy = True
        """The last try reached the collector."""

    def observe(self, event: Event) -> None:
        """A bus observer: poke the event's run when it may have settled a span."""
        if event.kind in POKED_BY:
            self.poke(event.run_id)

    def poke(self, run_id: str) -> None:
        """Export ``run_id``'s missing spans soon (returns at once)."""
        with self._lock:
            if self._closing:
                return
            self._owed[run_id] = self._owed.get(run_id, 0) + 1
            self._idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="wf_magic-otel-export", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until every poked run was exported; False when ``timeout_s`` passed first."""
        return self._idle.wait(timeout_s)

    def close(self, wait_s: float = 5.0) -> None:
        """Give the owed exports ``wait_s`` to finish — none once a try has failed (a dead
        collector costs no wait: the first refused try ends it) — then stop: what is left
        goes with the next drive or export."""
        end = time.monotonic() + wait_s
        failures = self.failures
        while self._healthy and self.failures == failures:
            left = end - time.monotonic()
            if left <= 0 or self.wait_idle(min(left, 0.05)):
                break
        with self._lock:
            owed = sorted(self._owed)
        if owed and self._healthy and self.failures == failures:
            # A collector that takes the connection and never answers: no try failed yet,
            # so nothing was said; the spans still owed are said once, here.
            self._say(
                owed[0],
                f"OpenTelemetry export to {mask_url(self.url)} did not finish within "
                f"{wait_s:g} s ({len(owed)} run(s) owed spans, first {owed[0]}).",
                retrying=False,
            )
        with self._lock:
            self._closing = True
        self._wake.set()
        if self._thread is not None:  # a daemon: one stuck on a slow collector is left behind
            self._thread.join(1.0)

    # -- the thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        pause = 0
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                if self._closing:
                    return
                owed = dict(self._owed)
            failed = False
            for run_id, pokes in owed.items():
                if not self._export(run_id):
                    failed = True
                    continue
                with self._lock:
                    if self._owed.get(run_id) == pokes:  # no newer poke meanwhile
                        del self._owed[run_id]
            with self._lock:
                if not self._owed:
                    self._idle.set()
                else:
                    self._wake.set()  # newer pokes, or a retry below
            self._healthy = not failed
            if failed:
                self.failures += 1
                delay = RETRY_S[min(pause, len(RETRY_S) - 1)]
                pause += 1
                self._sleep(delay)
            else:
                pause = 0

    def _export(self, run_id: str) -> bool:
        try:
            export_run(
                self.store,
                run_id,
                url=self.url,
                headers=self.headers,
                redactor=self.redactor_of(run_id),
                content=self.content,
                timeout_s=self.timeout_s,
                only_new=True,
            )
            return True
        except WorkflowError as exc:
            self._say(run_id, str(exc))
        except Exception as exc:  # a bug or a store fault must not kill the thread
            self._say(
                run_id, f"OpenTelemetry export of run {run_id} failed: {type(exc).__name__}: {exc}"
            )
        return False

    def _sleep(self, delay: float) -> None:
        end = time.monotonic() + delay
        while not self._closing and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))

    def _say(self, run_id: str, message: str, *, retrying: bool = True) -> None:
        if self._warned or self._closing:  # the store may be closing under the thread
            return
        self._warned = True
        line = " ".join(self.redactor_of(run_id).redact(message).split())
        later = (
            f"sent when {mask_url(self.url)} answers (retrying in the background)"
            if retrying
            else "sent by the next drive or `wf export-otel RUN`"
        )
        self._warn(f"wf_magic: warning: {line} Spans are kept in the journal and {later}.")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
