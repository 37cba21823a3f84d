"""One worker process of a sweep spread over several (``python -m wf_magic.sweep_worker``):
reads its order as JSON on stdin and drives its share of the owed cells.

Started only by :func:`wf_magic.sweeps.workers.drive_spread`. SIGINT or SIGTERM stops it
after its units in flight (each journaled); so does finding the process that started it
gone. Exit 0: the share was driven (its cells' outcomes are in the journal); 2: the order
could not be carried out (the line on stderr says why).
"""

from __future__ import annotations

import os
import signal as signals
import sys
import threading

from .errors import WorkflowError
from .exits import EXIT_OK, EXIT_USAGE
from .sweeps.workers import PROGRESS_EVERY_S, WorkerOrder


def _watch_parent(parent_pid: int, stop: threading.Event, done: threading.Event) -> None:
    """Set ``stop`` once the process that started this one is gone (re-parented)."""
    while not done.wait(PROGRESS_EVERY_S):
        if os.getppid() != parent_pid:
            stop.set()
            return


def main() -> int:
    from .engine import Engine

    try:
        order = WorkerOrder.from_json(sys.stdin.read())
    except WorkflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    sys.path[:0] = [d for d in order.import_dirs if d not in sys.path]
    stop, done = threading.Event(), threading.Event()
    for sig in (signals.SIGINT, signals.SIGTERM):
        signals.signal(sig, lambda *_: stop.set())
    if order.parent_pid:
        threading.Thread(
            target=_watch_parent, args=(order.parent_pid, stop, done), daemon=True
        ).start()
    try:
        with Engine(
            order.open_state(),
            library=order.library,
            durability=order.durability,
            max_concurrency=order.max_concurrency,
        ) as engine:
            engine.sweep_resume(
                order.sweep_id,
                max_concurrency=order.max_concurrency,
                signal=stop,
                params=order.params,
                share=(order.share, order.shares),
            )
    except WorkflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        done.set()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
