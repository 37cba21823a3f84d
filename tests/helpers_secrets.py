"""Shared machinery of the secret canary tests: where a canary could land, and a search of all of it.

Not a test module. A canary is looked for as bytes in every file under a state dir (the
database, its WAL and shm files, locks, sidecars) and as text in everything a user can be
shown of a run: every frame, the handles' renderings, and the ``wf`` verbs that print a run
(``status``, ``show`` of every unit, ``journal``, ``events``, ``tokens``,
``export-cassette``), run in-process so their stdout and stderr are captured.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Sequence
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from wf_magic import Engine
from wf_magic.cli import main as wf_main

CANARY_RUNS = settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""A few whole runs per generated secret: each example starts engines in a fresh dir."""
SECRETS = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=40)
"""Any printable text, the empty string included (the canary markers make it long enough)."""


def forms(canary: str) -> list[bytes]:
    """The canary as it could land in a file: UTF-8, and JSON-escaped (ASCII) UTF-8."""
    escaped = json.dumps(canary)[1:-1]
    return sorted({canary.encode("utf-8"), escaped.encode("utf-8")})


def files_holding(state_dir: Path, canary: str) -> list[str]:
    """Every file under ``state_dir`` (recursively) whose bytes contain the canary."""
    wanted = forms(canary)
    return [
        str(p.relative_to(state_dir))
        for p in sorted(state_dir.rglob("*"))
        if p.is_file() and any(f in p.read_bytes() for f in wanted)
    ]


def everything_shown(engine: Engine, run_id: str) -> str:
    """Every frame and handle rendering of a run, as text."""
    run = engine.handle(run_id)
    frames = [
        engine.runs(),
        engine.runs(include_deleted=True),
        engine.journal(run_id),
        engine.journal(),
        run.journal(inputs=True),
        engine.tokens(run_id),
        engine.events(run_id),
        engine.budget(run_id),
    ]
    parts = [f.to_json(orient="records", date_format="iso") + f.to_csv() for f in frames]
    parts += [repr(run), run._repr_html_(), json.dumps(run.params, ensure_ascii=False)]
    parts += [repr(engine.attempts(run_id)), repr(engine.steps(run_id))]
    parts += [repr(engine.list_runs(include_children=True))]
    return "\n".join(parts)


def wf(state_dir: Path, *args: str) -> tuple[int, str]:
    """``wf ARGS`` in-process: its exit code and everything it printed (stdout + stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = wf_main(["--db", str(state_dir), *args])
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
    return code, out.getvalue() + err.getvalue()


def cli_shown(state_dir: Path, run_id: str) -> str:
    """What the ``wf`` verbs that print a run show of it (every unit's ``show`` included)."""
    parts: list[str] = []
    for verb in (
        ("status", run_id),
        ("list", "--all"),
        ("journal", run_id, "--format", "json"),
        ("events", run_id, "--format", "csv"),
        ("tokens", run_id),
        ("export-cassette", run_id),
    ):
        parts.append(wf(state_dir, *verb)[1])
    with Engine(state_dir) as engine:
        units = sorted({(a.unit_id, a.attempt) for a in engine.attempts(run_id)})
    for unit_id, attempt in units:
        for fmt in ("text", "json"):
            shown = wf(
                state_dir, "show", run_id, unit_id, "--attempt", str(attempt), "--format", fmt
            )
            parts.append(shown[1])
    return "\n".join(parts)


def leaks(canary: str, state_dir: Path, texts: Sequence[str]) -> list[str]:
    """Where the canary shows: files under the state dir, and which of ``texts`` (by index)."""
    shown = [f.decode("utf-8") for f in forms(canary)]
    found = [f"file {name}" for name in files_holding(state_dir, canary)]
    found += [f"text {i}" for i, text in enumerate(texts) if any(s in text for s in shown)]
    return found
