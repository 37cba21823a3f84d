"""Secrets stay out of what errors, verdicts and people write (issue 20, class 1).

The journal's own outputs were already redacted; these are the other ways text reaches a
row, an event, a frame or a terminal: a template error that quotes a value, a map value
clipped into a message, an ``expr`` gate's rendered criteria turned into feedback, a judge's
unparsable reply, a person's feedback, a validation error about an object param, a secret
``default:``. Each scenario is one such way, run through the real ``wf`` verbs with a
generated canary; afterwards the whole state dir (database, WAL, shm, as bytes), every frame,
``wf status``/``show``/``journal``/``events``/``export-cassette`` and everything each verb
printed are searched for the canary, for a clipped start of it, and for a kept end of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers_flow import use_runner
from tests.helpers_secrets import CANARY_RUNS, SECRETS, cli_shown, everything_shown, leaks, wf
from wf_magic import Engine, load_workflow
from wf_magic.errors import DefinitionError, UsageError
from wf_magic.redact import PIECE_MIN
from wf_magic.runners.base import UnitRequest

CANARY = "canary-2b7e0d91f4a6"
ECHO = {"scripted": {"rules": [{"match": ".", "reply": "echo: {{ prompt }}"}]}}


def _workflow(params: dict[str, Any], steps: list[dict[str, Any]], **extra: Any) -> str:
    """A workflow as JSON, which a YAML 1.2 loader reads as it is (no quoting of the canary).

    ASCII-escaped, but a character beyond the BMP as YAML's ``\\UXXXXXXXX``: JSON's
    surrogate pair would read as two lone surrogates.
    """
    text = json.dumps({"name": "leaky", "params": params, "steps": steps, **extra})
    return _PAIR.sub(lambda m: f"\\U{ord(json.loads(_QUOTE + m[0] + _QUOTE)):08x}", text)


_QUOTE = '"'
_PAIR = re.compile(r"\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}")


@dataclass
class Trial:
    """One scenario's run: its state dir, the runs it made, what it printed or raised."""

    state_dir: Path
    tmp: Path
    canary: str
    texts: list[str] = field(default_factory=list)

    def write(self, text: str) -> str:
        path = self.tmp / "flow.yaml"
        path.write_text(text, encoding="utf-8")
        return str(path)

    def wf(self, *args: str, expect: int) -> str:
        code, shown = wf(self.state_dir, *args)
        self.texts.append(shown)
        assert code == expect, shown
        return shown

    def run_id(self) -> str:
        with Engine(self.state_dir) as engine:
            return engine.list_runs()[0].run_id


def _param(name: str, value: Any) -> str:
    return f"{name}={value if isinstance(value, str) else json.dumps(value)}"


def template_error(t: Trial) -> None:
    """``'dict object' has no attribute '<secret>'`` in a step note and the run's reason."""
    flow = _workflow(
        {"api_key": {"type": "string"}, "conf": {"type": "object", "default": {}}},
        [{"id": "a", "prompt": "{{ params.conf[params.api_key] }}"}],
    )
    shown = t.wf("run", t.write(flow), "--param", _param("api_key", t.canary), expect=1)
    assert "has no attribute" in shown


def map_value_clipped(t: Trial) -> None:
    """``map must evaluate to a list (got str: '<secret>')``: a long secret, masked before the cut."""
    flow = _workflow(
        {"api_key": {"type": "string"}}, [{"id": "a", "map": "{{ params.api_key }}", "prompt": "x"}]
    )
    secret = t.canary + "-" + "z" * 90  # longer than the 80 characters the message keeps
    t.canary = secret
    shown = t.wf("run", t.write(flow), "--param", _param("api_key", secret), expect=1)
    assert "map must evaluate to a list (got str: '***')" in shown


