"""The workflow library (wf_magic.library): names from folders and an index, a TTL cache.

Remote documents come from a real HTTP server on 127.0.0.1 (port 0, in a thread) that a
test can make fail (HTTP 500) or take away (connection refused).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, db_rows, wf_inproc, write_file
from tests.helpers_http import LoopbackHTTPServer, isolate_loopback_env
from wf_magic import DefinitionError, Engine
from wf_magic.exits import EXIT_FAILED, EXIT_USAGE, error_exit_code
from wf_magic.library import (
    ChecksumMismatch,
    FetchError,
    Library,
    LibraryIndexError,
    StaleLibraryCopy,
    WorkflowNotFound,
)
from wf_magic.library_index import parse_index

REVIEW = """\
name: review
params:
  topic: {type: string, default: owls}
runner: scripted
steps:
  - id: read
    prompt: "Review {{ params.topic }}"
"""
REVIEW_V2 = REVIEW.replace("Review", "Critique")
PARENT = """\
name: parent
runner: scripted
steps:
  - id: pick
    prompt: Pick a topic
  - id: check
    workflow: review
    with: {topic: bees}
"""


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Site:
    """A loopback HTTP server: ``files`` by path, every request logged in ``hits``."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.hits: list[str] = []
        self.fail_with: int | None = None
        self.truncate = False
        self.redirects: dict[str, str] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                site.hits.append(self.path)
                if self.path in site.redirects:
                    self.send_response(302)
                    self.send_header("Location", site.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = site.files.get(self.path)
                status = site.fail_with or (200 if body is not None else 404)
                self.send_response(status)
                length = len(body or b"") if status == 200 else 0
                self.send_header("Content-Length", str(length + 100 * site.truncate))
                self.end_headers()
                if status == 200 and body is not None:
                    self.wfile.write(body)  # with `truncate`, 100 promised bytes never come

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the test reads `hits`

        self.server = LoopbackHTTPServer(Handler, name="library-site")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.port}{path}"

    def publish(self, path: str, text: str) -> str:
        self.files[path] = text.encode("utf-8")
        return self.url(path)

    def publish_index(self, workflows: dict[str, dict[str, str]]) -> str:
        return self.publish("/index.json", json.dumps({"workflows": workflows}))

    def stop(self) -> None:
        """Take the server away: later requests are refused."""
        self.server.stop()


@pytest.fixture(autouse=True)
def _isolated_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user library leaks in; ./workflows is the test's own; loopback never uses a proxy."""
    for name in ("WF_MAGIC_PATH", "WF_MAGIC_INDEX", "WF_MAGIC_LIBRARY_TTL"):
        monkeypatch.delenv(name, raising=False)
    isolate_loopback_env(monkeypatch)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def site() -> Iterator[Site]:
    server = Site()
    yield server
    server.stop()


@pytest.fixture
def published(site: Site) -> str:
    """The index URL of a site serving ``review`` (REVIEW) with its sha256."""
    review_url = site.publish("/wf/review.yaml", REVIEW)
    return site.publish_index({"review": {"url": review_url, "sha256": sha(REVIEW)}})


def library(index: str, state_dir: Path, **kwargs: Any) -> Library:
    return Library(folders=[], index=index, state_dir=state_dir, **kwargs)


def cached(state_dir: Path) -> dict[str, tuple[str, str, float]]:
    rows = db_rows(state_dir, "SELECT url, kind, sha256, fetched_at FROM library_cache")
    return {str(u): (str(k), str(s), float(f)) for u, k, s, f in rows}  # type: ignore[arg-type]


def _age_cache(state_dir: Path, url: str, fetched_at: float) -> None:
    """Make a cached copy older, as if fetched at ``fetched_at``."""
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        conn.execute("UPDATE library_cache SET fetched_at = ? WHERE url = ?", (fetched_at, url))
        conn.commit()
    finally:
        conn.close()


# -- the cache -----------------------------------------------------------------------------------
def test_a_remote_workflow_is_fetched_verified_and_cached(
    site: Site, published: str, state_dir: Path
) -> None:
    with library(published, state_dir) as lib:
        found = lib.find("review")
    review_url = site.url("/wf/review.yaml")
    assert (found.text, found.origin, found.sha256, found.path) == (
        REVIEW,
        review_url,
        sha(REVIEW),
        None,
    )
    assert site.hits == ["/index.json", "/wf/review.yaml"]
    rows = cached(state_dir)
    assert {url: row[:2] for url, row in rows.items()} == {
        published: ("index", sha(site.files["/index.json"].decode())),
        review_url: ("workflow", sha(REVIEW)),
    }


