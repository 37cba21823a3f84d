"""Credential shapes anywhere inside a word (issue 31, item 3): the one redactor masks a value
named by a secret word whatever separates, quotes or nests it — in a URL's query, a JSON
string, JSON inside JSON, a YAML line, a query string, prose, a command line, a header — and
leaves innocent text (``max_tokens=5``, ``keywords: …``, ``author: …``) as it was.

The generators below combine credential names × separators × quoting × nesting, so the
next shape of the class is found here, not by a user.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers_secrets import files_holding, wf
from wf_magic import Engine
from wf_magic.redact import MASK, Redactor, mask_url

SHAPES = Redactor()
"""No known secrets: only the credential shapes can mask anything."""

NAMES = [
    "api_key",
    "apiKey",
    "API-KEY",
    "x-api-key",
    "OPENAI_API_KEY",
    "access_token",
    "accessToken",
    "private_token",
    "PRIVATE-TOKEN",
    "refresh_token",
    "GH_TOKEN",
    "token",
    "password",
    "db_password",
    "PGPASSWORD",
    "passwd",
    "pwd",
    "Pwd",
    "secret",
    "client_secret",
    "secret_key",
    "aws_secret_access_key",
    "credentials",
    "auth",
    "Authorization",
]
SEPARATORS = ["=", ":", ": ", " = ", " : ", "=>", " => ", ":=", "\t=\t", "%3D", "%3a"]
QUOTES = ["", '"', "'", "`"]
SCHEMES = ["", "Bearer ", "Basic ", "token ", "bearer\t"]
SECRET_VALUES = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~+/=!@$%^*:-",
    min_size=8,
    max_size=40,
).filter(lambda v: sum(c.isalnum() for c in v) >= 6)
"""What a token, key or password looks like: no quote, space, backslash, ``&``, ``,``, ``;``,
``#`` or ``?`` (those end a value in the contexts below, as they do in real ones)."""


def _json_string(text: str) -> str:
    return json.dumps({"config": text})


NESTINGS: dict[str, Callable[[str], str]] = {
    "bare": lambda pair: pair,
    "prose": lambda pair: f"The call failed with {pair} as given, retry later.",
    "url query": lambda pair: f"GET https://api.example.org/v1/items?{pair}",
    "url query, later param": lambda pair: f"https://h.example/x?page=2&{pair}&limit=5",
    "url in a param": lambda pair: f"url=https://h.example/p?q=1&{pair}",
    "query string ;": lambda pair: f"Server=db;Database=x;{pair};Encrypt=yes",
    "json string": _json_string,
    "json in json": lambda pair: json.dumps({"body": _json_string(pair)}),
    "json in json in json": lambda pair: json.dumps({"a": json.dumps({"b": _json_string(pair)})}),
    "yaml line": lambda pair: f"service:\n  name: ingest\n  {pair}\n  retries: 3\n",
    "python repr": lambda pair: repr({"settings": pair, "n": 3}),
    "markdown code": lambda pair: f"Run `{pair}` first.",
    "parenthesised": lambda pair: f"(see {pair})",
    "header line": lambda pair: f"> {pair}\r\n",
    "after a word": lambda pair: f"config:{pair}",
}


SHORT_VALUES = st.from_regex(r"Q[a-z0-9._~+/=!@$%^*-]{0,4}", fullmatch=True)
"""Values under six characters (``pass1``, ``abc``): masked at any length. Each starts with
``Q``, which no name or nesting holds, so ``"Q" not in redacted`` says the value is gone."""
LABELS = frozenset({":", ": ", " : ", "%3a"})
"""Separators that label (``name: value``) rather than assign (``name=value``)."""
FOLLOWED_BY_WORDS = frozenset({"prose"})
"""Nestings that put more words after the pair on its line."""


STRONG = re.compile(r"(?i)(?:password|passwd|passphrase|pwd|secret|credentials?)\b")
"""Names whose label is always followed by a value (redact_shapes._STRONG_NAME)."""


def reads_as_prose(value: str, *, name: str, sep: str, quote: str, nesting: str) -> bool:
    """The rule of redact_shapes._is_value, stated for the generator: after a key or token label
    (``name:``) an unquoted word of letters alone followed by another word on its line starts
    a sentence (an error's prose: ``params.api_key: unknown JSON Schema keyword(s)``) and is
    kept; after a password, passphrase, secret or credential label it is a value; every
    other value, at any length, is masked."""
    return (
        sep in LABELS
        and not quote
        and value.rstrip(".!?:").isalpha()
        and nesting in FOLLOWED_BY_WORDS
        and STRONG.search(name) is None
    )


