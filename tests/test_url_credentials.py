"""Credentials inside URLs (issue 31, item 4): what wf_magic stores or prints of a URL — the
library index and source URLs, the library cache's rows, ``runs.source_path``, every
message and ``--debug`` output — shows a password or a secret query parameter as ``***``.

:func:`wf_magic.redact.mask_url` is the one function; a generator over schemes × userinfo ×
secret parameter names × positions checks it, and a real loopback site serving a library
index behind an ``?access_token=`` checks every place the URL goes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import db_rows, wf_inproc
from tests.helpers_http import LoopbackHTTPServer, isolate_loopback_env
from tests.helpers_secrets import files_holding
from wf_magic.library import Library
from wf_magic.redact import MASK, URL_SECRET_PARAMS, mask_url

SECRET = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~-%!$'()*+,",
    min_size=8,
    max_size=30,
).filter(lambda v: sum(c.isalnum() for c in v) >= 6)
"""A password or token as a URL may carry it (percent-encoding included): no ``/?#@&;=``."""
SECRET_PARAMS = [
    "api_key",
    "apiKey",
    "access_token",
    "private_token",
    "token",
    "password",
    "db_password",
    "secret",
    "client_secret",
    "auth",
    "X-Amz-Signature",
    "X-Amz-Credential",
    "X-Amz-Security-Token",
    *sorted(URL_SECRET_PARAMS),
]
INNOCENT_PARAMS = {"page": "2", "schema": "wf", "sslmode": "require", "max_tokens": "5"}


@st.composite
def credential_urls(draw: st.DrawFn) -> tuple[str, str]:
    """A URL with one credential somewhere in it, and the credential."""
    secret = draw(SECRET)
    scheme = draw(st.sampled_from(["https", "http", "postgresql", "postgres", "redis"]))
    host = draw(st.sampled_from(["h.example", "127.0.0.1:8080", "[::1]:5432", "db"]))
    where = draw(st.sampled_from(["password", "query", "fragment"]))
    user = draw(st.sampled_from(["ada", "", "svc%40corp"]))
    path = draw(st.sampled_from(["/", "/index.json", "/db", "/a/b.yaml"]))
    params = list(INNOCENT_PARAMS.items())[: draw(st.integers(0, len(INNOCENT_PARAMS)))]
    netloc = f"{user}:{secret}@{host}" if where == "password" else host
    if where == "query":
        name = draw(st.sampled_from(SECRET_PARAMS))
        params.insert(draw(st.integers(0, len(params))), (name, secret))
    query = "&".join(f"{k}={v}" for k, v in params)
    url = f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")
    if where == "fragment":
        url += f"#access_token={secret}&token_type=bearer"
    return url, secret


@settings(max_examples=300)
@given(case=credential_urls())
def test_no_credential_survives_mask_url(case: tuple[str, str]) -> None:
    url, secret = case
    masked = mask_url(url)
    assert secret not in masked, (url, masked)
    assert MASK in masked
    assert mask_url(masked) == masked  # idempotent: a stored URL masks to itself
    assert urlsplit(masked).path == urlsplit(url).path  # still says where it points
    for name, value in INNOCENT_PARAMS.items():
        if f"{name}={value}" in url:
            assert f"{name}={value}" in masked


@pytest.mark.parametrize(
    "url",
    [
        "https://example.org/wf/review.yaml",
        "https://example.org/i.json?page=2&keywords=tides&author=ada#top",
        "postgresql://ada@db:5432/wf?schema=runs&sslmode=require",
        "/home/ada/workflows/review.yaml",
        "http://[::1",  # unreadable: returned as it is, never an exception
        "",
    ],
)
def test_a_url_without_credentials_is_kept_byte_for_byte(url: str) -> None:
    assert mask_url(url) == url


@given(text=st.text(max_size=80))
def test_mask_url_never_raises(text: str) -> None:
    assert isinstance(mask_url(text), str)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://app:pw@db/wf?password=hunter22", "postgresql://app:***@db/wf?password=***"),
        (
            "postgresql://app@db/wf?sslmode=require&password=x",
            "postgresql://app@db/wf?sslmode=require&password=***",
        ),
        (
            "https://acct.blob.example/c/f?sv=2024&sig=AbC%2Bd",
            "https://acct.blob.example/c/f?sv=2024&sig=***",
        ),
        ("https://maps.example/api?key=AIzaShort&q=x", "https://maps.example/api?key=***&q=x"),
        (
            "https://gitlab.example/i.json?private_token=glpat-1",
            "https://gitlab.example/i.json?private_token=***",
        ),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
    ],
)
def test_the_url_shapes_the_issue_names(url: str, expected: str) -> None:
    assert mask_url(url) == expected


# -- the library, end to end ----------------------------------------------------------------------
CANARY = "c4nary0Tok3nQ9xZ"
REVIEW = """\
name: review
runner: scripted
steps:
  - id: read
    prompt: Review owls
"""