def test_a_fresh_cache_is_used_without_the_network(
    site: Site, published: str, state_dir: Path
) -> None:
    with library(published, state_dir) as lib:
        lib.find("review")
    site.stop()  # the server goes away between the two calls
    with library(published, state_dir) as lib:
        found = lib.find("review")
    assert found.text == REVIEW and found.sha256 == sha(REVIEW)


def test_a_stale_index_is_refreshed_and_written_back(
    site: Site, published: str, state_dir: Path
) -> None:
    with library(published, state_dir) as lib:
        assert lib.find("review").text == REVIEW
    before = cached(state_dir)[published][2]
    v2_url = site.publish("/wf/review-v2.yaml", REVIEW_V2)
    site.publish_index({"review": {"url": v2_url, "sha256": sha(REVIEW_V2)}})
    site.hits.clear()
    with library(published, state_dir) as lib:  # still fresh: the old index, no request
        assert lib.find("review").text == REVIEW
    assert site.hits == []
    time.sleep(0.01)
    with library(published, state_dir, ttl_s=0) as lib:  # stale at once
        found = lib.find("review")
    assert (found.text, found.origin) == (REVIEW_V2, v2_url)
    assert site.hits == ["/index.json", "/wf/review-v2.yaml"]
    rows = cached(state_dir)
    assert rows[published][2] > before
    assert rows[v2_url][:2] == ("workflow", sha(REVIEW_V2))


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        ("server gone", "(connection refused)"),
        ("HTTP 500", "(HTTP 500 Internal Server Error)"),
        ("cut short", "(the connection closed after"),
        ("malformed", "(Workflow index http"),
    ],
)
def test_a_failed_refresh_uses_the_stale_copy_with_one_warning_naming_its_age(
    site: Site, published: str, state_dir: Path, failure: str, said: str
) -> None:
    with library(published, state_dir) as lib:
        lib.find("review")
    _age_cache(state_dir, published, time.time() - 7200)
    if failure == "server gone":
        site.stop()
    elif failure == "HTTP 500":
        site.fail_with = 500
    elif failure == "cut short":
        site.truncate = True
    else:
        site.publish("/index.json", "workflows: [not, a, mapping]")
    with pytest.warns(StaleLibraryCopy) as caught, library(published, state_dir) as lib:
        first = lib.find("review")
        again = lib.find("review")
    assert first.text == again.text == REVIEW
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"refreshing the index {published} failed" in message
    assert "using the cached copy from 2 h 0 min ago" in message
    assert f"{published} failed {said}" in message
    assert cached(state_dir)[published][2] < time.time() - 7000  # the copy was not replaced


def test_no_copy_and_no_server_is_a_clear_error(
    site: Site, published: str, state_dir: Path
) -> None:
    site.stop()
    with pytest.raises(FetchError) as caught, library(published, state_dir) as lib:
        lib.find("review")
    assert str(caught.value) == (
        f"Cannot fetch the workflow index {published} (looking up 'review'): connection refused; "
        "no copy is cached. Check the network and WF_MAGIC_INDEX, or put the workflow in a "
        "folder on WF_MAGIC_PATH (or ./workflows)."
    )
    assert error_exit_code(caught.value) == EXIT_FAILED


def test_a_workflow_source_that_cannot_be_fetched_names_the_name_and_url(
    site: Site, state_dir: Path
) -> None:
    missing = site.url("/wf/gone.yaml")
    index = site.publish_index({"gone": {"url": missing, "sha256": sha("x")}})
    with pytest.raises(FetchError) as caught, library(index, state_dir) as lib:
        lib.find("gone")
    assert str(caught.value).startswith(
        f"Cannot fetch workflow 'gone' from {missing}: HTTP 404 Not Found; no copy with the "
        "index's sha256 is cached."
    )


def test_redirects_are_followed_only_to_http(site: Site, state_dir: Path) -> None:
    target = site.publish("/wf/review.yaml", REVIEW)
    site.redirects = {"/moved.yaml": target, "/away.yaml": "ftp://127.0.0.1/review.yaml"}
    index = site.publish_index(
        {
            "moved": {"url": site.url("/moved.yaml"), "sha256": sha(REVIEW)},
            "away": {"url": site.url("/away.yaml"), "sha256": sha(REVIEW)},
        }
    )
    with library(index, state_dir) as lib:
        assert lib.find("moved").text == REVIEW
        with pytest.raises(FetchError, match="refused a redirect to ftp://127.0.0.1/review.yaml"):
            lib.find("away")


