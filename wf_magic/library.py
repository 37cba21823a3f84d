"""The workflow library: workflows by name from folders and an index, remote copies cached.

A name resolves, first hit wins, from:

1. the folders on the search path (``$WF_MAGIC_PATH``, ``os.pathsep``-separated, then
   ``./workflows``): ``NAME.yaml`` or ``NAME.yml``;
2. the index (``$WF_MAGIC_INDEX``: a JSON/YAML file or an ``http(s)`` URL, see
   :mod:`wf_magic.library_index`) listing ``NAME`` → ``url``/``path`` + ``sha256``.

Remote documents go through the ``library_cache`` table of the state DB. An index copy is
fresh for ``ttl_s`` (``$WF_MAGIC_LIBRARY_TTL``, default 1 h) and used without the network;
a stale one is refetched and written back; when that fetch fails the stale copy is used
with one :class:`StaleLibraryCopy` warning naming its age. A workflow source is
content-addressed: a cached copy whose sha256 is the one the index promises is used as is,
anything else is fetched and verified before it is cached. Errors::

    LibraryError (WorkflowError)
    ├── LibraryIndexError (UsageError)   a malformed or unreadable index (exit 2)
    ├── WorkflowNotFound (UsageError)    no folder or index has the name (exit 2)
    ├── FetchError                       unreachable, and no usable cached copy (exit 1)
    └── ChecksumMismatch                 fetched bytes are not what the index promised (exit 1)
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from .errors import FileRefused, UsageError, clip
from .library_fetch import Unreachable, fetch
from .library_index import (
    MAX_DOCUMENT_BYTES,
    IndexEntry,
    LibraryError,
    LibraryIndexError,
    check_name,
    is_url,
    parse_index,
)
from .reading import read_bounded
from .redact import MASK, Redactor, mask_url
from .store import Store
from .store.db import default_state, store_target
from .store.library_cache import LibraryCopy
from .store.location import parse_state

__all__ = [
    "ChecksumMismatch",
    "FetchError",
    "Library",
    "LibraryError",
    "LibraryIndexError",
    "LibraryWorkflow",
    "StaleLibraryCopy",
    "WorkflowNotFound",
    "child_source",
]

DEFAULT_TTL_S = 3600.0
"""How long a cached index copy is used without asking the network."""
FETCH_TIMEOUT_S = 10.0
"""The whole of one fetch (connect, headers, every redirect and the body), not each read."""
ENV_PATH, ENV_INDEX, ENV_TTL = "WF_MAGIC_PATH", "WF_MAGIC_INDEX", "WF_MAGIC_LIBRARY_TTL"
DEFAULT_FOLDER = Path("workflows")
"""Searched after ``$WF_MAGIC_PATH``, relative to the working directory."""
_SHAPES = Redactor()
"""Credential shapes, masked in an index before it is cached."""
_ACTIVE: ContextVar[Library | None] = ContextVar("wf_magic_library", default=None)


class WorkflowNotFound(LibraryError, UsageError):
    """No folder on the search path and no index entry has the name."""


class FetchError(LibraryError):
    """A remote document could not be fetched and no usable copy is cached."""


class ChecksumMismatch(LibraryError):
    """Fetched bytes do not have the sha256 the index promises; nothing was cached."""


class StaleLibraryCopy(UserWarning):
    """A cached index copy past its TTL is in use because refreshing it failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LibraryWorkflow:
    """A workflow source the library found, and where it came from."""

    name: str
    text: str
    origin: str
    """The file path or URL the source came from (a run records it as ``source_path``); a
    URL's credentials (a password, an ``?access_token=``) read ``***``."""
    sha256: str
    """Hex sha256 of the source's bytes (verified against the index when it lists one)."""
    path: Path | None = None
    """The local file, when there is one (``python:`` modules beside it are importable)."""

    @property
    def source(self) -> str | Path:
        """What to freeze (``Engine.load``): the local file, else the text.

        A one-line text ending in ``.yaml`` would be read as a path; it cannot be a workflow,
        and a newline keeps it text so that freezing it reports why.
        """
        if self.path is not None:
            return self.path
        one_line = "\n" not in self.text and self.text.rstrip().endswith((".yaml", ".yml"))
        return self.text + "\n" if one_line else self.text

    @property
    def origin_text(self) -> str:
        """``ORIGIN (sha256 0123456789ab)``: where a message says the workflow came from."""
        return f"{self.origin} (sha256 {self.sha256[:12]})"


