"""Model aliases: the ``models:`` tables of a workflow, of ``models.yaml`` beside it and in the
state dir, merged by precedence into one table of alias → runner → model id.

An alias names a model id per runner. The YAML shape is the same in all three places (the
files hold the mapping at their top level)::

    fast: gpt-4o-mini                 # one id for every runner
    reasoning:
      openai: o3-mini                 # by runner name (a `runners:` entry) ...
      scripted: scripted-big          # ... or by runner type
      default: gpt-4o                 # any other runner

Precedence, highest first: the workflow's ``models:``, ``models.yaml`` beside the workflow
file, the user's ``models.yaml``: in the state dir (``--db``, ``Engine(state_dir)``), then in
``$WF_MAGIC_HOME`` when that is another folder. A higher source replaces a whole
alias entry, it does not merge runner keys into a lower one. A ``model:`` that names no alias
is an exact model id; an alias's id is never looked up again (no chains).
"""

from __future__ import annotations

import os
from pathlib import Path as FsPath
from typing import Any

from ..errors import DefinitionError
from .models_resolve import DEFAULT_RUNNER, model_id_problem
from .source import Source, read_source
from .yamlload import Path

ALIASES_FILENAME = "models.yaml"

AliasTable = dict[str, dict[str, str]]
"""Alias → runner name or type (or ``default``) → model id."""


def parse_table(data: Any, src: Source, at: Path) -> AliasTable:
    """The alias table written at ``at`` of ``src``, each entry as runner → id.

    Raises:
        DefinitionError: naming the line and field of the first bad alias or id.
    """
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise src.error(
            "expected a mapping of alias → model id, or alias → {runner: model id} "
            f"(got {type(data).__name__})",
            at,
        )
    table: AliasTable = {}
    for alias, entry in data.items():
        where: Path = (*at, alias)
        if not isinstance(alias, str) or model_id_problem(alias):
            raise src.error(
                f"expected an alias name on one line, without spaces around it or `{{{{` "
                f"(got {alias!r:.80})",
                where,
            )
        if isinstance(entry, str):
            entry = {DEFAULT_RUNNER: entry}
        if not isinstance(entry, dict) or not entry:
            raise src.error(
                "expected a model id, or a non-empty mapping of runner → model id "
                f"(got {type(entry).__name__})",
                where,
            )
        ids: dict[str, str] = {}
        for runner, model in entry.items():
            if not isinstance(model, str):
                raise src.error(
                    f"expected a model id (got {type(model).__name__})", (*where, runner)
                )
            problem = model_id_problem(model)
            if problem:
                raise src.error(problem, (*where, runner) if len(entry) > 1 else where)
            ids[str(runner)] = model
        table[alias] = ids
    return table


def read_table(path: FsPath) -> AliasTable:
    """The alias table of a ``models.yaml`` file (empty when there is none).

    Raises:
        DefinitionError: the file is unreadable, not YAML, or holds a bad entry (its line).
    """
    if not path.is_file():
        return {}
    src = Source(read_source(path), str(path))
    return parse_table(src.data, src, ())


def base_table(*, home: FsPath | None, beside: FsPath | None, exclude: FsPath | None) -> AliasTable:
    """The aliases every workflow of one load sees: ``$WF_MAGIC_HOME``'s, the state dir
    ``home``'s, then the workflow folder ``beside``'s, each later one winning.

    ``exclude`` is the workflow file itself (a workflow named ``models.yaml`` is no table).
    """
    env_home = os.environ.get("WF_MAGIC_HOME")
    folders = [FsPath(env_home)] if env_home else []
    folders += [f for f in (home, beside) if f is not None]
    table: AliasTable = {}
    seen: set[FsPath] = set()
    for folder in folders:
        path = (folder / ALIASES_FILENAME).resolve()
        if path in seen or (exclude is not None and path == exclude.resolve()):
            continue
        seen.add(path)
        try:
            table.update(read_table(path))
        except DefinitionError as exc:
            raise DefinitionError(
                f"model aliases: {exc.problem}",
                field=exc.field,
                line=exc.line,
                source_name=str(path),
            ) from None
    return table
