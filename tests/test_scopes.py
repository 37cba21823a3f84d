"""Scopes visible (issue 15 item 4): list, status and runs() show each run's params, secret
ones masked, so two scopes of one workflow are told apart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.helpers_notebook import ipython_shell, magics_in
from wf_magic import Engine
from wf_magic.store.runs import masked_params, params_text
from wf_magic.users import current_user

from .conftest import wf_inproc, write_file

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

FLOW = """\
name: scoped
params:
  day: {type: string, default: mon}
  api_key: {type: string, default: none}
  depth: {type: integer, default: 2}
steps:
  - id: report
    prompt: "report {{ params.day }} {{ params.depth }}"
"""
SECRET = "hunter2-very-secret"


def test_masked_params_hide_secret_keys_at_any_depth() -> None:
    given = {"day": "mon", "api_key": SECRET, "db": {"password": "pw", "host": "h"}}
    assert masked_params(json.dumps(given)) == {
        "day": "mon",
        "api_key": "***",
        "db": {"password": "***", "host": "h"},
    }


def test_params_text_is_one_sorted_line_of_key_value_pairs() -> None:
    text = params_text(json.dumps({"day": "mon", "api_key": SECRET, "depth": 2, "tags": ["a"]}))
    assert text == 'api_key=*** day=mon depth=2 tags=["a"]'
    assert params_text("{}") == ""
    assert params_text(json.dumps({"note": "x" * 200})) == "note=" + "x" * 74 + "…"


def _two_scopes(engine: Engine) -> tuple[str, str]:
    mon = engine.run(FLOW, params={"api_key": SECRET})
    tue = engine.run(FLOW, params={"day": "tue", "api_key": SECRET})
    return mon.run_id, tue.run_id


def test_wf_list_shows_each_runs_params_with_secrets_masked(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mon, tue = _two_scopes(engine)
    engine.close()
    out = wf_inproc(capsys, state_dir, "list").stdout
    lines = {line.split()[0]: line for line in out.splitlines()}
    owner = f"{current_user():<12}"  # the owner column: whose run it is
    assert lines[mon].endswith(f"completed  {owner}  api_key=*** day=mon depth=2")
    assert lines[tue].endswith(f"completed  {owner}  api_key=*** day=tue depth=2")
    assert SECRET not in out


def test_wf_status_shows_the_params_under_the_header(
    engine: Engine, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mon, _ = _two_scopes(engine)
    engine.close()
    out = wf_inproc(capsys, state_dir, "status", mon).stdout
    assert out.splitlines()[:2] == [
        f"Run {mon}  scoped  [completed]",
        "  params: api_key=*** day=mon depth=2",
    ]
    assert SECRET not in out


def test_runs_frame_has_masked_params_and_scope(engine: Engine) -> None:
    mon, tue = _two_scopes(engine)
    frame = engine.runs().set_index("run")
    assert json.loads(frame.loc[mon, "params"]) == {"api_key": "***", "day": "mon", "depth": 2}
    assert json.loads(frame.loc[tue, "params"])["day"] == "tue"
    assert str(frame["params"].dtype) == "string"
    assert SECRET not in frame.to_string() and SECRET not in "".join(frame["scope_key"])
    assert json.loads(frame.loc[mon, "scope_key"]) == {
        "workflow": "scoped",
        "params": {"api_key": "***", "day": "mon", "depth": 2},
    }
    stored = json.loads(engine.get_run(mon).scope_key)  # what starts match on: a keyed hash
    assert stored["params"]["api_key"].startswith("wf-sealed:hmac-sha256:")


def test_a_run_without_params_lists_no_params_column_text(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_file(tmp_path, "bare.yaml", "name: bare\nsteps:\n  - id: a\n    prompt: hi\n")
    wf_inproc(capsys, state_dir, "run", str(path))
    [line] = wf_inproc(capsys, state_dir, "list").stdout.splitlines()
    assert line.rstrip().endswith(f"completed  {current_user()}")


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


def test_workflow_list_in_the_notebook_tells_scopes_apart(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    with magics_in(shell, tmp_path / "state") as magics:
        mon, tue = _two_scopes(magics.engine)
        shown = shell.run_line_magic("workflow", "list")
        text = shown._repr_html_()
    assert "api_key=*** day=mon depth=2" in text and "api_key=*** day=tue depth=2" in text
    assert SECRET not in text


FAILING = """
name: flaky
runners:
  scripted:
    rules:
      - {match: "^Boom", error: permanent}
      - {match: ".", reply: ok}
