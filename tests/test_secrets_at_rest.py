"""Secret params at rest (issue 12, item 16): only a keyed hash is stored, never the value.

A canary secret is handed to a run whose prompt uses it; then every file under the state
dir (``state.db`` and its WAL and shm files, the key, locks, sidecars) is read as bytes,
every frame and handle is rendered, and the CLI's stdout and stderr (with ``--debug``) are
read: the canary appears nowhere. A resumed run gets the value from its caller again.
"""

from __future__ import annotations

import json
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given

from tests.conftest import db_rows, run_wf, write_file
from tests.helpers_flow import use_runner
from tests.helpers_secrets import CANARY_RUNS, SECRETS
from tests.helpers_secrets import everything_shown as _everything_shown
from tests.helpers_secrets import files_holding as _files_holding
from tests.helpers_secrets import forms as _forms
from wf_magic import Engine
from wf_magic.errors import UsageError
from wf_magic.hashing import canonical_json
from wf_magic.sealing import KEY_FILENAME, SEAL_PREFIX, is_seal

CANARY = "canary-7d41c0b9e2f5a86"  # 22 characters

SECRET_WF = """
name: secret-flow
params:
  api_token: {type: string}
  topic: {type: string, default: cats}
runner: RUNNER
steps:
  - id: ask
    prompt: "use {{ params.api_token }} for {{ params.topic }}"
  - id: again
    prompt: "and once more with {{ params.api_token }}"
"""

ECHO_RULES = """
runners:
  scripted:
    rules:
      - match: "."
        reply: "echo: {{ prompt }}"
"""


def _workflow(runner: str = "scripted") -> str:
    text = SECRET_WF.replace("RUNNER", runner)
    return text + ECHO_RULES if runner == "scripted" else text


def test_a_secret_param_is_stored_as_a_keyed_hash_and_the_drive_gets_its_value(
    state_dir: Path,
) -> None:
    seen = use_runner("secret-recorder", lambda r: "ok")
    with Engine(state_dir) as engine:
        run = engine.run(_workflow("secret-recorder"), params={"api_token": CANARY})
        assert run.status == "completed"
        row = engine.get_run(run.run_id)

    assert seen.prompts() == [f"use {CANARY} for cats", f"and once more with {CANARY}"]
    stored = json.loads(row.params_json)
    assert stored["topic"] == "cats"
    assert stored["api_token"].startswith(SEAL_PREFIX)
    assert json.loads(row.scope_key) == {"params": stored, "workflow": "secret-flow"}
    key = state_dir / KEY_FILENAME
    assert len(key.read_bytes()) == 32
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_non_secret_params_are_stored_as_before_and_no_key_is_made(state_dir: Path) -> None:
    plain = "name: plain\nparams:\n  topic: {type: string}\nsteps:\n  - id: a\n    prompt: hi\n"
    with Engine(state_dir) as engine:
        run = engine.run(plain, params={"topic": CANARY})
        row = engine.get_run(run.run_id)

    assert row.params_json == canonical_json({"topic": CANARY})
    assert row.scope_key == canonical_json({"workflow": "plain", "params": {"topic": CANARY}})
    assert not (state_dir / KEY_FILENAME).exists()


@CANARY_RUNS
@given(secret=SECRETS)
def test_a_canary_secret_appears_nowhere_at_rest_in_frames_or_handles(secret: str) -> None:
    # The markers keep an arbitrary value from matching by chance, and make it at least
    # MIN_SECRET_LEN long: shorter values are not masked inside outputs (by design).
    canary = f"⟪canary{secret}⟫"
    with tempfile.TemporaryDirectory() as tmp:
        state_dir = Path(tmp) / "state"
        with Engine(state_dir) as engine:
            run = engine.run(_workflow(), params={"api_token": canary})
            assert run.status == "completed"
            outputs = [a.output_json or "" for a in engine.attempts(run.run_id)]
            assert outputs == ['"echo: use *** for cats"', '"echo: and once more with ***"']
            assert _files_holding(state_dir, canary) == []  # WAL and shm still open
            shown = _everything_shown(engine, run.run_id)
            assert all(f.decode("utf-8") not in shown for f in _forms(canary))
        assert _files_holding(state_dir, canary) == []  # after the checkpoint on close


