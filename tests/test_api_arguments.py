"""The Python API refuses a hostile argument as the CLI does: a ``UsageError`` naming it, never
a ``TypeError``, ``ValueError`` or ``AttributeError`` from deep inside, and never accepted
(a ``max_concurrency`` of ``nan``, a ``gc`` retention of ``nan`` deleting nothing quietly)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wf_magic import Engine
from wf_magic.errors import UsageError

FLOW = """
name: api
params:
  n: {type: number, default: 1}
runner: scripted
steps:
  - id: a
    prompt: "x {{ params.n }}"
"""

HOSTILE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, 0.5, 2.5, True, "3", b"3", [1], {}]),
    st.integers(min_value=2**63),
    st.floats(allow_nan=True).filter(lambda x: not float(x).is_integer() or not math.isfinite(x)),
)
"""Values no count, ceiling or retention takes."""

CALLS: dict[str, Callable[[Engine, str, Any], object]] = {
    "drive max_concurrency": lambda e, r, v: e.drive(r, max_concurrency=v),
    "drive max_steps": lambda e, r, v: e.drive(r, max_steps=v),
    "drive max_retries": lambda e, r, v: e.drive(r, max_retries=v),
    "gc older_than_s": lambda e, r, v: e.gc(older_than_s=v),
    "sweep max_concurrency": lambda e, r, v: e.sweep(FLOW, grid={"n": [1]}, max_concurrency=v),
    "sweep budget max_units": lambda e, r, v: e.sweep(FLOW, grid={"n": [1]}, budget={"max_units": v}),
    "sweep budget max_cost": lambda e, r, v: e.sweep(FLOW, grid={"n": [1]}, budget={"max_cost": v}),
    "sweep repeat": lambda e, r, v: e.sweep(FLOW, grid={"n": [1]}, repeat=v),
}  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, str]]:
    state: Path = tmp_path_factory.mktemp("api") / "state"
    with Engine(state) as engine:
        yield engine, engine.run(FLOW).run_id


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(call=st.sampled_from(sorted(CALLS)), value=HOSTILE)
def test_a_hostile_count_ceiling_or_retention_is_a_usage_error(
    engine: tuple[Engine, str], call: str, value: Any
) -> None:
    amount = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )
    if call == "sweep budget max_cost" and amount:
        return  # a cost ceiling may be any finite amount
    if call == "gc older_than_s" and amount and value <= 100 * 365.25 * 86400:
        return  # a retention may be any number of seconds up to 100 years
    eng, run_id = engine
    with pytest.raises(UsageError):
        CALLS[call](eng, run_id, value)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e: e.run(FLOW, params=[1]), "params: expected a mapping"),
        (lambda e: e.sweep(FLOW, grid={"n": [1]}, params=[1]), "sweep params: expected a mapping"),
        (lambda e: e.sweep(FLOW, grid=[1]), "sweep grid: expected a mapping"),
        (lambda e: e.sweep(FLOW, grid={"n": 5}), "sweep grid axis 'n': expected a list of values"),
        (lambda e: e.sweep(FLOW, grid={"n": [math.nan]}), "sweep grid axis 'n': expected JSON"),
        (lambda e: e.sweep(FLOW, grid={"n": [1]}, budget="x"), "sweep budget: expected a mapping"),
    ],
)
def test_a_wrong_shape_is_a_usage_error_naming_the_argument(
    engine: tuple[Engine, str], call: Callable[[Engine], object], message: str
) -> None:
    with pytest.raises(UsageError) as info:
        call(engine[0])
    assert str(info.value).startswith(message), str(info.value)