class TokenSite:
    """A loopback site that serves documents only to requests carrying the canary token."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path, _, query = self.path.partition("?")
                body = site.files.get(path)
                if body is None or CANARY not in query:
                    self.send_response(404 if body is None else 401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = LoopbackHTTPServer(Handler, name="token-site")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.port}{path}"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TokenSite]:
    for name in ("WF_MAGIC_PATH", "WF_MAGIC_INDEX", "WF_MAGIC_LIBRARY_TTL"):
        monkeypatch.delenv(name, raising=False)
    isolate_loopback_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    server = TokenSite()
    review = REVIEW.encode()
    server.files["/wf/review.yaml"] = review
    sha = hashlib.sha256(review).hexdigest()
    # The index lists its source with a token of its own (absolute URL, query credential).
    source = server.url(f"/wf/review.yaml?private_token={CANARY}")
    server.files["/index.json"] = json.dumps(
        {"workflows": {"review": {"url": source, "sha256": sha}}}
    ).encode()
    yield server
    server.server.stop()


def test_a_library_url_with_a_token_is_stored_and_shown_masked(
    site: TokenSite,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = tmp_path / "state"
    index = site.url(f"/index.json?access_token={CANARY}")
    monkeypatch.setenv("WF_MAGIC_INDEX", index)
    done = wf_inproc(capsys, state, "run", "review")
    assert done.returncode == 0, done.stderr
    shown_source = site.url("/wf/review.yaml?private_token=***")
    assert f"workflow review: {shown_source} (sha256 " in done.stderr
    [(source_path,)] = db_rows(state, "SELECT source_path FROM runs")
    assert source_path == shown_source
    cache = sorted(db_rows(state, "SELECT url, kind FROM library_cache"))
    assert cache == [
        (site.url("/index.json?access_token=***"), "index"),
        (shown_source, "workflow"),
    ]
    [(index_body,)] = db_rows(state, "SELECT body FROM library_cache WHERE kind = 'index'")
    assert CANARY not in str(index_body)  # the index's own listed token is masked at rest
    run_id = str(db_rows(state, "SELECT run_id FROM runs")[0][0])
    outputs = [wf_inproc(capsys, state, *verb) for verb in (("status", run_id), ("list", "--all"))]
    assert not [o for o in outputs if CANARY in o.stdout + o.stderr]
    assert files_holding(state, CANARY) == []

    # The cached index lists a masked URL: the real one is fetched again, not guessed at.
    again = wf_inproc(capsys, state, "run", "review", "--new")
    assert again.returncode == 0, again.stderr
    assert files_holding(state, CANARY) == []


def test_fetch_errors_and_debug_output_show_no_credentials(
    site: TokenSite,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = tmp_path / "state"
    # userinfo and a token on an index that does not exist
    index = site.url(f"/missing.json?access_token={CANARY}").replace("//", f"//ada:{CANARY}@", 1)
    monkeypatch.setenv("WF_MAGIC_INDEX", index)
    plain = wf_inproc(capsys, state, "run", "review")
    assert plain.returncode != 0
    assert "Cannot fetch the workflow index http://ada:***@127.0.0.1:" in plain.stderr
    assert CANARY not in plain.stdout + plain.stderr
    debug = wf_inproc(capsys, state, "--debug", "run", "review")
    assert debug.returncode == plain.returncode  # --debug adds the traceback, keeps the code
    assert "Traceback (most recent call last)" in debug.stderr and "FetchError" in debug.stderr
    assert CANARY not in debug.stdout + debug.stderr
    assert files_holding(state, CANARY) == [] if state.exists() else True

    # A wrong sha256 names the source without its token, and so does the stale warning.
    with Library(
        folders=[], index=site.url(f"/index.json?access_token={CANARY}"), state_dir=state
    ) as lib:
        site.files["/wf/review.yaml"] = b"name: review\nsteps: []\n"
        with pytest.raises(Exception) as mismatch:
            lib.find("review")
    assert "private_token=***" in str(mismatch.value) and CANARY not in str(mismatch.value)


def test_an_index_entry_problem_names_the_url_masked(tmp_path: Path) -> None:
    from wf_magic.library import _parse_remote
    from wf_magic.library_index import LibraryIndexError

    body = json.dumps(
        {"workflows": {"x": {"url": f"ftp://u:{CANARY}@h/x?token={CANARY}", "sha256": "0" * 64}}}
    )
    with pytest.raises(LibraryIndexError) as caught:
        _parse_remote(body, f"https://h.example/i.json?access_token={CANARY}")
    assert CANARY not in str(caught.value)
    assert "https://h.example/i.json?access_token=***" in str(caught.value)


def test_a_masked_origin_is_what_a_run_records_even_through_the_api(tmp_path: Path) -> None:
    from dataclasses import replace

    from wf_magic import Engine

    with Engine(tmp_path / "state") as engine:
        wf = replace(engine.load(REVIEW), source_path=f"https://h.example/r.yaml?token={CANARY}")
        run = engine.run(wf)
        assert engine.get_run(run.run_id).source_path == "https://h.example/r.yaml?token=***"
    assert files_holding(tmp_path / "state", CANARY) == []


# -- PostgreSQL state URLs ------------------------------------------------------------------------
@settings(max_examples=100)
@given(
    secret=SECRET,
    in_query=st.booleans(),
    problem=st.sampled_from(
        ["schema=Bad-Name", "schema=pg_catalog", "scheme", "port", "options=-csearch_path%3Da,b"]
    ),
)
def test_a_state_url_refused_shows_no_password(secret: str, in_query: bool, problem: str) -> None:
    from wf_magic.errors import UsageError
    from wf_magic.store.location import parse_state

    netloc = "app@db:5432" if in_query else f"app:{secret}@db:5432"
    if problem == "port":
        netloc = netloc.replace("5432", "99999")
    query = [f"password={secret}"] if in_query else []
    query += [] if problem in ("scheme", "port") else [problem]
    scheme = "mysql" if problem == "scheme" else "postgresql"
    url = f"{scheme}://{netloc}/wf" + (f"?{'&'.join(query)}" if query else "")
    with pytest.raises(UsageError) as caught:
        parse_state(url)
    assert secret not in str(caught.value), str(caught.value)
    assert "***" in str(caught.value)