def test_a_run_resumed_elsewhere_needs_its_secret_again_and_checks_it(state_dir: Path) -> None:
    seen = use_runner("secret-resume", lambda r: "ok")
    with Engine(state_dir) as first:
        run_id = first.run(
            _workflow("secret-resume"), params={"api_token": CANARY}, max_steps=1
        ).run_id
        assert first.handle(run_id).status == "active"

    with Engine(state_dir) as second:  # another process: the value was never stored
        with pytest.raises(UsageError) as missing:
            second.drive(run_id)
        with pytest.raises(UsageError) as wrong:
            second.drive(run_id, params={"api_token": CANARY + "x"})
        done = second.drive(run_id, params={"api_token": CANARY})

    assert str(missing.value) == (
        f"Run {run_id} has the secret param 'api_token', whose value is never stored; pass "
        "it again to drive the run: `--param api_token=VALUE`, params={'api_token': ...} in "
        "Python, or the environment variable WF_PARAM_API_TOKEN"
    )
    assert str(wrong.value).startswith(
        f"Run {run_id}: the secret param 'api_token' differs from the value the run started "
        "with (its keyed hash does not match)."
    )
    assert CANARY not in str(wrong.value)
    assert done.status == "completed"
    assert seen.prompts() == [f"use {CANARY} for cats", f"and once more with {CANARY}"]