def expr_criteria(t: Trial) -> None:
    """An ``expr`` gate's rendered criteria become the rejection feedback (and the prompt's)."""
    gate = {"judge": "expr", "check": "false", "criteria": ["use {{ params.api_key }}"]}
    flow = _workflow(
        {"api_key": {"type": "string"}},
        [{"id": "a", "prompt": "draft", "gate": {**gate, "max_loops": 2}}],
        runners=ECHO,
    )
    shown = t.wf("run", t.write(flow), "--param", _param("api_key", t.canary), expect=3)
    assert "gate exhausted after 2 loop(s); last feedback: use ***" in shown


def judge_reply_unparsable(t: Trial) -> None:
    """An ``llm`` judge's reply that is not JSON is quoted, clipped, in the failure."""
    rules = [
        {"match": "^Judge", "reply": "{{ prompt }}"},  # not JSON; quotes the criteria
        {"match": ".", "reply": "work"},
    ]
    t.canary += "-" + "z" * 90  # cut by the 120 characters of the reply the failure quotes
    gate = {"judge": "llm", "criteria": ["cite {{ params.api_key }} {{ params.api_key }}"]}
    flow = _workflow(
        {"api_key": {"type": "string"}},
        [{"id": "a", "prompt": "draft", "gate": gate}],
        runners={"scripted": {"rules": rules}},
    )
    shown = t.wf("run", t.write(flow), "--param", _param("api_key", t.canary), expect=3)
    assert "judge reply is not JSON" in shown


def human_feedback(t: Trial) -> None:
    """A person's feedback: the secret itself (this engine was handed it) and a key's shape."""
    credential = "sk-live-" + hashlib.sha256(t.canary.encode()).hexdigest()[:32]
    flow = _workflow(
        {"api_key": {"type": "string"}},
        [{"id": "a", "prompt": "draft", "gate": {"judge": "human", "max_loops": 3}}],
        runners=ECHO,
    )
    with Engine(t.state_dir) as engine:
        run = engine.run(flow, params={"api_key": t.canary})
        engine.reject(run.run_id, "a", feedback=f"do not paste {t.canary} here")
        engine.drive(run.run_id)
    t.wf("reject", run.run_id, "a", "--feedback", f"api_key={credential}", expect=0)
    t.wf("resume", run.run_id, "--param", _param("api_key", t.canary), expect=3)
    with Engine(t.state_dir) as engine:
        kept = [a.output_json or "" for a in engine.attempts(run.run_id) if a.runner == "human"]
    assert [json.loads(k)["feedback"] for k in kept] == ["do not paste *** here", "api_key=***"]
    assert credential[8:] not in "".join(t.texts)


def nested_validation(t: Trial) -> None:
    """A secret inside an object param, echoed by its validation error (CLI and Python)."""
    schema = {"type": "object", "properties": {"gh_token": {"type": "integer"}}}
    flow = _workflow({"conf": schema}, [{"id": "a", "prompt": "hi"}])
    conf = {"gh_token": t.canary}
    shown = t.wf("run", t.write(flow), "--param", _param("conf", conf), expect=2)
    assert "param conf: '***' is not of type 'integer'" in shown
    with Engine(t.state_dir) as engine, pytest.raises(UsageError) as raised:
        engine.start(flow, params={"conf": conf})
    t.texts.append(str(raised.value))


def nested_param_echoed(t: Trial) -> None:
    """A secret inside an object param reaches the prompt; the runner echoes it back."""
    schema = {"type": "object", "properties": {"gh_token": {"type": "string"}}}
    flow = _workflow(
        {"conf": schema},
        [{"id": "a", "prompt": "token {{ params.conf.gh_token }}"}],
        runners=ECHO,
    )
    shown = t.wf("run", t.write(flow), "--param", _param("conf", {"gh_token": t.canary}), expect=0)
    assert "echo: token ***" in shown


def secret_default(t: Trial) -> None:
    """A secret param's ``default:`` would be frozen into the plan: refused, nothing written."""
    flow = _workflow(
        {"api_key": {"type": "string", "default": t.canary}}, [{"id": "a", "prompt": "hi"}]
    )
    shown = t.wf("run", t.write(flow), expect=2)
    assert "params.api_key.default: a secret default would be frozen into the plan" in shown


