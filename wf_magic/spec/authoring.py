"""``wf check``: freeze workflow files without a state dir and say, in one line each, what came out.

A check freezes exactly as ``wf run`` does (the same loader, the library for children, python
targets pinned, a ``model:`` templated from params rendered with the default params when they
resolve) and so reports the plan hash a run of the file with its default params would record,
or the error that run would stop on (a default rendering to an unusable model); it writes
nothing: no state dir, no database, no cache (a child fetched from a remote library index is
cached in a throwaway directory).

The line format is stable, for editors and pre-commit hooks::

    FILE: ok PLAN_HASH
    FILE:LINE: error: FIELD: PROBLEM
    FILE: error: PROBLEM                 (no line: an unreadable file, a library failure)

An error inside another source (a child workflow from the library) names it, and its line,
after the problem: ``FILE: error: FIELD: PROBLEM (in workflow NAME, line N)``.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import DefinitionError, UsageError, WorkflowError
from .models_resolve import preview_workflow


@dataclass(frozen=True, slots=True, kw_only=True)
class FileCheck:
    """What checking one workflow file found: its plan hash, or the error that stopped it."""

    path: str
    plan_hash: str | None = None
    line: int | None = None
    """The source line of the error, when it has one."""
    error: str | None = None
    """The error, on one line (``FIELD: PROBLEM`` for a definition error)."""

    @property
    def ok(self) -> bool:
        """Whether the file froze."""
        return self.error is None

    def text(self) -> str:
        """The file's line of ``wf check`` output (module docstring)."""
        if self.error is None:
            return f"{self.path}: ok {self.plan_hash}"
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: error: {self.error}"


def check_file(path: str | Path) -> FileCheck:
    """Freeze the workflow file ``path`` and report its plan hash or its error (never raises
    for a bad workflow)."""
    from .freeze import load_workflow

    name = str(path)
    target = Path(path)
    with _library(), _importable(target.resolve().parent):
        try:
            wf = load_workflow(target, source_name=name)
        except DefinitionError as exc:
            # "(file)", "(source)", "(plan)" name no YAML field: the problem says it all
            pseudo = exc.field is None or (exc.field.startswith("(") and exc.field != "(top level)")
            head = "" if pseudo else f"{exc.field}: "
            elsewhere = exc.source_name not in (None, name)
            at = f", line {exc.line}" if exc.line is not None else ""
            tail = f" (in {exc.source_name}{at})" if elsewhere else ""
            return FileCheck(
                path=name,
                line=None if elsewhere else exc.line,
                error=f"{head}{exc.problem}{tail}",
            )
        except WorkflowError as exc:  # the library could not provide a child, ...
            return FileCheck(path=name, error=" ".join(str(exc).split()))
    try:
        # As `wf run` (and its --dry-run) would freeze it: models templated from params are
        # rendered with the default params when they resolve, so the hashes agree.
        wf = preview_workflow(wf, None)
    except UsageError as exc:
        return FileCheck(path=name, error=f"{' '.join(str(exc).split())} (with the default params)")
    return FileCheck(path=name, plan_hash=wf.plan_hash)


@contextmanager
def _library() -> Iterator[None]:
    """Children resolve through the library ``wf run`` uses, caching remote copies only in a
    temporary directory (a check writes nothing to the state dir)."""
    from ..library import Library

    with (
        tempfile.TemporaryDirectory(prefix="wf-check-") as scratch,
        Library.from_environ(state_dir=scratch) as library,
        library.using(),
    ):
        yield


@contextmanager
def _importable(directory: Path) -> Iterator[None]:
    """``python: module:function`` targets import modules beside the file, as ``wf run`` does."""
    added = str(directory) not in sys.path
    if added:
        sys.path.insert(0, str(directory))
    try:
        yield
    finally:
        if added and str(directory) in sys.path:
            sys.path.remove(str(directory))
