"""Template syntax outside the template fields: refused at freeze time, never kept literally.

A workflow's strings are of three sorts. *Template fields* are rendered (per unit, from
params, earlier outputs, the map item and gate feedback). *Model fields* are rendered once,
when a run starts, from params only (``spec/models_resolve.py``). Every other string, a key or
a value (ids, names, descriptions, ``runner:``, ``exec`` argv, ``pass_env``, route cases,
param and output schemas, alias tables), is taken as written, so ``{{`` or ``{%`` in one would
reach the runner or the journal as literal braces: it is a definition error instead.

Runner options (the values under ``runners.<name>``) pass to the runner as written, so they
are refused too (a ``base_url: "http://{{ params.host }}/v1"`` would reach the runner as
literal braces), except the few a runner renders itself (``RUNNER_TEMPLATES``): the scripted
runner's string replies, templates over the prompt and the match groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a resume renders models without loading the YAML reader
    from .source import Source
    from .yamlload import Path

ANY = "*"
"""Matches one path element (a key or an index)."""
REST = "**"
"""Matches the rest of a path (every value below, not the keys)."""

TEMPLATE_FIELDS: tuple[tuple[str, ...], ...] = (
    ("steps", ANY, "prompt"),
    ("steps", ANY, "map"),
    ("steps", ANY, "route", "on"),
    ("steps", ANY, "with", ANY, REST),
    ("steps", ANY, "gate", "criteria", ANY),
    ("steps", ANY, "gate", "check"),
    ("steps", ANY, "score", ANY, "equals"),
    ("steps", ANY, "score", ANY, "contains"),
    ("steps", ANY, "score", ANY, "regex"),
    ("steps", ANY, "score", ANY, "rubric"),
)
"""Where templates are rendered (a step kind that reads another template field adds it here)."""
MODEL_FIELDS: tuple[tuple[str, ...], ...] = (
    ("steps", ANY, "model"),
    ("steps", ANY, "gate", "model"),
    ("steps", ANY, "score", ANY, "model"),
)
"""Fields rendered from params when a run starts (``spec/models_resolve.py``)."""
RUNNER_TEMPLATES: dict[str, tuple[tuple[str, ...], ...]] = {
    "scripted": (("rules", ANY, "reply"), ("replies", ANY)),
}
"""Runner options a runner renders itself, by runner type: paths below ``runners.<name>``.

Only a string there is a template (``runners/scripted.py``: ``_render_reply``); a JSON reply is
returned as written, so ``{{`` inside one is refused like any other option value.
"""
RUNNER_FIELDS: tuple[tuple[str, ...], ...] = (
    ("runner",),
    ("steps", ANY, "runner"),
    ("steps", ANY, "gate", "runner"),
    ("steps", ANY, "score", ANY, "runner"),
)
_MARKERS = ("{{", "{%")


def is_templated(text: str) -> bool:
    """Whether ``text`` holds Jinja syntax (``{{`` or ``{%``)."""
    return any(m in text for m in _MARKERS)


def _matches(pattern: tuple[str, ...], path: Path) -> bool:
    for i, part in enumerate(pattern):
        if part == REST:
            return True
        if i >= len(path) or (part != ANY and part != path[i]):
            return False
    return len(pattern) == len(path)


def _rendered(path: Path, root: Any) -> bool:
    if path and path[0] == "runners":
        return _runner_renders(path, root)
    patterns = (*TEMPLATE_FIELDS, *MODEL_FIELDS)
    return any(_matches(p, path) for p in patterns)


def _runner_renders(path: Path, root: Any) -> bool:
    """Whether the runner option at ``path`` (``runners.<name>.…``) is one its runner renders."""
    if len(path) < 3:
        return False
    options = root.get("runners", {}).get(path[1]) if isinstance(root, dict) else None
    kind = options.get("type", path[1]) if isinstance(options, dict) else path[1]
    own = RUNNER_TEMPLATES.get(kind, ()) if isinstance(kind, str) else ()
    return any(_matches(p, path[2:]) for p in own)


def _problem(path: Path) -> str:
    if any(_matches(p, path) for p in RUNNER_FIELDS):
        return (
            "`runner:` is not a template: name a runner (the runner decides which options "
            "freeze checks, so it cannot wait for params); template `model:` from params instead"
        )
    if len(path) >= 3 and path[0] == "runners" and path[2:] != ("type",):
        return (
            "is a runner option, passed to the runner as written, so `{{`/`{%` here would "
            "reach it as literal text (only the scripted runner's string `reply:` values are "
            "templates); write the value out, or pass it from a template field"
        )
    if len(path) >= 3 and path[0] == "steps" and path[2] == "exec":
        return (
            "`exec:` argv is frozen and never templated; an exec unit reads its map item "
            "from $WF_ITEM (or use a python step to build arguments)"
        )
    return (
        "is not a template, so `{{`/`{%` here would be kept as literal text; templates are "
        "rendered only in prompt, map, route.on, with, gate.criteria, gate.check and a "
        "score's equals, contains, regex and rubric, and `model:` from params"
    )


def check_literals(data: Any, src: Source) -> None:
    """Refuse Jinja syntax in every key, and in every value outside the rendered fields.

    Raises:
        DefinitionError: naming the field and its line.
    """
    _walk(data, (), src, data)


def _walk(value: Any, path: Path, src: Source, root: Any) -> None:
    if isinstance(value, str):
        if is_templated(value) and not _rendered(path, root):
            raise src.error(_problem(path), path)
    elif isinstance(value, dict):
        for key, sub in value.items():
            if isinstance(key, str) and is_templated(key):
                raise src.error("a key is not a template; write it without `{{`/`{%`", (*path, key))
            _walk(sub, (*path, key), src, root)
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            _walk(sub, (*path, i), src, root)
