"""Runs shared by a team (issue 25, items 6 and 7): owners, read-only runs, adoption, a shared
seal key, and the network-filesystem warning.

Another user is simulated by ``JUPYTERHUB_USER``: set with monkeypatch in-process, and in the
environment of a real ``wf`` subprocess.
"""

from __future__ import annotations

import getpass
import html
import json
import os
import sqlite3
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.interactiveshell import InteractiveShell

from tests.conftest import ROOT, db_execute, db_rows, wf_cmd, wf_inproc
from tests.helpers_notebook import ipython_shell, magics_in, view_of
from wf_magic import Engine
from wf_magic.errors import RunNotOwned, UsageError
from wf_magic.exits import EXIT_USAGE, error_exit_code
from wf_magic.sealing import KEY_FILENAME
from wf_magic.store import db as dbmod
from wf_magic.store import migrations
from wf_magic.users import current_user

pytestmark = pytest.mark.backends  # the contract suite runs on SQLite and PostgreSQL

GATED = """
name: teamflow
steps:
  - id: draft
    prompt: draft
    gate: {judge: human}
"""

HUMAN_CHILD = """
name: waits
steps:
  - id: sub
    workflow: reviewed
---
name: reviewed
steps:
  - id: draft
    prompt: draft
    gate: {judge: human}
"""


def refusal(run_id: str, *, verb: str, owner: str = "alice", user: str = "bob") -> str:
    return (
        f"Run {run_id} belongs to {owner}; another user's run is read-only, so {user} may not "
        f"{verb} it (nothing was changed). `wf adopt {run_id}` makes it yours first."
    )


