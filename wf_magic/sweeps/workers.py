"""A sweep's owed cells spread over worker processes (``workers=N``): this process drives one
share of them and starts ``N - 1`` others (``python -m wf_magic.sweep_worker``), each with its
own loop and runner pool, all journaling into the same store.

Cells are split by index (cell ``i`` goes to share ``i % N``), so no two processes ever reach
for one cell; the cap on units in flight is split between the shares (32 over 2 workers:
16 + 16). The sweep's budget stays exact across them: every reservation counts what the
whole sweep has reserved, in the store's one write transaction (``fitting_txn``), whichever
process makes it.

What a worker needs and the command line must not carry — the sweep's secret params, a
PostgreSQL URL with its password, the engine's library table — goes to it as one JSON
document on its stdin. A worker stops when this process tells it to (SIGINT: the cells in
flight finish and are journaled) or when it finds this process gone (a kill -9 of the
driver), so nothing keeps spending after the driver died.
"""

from __future__ import annotations

import json
import os
import signal as signals
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..spec.workflow import Workflow
from ..store.location import PgLocation
from ..store.sweeps import SweepRow

if TYPE_CHECKING:
    from .driver import SweepDrive

WORKERS_ENV = "WF_MAGIC_SWEEP_WORKERS"
"""The default number of worker processes of a sweep (``--workers`` / ``workers=`` win)."""
WORKER_MODULE = "wf_magic.sweep_worker"
"""What a worker process runs (``python -m``)."""
WORKERS_MAX = 64
PROGRESS_EVERY_S = 0.5
STDERR_KEPT = 5
"""Lines of a worker's stderr kept to name what ended it."""


def default_workers(environ: Mapping[str, str] | None = None) -> int:
    """``$WF_MAGIC_SWEEP_WORKERS``, else 1.

    Raises:
        UsageError: the variable is not a whole number from 1 to 64.
    """
    text = (os.environ if environ is None else environ).get(WORKERS_ENV, "").strip()
    if not text:
        return 1
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= WORKERS_MAX:
        raise UsageError(
            f"{WORKERS_ENV}={text!r}: expected a whole number from 1 to {WORKERS_MAX} "
            "(worker processes of a sweep); unset it for one process"
        )
    return value


def check_workers(workers: int) -> int:
    """``workers`` if it is a count from 1 to 64.

    Raises:
        UsageError: naming the bounds.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= WORKERS_MAX:
        raise UsageError(
            f"workers must be a whole number from 1 to {WORKERS_MAX} (got {workers!r})"
        )
    return workers


def concurrency_shares(max_concurrency: int, workers: int) -> list[int]:
    """The cap on units in flight of each share: ``max_concurrency`` split as evenly as it
    goes (never a share of 0: fewer shares when the cap is smaller than ``workers``)."""
    count = max(1, min(workers, max_concurrency))
    base, extra = divmod(max_concurrency, count)
    return [base + (1 if k < extra else 0) for k in range(count)]


def refuse_unspreadable(wf: Workflow, *, has_executor: bool) -> None:
    """Refuse a sweep whose cells another process cannot drive.

    Raises:
        UsageError: an executor is set (a Dask cluster spreads units already), or a python
            step or scorer names a function of this process only (a notebook's namespace,
            ``register_function``), which a worker process cannot import.
    """
    if has_executor:
        raise UsageError(
            "workers and an executor both spread a sweep's work; use one (drop workers=, or "
            "the Engine's executor)"
        )
    bare = sorted(set(_bare_python_targets(json.loads(wf.plan_json))))
    if bare:
        raise UsageError(
            f"workflow {wf.name!r}: python target {bare[0]!r} lives in this process's "
            "namespace, which a worker process cannot import; name it as module:function "
            "(a module beside the workflow file), or drive the sweep without workers"
        )


def _bare_python_targets(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        target = node.get("target") if node.get("kind") == "python" else None
        if isinstance(target, str) and ":" not in target:  # a python step's
            yield target
        for key, value in node.items():
            if key == "python" and isinstance(value, str) and ":" not in value:  # a scorer's
                yield value
            else:
                yield from _bare_python_targets(value)
    elif isinstance(node, list):
        for value in node:
            yield from _bare_python_targets(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOrder:
    """What one worker process is told on its stdin (JSON): the share it drives and how to
    open the state it drives it in."""

    sweep_id: str
    share: int
    shares: int
    max_concurrency: int
    state: str | dict[str, str]
    """The state folder, or a PostgreSQL location's fields (its URL with the password)."""
    durability: str = "normal"
    library: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict, repr=False)
    """The sweep's secret params, name → value (checked against their seals again)."""
    import_dirs: list[str] = field(default_factory=list)
    """Folders python targets import modules from (the workflow file's)."""
    parent_pid: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerOrder:
        """The order a worker was given.

        Raises:
            UsageError: the text is not an order (a worker started by hand).
        """
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise UsageError(
                f"{WORKER_MODULE} reads its order as JSON on stdin, from the sweep that starts "
                f"it ({exc}); start a sweep with workers instead (`wf sweep … --workers N`)"
            ) from None

    def open_state(self) -> str | PgLocation:
        """What ``Engine(...)`` opens: the folder, or the PostgreSQL location."""
        from pathlib import Path

        if isinstance(self.state, str):
            return self.state
        fields = dict(self.state)
        return PgLocation(
            url=fields["url"],
            schema=fields["schema"],
            where=fields["where"],
            local_dir=Path(fields["local_dir"]),
        )


def state_of(location: PgLocation | None, state_dir: Any) -> str | dict[str, str]:
    """How a worker order names the state an engine opened."""
    if location is None:
        return str(os.fspath(state_dir))
    return {
        "url": location.url,
        "schema": location.schema,
        "where": location.where,
        "local_dir": os.fspath(location.local_dir),
    }