class Library:
    """Workflows by name from ``folders`` and an ``index``, with remote copies cached.

    Args:
        folders: searched in order for ``NAME.yaml`` / ``NAME.yml``.
        index: a JSON/YAML index file or an ``http(s)`` URL of one (None: folders only).
        store: the state DB holding the cache (e.g. an Engine's ``store``); without it one
            is opened in ``state_dir`` (default ``$WF_MAGIC_HOME`` or ``./.wf_magic``) the
            first time something remote is needed, and closed by :meth:`close`.
        ttl_s: how long a cached index copy is fresh (0: refetch every time).
        timeout_s: the deadline of one fetch, start to end (a server that drips is cut).
    """

    def __init__(
        self,
        *,
        folders: Sequence[str | Path] = (DEFAULT_FOLDER,),
        index: str | Path | None = None,
        store: Store | None = None,
        state_dir: str | Path | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        timeout_s: float = FETCH_TIMEOUT_S,
    ):
        if not ttl_s >= 0 or not 0 < timeout_s < float("inf"):  # nan fails both
            raise UsageError(
                f"expected ttl_s >= 0 and a finite timeout_s > 0 (got {ttl_s}, {timeout_s})"
            )
        self.folders = [Path(f).expanduser() for f in folders]
        self.index = str(index) if index is not None else None
        self.ttl_s = float(ttl_s)
        self.timeout_s = float(timeout_s)
        self._store = store
        self._owns_store = False
        self._state_dir = parse_state(state_dir) if state_dir is not None else None
        self._entries: dict[str, IndexEntry] | None = None
        self._warned: set[str] = set()

    @classmethod
    def from_environ(
        cls,
        *,
        store: Store | None = None,
        state_dir: str | Path | None = None,
        ttl_s: float | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Library:
        """The library ``$WF_MAGIC_PATH``, ``$WF_MAGIC_INDEX`` and ``$WF_MAGIC_LIBRARY_TTL``
        describe (``ttl_s`` overrides the variable).

        Raises:
            UsageError: ``$WF_MAGIC_LIBRARY_TTL`` is not a duration.
        """
        env = os.environ if environ is None else environ
        folders = [Path(p) for p in env.get(ENV_PATH, "").split(os.pathsep) if p.strip()]
        if ttl_s is None:
            ttl_s = _duration_s(env[ENV_TTL]) if env.get(ENV_TTL, "").strip() else DEFAULT_TTL_S
        return cls(
            folders=[*folders, DEFAULT_FOLDER],
            index=env.get(ENV_INDEX, "").strip() or None,
            store=store,
            state_dir=state_dir,
            ttl_s=ttl_s,
        )

    def close(self) -> None:
        """Close the cache's database if this library opened it."""
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store, self._owns_store = None, False

    def __enter__(self) -> Library:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def using(self) -> Iterator[Library]:
        """Resolve child ``workflow: NAME`` steps frozen inside the block through this library."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    # -- resolving ------------------------------------------------------------------------------
    def find(self, name: str) -> LibraryWorkflow:
        """The workflow ``name``: from the first folder that has it, else from the index.

        Raises:
            WorkflowNotFound: no folder or index entry has it (close names are suggested).
            LibraryIndexError: the name or the index is malformed.
            FetchError: a remote document is unreachable and no usable copy is cached.
            ChecksumMismatch: fetched bytes differ from the index's sha256.
        """
        found = self.find_optional(name)
        if found is None:
            raise self._not_found(name)
        return found

    def find_optional(self, name: str) -> LibraryWorkflow | None:
        """Like :meth:`find`, but None when nothing has ``name`` (other failures raise)."""
        check_name(name)
        for folder in self.folders:
            for suffix in (".yaml", ".yml"):
                path = folder / f"{name}{suffix}"
                if path.is_file():
                    return _local(name, path, expected=None, listed_in=None)
        if self.index is None:
            return None
        entry = self.entries(name).get(name)
        if entry is None:
            return None
        if entry.path is not None:
            return _local(
                name, Path(entry.path), expected=entry.sha256, listed_in=self._index_shown
            )
        return self._remote_source(entry)

    def entries(self, needed_for: str | None = None) -> dict[str, IndexEntry]:
        """The index's entries (read once per library; {} without an index).

        ``needed_for`` is the name being looked up, for a fetch error to name.

        Raises:
            LibraryIndexError: the index is malformed or a local index cannot be read.
            FetchError: a remote index is unreachable and was never cached.
        """
        if self.index is None:
            return {}
        if self._entries is None:
            if is_url(self.index):
                self._entries = self._remote_index(self.index, needed_for)
            else:
                path = Path(self.index).expanduser()
                body = _read_text(path, what="Workflow index", hint=f"fix {ENV_INDEX}")
                self._entries = parse_index(body, where=str(path), base_dir=str(path.parent))
        return self._entries

    # -- remote documents -----------------------------------------------------------------------
    def _remote_index(self, url: str, needed_for: str | None) -> dict[str, IndexEntry]:
        shown = mask_url(url)  # the cache's key, and what messages say: no credentials
        copy = self._cache().library_copy(shown)
        now = time.time()
        if copy is not None and now - copy.fetched_at < self.ttl_s:
            cached = _parse_remote(copy.body, url)
            if not _masked_urls(cached):
                return cached
            # the index lists URLs with credentials, masked at rest: fetch the real ones
        try:
            data = self._fetch(url)
            body = _utf8(data, shown)
            entries = _parse_remote(body, url)  # never cache a bad index
        except (Unreachable, LibraryError) as exc:
            if copy is None:
                if isinstance(exc, LibraryError):
                    raise
                wanted = f" (looking up {needed_for!r})" if needed_for else ""
                raise FetchError(
                    f"Cannot fetch the workflow index {shown}{wanted}: {exc}; no copy is "
                    f"cached. Check the network and {ENV_INDEX}, or put the workflow in a "
                    f"folder on {ENV_PATH} (or ./workflows)."
                ) from None
            self._warn_stale(shown, copy, str(exc))
            return _parse_remote(copy.body, url)
        kept = _SHAPES.redact(body)  # a credential the index lists is not kept at rest
        self._cache().keep_library_copy(
            LibraryCopy(url=shown, kind="index", body=kept, sha256=_sha256(data), fetched_at=now)
        )
        return entries

    def _remote_source(self, entry: IndexEntry) -> LibraryWorkflow:
        url, expected = entry.url or "", entry.sha256 or ""
        shown = mask_url(url)  # the cache's key, the run's source_path, what messages say
        copy = self._cache().library_copy(shown)
        if copy is not None and copy.sha256 == expected:  # content-addressed: never stale
            return LibraryWorkflow(name=entry.name, text=copy.body, origin=shown, sha256=expected)
        try:
            data = self._fetch(url)
        except Unreachable as exc:
            older = " (the cached copy is another version)" if copy is not None else ""
            raise FetchError(
                f"Cannot fetch workflow {entry.name!r} from {shown}: {exc}; no copy with the "
                f"index's sha256 is cached{older}. Check the network and the index "
                f"{self._index_shown}, or put {entry.name}.yaml in a folder on {ENV_PATH}."
            ) from None
        actual = _sha256(data)
        if actual != expected:
            raise ChecksumMismatch(
                f"Workflow {entry.name!r} from {shown} does not match the index "
                f"{self._index_shown}: expected sha256 {expected} (got {actual}); nothing was "
                "cached. Review the source and update the index's sha256, or restore the source."
            )
        body = _utf8(data, shown)
        self._cache().keep_library_copy(
            LibraryCopy(
                url=shown, kind="workflow", body=body, sha256=actual, fetched_at=time.time()
            )
        )
        return LibraryWorkflow(name=entry.name, text=body, origin=shown, sha256=actual)

    @property
    def _index_shown(self) -> str:
        """The index as messages name it: a URL's credentials masked."""
        return mask_url(self.index) if self.index is not None else "none"

    def _fetch(self, url: str) -> bytes:
        return fetch(url, timeout_s=self.timeout_s, limit=MAX_DOCUMENT_BYTES)

    def _cache(self) -> Store:
        if self._store is None:
            state = self._state_dir if self._state_dir is not None else default_state()
            self._store, self._owns_store = Store(store_target(state)), True
        return self._store

    def _warn_stale(self, url: str, copy: LibraryCopy, failure: str) -> None:
        if url in self._warned:
            return
        self._warned.add(url)
        fetched = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(copy.fetched_at))
        warnings.warn(
            f"workflow library: refreshing the index {url} failed ({failure}); using the "
            f"cached copy from {_age_text(time.time() - copy.fetched_at)} ago (fetched "
            f"{fetched}), which may list outdated workflows",
            StaleLibraryCopy,
            stacklevel=2,
        )

    def _not_found(self, name: str) -> WorkflowNotFound:
        folders = ", ".join(str(f.resolve()) for f in self.folders) or "none"
        index = self._index_shown if self.index else f"none (set {ENV_INDEX})"
        known = {p.stem for f in self.folders if f.is_dir() for p in f.glob("*.y*ml")}
        known.update(self._entries or {})
        import difflib

        near = difflib.get_close_matches(name, sorted(known), n=3)
        hint = f" Did you mean {', '.join(near)}?" if near else ""
        return WorkflowNotFound(
            f"No workflow named {name!r} in the library (folders: {folders}; index: {index})."
            f"{hint} Put {name}.yaml in one of those folders (or a folder on {ENV_PATH}), or "
            "list it in the index."
        )


