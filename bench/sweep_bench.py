"""Sweep benchmarks: throughput of one-unit cells against a loopback OpenAI-compatible server
that answers after a fixed latency (beside a plain thread-pool loop with the ``openai``
client, the floor), and the whole cost of a no-op cell beside a unit of one big map.

    .venv/bin/python bench/sweep_bench.py --cells 2000 --latency 0.1 --concurrency 32 --noop 10000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from wf_magic import Engine


def _server(latency_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out as two writes on a kept-alive connection: with Nagle on,
        # the body waits for the client's delayed ACK of the headers (~40 ms per call).
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(latency_s)
            body = json.dumps(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "ok"},
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # 32 clients connecting at once overflow the default 5

    httpd = Server(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


@contextmanager
def _server_process(latency_s: float) -> Iterator[str]:
    """The loopback server in a process of its own, as a provider's API is: its request
    handling must not share the measured interpreter's lock with the legs it serves. Yields
    its base URL."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(latency_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        child.terminate()
        child.wait(timeout=10)


def _serve(latency_s: float) -> None:
    httpd = _server(latency_s)
    print(httpd.server_address[1], flush=True)
    threading.Event().wait()


def throughput(cells: int, latency_s: float, concurrency: int) -> dict[str, float]:
    with _server_process(latency_s) as url:
        return _throughput(url, cells, latency_s, concurrency)


def _throughput(url: str, cells: int, latency_s: float, concurrency: int) -> dict[str, float]:
    source = f"""
name: sweep-bench
params:
  i: {{type: integer}}
runner: openai
runners:
  openai: {{base_url: "{url}", model: m, api_key_env: SWEEP_BENCH_KEY}}
steps:
  - id: ask
    prompt: "cell {{{{ params.i }}}}"
"""
    import os

    os.environ["SWEEP_BENCH_KEY"] = "x"
    state = Path(tempfile.mkdtemp())
    try:
        with Engine(state) as engine:
            started = time.perf_counter()
            sweep = engine.sweep(
                source, grid={"i": list(range(cells))}, max_concurrency=concurrency
            )
            sweep_s = time.perf_counter() - started
            assert sweep.status == "completed", sweep.status_reason
        import openai

        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)

        def call(i: int) -> str | None:
            reply = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"cell {i}"}]
            )
            return reply.choices[0].message.content

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(call, range(cells)))
        floor_s = time.perf_counter() - started
    finally:
        shutil.rmtree(state, ignore_errors=True)
    ideal = cells * latency_s / concurrency
    return {
        "cells": cells,
        "ideal_s": ideal,
        "sweep_s": sweep_s,
        "floor_s": floor_s,
        "sweep_vs_ideal": sweep_s / ideal,
        "floor_vs_ideal": floor_s / ideal,
    }


NOOP = """
name: noop-NAME
params:
  i: {type: integer, default: 0}
runner: scripted
steps:
  - id: one
    MAP
    prompt: "x {{ params.i }}ITEM"
"""


def _noop_sources(n: int) -> dict[str, str]:
    """The no-op map of ``n`` units and the no-op workflow a sweep runs once per cell."""
    return {
        "map": NOOP.replace("NAME", "map")
        .replace("ITEM", " {{ item }}")
        .replace("MAP", f'map: "{{{{ range({n}) | list }}}}"'),
        "sweep": NOOP.replace("NAME", "sweep").replace("    MAP\n", "").replace("ITEM", ""),
    }


def _warm_up() -> None:
    """Pay the process's one-time costs (imports, the template lexer) outside both clocks:
    a first workflow with a typed param imports jsonschema, whichever leg ran first."""
    state = Path(tempfile.mkdtemp())
    try:
        with Engine(state) as engine:
            sources = _noop_sources(2)
            assert engine.run(sources["map"]).status == "completed"
            assert engine.sweep(sources["sweep"], grid={"i": [0, 1]}).status == "completed"
    finally:
        shutil.rmtree(state, ignore_errors=True)


def cell_cost(n: int) -> dict[str, float]:
    out: dict[str, float] = {"cells": n}
    _warm_up()
    sources = _noop_sources(n)
    for label in ("map", "sweep"):
        state = Path(tempfile.mkdtemp())
        try:
            with Engine(state) as engine:
                started = time.perf_counter()
                if label == "map":
                    assert engine.run(sources["map"]).status == "completed"
                else:
                    grid = {"i": list(range(n))}
                    assert engine.sweep(sources["sweep"], grid=grid).status == "completed"
                elapsed = time.perf_counter() - started
            size = sum(p.stat().st_size for p in state.glob("state.db*"))
        finally:
            shutil.rmtree(state, ignore_errors=True)
        out[f"{label}_us_each"] = elapsed / n * 1e6
        out[f"{label}_db_bytes_each"] = size / n
    out["cell_vs_unit"] = out["sweep_us_each"] / out["map_us_each"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--noop", type=int, default=10000)
    parser.add_argument("--serve", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        return _serve(args.serve)
    print(json.dumps(throughput(args.cells, args.latency, args.concurrency)))
    print(json.dumps(cell_cost(args.noop)))


if __name__ == "__main__":
    main()
