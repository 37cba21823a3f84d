"""The Store's write doors redact every text column and event of a run (store/scrub.py)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import db_rows
from wf_magic import Engine
from wf_magic.redact import MIN_SECRET_LEN, Redactor
from wf_magic.store.journal import Finish
from wf_magic.store.scrub import Scrubber

CANARY = "canary-4f1e9b20c7d3"
FLOW = "name: plain\nsteps:\n  - id: a\n    prompt: hi\n"


def _texts(state_dir: Path) -> str:
    rows = db_rows(
        state_dir,
        "SELECT status_reason FROM runs UNION ALL SELECT note FROM steps"
        " UNION ALL SELECT output_json FROM steps UNION ALL SELECT data_json FROM events"
        " UNION ALL SELECT failure FROM attempts UNION ALL SELECT output_json FROM attempts",
    )
    return "\n".join(str(r[0]) for r in rows if r[0] is not None)


def test_writes_outside_a_drive_mask_what_this_engine_was_handed(state_dir: Path) -> None:
    with Engine(state_dir) as engine:
        run_id = engine.run(FLOW).run_id
        engine.store.scrubber.know([CANARY])  # as a secret param handed to this engine is
        engine.store.write_step(
            run_id, "a", status="failed", loop=1, note=f"saw {CANARY}", output_json=None
        )
        engine.store.set_run_status(run_id, "failed", reason=f"step a: saw {CANARY}")
        engine.abandon(run_id, reason=f"leaked {CANARY}; api_key=hunter2-hunter2")
        row = engine.get_run(run_id)

    assert row.status_reason == "leaked ***; api_key=***"
    texts = _texts(state_dir)
    assert CANARY not in texts and "hunter2" not in texts
    assert "saw ***" in texts


def test_a_drive_registers_its_runs_redactor_and_other_runs_keep_the_base(
    tmp_path: Path,
) -> None:
    scrubber = Scrubber(Redactor())
    with scrubber.driving("r-1", Redactor([CANARY])):
        assert scrubber.text("r-1", f"a {CANARY}") == "a ***"
        assert scrubber.text("r-2", f"a {CANARY}") == f"a {CANARY}"
        with scrubber.driving("r-1", Redactor(["other-secret-1"])):  # a nested drive
            assert scrubber.text("r-1", "other-secret-1") == "***"
        assert scrubber.text("r-1", f"a {CANARY}") == "a ***"
    assert scrubber.text("r-1", f"a {CANARY}") == f"a {CANARY}"


def test_a_finish_is_returned_as_is_when_it_holds_nothing_to_mask() -> None:
    finish = Finish(status="failed", failure="boom", output_json='{"a": 1}')
    assert Scrubber(Redactor([CANARY])).finish("r-1", finish) is finish


@given(
    secret=st.text(min_size=MIN_SECRET_LEN, max_size=24),
    value=st.recursive(
        st.one_of(st.none(), st.integers(), st.text(max_size=12)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
        ),
        max_leaves=8,
    ),
)
def test_a_json_column_stays_valid_json_without_the_secret(secret: str, value: object) -> None:
    # A secret holding quotes or brackets may match across the JSON's own syntax as text.
    scrubber = Scrubber(Redactor([secret]))
    for text in (json.dumps([value, secret, {"k": f"x{secret}y"}]), json.dumps(secret)):
        kept = scrubber.json_text("r-1", text)
        assert kept is not None
        parsed = json.loads(kept)
        assert secret not in json.dumps(parsed, ensure_ascii=False)
