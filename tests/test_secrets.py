"""Secrets stay out of the journal, also when a parent hands one to its child workflow."""

from __future__ import annotations

from pathlib import Path

import pytest

from wf_magic import Engine

from .conftest import db_rows

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

CANARY = "canary-0f3b9d2e7c41"

PARENT = """
name: parent
params:
  api_token: {type: string}
steps:
  - id: sub
    workflow: kid
    with: {text: "{{ params.api_token }}"}
---
name: kid
params:
  text: {type: string}
steps:
  - id: echo
    prompt: "say {{ params.text }} back"
"""


def _journaled_text(state: Path) -> str:
    """Everything the journal keeps of what ran: attempt outputs and failures, step outputs
    and notes, run results and reasons, event payloads."""
    parts = [
        *(str(r[0] or "") for r in db_rows(state, "SELECT output_json FROM attempts")),
        *(str(r[0] or "") for r in db_rows(state, "SELECT failure FROM attempts")),
        *(f"{r[0]}{r[1]}" for r in db_rows(state, "SELECT output_json, note FROM steps")),
        *(f"{r[0]}{r[1]}" for r in db_rows(state, "SELECT result_json, status_reason FROM runs")),
        *(str(r[0] or "") for r in db_rows(state, "SELECT data_json FROM events")),
    ]
    return "\n".join(parts)


def test_a_secret_handed_to_a_child_is_masked_in_everything_the_child_journals(
    state_dir: Path,
) -> None:
    engine = Engine(state_dir)
    try:
        run = engine.run(PARENT, params={"api_token": CANARY})
        assert run.status == "completed"
        child = next(r for r in engine.list_runs(include_children=True) if r.parent_run_id)
        echoed = engine.attempts(child.run_id)[0].output_json or ""
        assert "say *** back" in echoed  # the child's reply quoted the secret: masked
        assert CANARY not in _journaled_text(state_dir)
        assert CANARY not in repr(run) and CANARY not in repr(engine.status(child.run_id))
    finally:
        engine.close()


def test_the_same_value_under_a_plain_name_is_journaled_as_is(state_dir: Path) -> None:
    plain = PARENT.replace("api_token", "topic")
    engine = Engine(state_dir)
    try:
        engine.run(plain, params={"topic": CANARY})
        assert CANARY in _journaled_text(state_dir)  # nothing marks it secret
    finally:
        engine.close()
