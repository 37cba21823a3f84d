"""A schema rejection tells the model what is required, so the next loop can fix its answer."""

from __future__ import annotations

import json
from pathlib import Path

from wf_magic import Engine
from wf_magic.gates.judge import schema_requirement

WORKFLOW = """
name: typed
runners:
  scripted:
    rules:
      - {match: "Gate feedback", reply: {n: 3, note: fixed}}
      - {match: "^Count", reply: "not json at all"}
steps:
  - id: s
    prompt: Count.
    output:
      type: object
      properties: {n: {type: integer}, note: {type: string}}
      required: [n]
    gate: {max_loops: 2}
"""


def test_the_feedback_of_a_schema_mismatch_states_the_required_shape(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "state")
    try:
        run = engine.run(WORKFLOW)
        assert run.status == "completed" and run.result == {"n": 3, "note": "fixed"}
        verdict = next(a for a in engine.attempts(run.run_id) if a.unit_id == "s.gate:l1")
        feedback = json.loads(verdict.output_json or "{}")["feedback"]
        assert feedback == (
            "The output does not match the required schema: s: (root): 'not json at all' is not "
            "of type 'object'. Required: an object with n (integer, required), note (string)."
        )
    finally:
        engine.close()


def test_requirements_read_as_words_for_nested_arrays_enums_and_unions() -> None:
    schema = {
        "type": "object",
        "properties": {
            "sections": {"type": "array", "items": {"type": "string"}},
            "tone": {"enum": ["dry", "warm"]},
            "score": {"type": ["integer", "null"]},
        },
        "required": ["sections"],
    }
    assert schema_requirement(schema) == (
        "an object with sections (an array of string, required), "
        'tone (one of ["dry", "warm"]), score (integer or null)'
    )
    assert schema_requirement({"type": "array"}) == "an array"
    assert schema_requirement({"type": "object", "required": ["a", "b"]}) == (
        "an object with keys a, b"
    )
    assert len(schema_requirement({"enum": list(range(1000))}, clip=50)) == 50
