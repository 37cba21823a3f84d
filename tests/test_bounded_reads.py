"""Every file wf_magic reads is read bounded: at most the bound + 1 byte, regular files only (issue 20).

A table of file kinds (a regular file under, at and over the bound, a 3 GB sparse file,
``/dev/zero``, a link to it, a FIFO, a directory, a loop of links, an unreadable file, a
missing one) is crossed with every entry point that reads a file a user names: ``wf run
FILE``, ``load_workflow(path)``, ``WF_MAGIC_INDEX``, a path an index lists, a child
workflow's file and a replay cassette. Each refusal is one line naming the path; the read
size is asserted through the one helper every reader uses (``wf_magic.reading``), so a
huge or endless file is shown never to be read, with no clock in the test.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wf_magic import load_workflow
from wf_magic import reading as reading_module
from wf_magic.errors import FileRefused, UsageError, WorkflowError
from wf_magic.library import Library
from wf_magic.locking import read_holder
from wf_magic.runners.base import RunnerContext, UnitRequest
from wf_magic.runners.cassette_calls import MAX_CASSETTE_BYTES
from wf_magic.runners.orphans import read_unit_process, sidecar_path
from wf_magic.runners.replay import ReplayRunner
from wf_magic.sealing import KEY_FILENAME, Sealer
from wf_magic.spec.workflow import MAX_SOURCE_BYTES

from .conftest import wf_inproc

LIMIT = 4096
"""The bound every reader is given in the table (the real ones are checked separately)."""
SPARSE_BYTES = 3 * 1024**3
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


# -- the spy: what the one helper read ------------------------------------------------------
@dataclass
class ReadLog:
    """Every ``read_at_most`` call of the helper: bytes asked for and bytes returned, by file."""

    calls: list[tuple[int, int]]
    files: list[str]

    @property
    def bytes_read(self) -> int:
        return sum(got for _, got in self.calls)

    def of(self, path: Path) -> list[tuple[int, int]]:
        """The calls that read ``path`` (other files, such as an index naming it, left out)."""
        target = os.path.realpath(path)
        return [call for call, name in zip(self.calls, self.files, strict=True) if name == target]


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no procfs: every read counts as the file's own
        return "?"


@pytest.fixture
def read_log(monkeypatch: pytest.MonkeyPatch) -> ReadLog:
    log = ReadLog(calls=[], files=[])
    real = reading_module.read_at_most

    def spy(fd: int, count: int) -> bytes:
        data = real(fd, count)
        log.calls.append((count, len(data)))
        log.files.append(_fd_path(fd))
        return data

    monkeypatch.setattr(reading_module, "read_at_most", spy)
    return log


# -- contents of exactly n bytes ------------------------------------------------------------
def _padded(base: str, size: int) -> bytes:
    pad = size - len(base) - 1
    assert pad >= 1, (size, base)
    return (base + "#" * pad + "\n").encode("utf-8")


def workflow_bytes(size: int) -> bytes:
    return _padded("name: bounded\nsteps:\n  - id: a\n    prompt: hi\n", size)


def index_bytes(size: int) -> bytes:
    return _padded("workflows: {}\n", size)


def cassette_bytes(size: int) -> bytes:
    return b"\n" * size  # blank lines: a cassette with no recordings


def rows_bytes(size: int) -> bytes:
    row = b'{"topic": "cats"}'
    return row + b" " * (size - len(row) - 1) + b"\n"  # one row, padded inside its line


# -- file kinds -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """A kind of file at the path a reader is given, and what the reader must say of it."""

    name: str
    make: Callable[[Path, Callable[[int], bytes]], Path]
    says: str | None
    """A phrase of the one-line refusal; None: the reader accepts the file."""
    reads: bool
    """Whether any byte may be read (a refusal by kind or size reads none)."""


def _write(size: int) -> Callable[[Path, Callable[[int], bytes]], Path]:
    def make(path: Path, content: Callable[[int], bytes]) -> Path:
        path.write_bytes(content(size))
        return path

    return make


def _sparse(path: Path, content: Callable[[int], bytes]) -> Path:
    with path.open("wb") as f:
        f.truncate(SPARSE_BYTES)
    return path


def _link_to_zero(path: Path, content: Callable[[int], bytes]) -> Path:
    path.symlink_to("/dev/zero")
    return path


def _fifo(path: Path, content: Callable[[int], bytes]) -> Path:
    os.mkfifo(path)
    return path


def _directory(path: Path, content: Callable[[int], bytes]) -> Path:
    path.mkdir()
    return path


def _link_loop(path: Path, content: Callable[[int], bytes]) -> Path:
    path.symlink_to(path.name)
    return path


def _unreadable(path: Path, content: Callable[[int], bytes]) -> Path:
    path.write_bytes(content(LIMIT // 2))
    path.chmod(0)
    return path


def _missing(path: Path, content: Callable[[int], bytes]) -> Path:
    return path


KINDS = [
    Kind("under", _write(LIMIT // 2), None, True),
    Kind("at", _write(LIMIT), None, True),
    Kind("over", _write(LIMIT + 1), f"larger than {LIMIT} bytes", True),
    Kind("sparse-3GB", _sparse, f"larger than {LIMIT} bytes ({SPARSE_BYTES} bytes)", False),
    Kind("link-to-dev-zero", _link_to_zero, "a character device (a link to /dev/zero)", False),
    Kind("fifo", _fifo, "a FIFO (named pipe), not a regular file", False),
    Kind("directory", _directory, "a directory, not a regular file", False),
    Kind("link-loop", _link_loop, "Too many levels of symbolic links", False),
    pytest.param(
        Kind("unreadable", _unreadable, "Permission denied", False),
        marks=pytest.mark.skipif(IS_ROOT, reason="root reads a file of mode 000"),
        id="unreadable",
    ),
    Kind("missing", _missing, "No such file or directory", False),
]


# -- entry points ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Ctx:
    """What an entry point may use: the captured streams, a tmp dir, the env patcher."""

    capsys: pytest.CaptureFixture[str]
    tmp: Path
    monkeypatch: pytest.MonkeyPatch


@dataclass(frozen=True)
class EntryPoint:
    """A way a file reaches a reader; ``call`` returns the one-line refusal, or None."""

    name: str
    content: Callable[[int], bytes]
    filename: str
    call: Callable[[Ctx, Path], str | None]


def _cli_run(ctx: Ctx, path: Path) -> str | None:
    result = wf_inproc(ctx.capsys, ctx.tmp / "state", "run", str(path), "--quiet")
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    return lines[0]


def _api_load(ctx: Ctx, path: Path) -> str | None:
    try:
        load_workflow(path)
    except WorkflowError as exc:
        return str(exc)
    return None


def _env_index(ctx: Ctx, path: Path) -> str | None:
    ctx.monkeypatch.setenv("WF_MAGIC_INDEX", str(path))
    result = wf_inproc(ctx.capsys, ctx.tmp / "state", "run", "review", "--quiet")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    return None if "No workflow named 'review'" in lines[0] else lines[0]


def _index_entry(ctx: Ctx, path: Path) -> str | None:
    index = ctx.tmp / "index.json"
    index.write_text(json.dumps({"workflows": {"review": {"path": str(path)}}}))
    try:
        with Library(folders=[], index=index) as library:
            library.find("review")
    except WorkflowError as exc:
        return str(exc)
    return None


def _child_file(ctx: Ctx, path: Path) -> str | None:
    parent = path.parent / "parent.yaml"
    parent.write_text("name: parent\nsteps:\n  - id: call\n    workflow: kid\n")
    try:
        load_workflow(parent)
    except WorkflowError as exc:
        return str(exc)
    return None


def _cassette(ctx: Ctx | None, path: Path) -> str | None:
    runner_ctx = RunnerContext(
        name="replay",
        options={"cassette": str(path), "journal": False},
        state_dir=str(path.parent / "state"),
        workflow="digest",
    )
    request = UnitRequest(
        run_id="r-1",
        step_id="a",
        unit_id="a",
        dispatch_id="d-1",
        input_hash="a" * 64,
        attempt=1,
        kind="prompt",
        prompt="hi",
        model=None,
    )
    try:
        ReplayRunner.from_context(runner_ctx).run(request)
    except WorkflowError as exc:
        if "no recorded answer" in str(exc):  # read, and found empty
            return None
        return str(exc)
    raise AssertionError("an empty cassette answered")


SWEEP_FLOW = """
name: rows
params:
  topic: {type: string}
