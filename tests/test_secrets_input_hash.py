"""The input hash is no dictionary oracle (issue 31, item 2).

The journal keeps a unit's input redacted (``***`` where a secret was) beside its input hash.
Were that hash the plain sha256 of the unredacted input, a short secret would come back from
a copied ``state.db`` by hashing guesses: fill each candidate in for ``***`` until a hash
matches. A secret-bearing input is hashed under the state's key instead
(``sealing.InputHasher``), so the same brute force finds nothing; reuse, resume and replay
keep working within the state, and a journal written by an older wf_magic (plain hashes)
still resumes without paying again.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import db_rows, write_file
from tests.helpers_flow import use_runner
from wf_magic import Engine
from wf_magic.drive.units import build_units
from wf_magic.hashing import canonical_json, sha256_text
from wf_magic.redact import Redactor
from wf_magic.runners.replay import export_cassette
from wf_magic.sealing import KEY_FILE_ENV, InputHasher, Sealer
from wf_magic.spec.freeze import load_workflow

ALPHABET = "ab1Z"
"""A small alphabet: 4**8 = 65 536 secrets of 8 characters, hashed in a fraction of a second."""

ORACLE_WF = """
name: oracle
params:
  api_token: {type: string}
runner: RUNNER
steps:
  - id: ask
    prompt: "call the service with {{ params.api_token }}"
    gate: {judge: expr, check: "params.api_token not in output"}
  - id: plain
    prompt: "summarise the answer"
