"""The last door before disk: every text the Store writes passes the redactor of its run.

The drive redacts what it journals (outputs, failures, inputs), but text reaches the
journal by other ways too: a template error quoting a param, a gate's rendered criteria
turned into rejection feedback, a person's ``--feedback``, a status reason built from a
step note. So the Store's named writes pass each text column of a run — step notes and
outputs, run reasons and results, attempt outputs, failures and inputs — through a
redactor before the transaction; events are built from those same scrubbed values. A drive
registers its run's redactor (which knows the run's secret params) for as long as it
drives (:meth:`Scrubber.driving`); any other write (a decision, an abandon) gets the base
redactor: the environment's secrets, credential shapes, and the secret params handed to
this process (:meth:`Scrubber.know`).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ..hashing import canonical_json
from ..redact import Redactor
from .journal import Finish, UnitKey


class Scrubber:
    """The redactors of a Store's writes: the one of each run being driven, else the base.

    Args:
        base: the redactor of writes outside a drive.
    """

    __slots__ = ("_base", "_runs", "_lock")

    def __init__(self, base: Redactor) -> None:
        self._base = base
        self._runs: dict[str, Redactor] = {}
        self._lock = threading.Lock()

    def know(self, secrets: Iterable[str]) -> None:
        """Mask ``secrets`` in every later write (secret params handed to this process)."""
        values = [s for s in secrets if isinstance(s, str)]
        if values:
            with self._lock:
                self._base = self._base.with_secrets(values)

    @contextmanager
    def driving(self, run_id: str, redactor: Redactor) -> Iterator[None]:
        """Scrub the writes of ``run_id`` with ``redactor`` while the block runs (a drive)."""
        with self._lock:
            previous = self._runs.get(run_id)
            self._runs[run_id] = redactor
        try:
            yield
        finally:
            with self._lock:
                if previous is None:
                    self._runs.pop(run_id, None)
                else:
                    self._runs[run_id] = previous

    def redactor(self, run_id: str | None) -> Redactor:
        """The redactor of a write to ``run_id``."""
        found = self._runs.get(run_id) if run_id is not None else None
        return found if found is not None else self._base

    def text(self, run_id: str | None, text: str | None) -> str | None:
        """``text`` redacted for ``run_id`` (None stays None)."""
        return text if not text else self.redactor(run_id).redact(text)

    def json_text(self, run_id: str | None, text: str | None) -> str | None:
        """A JSON column redacted for ``run_id``, still valid JSON.

        The text is redacted as text (a secret's JSON-escaped form is one of the forms the
        redactor masks). Should masking cut through the JSON's own syntax (a secret holding
        a quote), the value is redacted instead and written as JSON again.
        """
        if not text:
            return text
        redactor = self.redactor(run_id)
        masked = redactor.redact(text)
        if masked is text:
            return text
        try:
            json.loads(masked)
        except ValueError:
            return canonical_json(redactor.redact_value(json.loads(text)))
        return masked

    def finish(self, run_id: str, finish: Finish) -> Finish:
        """``finish`` with its output and failure redacted (the very object when clean)."""
        output = self.json_text(run_id, finish.output_json)
        failure = self.text(run_id, finish.failure)
        if output is finish.output_json and failure is finish.failure:
            return finish
        return dataclasses.replace(finish, output_json=output, failure=failure)

    def key(self, key: UnitKey) -> UnitKey:
        """``key`` with its resolved input redacted (the very object when clean)."""
        kept = self.json_text(key.run_id, key.input_json)
        return key if kept is key.input_json else dataclasses.replace(key, input_json=kept)
