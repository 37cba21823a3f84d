"""The ``replay`` runner: answers a unit from a recorded succeeded attempt with the same input hash.

Record once against a real runner, replay for ever: deterministic tests and offline
teaching. Two sources, looked up in this order:

- a cassette (plan option ``runners: {replay: {cassette: path}}``): a JSONL file with one
  recorded attempt per line, written by :func:`export_cassette` (``wf export-cassette RUN``);
- the journal of the state dir (``<state dir>/state.db``, only ever read, and only when the
  file exists), unless the option ``journal: false`` turns it off.

The key is the unit's phase (``work``, or ``gate`` for judge calls) and its ``input_hash``;
the newest recording wins. A replayed answer charges zero tokens: the recording's tokens
were paid when it was made and are not reported again.

An input that holds a secret is hashed under the recording state's key
(``sealing.InputHasher``), so such a recording is found only in a state with the same key:
the one that recorded it, or any sharing ``$WF_MAGIC_SECRET_KEY_FILE`` (DESIGN.md §6). The
cassette carries no secret and nothing a secret can be guessed from.

A cassette line is canonical JSON with the fields ``input_hash`` (the lookup key),
``phase`` (``work``/``gate``, default ``work``), ``output`` (the answer, as JSON), and for
the reader's benefit ``step``, ``unit``, ``runner``, ``model``, ``tokens_in``, ``tokens_out``
(what the recording cost when it was made). A recording made by a runner with
answer-changing settings (``runners/identity.py``) also carries ``content_hash``, its input
hash without them: the ``replay`` runner hashes no settings of its own, so a replayed unit
finds such a recording by that key.

A cassette also holds one line per model call of each agent attempt (``kind: agent_call``,
``runners/cassette_calls.py``): agent steps replay them through their bridge; this runner
skips them.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import MigrationError, RunnerError, UsageError
from ..hashing import canonical_json
from ..sealing import KEY_FILE_ENV
from ..store import Store
from ..store.db import DB_FILENAME
from ..store.location import parse_state
from ..store.recordings import RecordingRow
from .base import RunnerContext, UnitRequest, UnitResult
from .cassette_calls import MAX_CASSETTE_BYTES as MAX_CASSETTE_BYTES  # its old home
from .cassette_calls import call_line, read_cassette
from .pricing import PRICE_OPTIONS

_OPTION_NAMES = frozenset({"cassette", "journal"}) | PRICE_OPTIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class Recording:
    """One recorded succeeded attempt: a line of a cassette, or a journal row."""

    input_hash: str
    step: str
    unit: str
    phase: str
    """``work`` or ``gate``."""
    runner: str
    model: str | None
    output: Any
    tokens_in: int = 0
    tokens_out: int = 0
    content_hash: str | None = None
    """The input hash without the recording runner's settings: the key a replayed unit
    (whose ``replay`` runner hashes no settings) is found by when ``input_hash`` differs."""

    def to_json_line(self) -> str:
        """The cassette line for this recording (canonical JSON, no newline)."""
        line = asdict(self)
        if line["content_hash"] is None:
            del line["content_hash"]
        return canonical_json(line)

    @classmethod
    def from_row(cls, row: RecordingRow) -> Recording:
        """The recording of a journal row (its output decoded)."""
        return cls(
            input_hash=row.input_hash,
            step=row.step_id,
            unit=row.unit_id,
            phase=row.phase,
            runner=row.runner,
            model=row.model,
            output=_decode(row.output_json),
            tokens_in=row.tokens_in,
            tokens_out=row.tokens_out,
            content_hash=row.content_hash,
        )

    @classmethod
    def from_json_line(cls, line: str, *, where: str) -> Recording:
        """Decode one cassette line.

        Raises:
            RunnerError: permanent, naming ``where`` (file and line) and what is wrong.
        """
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise RunnerError(f"{where} is not JSON: {exc}.") from exc
        if not isinstance(data, dict) or not isinstance(data.get("input_hash"), str):
            raise RunnerError(f"{where}: expected a JSON object with an input_hash string.")
        if "output" not in data:
            raise RunnerError(f"{where}: the recording has no output.")
        try:
            tokens = int(data.get("tokens_in") or 0), int(data.get("tokens_out") or 0)
        except (TypeError, ValueError) as exc:
            raise RunnerError(f"{where}: tokens_in/tokens_out must be integers.") from exc
        model = data.get("model")
        content_hash = data.get("content_hash")
        if content_hash is not None and not isinstance(content_hash, str):
            raise RunnerError(f"{where}: content_hash must be a string.")
        return cls(
            input_hash=data["input_hash"],
            step=str(data.get("step", "")),
            unit=str(data.get("unit", "")),
            phase=str(data.get("phase", "work")),
            runner=str(data.get("runner", "")),
            model=None if model is None else str(model),
            output=data["output"],
            tokens_in=tokens[0],
            tokens_out=tokens[1],
            content_hash=content_hash,
        )


class ReplayRunner:
    """Answers units from recordings; a unit nobody recorded is a permanent error."""

    ANSWER_OPTIONS: frozenset[str] = frozenset(())
    """Where recordings are read from never changes what a recording says."""

    def __init__(
        self,
        *,
        cassette: Path | None = None,
        db_path: Path | None = None,
        workflow: str = "",
        name: str = "replay",
    ) -> None:
        """Create a runner; nothing is read until the first unit.

        Args:
            cassette: A JSONL cassette to answer from first.
            db_path: A state database whose journal is searched next (may not exist yet).
            workflow: The workflow whose recordings are searched first (any other's next).
            name: The runner name the plan uses, for messages.
        """
        self.cassette = cassette
        self.db_path = db_path
        self.workflow = workflow
        self.name = name
        self._lock = threading.Lock()
        self._tape: dict[tuple[str, str], Recording] | None = None
        self._store: Store | None = None
        self.journal_url: str | None = None
        """The journal's ``postgresql://`` URL when it is not a ``state.db`` file."""

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for executors such as Dask: the worker reopens the cassette/journal itself.
        state = dict(self.__dict__)
        state.update(_lock=None, _store=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @classmethod
    def from_context(cls, ctx: RunnerContext) -> ReplayRunner:
        """The registry factory: ``cassette`` and ``journal`` from the plan's options.

        Raises:
            RunnerError: permanent, when an option is invalid.
        """
        unknown = sorted(map(str, set(ctx.options) - _OPTION_NAMES))
        if unknown:
            raise RunnerError(
                f"runners.{ctx.name}: unknown option(s) {', '.join(unknown)}; expected some of "
                f"{', '.join(sorted(_OPTION_NAMES))}."
            )
        cassette = ctx.options.get("cassette")
        if cassette is not None and not isinstance(cassette, str):
            raise RunnerError(f"runners.{ctx.name}.cassette: expected a path (got {cassette!r}).")
        use_journal = ctx.options.get("journal", True)
        runner = cls(
            cassette=Path(cassette).expanduser() if cassette else None,
            db_path=Path(ctx.state_dir) / DB_FILENAME if use_journal else None,
            workflow=ctx.workflow,
            name=ctx.name,
        )
        if use_journal and ctx.journal:  # the journal is on PostgreSQL
            runner.journal_url, runner.db_path = ctx.journal, None
        return runner

    def run(self, request: UnitRequest) -> UnitResult:
        """Answer ``request`` with the newest recording of its phase and input hash.

        Raises:
            RunnerError: permanent, when nothing was recorded for it or a source is unreadable.
        """
        input_hash = request.input_hash or ""
        if not input_hash:
            raise RunnerError(
                f"{self.name} runner: unit {request.unit_id} came without an input_hash."
            )
        phase = "gate" if request.kind == "judge" else "work"
        recording = self._from_cassette(phase, input_hash) or self._from_journal(phase, input_hash)
        if recording is None:
            raise RunnerError(self._miss_message(request.unit_id, input_hash))
        return UnitResult(
            output=recording.output,
            tokens_in=0,
            tokens_out=0,
            model=request.model or recording.model,
            cost=0.0,
            price_source="replay",
        )

    async def arun(self, request: UnitRequest) -> UnitResult:
        """:meth:`run` on the model loop: a cassette's answer is in memory once read; the
        journal's lookups and the cassette's first read go to a worker thread (a store read
        may wait on a lock or a network)."""
        return await asyncio.to_thread(self.run, request)

    def close(self) -> None:
        """Close the journal's store, if one was opened."""
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()

    def _miss_message(self, unit_id: str, input_hash: str) -> str:
        searched = [f"cassette {self.cassette}"] if self.cassette else []
        if self.db_path is not None:
            searched.append(f"journal {self.db_path}")
        keyed = (
            "; a unit whose input holds a secret replays only under the key it was recorded "
            f"with (the same state, or {KEY_FILE_ENV})"
            if self.cassette
            else ""
        )
        return (
            f"{self.name} runner: no recorded answer for unit {unit_id} (input_hash "
            f"{input_hash[:12]}…); record it by running against a real runner first "
            f"(searched: {', '.join(searched) or 'nothing'}){keyed}."
        )

    def _from_cassette(self, phase: str, input_hash: str) -> Recording | None:
        if self.cassette is None:
            return None
        with self._lock:
            if self._tape is None:
                self._tape = load_cassette(self.cassette)
            return self._tape.get((phase, input_hash))

    def _from_journal(self, phase: str, input_hash: str) -> Recording | None:
        store = self._journal()
        if store is None:
            return None
        row = store.latest_recording(phase=phase, input_hash=input_hash, workflow=self.workflow)
        return None if row is None else Recording.from_row(row)

    def _journal(self) -> Store | None:
        """The journal's store, opened on first use; None when there is no journal to read."""
        with self._lock:
            if self._store is None and self.journal_url is not None:
                self._store = Store(parse_state(self.journal_url))
            # Checked first: opening a Store would create (and migrate) a missing database.
            if self._store is None and self.db_path is not None and self.db_path.exists():
                store = Store(self.db_path)
                try:
                    store.open()
                except (UsageError, MigrationError) as exc:
                    raise RunnerError(
                        f"{self.name} runner cannot read {self.db_path}: {exc}"
                    ) from exc
                self._store = store
            return self._store


def load_cassette(path: Path) -> dict[tuple[str, str], Recording]:
    """A cassette's recordings keyed by (phase, input_hash); later lines win.

    At most ``MAX_CASSETTE_BYTES + 1`` bytes are read; a FIFO, a device or a directory is
    refused before it is opened.

    Raises:
        RunnerError: permanent, when the file is missing, unreadable, not a regular file,
            larger than ``MAX_CASSETTE_BYTES``, not UTF-8, or a line is not a recording.
    """
    text = read_cassette(path)
    tape: dict[tuple[str, str], Recording] = {}
    by_content: dict[tuple[str, str], Recording] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not _is_agent_call(line):
            rec = Recording.from_json_line(line, where=f"replay cassette {path} line {number}")
            tape[(rec.phase, rec.input_hash)] = rec
            if rec.content_hash:
                by_content[(rec.phase, rec.content_hash)] = rec
    # An exact input hash wins over a recording found by its content hash.
    return {**by_content, **tape}


def export_cassette(store: Store, run_id: str) -> Iterator[str]:
    """Cassette lines (canonical JSON, no newline) for a run's succeeded and reused attempts,
    then one line per recorded model call of its agent attempts (``cassette_calls.py``).

    Child runs are included, so a replay covers ``workflow:`` steps too. When several
    attempts share a phase and input hash only the newest is kept (replay would pick it).
    ``print`` each line (``wf export-cassette RUN > tape.jsonl``) to write a cassette.

    Args:
        store: The state database holding the run.
        run_id: The run to export.

    Raises:
        UsageError: no run ``run_id`` exists in this database.
    """
    if store.get_run(run_id) is None:
        raise UsageError(f"No run {run_id} in this state dir; `wf list` shows the runs.")
    newest: dict[tuple[str, str], Recording] = {}
    for row in store.run_recordings(run_id):
        newest.pop((row.phase, row.input_hash), None)  # re-insert: keep journal order
        newest[(row.phase, row.input_hash)] = Recording.from_row(row)
    for rec in newest.values():
        yield rec.to_json_line()
    for call in store.recorded_calls(run_id):
        yield call_line(call)


def _is_agent_call(line: str) -> bool:
    """Whether a cassette line is an agent call's (``kind: agent_call``), which agent steps
    replay and this runner skips."""
    if '"agent_call"' not in line:
        return False
    try:
        data = json.loads(line)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("kind") == "agent_call"


def _decode(output_json: str | None) -> Any:
    if output_json is None:
        return None
    try:
        return json.loads(output_json)
    except ValueError:
        return output_json  # not written by this version's journal; replay it verbatim
