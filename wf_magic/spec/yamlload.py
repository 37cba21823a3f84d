"""Load YAML with YAML 1.2 scalars and remember the source line of every value.

Workflows use plain YAML only: anchors, aliases, merge keys and tags (other than the core
scalar ones) are refused while composing, before anything is expanded, so a small file
cannot expand into a huge one (billion laughs) or refer to itself. Values nest at most
``MAX_DEPTH`` levels and integers have at most ``MAX_INT_DIGITS`` digits.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from ..errors import DefinitionError, clip

Path = tuple[str | int, ...]

MAX_DEPTH = 64
"""Levels of nested mappings and sequences in one document."""
MAX_INT_DIGITS = 4300
"""Digits of an integer (Python's own int-to-text limit)."""
_CORE_SCALAR_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null")
)
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_TOO_BIG = 10**MAX_INT_DIGITS
_ALIASES_REFUSED = "anchors and aliases are not supported in workflows; repeat the value"


class _Refused(yaml.MarkedYAMLError):
    """A YAML feature workflows do not use, found while composing (before any expansion)."""

    def __init__(self, problem: str, mark: yaml.Mark | None):
        super().__init__(problem=problem, problem_mark=mark)


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader whose implicit resolvers follow YAML 1.2 core: only true/false are booleans.

    Its composer refuses anchors, aliases, tags and nesting past ``MAX_DEPTH``.
    """

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(_ALIASES_REFUSED, event.start_mark)
        tag = getattr(event, "tag", None)
        is_collection = isinstance(event, yaml.CollectionStartEvent)
        if tag is not None and (is_collection or tag not in _CORE_SCALAR_TAGS):
            raise _Refused(
                f"YAML tag {clip(tag, 40)!r} is not supported in workflows; remove it",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    f"values nest deeper than {MAX_DEPTH} levels; flatten the structure",
                    event.start_mark,
                )
            return super().compose_node(parent, index)  # type: ignore[return-value]
        finally:
            self._depth -= 1


_Yaml12Loader.yaml_implicit_resolvers = {}
for _tag, _regexp, _first in [
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
]:
    _Yaml12Loader.add_implicit_resolver(_tag, re.compile(_regexp), list(_first))


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith("0o"):
        value = int(text[2:], 8)
    elif text.startswith("0x"):
        value = int(text[2:], 16)
    else:
        value = int(text) if len(text) <= MAX_INT_DIGITS else _TOO_BIG
    if abs(value) >= _TOO_BIG:
        raise yaml.constructor.ConstructorError(
            problem=f"integer is too large; at most {MAX_INT_DIGITS} digits",
            problem_mark=node.start_mark,
        )
    return value


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_with_lines(text: str, *, source_name: str | None = None) -> tuple[Any, dict[Path, int]]:
    """Parse ``text`` into plain Python values plus a map from value path to 1-based line.

    Raises:
        DefinitionError: the text is not valid YAML, or uses anchors, aliases, merge keys,
            tags, deep nesting or huge integers (with the line of the problem).
    """
    try:
        node = yaml.compose(text, Loader=_Yaml12Loader)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, source_name) from None
    lines: dict[Path, int] = {}
    if node is None:
        return None, lines
    loader = _Yaml12Loader("")
    try:
        value = _build(node, (), lines, loader, source_name)
    finally:
        loader.dispose()
    return value, lines


def _yaml_error(exc: yaml.YAMLError, text: str, source_name: str | None) -> DefinitionError:
    if isinstance(exc, yaml.reader.ReaderError):
        # The reader reports a character position; authors count lines.
        code = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1])
        return DefinitionError(
            f"invalid YAML: character #x{code:04x} is not allowed (control characters and "
            "lone surrogates cannot appear in a workflow); remove it",
            field="(yaml)",
            line=text.count("\n", 0, exc.position) + 1,
            source_name=source_name,
        )
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if isinstance(exc, _Refused):
        return DefinitionError(
            problem, field="(yaml)", line=mark.line + 1 if mark else None, source_name=source_name
        )
    return DefinitionError(
        f"invalid YAML: {clip(problem, 200)}",
        field="(yaml)",
        line=mark.line + 1 if mark else None,
        source_name=source_name,
    )


def _build(
    node: yaml.Node, path: Path, lines: dict[Path, int], loader: yaml.SafeLoader, src: str | None
) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node, path, loader, src)
            if not isinstance(key, str):
                raise _error(f"keys must be strings (got {clip(repr(key))})", path, key_node, src)
            if key == "<<":
                raise _error(
                    "merge keys (<<) are not supported in workflows; repeat the keys",
                    path,
                    key_node,
                    src,
                )
            if key in out:
                raise _error(f"duplicate key {clip(repr(key))}", (*path, key), key_node, src)
            out[key] = _build(value_node, (*path, key), lines, loader, src)
            lines[(*path, key)] = key_node.start_mark.line + 1  # errors point at the key
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(child, (*path, i), lines, loader, src) for i, child in enumerate(node.value)]
    value = _scalar(node, path, loader, src)
    if isinstance(value, float) and not math.isfinite(value):
        raise _error(
            f"expected a finite number (got {clip(node.value)}); .inf and .nan are not allowed",
            path,
            node,
            src,
        )
    return value


def _scalar(node: yaml.Node, path: Path, loader: yaml.SafeLoader, src: str | None) -> Any:
    """Construct one scalar; a bad value names its field and line instead of a traceback."""
    try:
        value = loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError) as exc:
        raise _error(
            clip(getattr(exc, "problem", None) or str(exc), 200), path, node, src
        ) from None
    if isinstance(value, str) and _SURROGATE.search(value):
        raise _error(
            "contains a lone surrogate (an escape like \\ud800), which is not valid Unicode; "
            "write the character itself",
            path,
            node,
            src,
        )
    return value


def _error(problem: str, path: Path, node: yaml.Node, src: str | None) -> DefinitionError:
    return DefinitionError(
        problem, field=_field(path), line=node.start_mark.line + 1, source_name=src
    )


def _field(path: Path) -> str:
    return clip(_dotted(path), 120) or "(top level)"


def _dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def dotted(path: Path) -> str:
    """Render a value path as ``steps[2].gate.max_loops``."""
    return _dotted(path)


def line_of(lines: dict[Path, int], path: Path) -> int | None:
    """The line of ``path`` or of its nearest ancestor that has one."""
    for cut in range(len(path), -1, -1):
        if path[:cut] in lines:
            return lines[path[:cut]]
    return None