"""


def _workflow(runner: str) -> str:
    return ORACLE_WF.replace("RUNNER", runner)


def _candidates() -> Iterable[str]:
    return ("".join(p) for p in itertools.product(ALPHABET, repeat=8))


def _kept_inputs(state_dir: Path) -> list[str]:
    """The journaled (redacted) inputs that had a secret masked."""
    rows = db_rows(state_dir, "SELECT input_json FROM inputs")
    return [str(text) for (text,) in rows if "***" in str(text)]


def _templates(kept_inputs: list[str]) -> list[str]:
    """What a plain hash would have hashed, with ``***`` where the guessed secret goes: each
    input itself, each input without its runner settings (its ``content_hash``), and the
    params an ``expr`` check reads (its ``params_read``)."""
    out = {canonical_json({"api_token": "***"})}
    for kept in kept_inputs:
        obj = json.loads(kept)
        out.add(canonical_json(obj))
        if "content_hash" in obj:
            out.add(canonical_json({k: v for k, v in obj.items() if k not in _SETTINGS}))
    return sorted(out)


_SETTINGS = ("runner", "content_hash")


def crack(hashes: set[str], kept_inputs: list[str]) -> str | None:
    """The brute force of a copied state.db: the candidate secret one of whose guessed texts
    hashes (plain sha256) to one of ``hashes``; None when none does."""
    templates = _templates(kept_inputs)
    for candidate in _candidates():
        for template in templates:
            if sha256_text(template.replace("***", candidate)) in hashes:
                return candidate
    return None


def _hashes_at_rest(state_dir: Path) -> set[str]:
    """Every 64-hex-digit string in any file under the state dir (the database, WAL, shm)."""
    found: set[str] = set()
    for path in state_dir.rglob("*"):
        if path.is_file():
            found.update(m.decode() for m in re.findall(rb"[0-9a-f]{64}", path.read_bytes()))
    return found


def _plain_hashes(kept_inputs: list[str], secret: str) -> set[str]:
    """What a wf_magic hashing plainly would have stored for the same inputs."""
    return {sha256_text(t.replace("***", secret)) for t in _templates(kept_inputs)}


ORACLE_RUNS = settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@ORACLE_RUNS
@given(secret=st.text(alphabet=ALPHABET, min_size=8, max_size=8))
def test_a_brute_force_over_short_secrets_finds_nothing_in_the_state_dir(secret: str) -> None:
    use_runner("oracle-echo", lambda r: "done")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        with Engine(state) as engine:
            run = engine.run(_workflow("oracle-echo"), params={"api_token": secret})
            assert run.status == "completed"
        kept = _kept_inputs(state)
        at_rest = _hashes_at_rest(state)

        # The unit's input was journaled with the secret masked; the judge's input keeps
        # only a hash of the params its check reads (``params_read``), keyed too.
        assert [json.loads(k)["prompt"] for k in kept] == ["call the service with ***"]
        assert db_rows(
            state, "SELECT COUNT(*) FROM inputs WHERE input_json LIKE ?", ("%params_read%",)
        ) == [(1,)]
        # Against what the state dir holds, every candidate fails ...
        assert crack(at_rest, kept) is None
        # ... while the same brute force recovers the secret from plain hashes (the old way).
        assert crack(_plain_hashes(kept, secret), kept) == secret
        assert not _plain_hashes(kept, secret) & at_rest


def test_a_runner_with_settings_keys_its_content_hash_too(state_dir: Path) -> None:
    secret = "Zb1aZb1a"
    text = _workflow("scripted") + (
        'runners:\n  scripted:\n    rules:\n      - {match: ".", reply: "done"}\n'
    )
    with Engine(state_dir) as engine:
        assert engine.run(text, params={"api_token": secret}).status == "completed"
    kept = _kept_inputs(state_dir)
    assert any('"content_hash"' in k for k in kept)
    assert crack(_hashes_at_rest(state_dir), kept) is None
    assert crack(_plain_hashes(kept, secret), kept) == secret


def test_an_input_without_secrets_keeps_its_plain_sha256(state_dir: Path) -> None:
    use_runner("oracle-echo", lambda r: "done")
    with Engine(state_dir) as engine:
        run = engine.run(_workflow("oracle-echo"), params={"api_token": "Zb1aZb1a"})
        [plain] = [a for a in engine.attempts(run.run_id) if a.unit_id == "plain"]
        [ask] = [a for a in engine.attempts(run.run_id) if a.unit_id == "ask"]
    [(plain_json,)] = db_rows(
        state_dir, "SELECT input_json FROM inputs WHERE input_hash = ?", (plain.input_hash,)
    )
    assert plain.input_hash == sha256_text(str(plain_json))
    [(ask_json,)] = db_rows(
        state_dir, "SELECT input_json FROM inputs WHERE input_hash = ?", (ask.input_hash,)
    )
    expected = Sealer.existing(state_dir).input_digest(  # type: ignore[union-attr]
        str(ask_json).replace("***", "Zb1aZb1a")
    )
    assert ask.input_hash == expected


@pytest.mark.parametrize(
    ("value", "keyed"),
    [
        ({"prompt": "hello"}, False),
        ({"prompt": "use s3cr3t-value-1 now"}, True),  # a known secret's value
        ({"prompt": "password: hunter22"}, True),  # a credential shape
        ({"headers": {"api_key": "short"}}, True),  # a secret-looking key, masked whole
        ({"prompt": "Bearer abcdefghijklmnop1234"}, True),
        ({"prompt": "a key word and a token count"}, False),
    ],
)
def test_a_value_is_keyed_exactly_when_the_journal_would_mask_it(
    tmp_path: Path, value: dict[str, object], keyed: bool
) -> None:
    hasher = InputHasher(Redactor(["s3cr3t-value-1"]), state_dir=tmp_path)
    hashed = hasher.hash_value(value)
    plain = sha256_text(canonical_json(value))
    assert (hashed.hash != plain) is keyed
    assert hashed.hashes == ((hashed.hash, plain) if keyed else (plain,))
    assert ("***" in hashed.kept_json) is keyed
    assert hasher.hash_value(value) == hashed  # stable: reuse and resume find it again
    assert (tmp_path / "secret.key").exists() is keyed  # the key is made on first need


def test_two_states_key_the_same_secret_input_apart_unless_they_share_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = {"prompt": "password: hunter22"}
    one = InputHasher(Redactor(), state_dir=tmp_path / "one").hash_value(value)
    two = InputHasher(Redactor(), state_dir=tmp_path / "two").hash_value(value)
    assert one.hash != two.hash
    shared = tmp_path / "team.key"
    shared.write_bytes(os.urandom(32))
    monkeypatch.setenv(KEY_FILE_ENV, str(shared))
    one = InputHasher(Redactor(), state_dir=tmp_path / "one").hash_value(value)
    two = InputHasher(Redactor(), state_dir=tmp_path / "two").hash_value(value)
    assert one.hash == two.hash


def test_reuse_and_journal_replay_work_within_the_state(state_dir: Path) -> None:
    seen = use_runner("oracle-paid", lambda r: "done")
    with Engine(state_dir) as engine:
        first = engine.run(_workflow("oracle-paid"), params={"api_token": "ab1Zab1Z"})
        again = engine.run(_workflow("oracle-paid"), params={"api_token": "ab1Zab1Z"}, new=True)
        other = engine.run(_workflow("oracle-paid"), params={"api_token": "Zab1Zab1"}, new=True)
        replayed = engine.run(_workflow("replay"), params={"api_token": "ab1Zab1Z"})
        statuses = {
            run.run_id: {a.unit_id: a.status for a in engine.attempts(run.run_id)}
            for run in (first, again, other, replayed)
        }
    assert [first.status, again.status, other.status, replayed.status] == ["completed"] * 4
    assert statuses[again.run_id] == {"ask": "reused", "ask.gate:l1": "reused", "plain": "reused"}
    # Another secret is another input: the secret-bearing unit runs again, the rest is reused.
    assert statuses[other.run_id]["ask"] == "succeeded"
    assert statuses[other.run_id]["plain"] == "reused"
    assert statuses[replayed.run_id]["ask"] == "succeeded"  # answered by the journal
    assert len(seen.prompts()) == 3  # first: ask, plain; other: ask


def test_a_cassette_replays_a_secret_bearing_unit_only_under_the_same_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_runner("oracle-rec", lambda r: "recorded answer")
    home = tmp_path / "home"
    with Engine(home) as engine:
        run = engine.run(_workflow("oracle-rec"), params={"api_token": "ab1Zab1Z"})
        tape = write_file(
            tmp_path, "tape.jsonl", "\n".join(export_cassette(engine.store, run.run_id))
        )
    assert "ab1Zab1Z" not in tape.read_text()
    replay = _workflow("replay") + (
        f"runners:\n  replay: {{cassette: {json.dumps(str(tape))}, journal: false}}\n"
    )
    with Engine(tmp_path / "elsewhere") as engine:
        moved = engine.run(replay, params={"api_token": "ab1Zab1Z"})
        failures = {a.unit_id: a.failure for a in engine.attempts(moved.run_id)}
    assert moved.status == "failed"
    assert "replay runner: no recorded answer for unit ask" in str(failures["ask"])
    assert str(failures["ask"]).endswith(
        "; a unit whose input holds a secret replays only under the key it was recorded with "
        "(the same state, or WF_MAGIC_SECRET_KEY_FILE)."
    )

    # A non-secret unit replays anywhere; with the team's key file, so does the secret one.
    shared = tmp_path / "team.key"
    shared.write_bytes(os.urandom(32))
    monkeypatch.setenv(KEY_FILE_ENV, str(shared))
    with Engine(tmp_path / "home2") as engine:
        run = engine.run(_workflow("oracle-rec"), params={"api_token": "ab1Zab1Z"})
        tape.write_text("\n".join(export_cassette(engine.store, run.run_id)))
    with Engine(tmp_path / "elsewhere2") as engine:
        moved = engine.run(replay, params={"api_token": "ab1Zab1Z"})
        outputs = {a.unit_id: a.status for a in engine.attempts(moved.run_id)}
    assert moved.status == "completed"
    assert outputs == {"ask": "succeeded", "ask.gate:l1": "succeeded", "plain": "succeeded"}


def _to_legacy(state_dir: Path, secret: str) -> list[str]:
    """Rewrite a journal as a wf_magic that hashed every input plainly wrote it: each keyed
    hash becomes the plain sha256 of the unredacted input. Returns the units rewritten.

    The append-only triggers are lifted for the rewrite and put back as they were."""
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        triggers = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'attempts'"
        ).fetchall()
        for name, _ in triggers:
            conn.execute(f"DROP TRIGGER {name}")
        rewritten: list[str] = []
        for keyed, kept in conn.execute("SELECT input_hash, input_json FROM inputs").fetchall():
            if "***" not in kept:
                continue
            obj = json.loads(kept.replace("***", secret))
            legacy = sha256_text(canonical_json(obj))
            for table in ("attempts", "inputs"):
                conn.execute(
                    f"UPDATE {table} SET input_hash = ? WHERE input_hash = ?",  # noqa: S608
                    (legacy, keyed),
                )
            rewritten += [
                u
                for (u,) in conn.execute(
                    "SELECT unit_id FROM attempts WHERE input_hash = ?", (legacy,)
                )
            ]
        # The judge's input: its params_read was the plain hash of the params its check reads.
        for keyed, kept in conn.execute("SELECT input_hash, input_json FROM inputs").fetchall():
            obj = json.loads(kept)
            if "params_read" not in obj:
                continue
            obj["params_read"] = sha256_text(canonical_json({"api_token": secret}))
            legacy = sha256_text(canonical_json(obj))
            for table in ("attempts",):
                conn.execute(
                    f"UPDATE {table} SET input_hash = ? WHERE input_hash = ?",  # noqa: S608
                    (legacy, keyed),
                )
            conn.execute(
                "UPDATE inputs SET input_hash = ?, input_json = ? WHERE input_hash = ?",
                (legacy, canonical_json(obj), keyed),
            )
            rewritten += [
                u
                for (u,) in conn.execute(
                    "SELECT unit_id FROM attempts WHERE input_hash = ?", (legacy,)
                )
            ]
        for _, sql in triggers:
            conn.execute(sql)
        conn.commit()
    finally:
        conn.close()
    return sorted(rewritten)


def test_a_journal_with_plain_hashes_resumes_without_paying_again(state_dir: Path) -> None:
    seen = use_runner("oracle-old", lambda r: "done")
    secret = "1ZZa1ZZa"
    with Engine(state_dir) as engine:
        run = engine.run(_workflow("oracle-old"), params={"api_token": secret}, max_steps=1)
    assert _to_legacy(state_dir, secret) == ["ask", "ask.gate:l1"]
    with Engine(state_dir) as engine:
        done = engine.drive(run.run_id, params={"api_token": secret})
        attempts = [(a.unit_id, a.status) for a in engine.attempts(run.run_id)]
        again = engine.run(_workflow("oracle-old"), params={"api_token": secret}, new=True)
        reused = {a.unit_id: a.status for a in engine.attempts(again.run_id)}
    assert done.status == "completed"
    # The old attempts answer their units: no second ask, no second verdict.
    assert attempts == [("ask", "succeeded"), ("ask.gate:l1", "succeeded"), ("plain", "succeeded")]
    assert seen.prompts() == ["call the service with 1ZZa1ZZa", "summarise the answer"]
    # Another run reuses them too; what it writes is keyed (no plain hash written again).
    assert reused == {"ask": "reused", "ask.gate:l1": "reused", "plain": "reused"}
    kept = _kept_inputs(state_dir)
    new_rows = {
        str(h)
        for (h,) in db_rows(
            state_dir, "SELECT input_hash FROM attempts WHERE run_id = ?", (again.run_id,)
        )
    }
    assert not new_rows & _plain_hashes(kept, secret)


CONTEXT_WF = """
name: big
params:
  api_token: {type: string}
