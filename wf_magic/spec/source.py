"""Workflow source text: reading a file, size limits, further YAML documents, line-naming errors."""

from __future__ import annotations

import re
from pathlib import Path as FsPath

from ..errors import DefinitionError, FileRefused, clip, clip_message
from ..reading import read_bounded
from .workflow import MAX_SOURCE_BYTES
from .yamlload import Path, dotted, line_of, load_with_lines

MAX_PROBLEM_CHARS = 600
"""A message's problem text is clipped here, whatever the values it echoes."""


class Source:
    """One parsed source document and its line map, for error messages."""

    def __init__(self, text: str, name: str | None, *, child: str | None = None):
        # surrogatepass: a lone surrogate is reported by the YAML reader, with its line
        if len(text.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
            raise DefinitionError(
                f"source is larger than {MAX_SOURCE_BYTES} bytes",
                field="(source)",
                source_name=name,
            )
        self.text = text
        self.name = name
        self.child = child
        self.data, self.lines = load_with_lines(text, source_name=name)

    def error(self, problem: str, path: Path) -> DefinitionError:
        """The error for ``problem`` at ``path``, naming its line (and the child, if any)."""
        if self.child is not None:
            problem = f"in child workflow {self.child!r}: {problem}"
        return DefinitionError(
            clip_message(problem, MAX_PROBLEM_CHARS),
            field=clip(dotted(path), 120) or "(top level)",
            line=line_of(self.lines, path),
            source_name=self.name,
        )


def read_source(path: FsPath) -> str:
    """The text of a workflow file.

    Raises:
        DefinitionError: the file cannot be read, is not a regular file (a FIFO, a device,
            a directory), is larger than ``MAX_SOURCE_BYTES``, or is not UTF-8 (naming the
            line). At most ``MAX_SOURCE_BYTES + 1`` bytes are read, whatever the file.
    """
    try:
        data = read_bounded(path, limit=MAX_SOURCE_BYTES)
    except FileRefused as exc:
        problem = (
            f"source is {exc.problem}"
            if exc.reason == "too_large"
            else f"cannot read workflow file: {exc.problem}"
        )
        raise DefinitionError(problem, field="(file)", source_name=str(path)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DefinitionError(
            f"not UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8",
            field="(file)",
            line=data.count(b"\n", 0, exc.start) + 1,
            source_name=str(path),
        ) from None


def split_documents(text: str, name: str) -> tuple[str, dict[str, str]]:
    """Split off further YAML documents; each defines a child workflow by its ``name``."""
    seps = [m.start() for m in re.finditer(r"(?m)^---[ \t]*$", text)]
    if seps and not text[: seps[0]].strip():
        seps = seps[1:]  # a leading '---' opens the first document
    if not seps:
        return text, {}
    bounds = [*seps, len(text)]
    out: dict[str, str] = {}
    for start, end in zip(bounds, bounds[1:], strict=False):
        # Pad with the newlines before the document so its errors name the source's own lines.
        part = "\n" * text.count("\n", 0, start) + text[start:end]
        data, _ = load_with_lines(part, source_name=name)
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            out[data["name"]] = part
    return text[: seps[0]], out