runner: scripted
runners: {scripted: {rules: [{match: ".", reply: "ok"}]}}
steps:
  - id: a
    prompt: "about {{ params.topic }}"
"""


def _sweep_rows(ctx: Ctx, path: Path) -> str | None:
    flow = ctx.tmp / "flow.yaml"
    flow.write_text(SWEEP_FLOW)
    result = wf_inproc(ctx.capsys, ctx.tmp / "state", "sweep", str(flow), "--rows", str(path))
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    return lines[0]


ENTRY_POINTS = [
    EntryPoint("wf-run-FILE", workflow_bytes, "flow.yaml", _cli_run),
    EntryPoint("load_workflow", workflow_bytes, "flow.yaml", _api_load),
    EntryPoint("WF_MAGIC_INDEX", index_bytes, "index.yaml", _env_index),
    EntryPoint("index-entry-path", workflow_bytes, "review.yaml", _index_entry),
    EntryPoint("child-workflow-file", workflow_bytes, "kid.yaml", _child_file),
    EntryPoint("replay-cassette", cassette_bytes, "tape.jsonl", _cassette),
    EntryPoint("wf-sweep-rows-FILE", rows_bytes, "rows.jsonl", _sweep_rows),
]
_CASSETTE_MISSING = "does not exist; write one with `wf export-cassette RUN"


@pytest.fixture
def small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reader's bound lowered to ``LIMIT`` (a file at the bound is then cheap to make)."""
    monkeypatch.setattr("wf_magic.spec.source.MAX_SOURCE_BYTES", LIMIT)
    monkeypatch.setattr("wf_magic.library.MAX_DOCUMENT_BYTES", LIMIT)
    monkeypatch.setattr("wf_magic.runners.cassette_calls.MAX_CASSETTE_BYTES", LIMIT)
    monkeypatch.setattr("wf_magic.sweeps.expand.MAX_ROWS_BYTES", LIMIT)


