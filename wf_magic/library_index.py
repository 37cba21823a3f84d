"""The workflow library's index document: parsing and checking name → source + sha256.

An index is JSON or YAML::

    version: 1                      # optional
    workflows:
      review:
        url: https://example.org/wf/review.yaml   # absolute, or relative to a remote index
        sha256: 3f1c…                              # 64 hex digits of the file's bytes
        description: Review a draft                # optional
      digest:
        path: digest.yaml                          # a local index only: beside the index
        sha256: 9a0b…                              # optional for a path

Every problem is one :class:`LibraryIndexError` line naming the index and the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from .errors import UsageError, WorkflowError, clip

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
"""A library name: the same shape as a workflow or child name (``review``, ``fix-digest``)."""
MAX_NAME_LENGTH = 64
MAX_DOCUMENT_BYTES = 1_000_000
"""The largest index or workflow source the library reads or fetches."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ENTRY_KEYS = {"url", "path", "sha256", "description"}
_TOP_KEYS = {"version", "workflows"}


class LibraryError(WorkflowError):
    """The workflow library could not provide a workflow (the subclasses say why)."""


class LibraryIndexError(LibraryError, UsageError):
    """An index document is malformed: not JSON/YAML, or a field has the wrong shape."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexEntry:
    """One workflow an index lists."""

    name: str
    url: str | None
    """An absolute ``http(s)`` URL (a relative one was resolved against the index's URL)."""
    path: str | None
    """A local file, resolved against the folder of a local index."""
    sha256: str | None
    """The promised sha256 of the source's bytes (required for a URL)."""
    description: str = ""


def is_url(location: str) -> bool:
    """Whether ``location`` is an ``http(s)`` URL (anything else is a local path)."""
    return urlsplit(location).scheme.lower() in ("http", "https")


def check_name(name: str) -> None:
    """Refuse a library name that is not a plain workflow name (no paths, no URLs).

    Raises:
        LibraryIndexError: the name has the wrong shape.
    """
    if not NAME_PATTERN.match(name) or len(name) > MAX_NAME_LENGTH:
        raise LibraryIndexError(
            f"expected a workflow name matching {NAME_PATTERN.pattern} of at most "
            f"{MAX_NAME_LENGTH} characters (got {clip(repr(name))})"
        )


def parse_index(
    body: str, *, where: str, base_dir: str | None, base_url: str | None = None
) -> dict[str, IndexEntry]:
    """The entries of index document ``body`` read from ``where`` (a URL or a file path).

    ``base_dir`` is the folder of a local index (``path`` entries resolve against it); a
    remote index has none and may not list ``path`` entries. ``base_url`` is the URL relative
    ``url`` entries resolve against (default ``where``): the real one, where ``where`` is the
    URL as messages show it (credentials masked).

    Raises:
        LibraryIndexError: the document is not JSON/YAML or not an index (one line).
    """
    data = _decode(body, where)
    if not isinstance(data, dict):
        raise _problem(where, "(top level)", "expected a mapping with `workflows:`", data)
    _refuse_unknown(data, _TOP_KEYS, where=where, field="(top level)")
    if data.get("version", 1) != 1:
        raise _problem(where, "version", "expected 1", data.get("version"))
    listed = data.get("workflows")
    if not isinstance(listed, dict):
        raise _problem(where, "workflows", "expected a mapping of name → entry", listed)
    entries: dict[str, IndexEntry] = {}
    for name, raw in listed.items():
        if not isinstance(name, str) or not NAME_PATTERN.match(name) or len(name) > MAX_NAME_LENGTH:
            raise _problem(
                where, "workflows", f"expected names matching {NAME_PATTERN.pattern}", name
            )
        entries[name] = _entry(name, raw, where=where, base_dir=base_dir, base_url=base_url)
    return entries


def _decode(body: str, where: str) -> Any:
    if body.lstrip().startswith(("{", "[")):
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise LibraryIndexError(
                f"Workflow index {where} is not valid JSON: {clip(str(exc), 160)}; fix the file "
                "(or its URL)"
            ) from None
    import yaml

    try:
        return yaml.safe_load(body)
    except Exception as exc:  # noqa: BLE001 - PyYAML raises more than YAMLError on hostile text
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise LibraryIndexError(
            f"Workflow index {where} is not valid JSON or YAML: {clip(first, 160)}; fix the "
            "file (or its URL)"
        ) from None


def _entry(
    name: str, raw: object, *, where: str, base_dir: str | None, base_url: str | None
) -> IndexEntry:
    field = f"workflows.{name}"
    if not isinstance(raw, dict):
        raise _problem(where, field, "expected a mapping with url or path, and sha256", raw)
    _refuse_unknown(raw, _ENTRY_KEYS, where=where, field=field)
    url, path, sha, description = (raw.get(k) for k in ("url", "path", "sha256", "description"))
    if (url is None) == (path is None):
        raise _problem(where, field, "expected exactly one of url and path", sorted(map(str, raw)))
    for key, value in (("url", url), ("path", path), ("description", description)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise _problem(where, f"{field}.{key}", "expected a non-empty string", value)
    if sha is not None:
        if not isinstance(sha, str) or not _SHA256.match(sha.strip().lower()):
            raise _problem(where, f"{field}.sha256", "expected 64 hex digits", sha)
        sha = sha.strip().lower()
    if isinstance(url, str):
        url = _absolute_url(url, where=where, base=base_url or where, field=f"{field}.url")
        if sha is None:
            raise _problem(where, f"{field}.sha256", "a url needs its sha256 (got none)", None)
    if isinstance(path, str):
        if base_dir is None:
            raise _problem(where, f"{field}.path", "a remote index lists urls, not paths", path)
        from pathlib import Path

        path = str(Path(base_dir) / Path(path).expanduser())
    return IndexEntry(
        name=name,
        url=url if isinstance(url, str) else None,
        path=path if isinstance(path, str) else None,
        sha256=sha,
        description=description if isinstance(description, str) else "",
    )


def _absolute_url(url: str, *, where: str, base: str, field: str) -> str:
    """``url`` made absolute against a remote index at ``base``; only http(s) is accepted."""
    resolved = urljoin(base, url.strip()) if is_url(base) else url.strip()
    if not is_url(resolved) or not urlsplit(resolved).hostname:
        raise _problem(where, field, "expected an http(s) URL", url)
    return resolved


def _refuse_unknown(data: dict[Any, Any], known: set[str], *, where: str, field: str) -> None:
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise LibraryIndexError(
            f"Workflow index {where}: {field}: unknown key(s) {clip(', '.join(unknown), 120)}; "
            f"the keys are {', '.join(sorted(known))}; fix the index"
        )


def _problem(where: str, field: str, expected: str, got: object) -> LibraryIndexError:
    return LibraryIndexError(
        f"Workflow index {where}: {field}: {expected} (got {clip(repr(got), 120)}); fix the index"
    )