@st.composite
def credential_texts(draw: st.DrawFn) -> tuple[str, str, str]:
    """A text holding one credential, its value, and the name that labels it."""
    text, value, name, _masked = draw(credential_cases())
    return text, value, name


@st.composite
def credential_cases(draw: st.DrawFn) -> tuple[str, str, str, bool]:
    """A text holding one credential, its value, its name, and whether it must be masked."""
    name = draw(st.sampled_from([*NAMES, "passphrase", "X-Amz-Signature", "signature"]))
    value = draw(SECRET_VALUES | SHORT_VALUES)
    sep = draw(st.sampled_from(SEPARATORS))
    quote = draw(st.sampled_from(QUOTES))
    key_quote = draw(st.sampled_from(["", quote])) if quote else ""
    scheme = draw(st.sampled_from(SCHEMES)) if name.lower() in ("authorization", "auth") else ""
    pair = f"{key_quote}{name}{key_quote}{sep}{quote}{scheme}{value}{quote}"
    nesting = draw(st.sampled_from(sorted(NESTINGS)))
    masked = not reads_as_prose(value, name=name, sep=sep, quote=quote, nesting=nesting)
    return NESTINGS[nesting](pair), value, name, masked


@settings(max_examples=600)
@given(case=credential_cases())
def test_a_value_named_by_a_secret_word_is_masked_however_it_is_separated_quoted_and_nested(
    case: tuple[str, str, str, bool],
) -> None:
    text, value, name, masked = case
    redacted = SHAPES.redact(text)
    if not masked:  # the first word of a sentence after a label: prose, kept
        assert redacted is text
        return
    gone = "Q" if value.startswith("Q") else value
    assert gone not in redacted, (text, redacted)
    assert MASK in redacted
    assert name in redacted  # the label stays: a redacted message still says what was there


@settings(max_examples=200)
@given(case=credential_texts())
def test_masking_is_idempotent_and_keeps_json_valid(case: tuple[str, str, str]) -> None:
    text, _value, _name = case
    once = SHAPES.redact(text)
    assert SHAPES.redact(once) == once
    try:
        original = json.loads(text)
    except ValueError:
        return
    assert json.loads(once).keys() == original.keys()  # a JSON column stays JSON


@settings(max_examples=200)
@given(
    name=st.sampled_from(["--password", "--api-key", "--token", "--db-password", "--auth"]),
    # ``--password =x`` reads as an assignment (``password =x``)
    value=SECRET_VALUES.filter(lambda v: not v.startswith(("-", "="))),
    before=st.sampled_from(["", "wf run flow.yaml ", "error: mycli "]),
    after=st.sampled_from(["", " --verbose", " and more"]),
)
def test_a_command_line_option_naming_a_secret_has_its_value_masked(
    name: str, value: str, before: str, after: str
) -> None:
    text = f"{before}{name} {value}{after}"
    redacted = SHAPES.redact(text)
    assert value not in redacted
    assert redacted.startswith(f"{before}{name} ") and redacted.endswith(f"{MASK}{after}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the issue's shapes, each as it was written there
        ("https://h/x?api_key=abc123def456", "https://h/x?api_key=***"),
        ("see https://h/x?access_token=ya29.a0AfH6&y=2", "see https://h/x?access_token=***&y=2"),
        ('"config": "password=hunter2hunter2"', '"config": "password=***"'),
        ("url=https://h/x&private_token=glpat-xxxxxxxx", "url=https://h/x&private_token=***"),
        ("password: correct-horse", "password: ***"),
        ("Authorization: Bearer abcdefghij", "Authorization: Bearer ***"),
        ('{"Authorization": "Basic dXNlcjpwYXNz"}', '{"Authorization": "Basic ***"}'),
        ('{"password": "correct horse battery"}', '{"password": "***"}'),
        ('{"password": "it\'s a secret"}', '{"password": "***"}'),
        ('{"msg": "password: \'oops", "n": 1}', '{"msg": "password: \'***", "n": 1}'),
        ('{\\"api_key\\": \\"abc123xyz\\", \\"n\\": 1}', '{\\"api_key\\": \\"***\\", \\"n\\": 1}'),
        ("redis://:s3cretpass@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://app:p@ss@db/prod", "postgresql://app:***@db/prod"),
        ("--password hunter22 --token --api-key xyz12345", "--password *** --token --api-key ***"),
        ("$ export PGPASSWORD=Sup3rS3cret", "$ export PGPASSWORD=***"),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEow1BAAK\nCAQEA+x/9==\n-----END RSA PRIVATE KEY-----",
            "-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----",
        ),
        (
            json.dumps(
                {"key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADAN\n-----END PRIVATE KEY-----\n"}
            ),
            '{"key": "-----BEGIN PRIVATE KEY-----***-----END PRIVATE KEY-----\\n"}',
        ),
    ],
)
def test_the_shapes_the_issue_names(text: str, expected: str) -> None:
    assert SHAPES.redact(text) == expected