def _call_without_hanging(fn: Callable[[], str | None], fifo: Path | None) -> str | None:
    """``fn()`` in a thread when ``fifo`` is given; should it block on the FIFO, a writer is let
    in and the test fails. Without one, ``fn()`` runs here (a drive sets signal handlers)."""
    if fifo is None or not fifo.is_fifo():
        return fn()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        if fifo is not None:  # release the reader blocked in open(), then fail
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        thread.join(10)
        pytest.fail("the reader blocked on the file")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.mark.usefixtures("small_bounds")
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_reader_refuses_special_and_oversized_files_in_one_line_reading_at_most_the_bound(
    entry: EntryPoint,
    kind: Kind,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    read_log: ReadLog,
) -> None:
    monkeypatch.delenv("WF_MAGIC_INDEX", raising=False)
    ctx = Ctx(capsys=capsys, tmp=tmp_path, monkeypatch=monkeypatch)
    folder = tmp_path / "files"
    folder.mkdir()
    path = kind.make(folder / entry.filename, entry.content)
    try:
        said = _call_without_hanging(
            lambda: entry.call(ctx, path), path if kind.name == "fifo" else None
        )
    finally:
        if kind.name == "unreadable":
            path.chmod(0o600)
    if entry.name == "child-workflow-file" and kind.name == "missing":
        assert said is not None and "kid" in said  # no file: the child is unknown, as before
        return
    if kind.says is None:
        assert said is None, said
    else:
        assert said is not None, f"{entry.name} accepted a {kind.name} file"
        assert len(said.splitlines()) == 1 and len(said) < 1000, said
        assert str(path) in said, said
        phrase = (
            _CASSETTE_MISSING
            if (kind.name, entry.name)
            == (
                "missing",
                "replay-cassette",
            )
            else kind.says
        )
        if (kind.name, entry.name) == ("link-to-dev-zero", "child-workflow-file"):
            phrase = "links outside the workflow's folder"  # refused before it is opened
        assert phrase in said, said
    own = read_log.of(path) if "?" not in read_log.files else read_log.calls
    assert all(asked <= LIMIT + 1 for asked, _ in own), own
    assert sum(got for _, got in own) <= LIMIT + 1
    if not kind.reads:
        assert own == [], f"{kind.name}: read {own}"


