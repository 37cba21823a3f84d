"""What a RUN argument may be: an id, a unique prefix, a workflow name (its newest run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic import Engine, UsageError

from .conftest import wf_inproc

ONE = """
name: {name}
params:
  n: {{type: integer, default: 0}}
steps:
  - id: s
    prompt: "Say {{{{ params.n }}}}"
"""


def _runs(engine: Engine, name: str, count: int) -> list[str]:
    return [engine.run(ONE.format(name=name), params={"n": i}).run_id for i in range(count)]


def test_a_workflow_name_means_its_newest_root_run(engine: Engine) -> None:
    ids = _runs(engine, "alpha", 3)
    _runs(engine, "beta", 1)
    assert engine.resolve_run_id("alpha") == ids[-1]
    assert engine.handle("alpha").run_id == ids[-1]


def test_an_exact_run_id_wins_over_a_workflow_name(engine: Engine) -> None:
    ids = _runs(engine, "alpha", 2)
    assert engine.resolve_run_id(ids[0]) == ids[0]


def test_an_ambiguous_prefix_says_so_and_lists_the_matches(engine: Engine) -> None:
    ids = _runs(engine, "alpha", 3)
    with pytest.raises(UsageError) as caught:
        engine.resolve_run_id("r-")
    message = str(caught.value)
    assert message.startswith("Run id prefix 'r-' is ambiguous: it matches ")
    assert all(run_id in message for run_id in ids)
    assert message.endswith("give more characters of the id.")


def test_a_unique_prefix_resolves(engine: Engine) -> None:
    (only,) = _runs(engine, "alpha", 1)
    assert engine.resolve_run_id(only[:-2]) == only


@settings(max_examples=30, deadline=None)
@given(junk=st.text(alphabet="%_\\*?[]r-", min_size=1, max_size=6))
def test_like_wildcards_in_a_prefix_match_literally(tmp_path_factory, junk: str) -> None:  # type: ignore[no-untyped-def]
    with Engine(tmp_path_factory.mktemp("s")) as engine:
        (only,) = _runs(engine, "alpha", 1)
        if only.startswith(junk):
            assert engine.resolve_run_id(junk) == only
        else:
            with pytest.raises(UsageError, match="No run"):
                engine.resolve_run_id(junk)


def test_the_cli_takes_a_workflow_name_and_names_ambiguity(
    capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    with Engine(state_dir) as engine:
        ids = _runs(engine, "alpha", 2)
    status = wf_inproc(capsys, state_dir, "status", "alpha")
    assert status.returncode == 0 and ids[-1] in status.stdout
    ambiguous = wf_inproc(capsys, state_dir, "status", "r-")
    assert ambiguous.returncode == 2 and "is ambiguous" in ambiguous.stderr