def test_a_secret_param_may_come_from_its_environment_variable(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = use_runner("secret-env", lambda r: "ok")
    monkeypatch.setenv("WF_PARAM_API_TOKEN", CANARY)
    with Engine(state_dir) as engine:
        run_id = engine.run(_workflow("secret-env"), max_steps=1).run_id
    with Engine(state_dir) as engine:
        assert engine.drive(run_id).status == "completed"

    assert seen.prompts() == [f"use {CANARY} for cats", f"and once more with {CANARY}"]


def test_the_same_secret_keeps_its_scope_and_another_one_starts_a_new_run(
    state_dir: Path,
) -> None:
    with Engine(state_dir) as engine:
        first = engine.start(_workflow(), params={"api_token": CANARY})
        again = engine.start(_workflow(), params={"api_token": CANARY})
        other = engine.start(_workflow(), params={"api_token": CANARY + "-rotated"})

        assert (first.created, again.created, other.created) == (True, False, True)
        assert again.run_id == first.run_id != other.run_id
        assert engine.handle(first.run_id).status == "active"  # another scope: not superseded


def test_a_bad_secret_value_is_not_echoed_in_the_error(state_dir: Path) -> None:
    wf = (
        "name: picky\nparams:\n  pin_token: {type: integer}\n"
        "  api_key: {type: string, minLength: 100}\nsteps:\n  - id: a\n    prompt: hi\n"
    )
    with Engine(state_dir) as engine:
        with pytest.raises(UsageError) as not_int:
            engine.start(wf, params={"pin_token": CANARY, "api_key": "x" * 100})
        with pytest.raises(UsageError) as from_text:
            engine.start(
                wf, params={"pin_token": CANARY, "api_key": "x" * 100}, params_from_strings=True
            )
        with pytest.raises(UsageError) as too_short:
            engine.start(wf, params={"pin_token": 1234, "api_key": CANARY})

    assert str(not_int.value) == (
        'param pin_token: does not match its schema {"type": "integer"} '
        "(got a secret value (22 characters), not shown)"
    )
    assert str(from_text.value) == (
        "param pin_token: expected type integer (got a secret value (22 characters), not shown)"
    )
    assert CANARY not in str(too_short.value)
    assert str(too_short.value).endswith("(got a secret value (22 characters), not shown)")


def test_the_cli_shows_the_canary_nowhere_even_with_debug(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wf = write_file(tmp_path, "secret.yaml", _workflow())
    outputs = []

    def wf_cli(*args: str, debug: bool = True) -> tuple[int, str]:
        done = run_wf(state, *(["--debug"] if debug else []), *args)
        outputs.append(done.stdout + done.stderr)
        return done.returncode, done.stdout + done.stderr

    code, text = wf_cli("run", str(wf), "--param", f"api_token={CANARY}", "--max-steps", "1")
    assert code == 0, text
    [(run_id,)] = db_rows(state, "SELECT run_id FROM runs")
    run = str(run_id)
    code, text = wf_cli("resume", run, debug=False)
    assert code == 2, text
    assert f"Run {run} has the secret param 'api_token', whose value is never stored" in text
    code, text = wf_cli("resume", run, "--param", f"api_token={CANARY}-wrong", debug=False)
    assert (code, text.count("\n")) == (2, 1), text
    assert "differs from the value the run started with" in text
    code, text = wf_cli("resume", run, "--param", f"api_token={CANARY}-wrong")
    assert "Traceback" in text  # --debug shows it: still without the value
    code, text = wf_cli("resume", run, "--param", f"api_token={CANARY}")
    assert code == 0, text
    assert "echo: and once more with ***" in text
    for verb in ("status", "list", "journal", "tokens", "events"):
        wf_cli(verb, *([] if verb == "list" else [run]))
    wf_cli("journal", run, "--format", "json")
    wf_cli("show", run, "again")

    assert all(CANARY not in text for text in outputs)
    assert _files_holding(state, CANARY) == []


def test_a_fork_keeps_the_seal_and_is_driven_with_the_secret_handed_back(
    state_dir: Path,
) -> None:
    seen = use_runner("secret-fork", lambda r: "ok")
    with Engine(state_dir) as engine:
        source = engine.run(_workflow("secret-fork"), params={"api_token": CANARY}).row
    with Engine(state_dir) as engine:
        fork = engine.fork(source.run_id, from_step="again")
        with pytest.raises(UsageError, match="has the secret param 'api_token'"):
            engine.drive(fork)
        done = engine.drive(fork, params={"api_token": CANARY})
        assert done.status == "completed"
        assert engine.get_run(fork.run_id).params_json == source.params_json

    assert seen.prompts()[-1] == f"and once more with {CANARY}"


CHILD_WF = """
name: hands-down
params:
  api_token: {type: string}
steps:
  - id: sub
    workflow: keeper
    with: {db_token: "{{ params.api_token }}"}
---
name: keeper
runner: RUNNER
params:
  db_token: {type: string}
steps:
  - id: draft
    prompt: "draft with {{ params.db_token }}"
    gate: {judge: human}
  - id: final
    prompt: "final with {{ params.db_token }}"
"""


def test_a_childs_secret_param_is_sealed_and_reaches_the_child_after_a_resume(
    state_dir: Path,
) -> None:
    seen = use_runner("secret-child", lambda r: "ok")
    source = CHILD_WF.replace("RUNNER", "secret-child")
    with Engine(state_dir) as engine:
        run_id = engine.run(source, params={"api_token": CANARY}).run_id
        [child] = [r for r in engine.list_runs(include_children=True) if r.parent_run_id]
        assert engine.handle(run_id).status == "blocked"
    with Engine(state_dir) as engine:  # another process: approve, then resume the parent
        engine.approve(child.run_id, "draft")
        with pytest.raises(UsageError, match="has the secret param 'api_token'"):
            engine.drive(run_id)
        assert engine.drive(run_id, params={"api_token": CANARY}).status == "completed"
        assert CANARY not in _everything_shown(engine, child.run_id)

    assert json.loads(child.params_json)["db_token"].startswith(SEAL_PREFIX)
    assert json.loads(child.scope_key)["params"]["db_token"].startswith(SEAL_PREFIX)
    assert seen.prompts() == [f"draft with {CANARY}", f"final with {CANARY}"]
    assert _files_holding(state_dir, CANARY) == []


CHILD_PLAIN_WF = """
name: hands-plain
params:
  api_token: {type: string}
steps:
  - id: sub
    workflow: quoter
    with: {header: "Bearer {{ params.api_token }}", topic: cats}
---
name: quoter
runner: RUNNER
params:
  header: {type: string}
  topic: {type: string}
steps:
  - id: draft
    prompt: "call with {{ params.header }} about {{ params.topic }}"
    gate: {judge: human}
  - id: final
    prompt: "final with {{ params.header }}"
"""


@pytest.mark.parametrize("secret", [CANARY, "s3cr"])  # masked inside text / too short to be
def test_a_secret_handed_to_a_child_under_a_plain_name_is_sealed_whole(
    state_dir: Path, secret: str
) -> None:
    seen = use_runner("plain-child", lambda r: "ok")
    source = CHILD_PLAIN_WF.replace("RUNNER", "plain-child")
    if secret != CANARY:  # a short secret is sealed when it is the whole value
        source = source.replace('"Bearer {{ params.api_token }}"', '"{{ params.api_token }}"')
    value = f"Bearer {secret}" if secret == CANARY else secret
    with Engine(state_dir) as engine:
        run_id = engine.run(source, params={"api_token": secret}).run_id
        [child] = [r for r in engine.list_runs(include_children=True) if r.parent_run_id]
    with Engine(state_dir) as engine:  # another process: approve, then resume the parent
        engine.approve(child.run_id, "draft")
        with pytest.raises(UsageError, match="has the secret param 'header'"):
            engine.drive(child.run_id)  # the child alone: its header is not at hand
        assert engine.drive(run_id, params={"api_token": secret}).status == "completed"
        shown = _everything_shown(engine, child.run_id)

    stored = json.loads(child.params_json)
    assert stored["header"].startswith(SEAL_PREFIX)
    assert stored["topic"] == "cats"  # a plain value without a secret stays as it is
    assert json.loads(child.scope_key)["params"]["header"] == stored["header"]
    assert engine.handle(child.run_id).params["header"] == stored["header"]
    assert seen.prompts() == [f"call with {value} about cats", f"final with {value}"]
    if secret == CANARY:
        assert CANARY not in shown
        assert _files_holding(state_dir, CANARY) == []
    else:
        assert db_rows(
            state_dir, "SELECT COUNT(*) FROM runs WHERE params_json LIKE ?", (f'%"{secret}"%',)
        ) == [(0,)]


def test_a_child_param_sealed_whole_can_be_handed_back_by_name(state_dir: Path) -> None:
    use_runner("plain-child", lambda r: "ok")
    source = CHILD_PLAIN_WF.replace("RUNNER", "plain-child")
    with Engine(state_dir) as engine:
        engine.run(source, params={"api_token": CANARY})
        [child] = [r for r in engine.list_runs(include_children=True) if r.parent_run_id]
        engine.approve(child.run_id, "draft")
    with Engine(state_dir) as engine:
        with pytest.raises(UsageError, match="differs from the value the run started with"):
            engine.drive(child.run_id, params={"header": "Bearer something-else-entirely"})
        done = engine.drive(child.run_id, params={"header": f"Bearer {CANARY}"})
    assert done.status == "completed"
    status = run_wf(state_dir, "status", child.run_id)
    assert status.returncode == 0, status.stderr
    assert "header=*** topic=cats" in status.stdout  # shown masked, like a secret name
    assert SEAL_PREFIX not in status.stdout


CHILD_ECHO_WF = (
    """
name: hands-echo
params:
  api_token: {type: string}
steps:
  - id: sub
    workflow: echoer
    with: {header: "Bearer {{ params.api_token }}", note: "{{ params.api_token }}"}
---
name: echoer
params:
  header: {type: string}
  note: {type: string}
steps:
  - id: say
    prompt: "send {{ params.header }} and {{ params.note }}"
"""
    + ECHO_RULES
)


@CANARY_RUNS
@given(secret=SECRETS)
def test_a_canary_handed_to_a_child_under_plain_names_appears_nowhere_at_rest(
    secret: str,
) -> None:
    canary = f"⟪canary{secret}⟫"
    with tempfile.TemporaryDirectory() as tmp:
        state_dir = Path(tmp) / "state"
        with Engine(state_dir) as engine:
            run = engine.run(CHILD_ECHO_WF, params={"api_token": canary})
            assert run.status == "completed"
            [child] = [r for r in engine.list_runs(include_children=True) if r.parent_run_id]
            stored = json.loads(child.params_json)
            assert all(is_seal(v) for v in stored.values()), stored
            outputs = [a.output_json or "" for a in engine.attempts(child.run_id)]
            # A param sealed whole is a secret of the child's drive as a whole.
            assert outputs == ['"echo: send *** and ***"']
            shown = _everything_shown(engine, child.run_id)
            assert all(f.decode("utf-8") not in shown for f in _forms(canary))
        assert _files_holding(state_dir, canary) == []


@pytest.mark.parametrize("given", [[], ["--param", f"api_token={CANARY}-wrong"]])
def test_wf_fork_without_the_right_secret_is_refused_before_a_fork_exists(
    tmp_path: Path, given: list[str]
) -> None:
    """``wf fork`` checks the source's secret params first: a missing or wrong value is one
    usage error (exit 2) and no fork is left behind, ``active`` and never driven."""
    state = tmp_path / "state"
    wf = write_file(tmp_path, "secret.yaml", _workflow())
    done = run_wf(state, "run", str(wf), "--param", f"api_token={CANARY}")
    assert done.returncode == 0, done.stderr
    [(run_id,)] = db_rows(state, "SELECT run_id FROM runs")
    refused = run_wf(state, "fork", str(run_id), "--from", "again", *given)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
    assert "secret param 'api_token'" in refused.stderr and CANARY not in refused.stderr
    assert db_rows(state, "SELECT run_id FROM runs") == [(run_id,)]
    forked = run_wf(state, "fork", str(run_id), "--from", "again", "--param", f"api_token={CANARY}")
    assert forked.returncode == 0, forked.stderr
    assert len(db_rows(state, "SELECT run_id FROM runs")) == 2