# -- /dev/zero itself, and the real bounds ----------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [("run", "/dev/zero"), ("run", "/dev/null")],
    ids=["dev-zero", "dev-null"],
)
def test_wf_run_on_a_device_is_refused_naming_it_before_any_byte_is_read(
    args: tuple[str, ...], state_dir: Path, capsys: pytest.CaptureFixture[str], read_log: ReadLog
) -> None:
    result = wf_inproc(capsys, state_dir, *args)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: (file): cannot read workflow file: a character device, not a regular file "
        f"({args[1]})\n"
    )
    assert read_log.calls == []


def test_wf_magic_index_on_dev_zero_is_refused_naming_the_variable(
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    read_log: ReadLog,
) -> None:
    monkeypatch.setenv("WF_MAGIC_INDEX", "/dev/zero")
    result = wf_inproc(capsys, state_dir, "run", "review")
    assert result.returncode == 2
    assert result.stderr == (
        "error: Workflow index /dev/zero cannot be read: a character device, not a regular "
        "file; fix WF_MAGIC_INDEX\n"
    )
    assert read_log.calls == []


def test_a_workflow_file_of_exactly_the_real_bound_runs_and_one_byte_more_is_refused(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str], read_log: ReadLog
) -> None:
    at = tmp_path / "at.yaml"
    at.write_bytes(workflow_bytes(MAX_SOURCE_BYTES))
    assert wf_inproc(capsys, state_dir, "run", str(at), "--quiet").returncode == 0
    over = tmp_path / "over.yaml"
    over.write_bytes(workflow_bytes(MAX_SOURCE_BYTES + 1))
    result = wf_inproc(capsys, state_dir, "run", str(over), "--quiet")
    assert result.returncode == 2
    assert result.stderr == (
        f"error: (file): source is larger than {MAX_SOURCE_BYTES} bytes "
        f"({MAX_SOURCE_BYTES + 1} bytes) ({over})\n"
    )
    assert max(asked for asked, _ in read_log.calls) <= reading_module.CHUNK_BYTES
    assert read_log.bytes_read == MAX_SOURCE_BYTES  # the file at the bound, nothing of over