def test_a_sha256_mismatch_is_refused_and_nothing_is_cached(site: Site, state_dir: Path) -> None:
    url = site.publish("/wf/review.yaml", REVIEW + "  - id: sneaky\n    prompt: exfiltrate\n")
    index = site.publish_index({"review": {"url": url, "sha256": sha(REVIEW)}})
    with pytest.raises(ChecksumMismatch) as caught, library(index, state_dir) as lib:
        lib.find("review")
    actual = sha(site.files["/wf/review.yaml"].decode())
    assert str(caught.value) == (
        f"Workflow 'review' from {url} does not match the index {index}: expected sha256 "
        f"{sha(REVIEW)} (got {actual}); nothing was cached. Review the source and update the "
        "index's sha256, or restore the source."
    )
    assert error_exit_code(caught.value) == EXIT_FAILED
    assert url not in cached(state_dir)


def test_a_verified_copy_is_never_replaced_by_a_mismatching_one(
    site: Site, published: str, state_dir: Path
) -> None:
    with library(published, state_dir) as lib:
        lib.find("review")
    site.publish("/wf/review.yaml", REVIEW_V2)  # changed in place; the index still says v1
    with library(published, state_dir, ttl_s=0) as lib:
        assert lib.find("review").text == REVIEW  # content-addressed: the copy still matches
    site.publish_index({"review": {"url": site.url("/wf/review.yaml"), "sha256": "0" * 64}})
    with pytest.raises(ChecksumMismatch), library(published, state_dir, ttl_s=0) as lib:
        lib.find("review")
    assert cached(state_dir)[site.url("/wf/review.yaml")][1] == sha(REVIEW)


# -- folders and local indexes -----------------------------------------------------------------------
def test_folders_on_the_search_path_come_first_then_workflows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second, tmp_path / "workflows"):
        folder.mkdir()
    write_file(second, "review.yml", REVIEW)
    write_file(first, "review.yaml", REVIEW_V2)
    write_file(tmp_path / "workflows", "local.yaml", REVIEW.replace("review", "local"))
    monkeypatch.setenv("WF_MAGIC_PATH", os.pathsep.join([str(first), str(second)]))
    with Library.from_environ() as lib:
        found = lib.find("review")
        local = lib.find("local")
    assert (found.text, found.path, found.origin) == (
        REVIEW_V2,
        (first / "review.yaml").resolve(),
        str((first / "review.yaml").resolve()),
    )
    assert local.path == (tmp_path / "workflows" / "local.yaml").resolve()
    assert not (tmp_path / "home").exists()  # folders need no state DB


def test_an_unknown_name_is_a_usage_error_that_suggests_close_names(tmp_path: Path) -> None:
    (tmp_path / "workflows").mkdir()
    write_file(tmp_path / "workflows", "review.yaml", REVIEW)
    with pytest.raises(WorkflowNotFound) as caught, Library.from_environ() as lib:
        lib.find("revew")
    assert str(caught.value) == (
        f"No workflow named 'revew' in the library (folders: {tmp_path / 'workflows'}; index: "
        "none (set WF_MAGIC_INDEX)). Did you mean review? Put revew.yaml in one of those "
        "folders (or a folder on WF_MAGIC_PATH), or list it in the index."
    )
    assert error_exit_code(caught.value) == EXIT_USAGE


def test_a_local_index_lists_paths_beside_it_verified_when_a_sha256_is_given(
    tmp_path: Path,
) -> None:
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    write_file(shelf, "review.yaml", REVIEW)
    index = write_file(
        shelf,
        "index.yaml",
        f"workflows:\n  review: {{path: review.yaml, sha256: {sha(REVIEW)}}}\n"
        f"  tampered: {{path: review.yaml, sha256: {'a' * 64}}}\n",
    )
    with Library(folders=[], index=index) as lib:
        found = lib.find("review")
        with pytest.raises(ChecksumMismatch, match="expected sha256 a{64}"):
            lib.find("tampered")
    assert found.path == (shelf / "review.yaml").resolve() and found.sha256 == sha(REVIEW)


