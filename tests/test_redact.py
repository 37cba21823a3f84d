"""Redaction: secret values and credential shapes never reach the journal."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from wf_magic.redact import (
    MASK,
    MIN_SECRET_LEN,
    PIECE_MIN,
    PREFIX_MIN,
    Redactor,
    is_secret_key,
    looks_secret,
    secret_strings,
)

CANARY = "canary-5e1f0c9a7d"


def test_secret_looking_environment_values_are_masked() -> None:
    redactor = Redactor.from_environ({"MY_API_KEY": CANARY, "HOME": "/home/someone-long"})
    assert redactor.redact(f"key={CANARY}!") == "key=***!"
    assert redactor.redact("home is /home/someone-long") == "home is /home/someone-long"


@pytest.mark.parametrize(
    "name",
    [
        "OPENAI_API_KEY",
        "GH_TOKEN",
        "CLIENT_SECRET",
        "DB_PASSWORD",
        "PASSWD",
        "GOOGLE_CREDENTIALS",
        "BASIC_AUTH",
        "aws_secret_access_key",
    ],
)
def test_secret_looking_names(name: str) -> None:
    assert looks_secret(name)


@pytest.mark.parametrize("name", ["HOME", "PATH", "LANG", "topic", "sections"])
def test_plain_names(name: str) -> None:
    assert not looks_secret(name)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("api_key", True),
        ("db_password", True),
        ("githubToken", True),
        ("secret", True),
        ("keywords", False),
        ("author", False),
        ("max_tokens", False),
        ("token_budget", False),
    ],
)
def test_secret_keys_must_end_in_a_secret_word(name: str, expected: bool) -> None:
    assert is_secret_key(name) is expected


def test_short_values_are_not_treated_as_secrets() -> None:
    redactor = Redactor.from_environ({"USE_AUTH": "true", "TOKEN_LIMIT": "1000"})
    assert redactor.secret_count == 0
    assert redactor.redact("true 1000") == "true 1000"


def test_extra_secrets_such_as_secret_params_are_masked() -> None:
    redactor = Redactor.from_environ({}, extra=["hunter2-hunter2"]).with_secrets(["s3cr3t-value"])
    assert redactor.redact("hunter2-hunter2 and s3cr3t-value") == "*** and ***"


def test_a_secret_containing_another_is_masked_whole() -> None:
    redactor = Redactor(["abcdefgh", "abcdefgh-ijkl"])
    assert redactor.redact("[abcdefgh-ijkl] [abcdefgh]") == "[***] [***]"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer eyJhbGciOi.JIUzI1NiJ9.abc123", "Authorization: Bearer ***"),
        ("key sk-proj-AbCdEfGhIjKlMnOpQrStUv in a log", "key sk-*** in a log"),
        ("api_key=abc123def456&x=1", "api_key=***&x=1"),
        ('{"api_key": "abc123def456"}', '{"api_key": "***"}'),
        ("OPENAI_API_KEY=zzzzzzzzzzzz", "OPENAI_API_KEY=***"),
        ("password: correct-horse", "password: ***"),
        ("https://bob:pa55w0rd@db.example/x", "https://bob:***@db.example/x"),
        ("ghp_0123456789abcdefghijABCDEFGHIJ012345", "ghp_***"),
        ("AKIAIOSFODNN7EXAMPLE", "AKIA***"),
    ],
)
def test_credential_shapes_are_scrubbed(text: str, expected: str) -> None:
    assert Redactor().redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens: 3000",
        '{"tokens_in": 120, "tokens_out": 30}',
        "token_count=123456",
        "A basic understanding of tides.",
        "The task-oriented-dialogue-system works.",
        "keywords: oceanography",
        "",
    ],
)
def test_ordinary_text_is_returned_unchanged_and_uncopied(text: str) -> None:
    assert Redactor(["unrelated-secret"]).redact(text) is text


def test_redact_value_walks_json_values() -> None:
    redactor = Redactor([CANARY])
    value = {
        "sections": [f"leaked {CANARY}", "clean"],
        "api_key": "short",
        "author": "Ada",
        "keywords": ["tides"],
        "tokens_in": 12,
        "nested": ({"password": "pw"}, None, 3.5),
    }
    assert redactor.redact_value(value) == {
        "sections": [f"leaked {MASK}", "clean"],
        "api_key": MASK,
        "author": "Ada",
        "keywords": ["tides"],
        "tokens_in": 12,
        "nested": ({"password": MASK}, None, 3.5),
    }


def test_redact_value_returns_clean_values_uncopied() -> None:
    value = {"sections": ["a", "b"], "n": 3, "nested": {"items": [1, 2, ("x",)]}}
    assert Redactor([CANARY]).redact_value(value) is value


secrets = st.text(min_size=8, max_size=40)


@given(secret=secrets, before=st.text(max_size=60), after=st.text(max_size=60))
def test_redacted_text_never_contains_the_secret(secret: str, before: str, after: str) -> None:
    redacted = Redactor([secret]).redact(before + secret + after + secret)
    assert secret not in redacted


@given(
    secret_list=st.lists(secrets, min_size=1, max_size=4),
    pieces=st.lists(st.one_of(st.text(max_size=20), st.integers(0, 3)), max_size=10),
)
def test_redacted_text_never_contains_any_of_several_secrets(
    secret_list: list[str], pieces: list[str | int]
) -> None:
    text = "".join(secret_list[p % len(secret_list)] if isinstance(p, int) else p for p in pieces)
    redacted = Redactor(secret_list).redact(text)
    assert not [s for s in secret_list if s in redacted]


@given(
    secret=st.text(alphabet="ab*", min_size=8, max_size=12),
    noise=st.text(alphabet="ab*", max_size=12),
)
def test_masking_cannot_splice_a_secret_back_together(secret: str, noise: str) -> None:
    assert secret not in Redactor([secret]).redact(noise + secret + noise)


@given(
    secret=secrets,
    value=st.recursive(
        st.one_of(st.none(), st.integers(), st.text(max_size=20)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    ),
)
def test_redacted_values_never_contain_the_secret(secret: str, value: object) -> None:
    wrapped = {"payload": value, "leak": f"x{secret}y", "list": [secret]}
    redacted = Redactor([secret]).redact_value(wrapped)
    assert not [s for s in _strings(redacted) if secret in s]


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


# -- clipped pieces, escaped forms (issue 20) -------------------------------------------------
LONG = "vault-a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5"
"""A known secret without a credential shape, so only its being known masks it."""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"got '{LONG[:12]}…'", "got '***…'"),  # the issue's example: a start cut at a clip
        (f"got {LONG[:20]}...", "got ***..."),
        (f"reply: {LONG[:25]}", "reply: ***"),  # the end of the text (a stream so far)
        (repr(LONG[:14]), "'***'"),  # a value clipped, then quoted
        (json.dumps({"x": LONG[:30] + "…"}), '{"x": "***\\u2026"}'),
        (f"{LONG[9:]} exited", "*** exited"),  # a tail kept: the start of a text
        (f"stderr: …{LONG[5:]}", "stderr: …***"),
        # Touching an ellipsis, any piece of PIECE_MIN characters or more: a cut is there.
        (f"keys look like {LONG[:8]}…", "keys look like ***…"),
        (f"{LONG[:11]}…", "***…"),
        (f"{LONG[:4]}...", "***..."),
        (f"x…{LONG[-4:]}", "x…***"),
        (f"…{LONG[-10:]} exited", "…*** exited"),
        (json.dumps({"x": "…" + LONG[-6:]}), '{"x": "\\u2026***"}'),
        (f"…{LONG[:7]}…{LONG[-5:]}", "…***…***"),
    ],
)
def test_a_clipped_piece_of_a_known_secret_is_masked(text: str, expected: str) -> None:
    assert Redactor([LONG]).redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        f"keys look like {LONG[:8]}",  # no clip mark: shorter than PREFIX_MIN
        f"{LONG[:3]}…",  # shorter than PIECE_MIN at an ellipsis
        f"…{LONG[-3:]}",
        f"{LONG[1:9]}…",  # not a start of the secret, though touching an ellipsis
        f"…{LONG[3:9]} more",  # not an end of it
        f"{LONG[:16]} and more",  # not at a clip: text that merely starts the same
        f"the end {LONG[-11:]}",
    ],
)
def test_short_or_unclipped_pieces_are_left_alone(text: str) -> None:
    assert Redactor([LONG]).redact(text) is text


@given(
    secret=st.text(min_size=PREFIX_MIN + 1, max_size=60),
    cut=st.integers(PREFIX_MIN, 60),
    before=st.text(max_size=20),
    mark=st.sampled_from(["…", "...", "'", '"', ""]),
)
def test_no_clip_of_a_secret_at_or_past_the_minimum_survives(
    secret: str, cut: int, before: str, mark: str
) -> None:
    piece = secret[: min(cut, len(secret))]
    redacted = Redactor([secret]).redact(before + piece + mark)
    assert piece not in redacted


@given(
    secret=st.text(min_size=MIN_SECRET_LEN, max_size=60),
    cut=st.integers(PIECE_MIN, 60),
    before=st.text(max_size=20),
    after=st.text(max_size=20),
    mark=st.sampled_from(["…", "...", "\\u2026"]),
    keep=st.sampled_from(["start", "end"]),
)
def test_no_piece_of_a_secret_touching_an_ellipsis_survives(
    secret: str, cut: int, before: str, after: str, mark: str, keep: str
) -> None:
    # What a clipper leaves: the start of a secret then the mark, or the mark then its end.
    n = min(cut, len(secret))
    assume("\0" not in secret and mark not in secret)
    assume(secret[:n] not in before + after and secret[-n:] not in before + after)
    if keep == "start":
        piece, text = secret[:n], before + secret[:n] + mark + after
    else:
        piece, text = secret[-n:], before + mark + secret[-n:] + after
    redacted = Redactor([secret]).redact(text)
    assert piece not in redacted.replace(MASK, "\0")


@given(secret=st.text(min_size=MIN_SECRET_LEN, max_size=40), before=st.text(max_size=10))
def test_a_secret_is_masked_in_every_form_a_message_or_json_column_quotes_it(
    secret: str, before: str
) -> None:
    redactor = Redactor([secret])
    quoted = [
        json.dumps({"v": before + secret}),
        json.dumps({"v": before + secret}, ensure_ascii=False),
        repr(before + secret),
        " ".join((before + secret).split()),
    ]
    for text in quoted:
        for form in (json.dumps(secret)[1:-1], repr(secret)[1:-1], secret):
            if len(form) >= MIN_SECRET_LEN:
                assert form not in redactor.redact(text), text


def test_secret_strings_finds_secrets_at_any_depth() -> None:
    params = {
        "topic": "cats",
        "api_key": "k" * 9,
        "conf": {"gh_token": "t" * 9, "depth": 2, "db": {"password": ["p1", 12345678]}},
        "auth": True,
    }
    assert secret_strings(params) == ["k" * 9, "t" * 9, "p1", "12345678"]
    assert secret_strings(["a", {"b": 1.5}], secret=True) == ["a", "1.5"]