@pytest.mark.parametrize(
    ("reader", "bound"),
    [("source", MAX_SOURCE_BYTES), ("index", 1_000_000), ("cassette", MAX_CASSETTE_BYTES)],
)
def test_each_reader_passes_its_documented_bound_to_the_helper(
    reader: str, bound: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    real = reading_module.read_bounded

    def spy(path: Any, *, limit: int) -> bytes:
        seen.append(limit)
        return real(path, limit=limit)

    for module in ("wf_magic.spec.source", "wf_magic.library", "wf_magic.runners.cassette_calls"):
        monkeypatch.setattr(f"{module}.read_bounded", spy)
    path = tmp_path / "file"
    if reader == "source":
        path.write_bytes(workflow_bytes(200))
        load_workflow(path)
    elif reader == "index":
        path.write_bytes(index_bytes(200))
        with Library(folders=[], index=path) as library:
            assert library.entries() == {}
    else:
        path.write_bytes(cassette_bytes(10))
        assert _cassette(None, path) is None
    assert seen == [bound]


# -- the state dir's own small files ---------------------------------------------------------
@pytest.mark.parametrize(
    "make", [_fifo, _link_to_zero, _sparse, _directory], ids=lambda f: f.__name__
)
def test_a_special_or_huge_secret_key_file_is_refused_naming_it_unread(
    make: Callable[[Path, Callable[[int], bytes]], Path], tmp_path: Path, read_log: ReadLog
) -> None:
    path = make(tmp_path / KEY_FILENAME, workflow_bytes)
    with pytest.raises(UsageError) as caught:
        _call_without_hanging(lambda: str(Sealer.existing(tmp_path)), path)
    message = str(caught.value)
    assert message.startswith(f"{path} is not a secret key file (expected a regular file of 32")
    assert len(message.splitlines()) == 1
    assert read_log.calls == []


@pytest.mark.parametrize("make", [_fifo, _link_to_zero, _sparse], ids=lambda f: f.__name__)
def test_a_special_lock_holder_or_process_sidecar_reads_as_none_without_blocking(
    make: Callable[[Path, Callable[[int], bytes]], Path], tmp_path: Path, read_log: ReadLog
) -> None:
    holder = make(tmp_path / "r-1.holder.json", workflow_bytes)
    assert _call_without_hanging(lambda: str(read_holder(holder)), holder) == "{}"
    sidecar = sidecar_path(tmp_path, "d-1")
    sidecar.parent.mkdir(parents=True)
    make(sidecar, workflow_bytes)
    assert _call_without_hanging(lambda: str(read_unit_process(tmp_path, "d-1")), sidecar) == (
        "None"
    )
    assert read_log.calls == []


def test_resume_after_the_source_grew_past_the_bound_warns_without_reading_it_whole(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str], read_log: ReadLog
) -> None:
    source = tmp_path / "flow.yaml"
    source.write_text(
        "name: grows\nsteps:\n  - id: a\n    prompt: one\n  - id: b\n    prompt: two\n"
    )
    started = wf_inproc(capsys, state_dir, "run", str(source), "--max-steps", "1", "--quiet")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[1]
    with source.open("r+b") as f:
        f.truncate(SPARSE_BYTES)
    read_log.calls.clear()
    resumed = wf_inproc(capsys, state_dir, "resume", run_id, "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert "warning: the workflow source changed since run" in resumed.stderr
    assert read_log.calls == []


# -- the helper itself ------------------------------------------------------------------------
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limit=st.integers(0, 3000), size=st.integers(0, 6000), data=st.data())
def test_read_bounded_returns_the_file_iff_it_fits_and_never_reads_past_the_bound(
    tmp_path: Path, limit: int, size: int, data: st.DataObject
) -> None:
    body = data.draw(st.binary(min_size=size, max_size=size))
    path = tmp_path / "f.bin"
    path.write_bytes(body)
    got: list[int] = []
    real = reading_module.read_at_most

    def spy(fd: int, count: int) -> bytes:
        chunk = real(fd, count)
        got.append(len(chunk))
        return chunk

    reading_module.read_at_most = spy
    try:
        if size <= limit:
            assert reading_module.read_bounded(path, limit=limit) == body
        else:
            with pytest.raises(FileRefused) as caught:
                reading_module.read_bounded(path, limit=limit)
            assert caught.value.reason == "too_large"
            assert str(caught.value) == f"{path}: larger than {limit} bytes ({size} bytes)"
    finally:
        reading_module.read_at_most = real
    assert sum(got) <= limit + 1
    assert got == ([size] if size <= limit else [])


def test_a_file_whose_size_lies_is_still_cut_at_the_bound_plus_one(read_log: ReadLog) -> None:
    status = Path("/proc/self/status")
    if not status.exists() or status.stat().st_size != 0:
        pytest.skip("needs procfs, whose files report size 0")
    with pytest.raises(FileRefused) as caught:
        reading_module.read_bounded(status, limit=100)
    assert caught.value.reason == "too_large"
    assert str(caught.value) == f"{status}: larger than 100 bytes"
    assert read_log.bytes_read == 101