def as_user(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("JUPYTERHUB_USER", name)


@pytest.fixture
def alices_run(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run of alice's, blocked at a human gate; the test then acts as bob."""
    as_user(monkeypatch, "alice")
    with Engine(state_dir) as engine:
        run = engine.run(GATED)
    assert run.status == "blocked"
    as_user(monkeypatch, "bob")
    return run.run_id


def events_of(state_dir: Path, run_id: str) -> list[tuple[str, Any]]:
    with Engine(state_dir) as engine:
        return [(e.kind, json.loads(e.data_json or "null")) for e in engine.events_after(run_id)]


def wf_as(state_dir: Path, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real ``wf`` in a subprocess, run as ``user`` (``JUPYTERHUB_USER``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JUPYTERHUB_USER": user}
    return subprocess.run(
        wf_cmd(state_dir, *args), capture_output=True, text=True, env=env, timeout=60, check=False
    )


# -- who the current user is ----------------------------------------------------------------------
def test_the_current_user_is_jupyterhub_user_else_the_os_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert current_user() == getpass.getuser()
    as_user(monkeypatch, "  alice ")
    assert current_user() == "alice"
    as_user(monkeypatch, "   ")  # blank: not a name
    assert current_user() == getpass.getuser()


@pytest.mark.parametrize("failure", [OSError("no name for uid"), KeyError("getpwuid")])
def test_the_current_user_is_the_uid_when_the_os_has_no_name_for_it(
    monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    def no_name() -> str:
        raise failure

    monkeypatch.setattr(getpass, "getuser", no_name)
    assert current_user() == f"uid-{os.getuid()}"


def test_a_run_belongs_to_the_user_who_started_it(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Engine(state_dir) as engine:
        mine = engine.run(GATED).run_id
        as_user(monkeypatch, "alice")
        hers = engine.run(GATED.replace("teamflow", "herflow")).run_id
        assert (engine.get_run(mine).owner, engine.get_run(hers).owner) == (
            getpass.getuser(),
            "alice",
        )
        frame = engine.runs().set_index("run")
    assert frame.loc[mine, "owner"] == getpass.getuser()
    assert frame.loc[hers, "owner"] == "alice"
    assert str(frame["owner"].dtype) == "string"


def test_child_runs_inherit_the_parents_owner_and_adopting_the_parent_takes_them_along(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_user(monkeypatch, "alice")
    with Engine(state_dir) as engine:
        parent = engine.run(HUMAN_CHILD)
        [child] = [r.run_id for r in engine.list_runs(include_children=True) if r.parent_run_id]
        assert engine.get_run(child).owner == "alice"

        as_user(monkeypatch, "bob")
        done = engine.adopt(parent.run_id)
        assert done.adopted == (parent.run_id, child)
        assert (engine.get_run(parent.run_id).owner, engine.get_run(child).owner) == ("bob", "bob")
        engine.approve(child, "draft")
        assert engine.resume(parent.run_id).status == "completed"

    adopted = [d for k, d in events_of(state_dir, child) if k == "run_adopted"]
    assert adopted == [{"adopter": "bob", "previous_owner": "alice"}]


# -- another user's run is read-only ----------------------------------------------------------
GUARDED: dict[str, tuple[list[str], int, Callable[[Engine, str], object]]] = {
    # verb: (wf arguments after the run id, wf exit once adopted, the Engine call)
    "resume": ([], 3, lambda e, r: e.resume(r).status),
    "abandon": ([], 0, lambda e, r: e.abandon(r)),
    "approve": (["draft"], 0, lambda e, r: e.approve(r, "draft")),
    "reject": (
        ["draft", "--feedback", "shorter"],
        0,
        lambda e, r: e.reject(r, "draft", feedback="shorter"),
    ),
    "stop": ([], 0, lambda e, r: e.stop(r)),
    "fork": (["--from", "draft"], 3, lambda e, r: e.fork(r, from_step="draft").run_id),
}
"""Every verb that changes a run, and what it gives once the run is yours."""

AFTER_ADOPTION: dict[str, object] = {
    "resume": "blocked",
    "abandon": ["RUN"],
    "approve": 1,
    "reject": 1,
    "stop": True,
    "fork": "NEW",
}


def _rows(state_dir: Path) -> list[tuple[Any, ...]]:
    runs = db_rows(state_dir, "SELECT * FROM runs ORDER BY run_id")
    counts = db_rows(
        state_dir, "SELECT (SELECT COUNT(*) FROM events), (SELECT COUNT(*) FROM attempts)"
    )
    return [*runs, *counts]


def _run_row(state_dir: Path, run_id: str) -> tuple[Any, ...]:
    return tuple(db_rows(state_dir, "SELECT * FROM runs WHERE run_id = ?", (run_id,))[0])


@pytest.mark.parametrize("face", ["cli", "engine"])
@pytest.mark.parametrize("verb", list(GUARDED))
def test_every_verb_that_changes_another_users_run_is_refused_until_adopted(
    verb: str,
    face: str,
    alices_run: str,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra, adopted_exit, call = GUARDED[verb]
    before = _rows(state_dir)

    if face == "cli":
        refused = wf_inproc(capsys, state_dir, verb, alices_run, *extra)
        assert (refused.returncode, refused.stdout) == (EXIT_USAGE, "")
        assert refused.stderr == f"error: {refusal(alices_run, verb=verb)}\n"
    else:
        with Engine(state_dir) as engine, pytest.raises(RunNotOwned) as info:
            call(engine, alices_run)
        assert str(info.value) == refusal(alices_run, verb=verb)
        assert (info.value.owner, info.value.user, error_exit_code(info.value)) == (
            "alice",
            "bob",
            EXIT_USAGE,
        )
    assert _rows(state_dir) == before  # nothing was changed

    adopt = wf_inproc(capsys, state_dir, "adopt", alices_run)
    assert (adopt.returncode, adopt.stdout) == (
        0,
        f"adopted run {alices_run} from alice; it is bob's now\n",
    )
    if face == "cli":
        assert wf_inproc(capsys, state_dir, verb, alices_run, *extra).returncode == adopted_exit
    else:
        with Engine(state_dir) as engine:
            got = call(engine, alices_run)
        expected = AFTER_ADOPTION[verb]
        if expected == "NEW":
            assert isinstance(got, str) and got != alices_run
            with Engine(state_dir) as engine:
                assert engine.get_run(got).owner == "bob"
        else:
            assert got == ([alices_run] if expected == ["RUN"] else expected)


@pytest.mark.parametrize("new", [False, True])
def test_a_start_in_a_scope_with_another_users_run_leaves_it_alone_and_starts_its_own(
    alices_run: str, state_dir: Path, monkeypatch: pytest.MonkeyPatch, new: bool
) -> None:
    alices_row = _run_row(state_dir, alices_run)
    with Engine(state_dir) as engine:
        bobs = engine.start(GATED, new=new)  # bob's: created beside alice's, never over it
        assert bobs.created and bobs.run_id != alices_run
        assert engine.get_run(bobs.run_id).owner == "bob"
        again = engine.start(GATED)
        assert (again.run_id, again.created) == (bobs.run_id, False)
        as_user(monkeypatch, "alice")
        hers = engine.start(GATED)
        assert (hers.run_id, hers.created) == (alices_run, False)
    assert _run_row(state_dir, alices_run) == alices_row  # not superseded, not abandoned


def test_reading_another_users_run_needs_no_adoption(
    alices_run: str, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for verb in ("status", "journal", "events", "tokens"):
        assert wf_inproc(capsys, state_dir, verb, alices_run).returncode in (0, 3), verb


def test_a_run_from_before_owners_belongs_to_nobody_and_anyone_may_change_it(
    alices_run: str, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db_execute(state_dir, "UPDATE runs SET owner = NULL")
    listed = wf_inproc(capsys, state_dir, "list", "--mine").stdout.split()
    assert listed[:4] == [alices_run, "teamflow", "blocked", "-"]
    assert wf_inproc(capsys, state_dir, "approve", alices_run, "draft").returncode == 0

    adopted = wf_inproc(capsys, state_dir, "adopt", alices_run)
    assert adopted.stdout == f"adopted run {alices_run} from nobody; it is bob's now\n"
    assert [d for k, d in events_of(state_dir, alices_run) if k == "run_adopted"] == [
        {"adopter": "bob", "previous_owner": None}
    ]


def test_adopting_your_own_run_is_a_no_op_that_says_so(
    alices_run: str, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert wf_inproc(capsys, state_dir, "adopt", alices_run).returncode == 0
    before = _rows(state_dir)
    again = wf_inproc(capsys, state_dir, "adopt", alices_run)
    assert (again.returncode, again.stdout) == (
        0,
        f"run {alices_run} is already yours (bob); nothing was changed\n",
    )
    assert _rows(state_dir) == before
    with Engine(state_dir) as engine:
        done = engine.adopt(alices_run)
    assert (done.adopted, done.owner, done.previous_owner) == ((), "bob", "bob")


def test_list_shows_whose_runs_they_are_and_mine_keeps_only_yours(
    alices_run: str, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Engine(state_dir) as engine:
        bobs = engine.run(GATED.replace("teamflow", "bobflow")).run_id

    def listed(*flags: str) -> list[list[str]]:
        out = wf_inproc(capsys, state_dir, "list", *flags).stdout
        return [line.split()[:4] for line in out.splitlines()]

    everyone = [[bobs, "bobflow", "blocked", "bob"], [alices_run, "teamflow", "blocked", "alice"]]
    assert listed() == everyone
    assert listed("--all-users") == everyone
    assert listed("--mine") == [[bobs, "bobflow", "blocked", "bob"]]
    both = wf_inproc(capsys, state_dir, "list", "--mine", "--all-users")
    assert both.returncode == EXIT_USAGE
    assert "not allowed with argument" in both.stderr


def test_a_gc_receipt_keeps_its_runs_owner(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_user(monkeypatch, "alice")
    with Engine(state_dir) as engine:
        run_id = engine.run("name: done\nsteps:\n  - id: a\n    prompt: hi\n").run_id
        assert engine.gc(older_than_s=0) == [run_id]
        frame = engine.runs(include_deleted=True)
    assert frame[["run", "owner"]].values.tolist() == [[run_id, "alice"]]
    assert frame["deleted_at"].notna().all()


# -- a real `wf` process as another user ------------------------------------------------------
def test_a_wf_process_of_another_user_is_refused_then_adopts_and_the_event_is_journaled(
    tmp_path: Path, state_dir: Path
) -> None:
    source = tmp_path / "team.yaml"
    source.write_text(GATED)
    started = wf_as(state_dir, "alice", "run", str(source))
    assert started.returncode == 3, started.stderr
    [run_id] = [line.split()[1] for line in started.stdout.splitlines() if line.startswith("run ")]

    refused = wf_as(state_dir, "bob", "resume", run_id)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == f"error: {refusal(run_id, verb='resume')}\n"

    adopted = wf_as(state_dir, "bob", "adopt", run_id)
    assert (adopted.returncode, adopted.stdout) == (
        0,
        f"adopted run {run_id} from alice; it is bob's now\n",
    )
    events = wf_as(state_dir, "carol", "events", run_id, "--format", "json")
    assert events.returncode == 0
    kinds = [json.loads(line) for line in events.stdout.splitlines()]
    [adoption] = [e for e in kinds if e["kind"] == "run_adopted"]
    assert adoption["data"] == {"adopter": "bob", "previous_owner": "alice"}
    table = wf_as(state_dir, "carol", "events", run_id)
    assert "run_adopted" in table.stdout

    assert wf_as(state_dir, "bob", "approve", run_id, "draft").returncode == 0
    assert wf_as(state_dir, "alice", "resume", run_id).returncode == 2  # hers no longer
    assert wf_as(state_dir, "bob", "resume", run_id).returncode == 0


# -- the notebook -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from ipython_shell()


def test_the_notebook_names_the_owner_and_its_own_adopt_command(
    shell: InteractiveShell,
    alices_run: str,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with magics_in(shell, state_dir, widgets="off"):
        for verb, extra in [
            ("resume", ""),
            ("abandon", ""),
            ("approve", " draft"),
            ("reject", " draft --feedback shorter"),
            ("stop", ""),
            ("fork", " --from draft"),
        ]:
            with pytest.raises(IPythonUsageError) as info:
                shell.run_line_magic("workflow", f"{verb} {alices_run}{extra}")
            assert str(info.value) == refusal(alices_run, verb=verb).replace(
                "`wf adopt", "`%workflow adopt"
            )
        listed = shell.run_line_magic("workflow", "list").readable()
        assert list(listed.columns)[:5] == ["run", "workflow", "params", "status", "owner"]
        assert listed["owner"].tolist() == ["alice"]
        assert shell.run_line_magic("workflow", "list --mine") is None
        assert capsys.readouterr().out.startswith("no runs of bob in ")

        shell.run_line_magic("workflow", f"adopt {alices_run}")
        assert capsys.readouterr().out == f"adopted run {alices_run} from alice; it is bob's now\n"
        shell.run_line_magic("workflow", f"approve {alices_run} draft")
        assert shell.run_line_magic("workflow", f"resume {alices_run}").status == "completed"
        assert shell.run_line_magic("workflow", "list --mine").readable()["owner"].tolist() == [
            "bob"
        ]


def test_the_run_views_buttons_on_another_users_run_say_how_to_adopt_it(
    alices_run: str, state_dir: Path
) -> None:
    expected = {
        verb: html.escape(refusal(alices_run, verb=verb).replace("`wf adopt", "`%workflow adopt"))
        for verb in ("approve", "reject", "abandon", "fork")
    }
    with Engine(state_dir) as engine:
        view = view_of(engine, alices_run)
        view.flush()
        before = _rows(state_dir)
        view.feedback.value = "shorter"
        for verb, press in [
            ("approve", view.approve_button.click),
            ("reject", view.reject_button.click),
            ("abandon", view.review.abandon),
            ("fork", view.review.fork),
        ]:
            press()
            assert expected[verb] in view.message.value, verb
        view.close()
    assert _rows(state_dir) == before


# -- a team's shared seal key -----------------------------------------------------------------
SECRET_WF = """
name: secret-flow
params:
  api_token: {type: string}
steps:
  - id: ask
    prompt: "call with {{ params.api_token }}"
  - id: again
    prompt: again
"""


def test_a_shared_key_file_seals_alike_in_two_state_dirs_and_unseals_in_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "team.key"
    key.write_bytes(os.urandom(32))
    monkeypatch.setenv("WF_MAGIC_SECRET_KEY_FILE", str(key))
    dirs = [tmp_path / "one", tmp_path / "two"]
    started = {}
    for state in dirs:
        with Engine(state) as engine:
            run = engine.run(SECRET_WF, params={"api_token": "s3cret-value"}, max_steps=1)
            started[state] = (run.run_id, engine.get_run(run.run_id).params_json)
    assert started[dirs[0]][1] == started[dirs[1]][1]  # one key: the same seal
    assert "s3cret-value" not in started[dirs[0]][1]
    for state in dirs:  # a new engine (another process) checks the value against the seal
        with Engine(state) as engine:
            run_id = started[state][0]
            with pytest.raises(UsageError, match="differs from the value the run started with"):
                engine.drive(run_id, params={"api_token": "other"})
            assert engine.drive(run_id, params={"api_token": "s3cret-value"}).status == (
                "completed"
            )
        assert not (state / KEY_FILENAME).exists()
        assert key.read_bytes() not in (state / "state.db").read_bytes()


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_bytes(b"short"), "holds 5 bytes"),
        (lambda p: p.write_bytes(os.urandom(33)), "holds more than 32 bytes"),
        (lambda p: p.mkdir(), "is not a regular file"),
    ],
)
def test_an_unusable_shared_key_file_is_one_line_naming_the_variable(
    tmp_path: Path,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], object],
    problem: str,
) -> None:
    key = tmp_path / "team.key"
    make(key)
    monkeypatch.setenv("WF_MAGIC_SECRET_KEY_FILE", str(key))
    source = tmp_path / "secret.yaml"
    source.write_text(SECRET_WF)
    expected = (
        f"WF_MAGIC_SECRET_KEY_FILE={key}: the file {problem}; expected a regular file of 32 "
        "bytes (the format of <state dir>/secret.key). Point it at the team's key file, or "
        "unset it to use the state dir's own key."
    )
    with Engine(state_dir) as engine, pytest.raises(UsageError) as info:
        engine.run(SECRET_WF, params={"api_token": "x"})
    assert str(info.value) == expected
    result = wf_inproc(capsys, state_dir, "run", str(source), "--param", "api_token=x")
    assert result.returncode == EXIT_USAGE
    # The CLI masks the values of secret-looking variables, but this one is a path, not a
    # secret: masked, the line would not say which file is wrong.
    assert result.stderr == f"error: {expected}\n"
    assert not key.is_file() or len(key.read_bytes()) != 32  # never created or rewritten


# -- the migration --------------------------------------------------------------------------------
def test_the_owner_migration_leaves_existing_runs_owned_by_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner_at = migrations.migration_ids().index("m013_run_owner")
    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:owner_at])
    migrations.apply_migrations(conn)
    conn.execute(
        "INSERT INTO runs (run_id, workflow, plan_json, plan_hash, plan_version, source_hash,"
        " params_json, params_hash, status, scope_key, root_run_id, created_at, updated_at)"
        " VALUES ('r-old', 'w', '{}', 'h', 1, 's', '{}', 'p', 'completed', 'k', 'r-old', 1, 1)"
    )
    monkeypatch.undo()
    assert migrations.apply_migrations(conn) == migrations.migration_ids()[owner_at:]
    assert conn.execute("SELECT owner FROM runs").fetchall() == [(None,)]
    conn.close()


# -- a state dir on a network filesystem ------------------------------------------------------
def test_the_network_filesystem_warning_says_locks_do_not_span_hosts_and_names_postgres(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dbmod, "filesystem_type", lambda path: "nfs4")
    monkeypatch.setattr(dbmod, "_warned_paths", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbmod.connect(tmp_path / "state.db").close()
        dbmod.connect(tmp_path / "state.db").close()
    assert [str(w.message) for w in caught] == [
        f"State dir {tmp_path} is on a network filesystem (nfs4); WAL is unsafe there, using "
        "journal_mode=DELETE, and a run's lock file there does not exclude drivers on other "
        "hosts (two hosts may drive one run at once). Set WF_MAGIC_HOME to a local disk for one "
        "host, or WF_MAGIC_SQLITE_JOURNAL_MODE to override the journal mode; for a team across "
        "hosts use PostgreSQL: --db postgresql://USER@HOST/DB?schema=NAME (or WF_MAGIC_HOME set "
        "to that URL)."
    ]
    assert [w.category for w in caught] == [dbmod.StateDirWarning]