class Worker:
    """One started worker process: its order, its exit, the last lines it printed."""

    def __init__(self, order: WorkerOrder) -> None:
        self.order = order
        self.tail: deque[str] = deque(maxlen=STDERR_KEPT)
        env = dict(os.environ)
        env.pop(WORKERS_ENV, None)  # a worker drives its share itself, never spreads it again
        # The worker imports this very wf_magic, wherever this process found it.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_package_root(), env.get("PYTHONPATH")) if p
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self._reader = threading.Thread(
            target=self._read, name=f"wf-worker-{order.share}-stderr", daemon=True
        )
        self._reader.start()
        try:
            self.proc.stdin.write(order.to_json().encode())
            self.proc.stdin.close()
        except OSError:  # it died at once: its stderr says why
            pass

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.tail.append(line)

    def stop(self) -> None:
        """Ask it to stop after its units in flight (as Ctrl-C asks a driver)."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signals.SIGINT)
            except OSError:
                pass

    def wait(self) -> str | None:
        """Wait for it to end; a line naming what went wrong, or None when it ended well."""
        code = self.proc.wait()
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        if code == 0:  # its share driven, or stopped: the journal says how each cell ended
            return None
        last = self.tail[-1] if self.tail else "no output"
        return (
            f"worker {self.order.share}/{self.order.shares} exited with code {code}: {last}; "
            f"its cells stay owed: `wf sweep-resume {self.order.sweep_id}` drives them"
        )


def _package_root() -> str:
    """The folder this process imported ``wf_magic`` from (``<it>/wf_magic/sweeps/``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_workers(template: WorkerOrder, caps: list[int]) -> list[Worker]:
    """Start a worker for every share but the first (this process drives that one)."""
    started: list[Worker] = []
    try:
        for share in range(1, len(caps)):
            started.append(Worker(replace(template, share=share, max_concurrency=caps[share])))
    except OSError as exc:
        for worker in started:
            worker.stop()
        raise UsageError(
            f"could not start a sweep worker process ({exc}); retry without workers"
        ) from None
    return started


@dataclass
class Watch:
    """While the shares are driven: forwards a stop to every worker and reports the sweep's
    settled cells (all shares') to a progress callback."""

    workers: list[Worker]
    stop_signal: threading.Event | None
    report: Any = None
    """``() -> None``: reads the store and calls the caller's progress (or None)."""
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="wf-workers-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        stopped = False
        while not self.done.wait(PROGRESS_EVERY_S):
            if not stopped and self.stop_signal is not None and self.stop_signal.is_set():
                stopped = True
                for worker in self.workers:
                    worker.stop()
            if self.report is not None:
                self.report()

    def close(self) -> None:
        self.done.set()
        self._thread.join(5)


def secret_params(sweep: SweepRow, secrets: Mapping[str, Any]) -> dict[str, Any]:
    """Name → value of the sweep's secret params, from its stored seals and the drive's
    seal → value table (what a worker hands back to its resume)."""
    from ..sealing import seals_of, unseal

    stored = json.loads(sweep.definition_json).get("params") or {}
    sealed = {name: value for name, value in stored.items() if seals_of(value, name=name)}
    return unseal(sealed, secrets, run_id=sweep.sweep_id) if sealed else {}


def drive_spread(
    ctx: SweepDrive, sweep: SweepRow, wf: Workflow, *, workers: int, order: WorkerOrder
) -> SweepRow:
    """Drive ``sweep``'s owed cells over ``workers`` processes (this one included); returns
    its row with the status every share's cells add up to.

    A worker that ends badly leaves its cells owed and a line in ``ctx.skipped``; a stop
    (``ctx.signal``) or an error here stops every worker after its units in flight.
    """
    from .driver import SETTLED, drive_cells, owed_cells, settle_sweep

    _, owed = owed_cells(ctx.store, sweep.sweep_id)
    caps = concurrency_shares(ctx.max_concurrency, min(workers, max(1, len(owed))))
    if len(caps) < workers and ctx.max_concurrency < min(workers, len(owed)):
        ctx.skipped.append(
            f"workers: {len(caps)} of the {workers} asked for drive this sweep: "
            f"max_concurrency {ctx.max_concurrency} is split between them and none runs "
            f"with 0; raise it (`--max-concurrency {workers * 8}`) to use {workers}"
        )
    if len(caps) == 1:
        from .driver import drive_sweep

        return drive_sweep(ctx, sweep, wf)
    template = replace(order, sweep_id=sweep.sweep_id, shares=len(caps), parent_pid=os.getpid())
    started = start_workers(template, caps)
    progress = ctx.progress

    def report() -> None:
        assert progress is not None
        counts = dict(ctx.store.sweep_cell_counts(sweep.sweep_id))
        settled = sum(n for status, n in counts.items() if status in (*SETTLED, "failed"))
        progress(settled, sweep.cells)

    watch = Watch(started, ctx.signal, report if progress is not None else None)
    own = replace(ctx, share=(0, len(caps)), max_concurrency=caps[0], progress=None)
    try:
        shared = drive_cells(own, sweep, wf)
    except BaseException:
        for worker in started:
            worker.stop()
        raise
    finally:
        problems = [line for line in (w.wait() for w in started) if line is not None]
        watch.close()
        ctx.skipped.extend(own.skipped)
        ctx.skipped.extend(problems)
    if progress is not None:
        report()
    interrupted = ctx.signal is not None and ctx.signal.is_set()
    return settle_sweep(ctx.store, sweep, shared, interrupted=interrupted)
