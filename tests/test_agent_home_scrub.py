"""An agent CLI's session transcripts in the run's isolated HOME hold the prompt, secrets and
all; ``sidecars.scrub_home`` masks them when the attempt ends, keeping each file readable by
the CLI (JSON stays JSON, line by line), and leaves binary and older files alone."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wf_magic.agents.sidecars import scrub_home
from wf_magic.redact import Redactor

SECRET = "s3cr3t-Vq8Lm2Zx"
REDACT = Redactor([SECRET]).redact_value

_words = st.text(alphabet='abc xyz\\"\n\t\u00e9', max_size=8)
_leaf = st.one_of(
    _words,
    st.builds(lambda a, b: f"{a}{SECRET}{b}", _words, _words),
    st.integers(),
    st.booleans(),
    st.none(),
)
_values = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_words, inner, max_size=3),
    max_leaves=8,
)


def _has_secret(value: Any) -> bool:
    return SECRET in json.dumps(value, ensure_ascii=False)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(_values, min_size=1, max_size=5), blob=_values, text=_words)
def test_every_secret_is_masked_and_json_stays_json(
    tmp_path: Path, lines: list[Any], blob: Any, text: str
) -> None:
    home = tmp_path / f"home-{time.monotonic_ns()}"
    (home / ".claude" / "projects" / "x").mkdir(parents=True)
    transcript = home / ".claude" / "projects" / "x" / "session.jsonl"
    transcript.write_text("".join(json.dumps(v) + "\n" for v in lines))
    config = home / ".gemini" / "chat.json"
    config.parent.mkdir()
    config.write_text(json.dumps(blob, ensure_ascii=True))  # escaped non-ASCII too
    notes = home / "notes.txt"
    notes.write_text(f"{text} token {SECRET} {text}")
    binary = home / "cache.bin"
    binary.write_bytes(b"\xff\xfe" + SECRET.encode())

    changed = scrub_home(home, REDACT, since=time.time() - 5)

    for path in (transcript, config, notes):
        assert SECRET not in path.read_text()
    kept = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert kept == [REDACT(v) for v in lines]
    assert json.loads(config.read_text()) == REDACT(blob)
    assert binary.read_bytes() == b"\xff\xfe" + SECRET.encode()  # not text: left alone
    expected = {"notes.txt"}
    if any(map(_has_secret, lines)):
        expected.add(".claude/projects/x/session.jsonl")
    if _has_secret(blob):
        expected.add(".gemini/chat.json")
    else:
        assert config.read_text() == json.dumps(blob, ensure_ascii=True)  # byte for byte
    assert set(changed) == expected


def test_files_older_than_the_attempt_and_symlinks_are_left_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    old = home / "old.jsonl"
    old.write_text(json.dumps({"p": SECRET}) + "\n")
    past = time.time() - 3600
    os.utime(old, (past, past))
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET)
    (home / "link.txt").symlink_to(outside)
    assert scrub_home(home, REDACT, since=time.time() - 5) == []
    assert SECRET in old.read_text()
    assert outside.read_text() == SECRET


def test_a_file_keeps_its_mode(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    transcript = home / "t.jsonl"
    transcript.write_text(json.dumps({"p": SECRET}) + "\n")
    transcript.chmod(0o600)
    assert scrub_home(home, REDACT, since=time.time() - 5) == ["t.jsonl"]
    assert transcript.stat().st_mode & 0o777 == 0o600
    assert json.loads(transcript.read_text()) == {"p": "***"}