URL_PARAM_NAMES = [
    "key",
    "sig",
    "X-Amz-Signature",
    "X-Goog-Signature",
    "signature",
    "api_key",
    "access_token",
    "passphrase",
]
URL_SHAPES: dict[str, Callable[[str], str]] = {
    "connect error": lambda url: f"openai runner: unit a (model m at {url}) could not connect",
    "quoted": lambda url: f"fetching '{url}' failed",
    "json": lambda url: json.dumps({"url": url, "n": 1}),
    "angle": lambda url: f"see <{url}> for details",
    "line end": lambda url: f"base_url = {url}\nretries = 3",
}


@settings(max_examples=400)
@given(
    name=st.sampled_from(URL_PARAM_NAMES),
    value=SHORT_VALUES | SECRET_VALUES.map(lambda v: "Q" + v.replace("=", "")),
    scheme=st.sampled_from(["http", "https", "postgresql"]),
    before=st.sampled_from(["", "page=2&", "a=1;"]),
    after=st.sampled_from(["", "&limit=5", "#top"]),
    shape=st.sampled_from(sorted(URL_SHAPES)),
)
def test_a_urls_credential_parameters_are_masked_in_free_text_as_mask_url_masks_them(
    name: str, value: str, scheme: str, before: str, after: str, shape: str
) -> None:
    url = f"{scheme}://127.0.0.1:1/v1?{before}{name}={value}{after}"
    text = URL_SHAPES[shape](url)
    redacted = SHAPES.redact(text)
    assert "Q" not in redacted, (text, redacted)
    assert "Q" not in mask_url(url)
    assert "127.0.0.1:1/v1?" in redacted and f"{name}={MASK}" in redacted


@settings(max_examples=200)
@given(
    tag=st.sampled_from(["password", "db_password", "secret", "api_key", "token", "passphrase"]),
    prefix=st.sampled_from(["", "ns:"]),
    attrs=st.sampled_from(["", ' type="string"', "\tid='1'"]),
    value=SHORT_VALUES | st.from_regex(r"Q[a-z0-9 .,!?-]{0,30}", fullmatch=True),
    nesting=st.sampled_from(["bare", "prose", "json string"]),
)
def test_an_xml_element_named_by_a_secret_word_has_its_text_masked(
    tag: str, prefix: str, attrs: str, value: str, nesting: str
) -> None:
    text = NESTINGS[nesting](f"<{prefix}{tag}{attrs}>{value}</{prefix}{tag}>")
    redacted = SHAPES.redact(text)
    assert "Q" not in redacted and f"{MASK}</{prefix}{tag}>" in redacted, (text, redacted)


FIELD_NAMES = ["params.api_key", "api_key", "token", "params.gh_token", "X-Auth-Token"]
"""Key and token names: error lines use them as field names. A password, passphrase, secret
or credential label is always followed by a value (see the next test)."""
SENTENCES = st.tuples(
    st.from_regex(r"[A-Za-z]{1,12}", fullmatch=True),
    st.from_regex(r"( [A-Za-z0-9()'.,-]{1,10}){1,5}", fullmatch=True),
).map("".join)
"""An error's prose: a first word of letters, then at least one more word (of anything)."""


@settings(max_examples=300)
@given(
    field=st.sampled_from(FIELD_NAMES),
    sentence=SENTENCES,
    before=st.sampled_from(["", "error: ", "usage: param ", "  - "]),
    after=st.sampled_from(["", "\n", "; see docs/params.md", " (line 4)"]),
)
def test_prose_after_a_field_name_in_an_error_line_is_not_masked(
    field: str, sentence: str, before: str, after: str
) -> None:
    text = f"{before}{field}: {sentence}{after}"
    assert SHAPES.redact(text) is text