def test_a_malformed_index_is_one_line_naming_the_field(tmp_path: Path) -> None:
    index = write_file(tmp_path, "index.json", json.dumps({"workflows": {"review": {"url": 3}}}))
    with pytest.raises(LibraryIndexError) as caught, Library(folders=[], index=index) as lib:
        lib.find("review")
    assert str(caught.value) == (
        f"Workflow index {index}: workflows.review.url: expected a non-empty string (got 3); "
        "fix the index"
    )
    assert error_exit_code(caught.value) == EXIT_USAGE


index_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
entry_like = st.fixed_dictionaries(
    {},
    optional={
        "url": st.one_of(st.text(max_size=30), st.just("https://x.test/a.yaml"), index_values),
        "path": st.one_of(st.text(max_size=20), index_values),
        "sha256": st.one_of(st.text(max_size=70), st.just("ab" * 32), index_values),
        "description": index_values,
        "extra": index_values,
    },
)
index_like = st.one_of(
    index_values,
    st.fixed_dictionaries(
        {"workflows": st.dictionaries(st.text(max_size=12), entry_like | index_values)},
        optional={"version": index_values},
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    document=index_like,
    form=st.sampled_from(["json", "yaml"]),
    garbage=st.text(max_size=40),
)
def test_any_malformed_index_is_a_clean_library_error_never_a_traceback(
    document: object, form: str, garbage: str
) -> None:
    for body in (
        json.dumps(document) if form == "json" else yaml.safe_dump(document),
        garbage,
        "workflows:\n  " + garbage,
    ):
        for base_dir in ("/idx", None):
            try:
                entries = parse_index(body, where="https://x.test/i.json", base_dir=base_dir)
            except LibraryIndexError as exc:
                assert "\n" not in str(exc) and str(exc).startswith("Workflow index ")
                continue
            for name, entry in entries.items():
                assert entry.name == name and (entry.url is None) != (entry.path is None)
                assert entry.url is None or entry.sha256 is not None


# -- the faces ---------------------------------------------------------------------------------------
def _wf(state_dir: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-m", "wf_magic", "--db", str(state_dir), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        timeout=60,
        check=False,
    )


def _only_run_id(state_dir: Path) -> str:
    (row,) = db_rows(state_dir, "SELECT run_id FROM runs")
    return str(row[0])


def test_wf_run_name_runs_a_library_workflow_and_records_its_origin(
    site: Site, published: str, state_dir: Path
) -> None:
    env = {"WF_MAGIC_INDEX": published}
    review_url = site.url("/wf/review.yaml")
    done = _wf(state_dir, "run", "review", "--param", "topic=bees", env=env)
    assert done.returncode == 0, done.stderr
    assert f"workflow review: {review_url} (sha256 {sha(REVIEW)[:12]})" in done.stderr
    assert "review  [completed]" in done.stdout
    rows = db_rows(state_dir, "SELECT workflow, source_path, source_hash FROM runs")
    assert rows == [("review", review_url, sha(REVIEW))]

    status = _wf(state_dir, "status", _only_run_id(state_dir), env=env)
    assert f"  source: {review_url} (sha256 {sha(REVIEW)})" in status.stdout

    site.stop()  # fresh cache: the same run is found without the network
    again = _wf(state_dir, "run", "review", "--param", "topic=bees", env=env)
    assert again.returncode == 0, again.stderr
    assert "(existing)" in again.stdout and "this drive: 0 dispatched" in again.stdout

    stale = _wf(state_dir, "run", "review", "--param", "topic=bees", "--refresh", env=env)
    assert stale.returncode == 0, stale.stderr
    warning = [line for line in stale.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1
    assert re.search(
        r"failed \(connection refused\); using the cached copy from \d+ (s|min) ago", warning[0]
    )


def test_wf_run_name_errors_are_one_line_with_their_exit_codes(
    capsys: pytest.CaptureFixture[str],
    site: Site,
    published: str,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WF_MAGIC_INDEX", published)
    unknown = wf_inproc(capsys, state_dir, "run", "nope")
    assert unknown.returncode == EXIT_USAGE
    assert unknown.stderr.startswith("error: No workflow named 'nope' in the library")
    assert unknown.stderr.count("\n") == 1
    site.stop()  # the index is cached (fresh) by now, the source never was
    down = wf_inproc(capsys, state_dir, "run", "review")
    assert down.returncode == EXIT_FAILED
    review_url = site.url("/wf/review.yaml")
    assert down.stderr == (
        f"error: Cannot fetch workflow 'review' from {review_url}: connection refused; no copy "
        f"with the index's sha256 is cached. Check the network and the index {published}, or "
        "put review.yaml in a folder on WF_MAGIC_PATH.\n"
    )
    missing_file = wf_inproc(capsys, state_dir, "run", "nope.yaml")
    assert (
        missing_file.returncode == EXIT_USAGE and "cannot read workflow file" in missing_file.stderr
    )


def test_wf_run_name_from_a_folder_records_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    (tmp_path / "workflows").mkdir()
    path = write_file(tmp_path / "workflows", "review.yaml", REVIEW).resolve()
    done = wf_inproc(capsys, state_dir, "run", "review")
    assert done.returncode == 0, done.stderr
    assert f"workflow review: {path} (sha256 {sha(REVIEW)[:12]})" in done.stderr
    rows = db_rows(state_dir, "SELECT source_path, source_hash FROM runs")
    assert rows == [(str(path), sha(REVIEW))]


def test_a_child_workflow_step_resolves_through_the_library(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    site: Site,
    published: str,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parent = write_file(tmp_path, "parent.yaml", PARENT)
    monkeypatch.setenv("WF_MAGIC_INDEX", published)
    done = wf_inproc(capsys, state_dir, "run", str(parent))
    assert done.returncode == 0, done.stderr
    with Engine(state_dir) as engine:
        (root,) = engine.list_runs()
        child = engine.list_runs(include_children=True)
        assert root.status == "completed"
        plan = json.loads(root.plan_json)
        assert plan["children"]["review"]["steps"][0]["prompt"] == "Review {{ params.topic }}"
        assert {r.workflow for r in child} == {"parent", "review"}


def test_an_engine_freezes_library_children_inside_library_using(
    site: Site, published: str, state_dir: Path
) -> None:
    with Engine(state_dir) as engine, library(published, state_dir, store=engine.store) as lib:
        with lib.using():
            run = engine.run(PARENT)
        assert run.status == "completed"
        with pytest.raises(DefinitionError, match="unknown child workflow 'review'"):
            engine.run(PARENT.replace("name: parent", "name: parent2"))


# -- %workflow use -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shell() -> Iterator[Any]:
    from tests.helpers_notebook import ipython_shell

    yield from ipython_shell()


def test_workflow_use_loads_a_library_workflow_that_cells_run_and_call(
    shell: Any,
    tmp_path: Path,
    site: Site,
    published: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.helpers_notebook import magics_in

    monkeypatch.setenv("WF_MAGIC_INDEX", published)
    with magics_in(shell, tmp_path / "nb") as magics:
        shell.run_line_magic("config", "WorkflowMagics.widgets = 'off'")
        shell.run_line_magic("workflow", "use review")
        out = capsys.readouterr().out
        review_url = site.url("/wf/review.yaml")
        assert f"using review from {review_url} (sha256 {sha(REVIEW)[:12]})" in out
        site.stop()  # what `use` loaded runs without the network
        run = shell.run_cell_magic("workflow", "--param topic=bees", "review\n")
        assert run.status == "completed"
        assert (run.row.source_path, run.row.source_hash) == (review_url, sha(REVIEW))
        parent = shell.run_cell_magic("workflow", "", PARENT)
        assert parent.status == "completed"
        (tmp_path / "workflows").mkdir()
        local = write_file(tmp_path / "workflows", "local.yaml", REVIEW.replace("review", "local"))
        direct = shell.run_cell_magic("workflow", "", "local\n")  # never `use`d: pinned now
        assert direct.status == "completed" and direct.row.source_path == str(local.resolve())
        assert magics.library_origins == {"review": review_url, "local": str(local.resolve())}


def test_the_docs_python_example_runs(tmp_path: Path) -> None:
    (tmp_path / "workflows").mkdir()
    write_file(tmp_path / "workflows", "review.yaml", REVIEW)
    text = (ROOT / "docs" / "library.md").read_text()
    code = text.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(code, "docs/library.md", "exec"), {})  # noqa: S102 - our own documentation
    origin, status = out.getvalue().splitlines()
    review = (tmp_path / "workflows" / "review.yaml").resolve()
    assert (origin, status) == (f"{review} (sha256 {sha(REVIEW)[:12]})", "completed")
