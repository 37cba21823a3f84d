"""Load YAML with YAML 1.2 scalars and remember the source line of every value."""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from ..errors import DefinitionError

Path = tuple[str | int, ...]


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader whose implicit resolvers follow YAML 1.2 core: only true/false are booleans."""


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
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text)


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_with_lines(text: str, *, source_name: str | None = None) -> tuple[Any, dict[Path, int]]:
    """Parse ``text`` into plain Python values plus a map from value path to 1-based line.

    Raises:
        DefinitionError: the text is not valid YAML (with the line of the problem).
    """
    try:
        node = yaml.compose(text, Loader=_Yaml12Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise DefinitionError(
            f"invalid YAML: {problem}",
            field="(yaml)",
            line=mark.line + 1 if mark else None,
            source_name=source_name,
        ) from exc
    lines: dict[Path, int] = {}
    if node is None:
        return None, lines
    loader = _Yaml12Loader("")
    try:
        value = _build(node, (), lines, loader, source_name)
    finally:
        loader.dispose()
    return value, lines


def _build(
    node: yaml.Node, path: Path, lines: dict[Path, int], loader: yaml.SafeLoader, src: str | None
) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise DefinitionError(
                    f"keys must be strings (got {key!r})",
                    field=_dotted(path) or "(top level)",
                    line=key_node.start_mark.line + 1,
                    source_name=src,
                )
            if key in out:
                raise DefinitionError(
                    f"duplicate key {key!r}",
                    field=_dotted((*path, key)),
                    line=key_node.start_mark.line + 1,
                    source_name=src,
                )
            out[key] = _build(value_node, (*path, key), lines, loader, src)
            lines[(*path, key)] = key_node.start_mark.line + 1  # errors point at the key
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(child, (*path, i), lines, loader, src) for i, child in enumerate(node.value)]
    value = loader.construct_object(node, deep=True)
    if isinstance(value, float) and not math.isfinite(value):
        raise DefinitionError(
            f"expected a finite number (got {node.value}); .inf and .nan are not allowed",
            field=_dotted(path) or "(top level)",
            line=node.start_mark.line + 1,
            source_name=src,
        )
    return value


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