@settings(max_examples=200)
@given(
    field=st.sampled_from(["password", "db_password", "secret", "passphrase", "credentials"]),
    sentence=SENTENCES,
    before=st.sampled_from(["", "error: ", "feedback: my ", "  - "]),
)
def test_a_password_label_masks_its_first_word_even_before_more_words(
    field: str, sentence: str, before: str
) -> None:
    first = sentence.split(" ", 1)[0]
    text = f"{before}{field}: {sentence}"
    redacted = SHAPES.redact(text)
    if first.lower() in ("null", "none", "true", "false", "nil", "undefined"):
        assert redacted == text
    else:
        assert redacted == f"{before}{field}: {MASK}{sentence[len(first) :]}", text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # short values, URL params, tags and the space case the audit found
        ("password=pass1", "password=***"),
        ("https://h/x?token=abc", "https://h/x?token=***"),
        ("retry with token=abc", "retry with token=***"),
        ("http://h/v1?key=abcdef12&sig=Zx9", "http://h/v1?key=***&sig=***"),
        ("GET /o?X-Amz-Signature=f00d&X-Amz-Date=1", "GET /o?X-Amz-Signature=***&X-Amz-Date=1"),
        ("passphrase=xyz", "passphrase=***"),
        ("<password>x</password>", "<password>***</password>"),
        # on a line of its own an assigned value runs over spaces, to the next pair or option
        ("password=hun ter22", "password=***"),
        ("  export DB_PASSWORD=hun ter22\nx=1", "  export DB_PASSWORD=***\nx=1"),
        ("password=hun ter22 user=ada", "password=*** user=ada"),
        ("--password=hun ter22 --verbose", "--password=*** --verbose"),
        # in running text a value ends at a blank: the message goes on
        ("at http://h/v1?key=Qz9 could not connect", "at http://h/v1?key=*** could not connect"),
        ("retry, token=abc and go", "retry, token=*** and go"),
        # a labelled value: a word that is no prose word, or one that ends its line
        ("password: pass1 was refused", "password: *** was refused"),
        ("password: hunter", "password: ***"),
        ("token: abc,\nnext: 1", "token: ***,\nnext: 1"),
        ("--token abc", "--token ***"),
        # an error's prose after a field name stays
        (
            "params.api_key: unknown JSON Schema keyword(s) at line 3",
            "params.api_key: unknown JSON Schema keyword(s) at line 3",
        ),
        ("--token is required", "--token is required"),
        # a help text's placeholder is no value: the advice stays readable
        ("`wf sweep-resume S --param api_key=VALUE`", "`wf sweep-resume S --param api_key=VALUE`"),
        ("params={'api_key': ...} in Python", "params={'api_key': ...} in Python"),
    ],
)
def test_short_values_and_the_audits_shapes(text: str, expected: str) -> None:
    assert SHAPES.redact(text) == expected


INNOCENT_NAMES = [
    "max_tokens",
    "tokens_in",
    "token_count",
    "token_budget",
    "tokenizer",
    "keywords",
    "keyboard",
    "monkey",
    "author",
    "authority",
    "authored_by",
    "secretary",
    "passwordless",
    "api_keys_count",
    "credentials_file_exists",
]
INNOCENT_VALUES = st.one_of(
    st.integers(0, 10**6).map(str),
    st.sampled_from(["Ada Lovelace", "oceanography", "cl100k_base", "true", "null", "tides"]),
    st.from_regex(r"[a-z][a-z0-9 ]{0,20}", fullmatch=True),
)


@settings(max_examples=300)
@given(
    name=st.sampled_from(INNOCENT_NAMES),
    value=INNOCENT_VALUES,
    sep=st.sampled_from(SEPARATORS),
    quote=st.sampled_from(QUOTES),
    nesting=st.sampled_from(sorted(NESTINGS)),
)
def test_innocent_names_keep_their_values(
    name: str, value: str, sep: str, quote: str, nesting: str
) -> None:
    text = NESTINGS[nesting](f"{quote}{name}{quote}{sep}{quote}{value}{quote}")
    assert SHAPES.redact(text) is text


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens=5",
        '{"max_tokens": 5, "keywords": ["tides"], "author": "Ada"}',
        "keywords: oceanography, tides",
        "author: Ada Lovelace",
        '{"token": null, "auth": true, "password": ""}',
        "Token: see below",
        "The password field is required.",
        "A basic understanding of tides.",
        "http://localhost:8080/path?x=1&y=2",
        '{"url":"https://h.example:8080","email":"ada@example.org"}',
        "-- a markdown rule --- and --flags like --verbose",
    ],
)
def test_innocent_text_reads_as_written(text: str) -> None:
    assert SHAPES.redact(text) is text


def test_a_text_whose_lower_case_is_longer_is_still_masked_in_place() -> None:
    # "İ" lowers to two characters: positions in the lowered text would be off by one.
    text = "İstanbul office: password=Sup3rS3cret, user=ada"
    assert SHAPES.redact(text) == "İstanbul office: password=***, user=ada"


