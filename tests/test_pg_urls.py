"""PostgreSQL state URLs (issue 31, item 23): a malformed URL is one line, not a traceback;
system schemas are refused; a role without CREATE is told so, with the grant that fixes it;
a libpq ``options=-csearch_path=X`` is honoured as the schema or refused, never replaced by
``public``. Passwords never appear in what is printed."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wf_magic.cli import main
from wf_magic.errors import UsageError
from wf_magic.store.location import PgLocation, parse_state

from .backends import pg_server

PASSWORD = "s3cr3t-Pw9"


def _wf(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def _local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WF_MAGIC_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.delenv("PGOPTIONS", raising=False)


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert PASSWORD not in err and quote(PASSWORD) not in err
    return lines[0]


# -- malformed URLs: refused before any connection -----------------------------------------------
MALFORMED = [
    (f"postgresql://u:{PASSWORD}@[::1/db", "is not a readable URL (Invalid IPv6 URL)"),
    (f"postgresql://u:{PASSWORD}@h:notaport/db", "is not a readable URL"),
    (f"postgresql://u:{PASSWORD}@h:99999/db", "is not a readable URL (Port out of range"),
    (f"postgresql://u:{PASSWORD}@h:-5/db", "is not a readable URL"),
    (f"postgresql://u:{PASSWORD}@h/db?badparam=1", 'invalid URI query parameter: "badparam"'),
    (f"postgresql://u:{PASSWORD}@h/db?port=0", "invalid port '0' (expected 1 to 65535)"),
    (f"postgresql://u:{PASSWORD}@h/db?port=http", "invalid port 'http'"),
    (f"postgresql://u:{PASSWORD}%ZZ@h/db", "libpq cannot read the URL: invalid percent"),
    (f"postgresql://u:{PASSWORD}@h/d%zb", "libpq cannot read the URL: invalid percent"),
]


@pytest.mark.parametrize(("url", "said"), MALFORMED)
def test_a_malformed_url_is_one_usage_line_without_its_password(url: str, said: str) -> None:
    code, out, err = _wf("--db", url, "list")
    assert code == 2 and out == ""
    line = _one_error_line(err)
    assert line.startswith("error: State postgresql://u:***@") and said in line
    assert line.endswith(
        "write it as postgresql://USER@HOST[:PORT]/DB?schema=NAME (percent-encode a reserved "
        "character in the user or password)."
    )


def _malformed_urls() -> st.SearchStrategy[str]:
    bad_port = st.one_of(
        st.integers(65536, 10**9).map(str),
        st.text("abcxyz-+.", min_size=1, max_size=5),
    )
    bad_escape = st.sampled_from(["%", "%Z", "%ZZ", "%G1", "%-1", "%%"])
    unknown = st.text("abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=8).filter(
        lambda n: n not in _LIBPQ_PARAMS
    )
    return st.one_of(
        bad_port.map(lambda p: f"postgresql://u:{PASSWORD}@h:{p}/db"),
        bad_port.map(lambda p: f"postgresql://u:{PASSWORD}@h/db?port={p}"),
        bad_escape.map(lambda e: f"postgresql://u:{PASSWORD}@h/d{e}b"),
        bad_escape.map(lambda e: f"postgresql://u{e}:{PASSWORD}@h/db"),
        unknown.map(lambda n: f"postgresql://u:{PASSWORD}@h/db?{n}=1"),
        st.sampled_from(["[", "[::1", "]", "[x]"]).map(
            lambda h: f"postgresql://u:{PASSWORD}@{h}/db"
        ),
    )


_LIBPQ_PARAMS = {
    "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "options", "service",
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "target", "gssencmode",
}  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(url=_malformed_urls())
def test_any_malformed_url_is_one_usage_line(url: str) -> None:
    code, _, err = _wf("--db", url, "list")
    assert code == 2, err
    line = _one_error_line(err)
    assert line.startswith("error: State postgresql://u"), line


# -- system schemas -------------------------------------------------------------------------------
SYSTEM = ["information_schema", "pg_catalog", "pg_temp", "pg_temp_3", "pg_toast", "pg_toast_temp_1"]


@pytest.mark.parametrize("schema", [*SYSTEM, "pg_anything"])
def test_system_schemas_are_refused(schema: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_state(f"postgresql://u:{PASSWORD}@h/db?schema={schema}")
    assert str(refused.value) == (
        f"State postgresql://u:***@h/db?schema={schema}: schema {schema!r} is a PostgreSQL "
        "system schema (information_schema, pg_catalog, pg_temp*, pg_toast*: every pg_ name is "
        "the server's); choose another ?schema=NAME."
    )
    code, _, err = _wf("--db", f"postgresql://u:{PASSWORD}@h/db?schema={schema}", "list")
    assert code == 2 and "is a PostgreSQL system schema" in _one_error_line(err)


@pytest.mark.parametrize("schema", SYSTEM)
def test_a_system_schema_in_search_path_options_is_refused_too(schema: str) -> None:
    with pytest.raises(UsageError, match="is a PostgreSQL system schema"):
        parse_state(f"postgresql://h/db?options=-csearch_path%3D{schema}")


# -- options=-csearch_path=X -------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    ["-csearch_path=wfx", "-c search_path=wfx", "--search_path=wfx", "-c statement_timeout=5 "
     "-csearch_path=wfx", '-csearch_path="wfx"', "-csearch_path=other -csearch_path=wfx"],
)  # fmt: skip
def test_search_path_in_libpq_options_names_the_schema(options: str) -> None:
    location = parse_state(f"postgresql://h/db?options={quote(options)}")
    assert isinstance(location, PgLocation)
    assert location.schema == "wfx"
    assert location.where == "postgresql://h/db?schema=wfx"
    assert f"options={quote(options, safe='')}" in location.url.replace("+", "%20")


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("options=-csearch_path%3Da,b", "sets search_path='a,b'; a state lives in one schema"),
        ("options=-csearch_path%3D%22%24user%22,public", "a state lives in one schema"),
        ("schema=a&options=-csearch_path%3Db", "sets search_path='b' but ?schema='a'"),
        ("options=-csearch_path%3DUpper", "schema 'Upper' is not a plain lowercase name"),
    ],
)
def test_search_path_options_that_cannot_be_honoured_are_refused(query: str, said: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_state(f"postgresql://u:{PASSWORD}@h/db?{query}")
    assert said in str(refused.value) and PASSWORD not in str(refused.value)


def test_pgoptions_search_path_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGOPTIONS", "-c search_path=fromenv")
    location = parse_state("postgresql://h/db")
    assert isinstance(location, PgLocation) and location.schema == "fromenv"
    monkeypatch.setenv("PGOPTIONS", "-c search_path=fromenv")
    with pytest.raises(UsageError, match=r"\$PGOPTIONS sets search_path='fromenv' but"):
        parse_state("postgresql://h/db?schema=other")


def test_the_same_schema_in_options_and_query_is_fine() -> None:
    location = parse_state("postgresql://h/db?schema=s1&options=-csearch_path%3Ds1")
    assert isinstance(location, PgLocation) and location.schema == "s1"


def test_an_empty_host_keeps_its_slashes_for_libpq() -> None:
    location = parse_state("postgresql:///db?schema=s1&sslmode=disable")
    assert isinstance(location, PgLocation)
    assert location.url == "postgresql:///db?sslmode=disable"
    assert location.where == "postgresql:///db?schema=s1"


def test_a_permission_refused_mid_command_is_a_permission_fault() -> None:
    from wf_magic.store.faults import pg_fault
    from wf_magic.store.pgconn import PgError

    exc = PgError("permission denied for table runs")
    exc.sqlstate = "42501"
    fault = pg_fault(exc, "postgresql://h/db?schema=s1", None)
    assert fault is not None and fault.fault == "readonly"
    assert str(fault) == (
        "state database postgresql://h/db?schema=s1: permission denied for table runs. Make it "
        "writable (or point --db / WF_MAGIC_HOME elsewhere), then retry."
    )


# -- against the real server ---------------------------------------------------------------------
def _server() -> str:
    server = pg_server()
    if server is None:
        pytest.skip("set WF_MAGIC_TEST_PG=postgresql://USER@HOST:PORT/DB")
    return server


def _admin(server: str) -> Any:
    import psycopg

    return psycopg.connect(server, autocommit=True)


def _schema_tables(server: str, schema: str) -> set[str]:
    with _admin(server) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


def test_a_search_path_option_is_where_the_state_lives_on_the_server() -> None:
    server = _server()
    schema = f"t_opt_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in server else "?"
    try:
        code, out, err = _wf("--db", f"{server}{sep}options=-csearch_path%3D{schema}", "list")
        assert (code, err) == (0, "")
        assert out.startswith("no runs in ") and out.rstrip().endswith(f"?schema={schema}")
        assert {"runs", "schema_migrations"} <= _schema_tables(server, schema)
    finally:
        with _admin(server) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def role_url() -> Iterator[tuple[str, str, str]]:
    """(server, a URL of a new LOGIN role without CREATE on the database, the role's name)."""
    server = _server()
    role = f"wf_nocreate_{uuid.uuid4().hex[:10]}"
    with _admin(server) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
        dbname = conn.info.dbname
        can_create = conn.execute(
            "SELECT has_database_privilege(%s, current_database(), 'CREATE')", (role,)
        ).fetchone()
    assert can_create == (False,)  # the server's defaults: CREATE is not PUBLIC's
    parts = urlsplit(server)
    url = f"postgresql://{role}:{quote(PASSWORD)}@{parts.hostname}:{parts.port}/{dbname}"
    try:
        yield server, url, role
    finally:
        with _admin(server) as conn:
            conn.execute(f"DROP OWNED BY {role} CASCADE")
            conn.execute(f"DROP ROLE {role}")


def test_a_role_without_create_is_told_it_lacks_the_permission(
    role_url: tuple[str, str, str],
) -> None:
    server, url, role = role_url
    schema = f"t_perm_{uuid.uuid4().hex[:12]}"
    code, out, err = _wf("--db", f"{url}?schema={schema}", "list")
    assert code == 2 and out == ""
    line = _one_error_line(err)
    db = urlsplit(url).path.lstrip("/")
    assert line == (
        f"error: State postgresql://{role}:***@{urlsplit(url).netloc.split('@')[1]}/{db}"
        f"?schema={schema}: role '{role}' may not use the schema '{schema}' "
        f"(permission denied for database {db}). Have the database owner run "
        f'GRANT CREATE ON DATABASE "{db}" TO "{role}" (for a new schema) or '
        f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO "{role}" (for one that exists), or '
        "choose a ?schema=NAME the role owns."
    )
    assert _schema_tables(server, schema) == set()


def test_the_grant_the_message_names_lets_the_role_open_its_schema(
    role_url: tuple[str, str, str],
) -> None:
    server, url, role = role_url
    schema = f"t_perm_{uuid.uuid4().hex[:12]}"
    with _admin(server) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO "{role}"')
    try:
        code, out, err = _wf("--db", f"{url}?schema={schema}", "list")
        assert (code, err) == (0, "")
        assert "runs" in _schema_tables(server, schema)
    finally:
        with _admin(server) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_role_without_usage_on_a_migrated_schema_is_told_it_is_a_permission_problem(
    role_url: tuple[str, str, str],
) -> None:
    server, url, role = role_url
    schema = f"t_perm_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in server else "?"
    try:
        assert _wf("--db", f"{server}{sep}schema={schema}", "list")[0] == 0  # owner migrates it
        code, out, err = _wf("--db", f"{url}?schema={schema}", "list")
        assert code == 2 and out == ""
        line = _one_error_line(err)
        assert f"role '{role}' may not use the schema '{schema}'" in line
        assert f"(permission denied for schema {schema})" in line
    finally:
        with _admin(server) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