# -- no reader outside wf_magic.reading: the next unbounded read is found here ------------------
PACKAGE = Path(__file__).resolve().parent.parent / "wf_magic"
UNBOUNDED_ALLOWED = {
    # (module, the call as written): why it may read without read_bounded.
    ("locking.py", "Path(f'/proc/{pid}/stat').read_text()"): "a kernel file: one short line",
    (
        "runners/orphans.py",
        "Path(f'/proc/{pid}/stat').read_text(encoding='utf-8', errors='replace')",
    ): "a kernel file: one short line",
    ("store/db.py", "Path('/proc/mounts').read_text()"): "a kernel file: the mount table",
    (
        "drive/loopcontext.py",
        "Path(str(origin)).read_text(encoding='utf-8')",
    ): "wf_magic's own installed modules, for the code fingerprint",
    ("runners/replay.py", "store.open()"): "opens a Store (a database), not a file",
    ("notebook/rows.py", "self.detail.open()"): "opens a widget panel",
    ("notebook/teardown.py", "widget.open()"): "reopens a closed widget's comm, not a file",
    ("agents/runner.py", "bridged.open(wired.upstream, model=request.model)"): "starts a bridge",
    (
        "bridge/attempt.py",
        "Bridge.open(upstream=upstream, on_call=self.on_call, model=model, gate=gate, limits=limits, replay=self.replay)",
    ): "starts a bridge server, not a file",
    (
        "library_fetch.py",
        "opener.open(request, timeout=deadline.remaining())",
    ): "an HTTP response, read in chunks and refused past the limit (library_fetch._body)",
}
"""Every call that could read a file unbounded and is not a read through wf_magic.reading."""
_WRITE_MODE = frozenset("wax")
_WRITE_FLAGS = frozenset({"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND"})


def _is_write(call: Any) -> bool:
    """Whether an ``open`` call opens for writing (a literal mode with w/a/x, or O_WRONLY…)."""
    import ast

    args = [*call.args[1:2], *(k.value for k in call.keywords if k.arg in ("mode", "flags"))]
    if isinstance(call.func, ast.Attribute) and call.func.attr == "open" and not call.args[1:]:
        args += call.args[:1]  # Path.open("w"): the mode is the first argument
    for arg in args:
        modes = [
            n.value
            for n in ast.walk(arg)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        if modes:  # a literal mode, or a choice between literal modes: all must write
            return all(_WRITE_MODE & set(mode) for mode in modes)
        names = {n.attr for n in ast.walk(arg) if isinstance(n, ast.Attribute)}
        if names & _WRITE_FLAGS:
            return True
    return False


def _file_reads(source: str) -> list[str]:
    """The calls (as ``ast.unparse`` writes them) in ``source`` that read a file's bytes without a bound: ``.read_text()``,
    ``.read_bytes()``, ``open()`` / ``x.open()`` / ``os.open()`` not opening for writing."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in ("read_text", "read_bytes") or (name == "open" and not _is_write(node)):
            found.append(ast.unparse(node))
    return found


def test_no_module_reads_a_file_unbounded_outside_the_reading_helper() -> None:
    found = {
        (str(path.relative_to(PACKAGE)), call)
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "reading.py" or path.parent != PACKAGE
        for call in _file_reads(path.read_text(encoding="utf-8"))
    }
    assert sorted(found - UNBOUNDED_ALLOWED.keys()) == []  # read it through read_bounded
    assert sorted(UNBOUNDED_ALLOWED.keys() - found) == []  # a stale entry: remove it


@pytest.mark.parametrize(
    ("source", "calls"),
    [
        ("p.read_text()", ["p.read_text()"]),
        ("Path(x).read_bytes()", ["Path(x).read_bytes()"]),
        ("open(p)", ["open(p)"]),
        ("open(p, 'rb')", ["open(p, 'rb')"]),
        ("p.open(encoding='utf-8')", ["p.open(encoding='utf-8')"]),
        ("os.open(p, os.O_RDONLY)", ["os.open(p, os.O_RDONLY)"]),
        ("open(p, 'w')", []),
        ("p.open('a', encoding='utf-8')", []),
        ("p.open('w' if force else 'x')", []),
        ("p.open('w' if force else 'r')", ["p.open('w' if force else 'r')"]),
        ("os.open(p, os.O_WRONLY | os.O_CREAT)", []),
        ("read_bounded(p, limit=1)", []),
    ],
)
def test_the_scan_finds_file_reads_and_passes_writes(source: str, calls: list[str]) -> None:
    assert _file_reads(source) == calls