steps:
  - id: s
    prompt: "PROMPT"
"""


def test_a_failed_run_superseded_by_an_edit_keeps_its_failure_and_names_its_successor(
    engine: Engine,
) -> None:
    failed = engine.run(FAILING.replace("PROMPT", "Boom now"))
    assert failed.status == "failed"
    reason = failed.reason
    assert reason
    started = engine.start(FAILING.replace("PROMPT", "Fine now"))
    assert started.created
    old = engine.handle(failed.run_id)
    assert (old.status, old.reason) == ("failed", reason)
    assert old.superseded_by == started.run_id
    assert f"superseded by {started.run_id}" in repr(old)
    assert f"superseded by <code>{started.run_id}</code>" in old._repr_html_()
    assert any(f"stays failed, superseded by {started.run_id}" in w for w in started.warnings)
    # The scope's run is the new one: an unchanged re-run continues it, not the failed one.
    again = engine.start(FAILING.replace("PROMPT", "Fine now"))
    assert (again.run_id, again.created) == (started.run_id, False)


def test_an_active_run_superseded_is_still_abandoned(engine: Engine) -> None:
    first = engine.start(FAILING.replace("PROMPT", "One")).run_id
    second = engine.start(FAILING.replace("PROMPT", "Two")).run_id
    old = engine.handle(first)
    assert (old.status, old.reason, old.superseded_by) == (
        "abandoned",
        f"superseded by {second}",
        None,
    )


def test_no_cache_on_an_unchanged_cell_says_the_existing_run_is_shown(engine: Engine) -> None:
    source = FAILING.replace("PROMPT", "Fine")
    done = engine.run(source)
    again = engine.start(source, no_cache=True)
    assert (again.run_id, again.created) == (done.run_id, False)
    assert again.warnings == [
        f"--no-cache applies to new runs only: run {done.run_id} of this cell already exists "
        "(completed); the completed run is shown. Pass --new --no-cache to re-run it without "
        "reuse."
    ]
    fresh = engine.start(source, no_cache=True, new=True)
    assert fresh.created and fresh.run_id != done.run_id and fresh.warnings == []
    quiet = engine.start(source)
    assert quiet.warnings == []


GATED_TWO = """
name: twostep
runner: scripted
steps:
  - id: plain
    prompt: "Plain"
  - id: draft
    prompt: "Draft"
    gate: {judge: human}
"""


def test_a_second_fork_of_a_superseded_run_supersedes_the_first_fork(engine: Engine) -> None:
    """A fork supersedes its unfinished source; forking that (now abandoned) source again
    supersedes the scope's unfinished run, the first fork: one unfinished run per scope."""
    first = engine.run(GATED_TWO)
    assert first.status == "blocked"
    fork_b = engine.drive(engine.fork(first.run_id, from_step="plain"))
    assert fork_b.status == "blocked" and engine.handle(first.run_id).status == "abandoned"
    fork_c = engine.fork(first.run_id, from_step="draft")
    b = engine.handle(fork_b.run_id)
    assert (b.status, b.reason) == ("abandoned", f"superseded by {fork_c.run_id}")
    unfinished = [r.run_id for r in engine.list_runs() if r.status in ("active", "blocked")]
    assert unfinished == [fork_c.run_id]