steps:
  - id: s
    map: "{{ range(120) | list }}"
    prompt: "unit {{ item }} with {{ params.api_token }}"
"""


def test_a_loops_context_hash_is_keyed_when_its_templates_read_a_secret(tmp_path: Path) -> None:
    plan = load_workflow(CONTEXT_WF).plan
    secret = "ab1Zab1Z"
    hasher = InputHasher(Redactor([secret]), state_dir=tmp_path)

    def context(params: dict[str, str], with_hasher: InputHasher | None) -> str | None:
        units = build_units(
            plan,
            plan.steps[0],
            params=params,
            outputs={},
            loop=1,
            feedback=None,
            hasher=with_hasher,
        )
        return units.context_hash

    keyed = context({"api_token": secret}, hasher)
    assert keyed is not None
    assert keyed == context({"api_token": secret}, hasher)  # stable: a resume trusts it
    assert keyed != context({"api_token": secret}, None)  # not the plain sha256 of the repr
    assert keyed != context({"api_token": "Zb1aZb1a"}, hasher)
    # Without a secret in what the templates read, the context hash is the plain one.
    assert context({"api_token": "short"}, hasher) == context({"api_token": "short"}, None)
    units = build_units(
        plan,
        plan.steps[0],
        params={"api_token": secret},
        outputs={},
        loop=1,
        feedback=None,
        hasher=hasher,
    )
    assert units[7].input_hash != sha256_text(units[7].rendered.input_json)
    assert units[7].input_hashes == (units[7].input_hash, sha256_text(units[7].rendered.input_json))
    assert (
        "***" in units[7].rendered.hashed.kept_json
        and secret not in units[7].rendered.hashed.kept_json
    )


KNOWN = "s3cr3t-value-1"
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=20)
    | st.sampled_from([KNOWN, f"use {KNOWN} now", "password: hunter22", "api_key=abcdef12"])
)
JSON_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["prompt", "item", "api_key", "text", "n"]), inner, max_size=4
        )
    ),
    max_leaves=10,
)


@given(value=JSON_VALUES)
@settings(max_examples=100, deadline=None)
def test_any_value_is_keyed_exactly_when_the_journal_masks_something_in_it(
    value: object, tmp_path_factory: pytest.TempPathFactory
) -> None:
    redactor = Redactor([KNOWN])
    hasher = InputHasher(redactor, state_dir=tmp_path_factory.getbasetemp() / "any-value")
    hashed = hasher.hash_value(value)
    text = canonical_json(value)
    masked = redactor.redact_value(value) is not value
    assert hashed.text == text
    assert hashed.hash == (hasher.hash_value(value).hash)
    assert (hashed.hash != sha256_text(text)) is masked
    assert hashed.legacy == (sha256_text(text) if masked else None)
    assert KNOWN not in hashed.kept_json
    assert hashed.kept_json == canonical_json(redactor.redact_value(value))
