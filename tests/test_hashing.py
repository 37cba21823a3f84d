"""Canonical JSON and input hashes: order-independent, stable, sensitive to every input part."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from wf_magic.drive.units import Feedback, build_units
from wf_magic.hashing import canonical_json, hash_value
from wf_magic.spec.freeze import load_workflow

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_canonical_json_ignores_key_order_and_round_trips(value: dict[str, Any]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert canonical_json(value) == canonical_json(reordered)
    assert json.loads(canonical_json(value)) == value
    assert " " not in canonical_json({"a": [1, 2]})


@given(st.text(min_size=1, max_size=30), st.text(max_size=30))
def test_input_hash_changes_with_prompt_item_and_feedback(word: str, feedback: str) -> None:
    wf = load_workflow(
        "name: h\nsteps:\n  - id: a\n    map: '{{ params.items }}'\n"
        "    prompt: 'say {{ item }}'\nparams:\n  items: {type: array}\n"
    )
    params = {"items": [word, word + "!"]}
    first = build_units(wf.plan, wf.plan.steps[0], params=params, outputs={}, loop=1, feedback=None)
    again = build_units(wf.plan, wf.plan.steps[0], params=params, outputs={}, loop=1, feedback=None)
    assert [u.input_hash for u in first] == [u.input_hash for u in again]
    assert first[0].input_hash != first[1].input_hash
    looped = build_units(
        wf.plan,
        wf.plan.steps[0],
        params=params,
        outputs={},
        loop=2,
        feedback=Feedback(loop=1, feedback=feedback),
    )
    assert looped[0].input_hash != first[0].input_hash
    assert "Gate feedback (loop 1 was rejected):" in (looped[0].prompt or "")


def test_hash_value_is_sha256_of_canonical_json() -> None:
    import hashlib

    assert (
        hash_value({"b": 1, "a": [True, None]})
        == hashlib.sha256(b'{"a":[true,null],"b":1}').hexdigest()
    )