@pytest.mark.parametrize(
    "text",
    [
        "password:" + " " * 200_000,
        'password="' + "\\" * 200_000,
        "--" * 100_000,
        "passwordpassword" * 20_000,
        "api_key" + '"' * 200_000,
        "://a:" * 50_000,
        "token=" * 50_000,
    ],
)
def test_hostile_texts_are_redacted_in_linear_time(text: str) -> None:
    import time

    started = time.perf_counter()
    SHAPES.redact(text)
    assert time.perf_counter() - started < 2.0  # quadratic would be minutes


# -- a person's feedback ------------------------------------------------------------------------
GATED = """\
name: gated
runner: scripted
steps:
  - id: a
    prompt: draft
    gate: {judge: human, max_loops: 3}
"""
FEEDBACK_SHAPES = [
    "fetch https://h.example/x?api_key={c} instead",
    'use {{"config": "password={c}"}}',
    "Authorization: Bearer {c}",
    "retry with url=https://h.example/a&private_token={c}",
    "password: {c}",
]


@pytest.mark.parametrize(
    ("shape", "canary"),
    [*((shape, "c4nary7Xq9Zw2Lm5") for shape in FEEDBACK_SHAPES), ("retry, token={c}", "Qz9")],
)
def test_a_persons_feedback_is_masked_before_it_is_journaled_or_shown(
    tmp_path: Path, shape: str, canary: str
) -> None:
    state = tmp_path / "state"
    flow = tmp_path / "gated.yaml"
    flow.write_text(GATED, encoding="utf-8")
    code, _ = wf(state, "run", str(flow))
    assert code == 3  # blocked on the human gate
    with Engine(state) as engine:
        run_id = engine.list_runs()[0].run_id
        engine.reject(run_id, "a", feedback=shape.format(c=canary))  # Engine.reject
    assert wf(state, "resume", run_id)[0] == 3  # loop 2 waits for a person again
    code, shown = wf(state, "reject", run_id, "a", "--feedback", shape.format(c=canary))
    assert code == 0, shown  # `wf reject --feedback`
    outputs = [wf(state, verb, run_id)[1] for verb in ("status", "journal", "events")]
    assert canary not in shown and not [o for o in outputs if canary in o]
    assert files_holding(state, canary) == []
    with Engine(state) as engine:
        verdicts = [a for a in engine.attempts(run_id) if a.runner == "human"]
    assert len(verdicts) == 2
    for verdict in verdicts:
        feedback = json.loads(verdict.output_json or "{}")["feedback"]
        assert MASK in feedback and canary not in feedback


@settings(max_examples=60)
@given(case=credential_cases())
def test_a_non_secret_params_credential_shape_is_masked_where_params_are_shown(
    case: tuple[str, str, str, bool],
) -> None:
    """A param not named as a secret may still hold a credential (a URL with a password,
    ``password=…`` in a note): ``wf list``, ``wf status`` and the runs frame show params
    through one function, which masks it as the journal does."""
    import json

    from wf_magic.store.runs import masked_params, params_text

    text, value, _name, masked = case
    stored = json.dumps({"topic": text, "nested": {"note": [text]}})
    shown = params_text(stored)
    if masked:
        gone = "Q" if value.startswith("Q") else value
        assert gone not in shown and gone not in json.dumps(masked_params(stored)), shown
    assert masked_params(stored)["topic"] == SHAPES.redact(text)


@settings(max_examples=200)
@given(
    flag=st.sampled_from(["-u ", "-u\t", "--user ", "--user="]),
    user=st.from_regex(r"[a-z][a-z0-9._-]{0,8}", fullmatch=True),
    password=SECRET_VALUES.filter(lambda v: ":" not in v),
    quote=st.sampled_from(["", "'", '"']),
    before=st.sampled_from(["curl ", "$ curl -s ", "wget ", "run: curl -fsS "]),
)
def test_a_user_password_given_to_a_command_line_is_masked(
    flag: str, user: str, password: str, quote: str, before: str
) -> None:
    """``curl -u admin:s3cret``, ``--user=ada:'two words'``: the password after the user's
    name and a colon is masked (an agent's or exec unit's printed command line)."""
    text = f"{before}{flag}{quote}{user}:{password}{quote} https://h.example/x"
    redacted = SHAPES.redact(text)
    assert password not in redacted, (text, redacted)
    assert f"{user}:" in redacted


@pytest.mark.parametrize(
    "text", ["git push -u origin main", "python -u x.py", "sort -u a.txt", "useradd --user ada"]
)
def test_a_u_flag_without_a_password_is_kept(text: str) -> None:
    assert SHAPES.redact(text) == text