SCENARIOS: dict[str, Callable[[Trial], None]] = {
    f.__name__: f
    for f in (
        template_error,
        map_value_clipped,
        expr_criteria,
        judge_reply_unparsable,
        human_feedback,
        nested_validation,
        nested_param_echoed,
        secret_default,
    )
}


def _needles(canary: str) -> list[str]:
    """The canary, and the clipped start and kept end of it a message could hold."""
    return [canary, canary[:PIECE_MIN], canary[-PIECE_MIN:]]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@settings(CANARY_RUNS, max_examples=3)
@given(secret=SECRETS)
def test_a_canary_reaches_no_row_event_frame_or_terminal(scenario: str, secret: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trial = Trial(state_dir=Path(tmp) / "state", tmp=Path(tmp), canary=f"⟪canary{secret}⟫")
        SCENARIOS[scenario](trial)
        texts = list(trial.texts)
        if (trial.state_dir / "state.db").exists():
            with Engine(trial.state_dir) as engine:
                run_ids = [r.run_id for r in engine.list_runs(include_children=True)]
                texts += [everything_shown(engine, run_id) for run_id in run_ids]
            texts += [cli_shown(trial.state_dir, run_id) for run_id in run_ids]
        found = {n: leaks(n, trial.state_dir, texts) for n in _needles(trial.canary)}
        assert found == {n: [] for n in _needles(trial.canary)}


# -- a secret cut at a clip boundary (issue 20 class 1: redact before clipping) ----------------
CLIP_SECRETS = st.text(alphabet="GHJKLMNPQRSTVWXZ", min_size=8, max_size=40)
"""Secrets of every length from MIN_SECRET_LEN, in letters no message, id or hash is made of,
so any piece of PIECE_MIN of them found anywhere is a leak."""
MAP_CLIP = 80
"""What ``map must evaluate to a list (got str: '…')`` keeps of the value."""


def map_clipped_inside(t: Trial, pad: int, post: int) -> None:
    """A map value whose 80-character cut may land inside the secret, anywhere in it."""
    source = f"{{{{ 'x' * {pad} ~ params.api_key ~ 'y' * {post} }}}}"
    flow = _workflow({"api_key": {"type": "string"}}, [{"id": "a", "map": source, "prompt": "x"}])
    shown = t.wf("run", t.write(flow), "--param", _param("api_key", t.canary), expect=1)
    assert "map must evaluate to a list (got str: 'xxx" in shown


def stderr_tail_inside(t: Trial, pad: int, post: int) -> None:
    """An exec step's stderr whose 2000-character tail may start inside an env secret."""
    script = (
        f"head -c {pad} /dev/zero | tr '\\0' x >&2; printf %s \"$DEPLOY_TOKEN\" >&2; "
        f"head -c {post} /dev/zero | tr '\\0' y >&2; exit 3"
    )
    flow = _workflow(
        {}, [{"id": "a", "exec": ["/bin/sh", "-c", script], "pass_env": ["DEPLOY_TOKEN"]}]
    )
    with mock.patch.dict(os.environ, {"DEPLOY_TOKEN": t.canary}):
        shown = t.wf("run", t.write(flow), expect=1)
    assert "exited with status 3; stderr: " in shown


CLIPPED_AT = {
    # (scenario, padding before the secret, padding after it): the cut sweeps the secret.
    # The cut keeps 0 to 17 characters of the secret: past PIECE_MIN and past PREFIX_MIN.
    "map": (map_clipped_inside, st.integers(MAP_CLIP - 18, MAP_CLIP - 1), st.integers(0, 20)),
    "stderr": (stderr_tail_inside, st.integers(0, 30), st.integers(2000 - 17, 2000)),
}


@pytest.mark.parametrize("where", sorted(CLIPPED_AT))
@settings(CANARY_RUNS, max_examples=10)
@given(secret=CLIP_SECRETS, data=st.data())
def test_no_piece_of_a_secret_survives_a_clip_in_any_row_event_or_terminal(
    where: str, secret: str, data: st.DataObject
) -> None:
    # Whatever the padding, the clip lands before, inside (any offset) or after the secret;
    # status_reason, notes, events, attempts.failure, every verb's output and stderr are read.
    scenario, pads, posts = CLIPPED_AT[where]
    pad, post = data.draw(pads, label="pad"), data.draw(posts, label="post")
    with tempfile.TemporaryDirectory() as tmp:
        trial = Trial(state_dir=Path(tmp) / "state", tmp=Path(tmp), canary=secret)
        scenario(trial, pad, post)
        texts = list(trial.texts)
        with Engine(trial.state_dir) as engine:
            [run] = engine.list_runs()
            texts += [everything_shown(engine, run.run_id), run.status_reason or ""]
            texts += [a.failure or "" for a in engine.attempts(run.run_id)]
            texts += [s.note or "" for s in engine.steps(run.run_id)]
        texts.append(cli_shown(trial.state_dir, run.run_id))
        found = {n: leaks(n, trial.state_dir, texts) for n in _needles(secret)}
        assert found == {n: [] for n in _needles(secret)}


# -- a secret default is refused at freeze, like a secret runner option -------------------------
DEFAULTS_REFUSED = [
    ("api_key", {"type": "string", "default": "hunter2-hunter2"}, "params.api_key.default"),
    ("pin_token", {"type": "integer", "default": 12345678}, "params.pin_token.default"),
    ("conf", {"type": "object", "default": {"gh_token": "abcdefgh1"}}, "params.conf.default"),
    (
        "conf",
        {"type": "object", "properties": {"gh_token": {"type": "string", "default": "x" * 9}}},
        "params.conf.properties.gh_token.default",
    ),
    (
        "header",
        {"type": "string", "default": "Bearer abc123def456ghi789jk"},
        "params.header.default",
    ),
    ("keys", {"type": "array", "default": ["sk-live-0123456789abcdefghij"]}, "params.keys.default"),
]
DEFAULTS_KEPT = [
    ("api_key", {"type": "string", "default": ""}),
    ("api_key", {"type": "string", "default": "none"}),  # a placeholder, under MIN_SECRET_LEN
    ("auth", {"type": "boolean", "default": False}),
    ("db_password", {"type": ["string", "null"], "default": None}),
    ("max_tokens", {"type": "integer", "default": 123456789}),
    ("topic", {"type": "string", "default": "tokens and passwords"}),
]


@pytest.mark.parametrize(("name", "schema", "field"), DEFAULTS_REFUSED)
def test_a_secret_default_is_refused_at_freeze(name: str, schema: Any, field: str) -> None:
    flow = _workflow({name: schema}, [{"id": "a", "prompt": "hi"}])
    with pytest.raises(DefinitionError) as raised:
        load_workflow(flow)
    secret_name = name in ("api_key", "pin_token")  # WF_PARAM_<NAME> is read for those only
    env = f", or the environment variable WF_PARAM_{name.upper()}" if secret_name else ""
    assert str(raised.value) == (
        f"{field}: a secret default would be frozen into the plan, in the clear; remove it "
        f"and pass the value when the run starts (`--param {name}=VALUE`, params= in "
        f"Python{env}) (<workflow>, line 1)"
    )


@pytest.mark.parametrize(("name", "schema"), DEFAULTS_KEPT)
def test_a_default_that_hides_nothing_is_kept(name: str, schema: Any) -> None:
    flow = _workflow({name: schema}, [{"id": "a", "prompt": "hi"}])
    assert load_workflow(flow).plan.params[name]["default"] == schema["default"]


def test_observers_see_notes_and_reasons_as_the_journal_keeps_them(state_dir: Path) -> None:
    flow = _workflow(
        {"api_key": {"type": "string"}, "conf": {"type": "object", "default": {}}},
        [{"id": "a", "prompt": "{{ params.conf[params.api_key] }}"}],
    )
    seen: list[str] = []
    with Engine(state_dir) as engine:
        engine.subscribe(lambda event: seen.append(json.dumps(event.data, ensure_ascii=False)))
        run = engine.run(flow, params={"api_key": CANARY})
    assert run.status == "failed"
    assert any("has no attribute '***'" in s for s in seen), seen
    assert not [s for s in seen if CANARY in s]


def test_the_cli_masks_an_environment_secret_in_any_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEPLOY_TOKEN", CANARY)
    missing = tmp_path / CANARY / "flow.yaml"  # an error naming a path that holds the secret
    code, shown = wf(tmp_path / "state", "run", str(missing))
    assert code == 2, shown
    assert CANARY not in shown and "***" in shown


def test_feedback_masked_in_the_journal_is_the_feedback_the_next_loop_was_sent(
    state_dir: Path,
) -> None:
    # The next loop's prompts (and input hashes) carry the rejection's feedback; a resume
    # rebuilds them from the journaled, masked verdict, so the drive must use that one too:
    # else a loop stopped midway re-dispatches its done units.
    stop = threading.Event()

    def reply(request: UnitRequest) -> str:
        if "Gate feedback" in (request.prompt or ""):
            stop.set()  # stop after this unit: the loop's second unit is owed
            return "fixed"
        return "draft"

    seen = use_runner("feedback-echo", reply)
    gate = {
        "judge": "expr",
        "check": "output | select('equalto', 'fixed') | list | length == 2",
        "criteria": ["use {{ params.api_key }} and fix it"],
        "max_loops": 3,
    }
    flow = _workflow(
        {"api_key": {"type": "string"}},
        [{"id": "a", "map": "{{ [1, 2] }}", "prompt": "draft {{ item }}", "gate": gate}],
        runner="feedback-echo",
        execution={"max_concurrency": 1},
    )
    with Engine(state_dir) as engine:
        run_id = engine.run(flow, params={"api_key": CANARY}, signal=stop).run_id
        assert engine.handle(run_id).status == "active"
        done = engine.drive(run_id, params={"api_key": CANARY})
        work = [a for a in engine.attempts(run_id) if a.phase == "work"]

    assert done.status == "completed"
    assert [(a.unit_id, a.loop, a.status) for a in work] == [
        ("a[0]", 1, "succeeded"),
        ("a[1]", 1, "succeeded"),
        ("a[0]", 2, "succeeded"),
        ("a[1]", 2, "succeeded"),
    ]
    assert all("use *** and fix it" in p for p in seen.prompts()[2:]), seen.prompts()


@pytest.mark.parametrize("secret", ["vault0f3b9d2e7c41aa", "pw-12345", "s3cr"])
def test_a_secret_pasted_into_feedback_elsewhere_is_found_by_its_seal(
    tmp_path: Path, secret: str
) -> None:
    # `wf reject` runs in another process than the run's start: the value was never stored,
    # but each word of the feedback is checked against the run's seals.
    state = tmp_path / "state"
    flow = _workflow(
        {"api_key": {"type": "string"}},
        [{"id": "a", "prompt": "draft", "gate": {"judge": "human", "max_loops": 2}}],
        runners=ECHO,
    )
    path = tmp_path / "flow.yaml"
    path.write_text(flow, encoding="utf-8")
    assert wf(state, "run", str(path), "--param", f"api_key={secret}")[0] == 3
    with Engine(state) as engine:
        run_id = engine.list_runs()[0].run_id
    code, shown = wf(state, "reject", run_id, "a", "--feedback", f"use ({secret}), not this")
    assert code == 0, shown
    with Engine(state) as engine:
        [verdict] = [a for a in engine.attempts(run_id) if a.runner == "human"]
    feedback = json.loads(verdict.output_json or "{}")["feedback"]
    # A value shorter than 8 characters is not masked inside text (MIN_SECRET_LEN).
    assert feedback == (f"use ({secret}), not this" if len(secret) < 8 else "use (***), not this")