def child_source(name: str) -> LibraryWorkflow | None:
    """The library's workflow ``name`` for a child ``workflow:`` step (None: not in it).

    Uses the library a face activated with :meth:`Library.using`, else the one the
    environment describes.

    Raises:
        LibraryError: the library has the name but cannot provide it (fetch, sha256, index).
    """
    active = _ACTIVE.get()
    if active is not None:
        return active.find_optional(name)
    with Library.from_environ() as library:
        return library.find_optional(name)


def _local(
    name: str, path: Path, *, expected: str | None, listed_in: str | None
) -> LibraryWorkflow:
    hint = f"fix the index {listed_in}" if listed_in else "fix or remove the file"
    text = _read_text(path, what=f"Workflow {name!r} file", hint=hint)
    actual = _sha256(text.encode("utf-8"))
    if expected is not None and actual != expected:
        raise ChecksumMismatch(
            f"Workflow {name!r} at {path} does not match the index {listed_in}: expected sha256 "
            f"{expected} (got {actual}). Review the file and update the index's sha256."
        )
    return LibraryWorkflow(
        name=name, text=text, origin=str(path.resolve()), sha256=actual, path=path.resolve()
    )


def _read_text(path: Path, *, what: str, hint: str) -> str:
    try:
        data = read_bounded(path, limit=MAX_DOCUMENT_BYTES)
    except FileRefused as exc:
        if exc.reason == "too_large":
            problem = f"is {exc.problem}"
        else:
            problem = f"cannot be read: {exc.problem}"
        raise LibraryIndexError(f"{what} {path} {problem}; {hint}") from None
    return _utf8(data, str(path))


def _utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LibraryIndexError(
            f"{where} is not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}); save "
            "it as UTF-8"
        ) from None


def _parse_remote(body: str, url: str) -> dict[str, IndexEntry]:
    """The entries of the index fetched from ``url``; its errors show no credentials (of the
    index's URL, or of a URL it lists)."""
    try:
        return parse_index(body, where=mask_url(url), base_dir=None, base_url=url)
    except LibraryIndexError as exc:
        raise LibraryIndexError(_SHAPES.redact(str(exc))) from None


def _masked_urls(entries: Mapping[str, IndexEntry]) -> bool:
    """Whether an index read from the cache lists a URL whose credentials were masked."""
    return any(MASK in (e.url or "") for e in entries.values())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _age_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 5 min``, ``2 d 4 h``."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _duration_s(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``30m``, ``1h`` or ``2d`` (``$WF_MAGIC_LIBRARY_TTL``)."""
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    text = text.strip().lower()
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise UsageError(
            f"{ENV_TTL}: expected a duration like 3600, 30m, 1h or 2d (got {clip(repr(text))})"
        )
    return value
