"""Starter workflows for ``wf new``: one commented template per kind, each running offline.

Every starter names the offline ``scripted`` runner and gives it rules, so ``wf run NAME.yaml``
completes with no network and no key. A template holds the workflow name as ``@NAME@``; Jinja's
``{{ }}`` in it is the workflow's own templating, left as is. Add a kind by adding an entry to
:data:`STARTERS` (``wf new --kind`` lists the table's keys).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..library_index import NAME_PATTERN

_HEADER = """\
# @NAME@: a starter workflow written by `wf new @NAME@ --kind {kind}`.
# It runs offline as written, on the built-in `scripted` runner (deterministic, no network):
#
#   wf check @FILE@        # freeze it: prints "@FILE@: ok <plan hash>" or the line of an error
#   wf run @FILE@          # drive it; `wf status RUN` and `wf journal RUN` show what happened
#
# To call a real model, set `runner: openai` and a `model:` (docs/runners.md), and delete the
# `runners: scripted:` rules, which only stand in for the model here.
"""

PROMPT = """\
name: @NAME@
description: Explain a topic, then title the explanation.
params:                               # validated when a run starts; --param topic=... sets one
  topic: {type: string, default: write-ahead logging}
runner: scripted                      # the default runner of prompt steps
runners:
  scripted:
    rules:                            # the first rule whose regex finds the prompt answers
      - match: "^Explain"
        reply: "A write-ahead log records each change before applying it, so a crash replays it."
      - match: "^Title"
        reply: "Log first, survive crashes"
steps:
  - id: explain
    prompt: "Explain {{ params.topic }} in one sentence."
  - id: title                         # a later step reads an earlier one's output
    prompt: "Title this in five words: {{ steps.explain.output }}"
"""

MAP = """\
name: @NAME@
description: Review several files in parallel (a map), then summarise the reviews.
params:
  files: {type: array, items: {type: string}, default: [intro.md, method.md, results.md]}
execution: {max_concurrency: 3}       # map units in flight at once
runner: scripted
runners:
  scripted:
    rules:
      - match: "^Review"
        reply: {ok: true, note: reads well}
      - match: "^Summarise"
        reply: "every file reads well"
steps:
  - id: review
    map: "{{ params.files }}"         # one unit per item; `item` and `index` name it
    prompt: "Review {{ item }} (file {{ index }}) and answer JSON."
    output:                           # each unit's output is checked against this schema
      type: object
      properties: {ok: {type: boolean}, note: {type: string}}
      required: [ok, note]
  - id: summary                       # the map's output is the list of its units' outputs
    prompt: >-
      Summarise {{ steps.review.output | length }} reviews:
      {{ steps.review.output | map(attribute='note') | join('; ') }}
"""

GATE = """\
name: @NAME@
description: Draft an abstract until a judge accepts it (a gate that loops).
params:
  topic: {type: string, default: write-ahead logging}
runner: scripted
runners:
  scripted:
    rules:
      # The judge: its prompt starts 'Judge the artifact' and quotes the draft. It rejects
      # the first draft; the rejection re-runs the step with a "Gate feedback" block.
      - match: 'Judge the artifact(?s:.*)"draft 1'
        kind: judge
        reply: {complete: false, feedback: "Give a concrete example.", missing: [an example]}
      - match: 'Judge the artifact'
        kind: judge
        reply: {complete: true, feedback: "Clear and concrete.", missing: []}
      # The writer: a prompt carrying the judge's feedback gets the better draft.
      - match: 'Gate feedback \\(loop 1'
        reply: "draft 2: logging each change first lets SQLite replay its WAL after a crash."
      - match: '^Write'
        reply: "draft 1: logging each change first makes crashes survivable."
      - match: '^Title'
        reply: "Replay the log"
steps:
  - id: abstract
    prompt: "Write a one-sentence abstract on {{ params.topic }}."
    gate:
      judge: llm                      # llm | expr (a Jinja check, free) | human (wf approve)
      criteria: ["has a concrete example"]
      max_loops: 3                    # after 3 rejections the run blocks with the feedback
  - id: title
    prompt: "Title for: {{ steps.abstract.output }}"
"""

STARTERS: dict[str, str] = {"prompt": PROMPT, "map": MAP, "gate": GATE}
"""The starter of each ``wf new --kind``: ``prompt`` (two chained prompt steps), ``map`` (a
fan-out with an output schema, then a summary) and ``gate`` (an LLM judge that rejects once)."""


def starter_text(name: str, kind: str, *, file_name: str | None = None) -> str:
    """The commented starter workflow ``name`` of ``kind``.

    Raises:
        UsageError: ``name`` is not a workflow name, or ``kind`` has no starter.
    """
    if not NAME_PATTERN.match(name) or len(name) > 64:
        raise UsageError(
            f"wf new: expected a workflow name matching {NAME_PATTERN.pattern}, at most 64 "
            f"characters (got {name!r}); the file is NAME.yaml"
        )
    if kind not in STARTERS:
        raise UsageError(f"wf new: expected --kind {' | '.join(STARTERS)} (got {kind!r})")
    text = _HEADER.replace("{kind}", kind) + STARTERS[kind]
    return text.replace("@FILE@", file_name or f"{name}.yaml").replace("@NAME@", name)


def write_starter(target: str | Path, *, kind: str = "prompt", force: bool = False) -> Path:
    """Write the starter of ``kind`` to ``target`` (``NAME`` → ``NAME.yaml``; a path's stem is
    the workflow name); an existing file is kept unless ``force``.

    Returns:
        The path written.

    Raises:
        UsageError: a bad name or kind, the file exists (without ``force``), or it cannot be
            written.
    """
    path = Path(target)
    if path.suffix not in (".yaml", ".yml"):
        path = path.with_name(f"{path.name}.yaml")
    text = starter_text(path.stem, kind, file_name=str(path))
    if path.is_dir():
        raise UsageError(f"wf new: {path} is a directory; pick another NAME")
    try:
        with path.open("w" if force else "x", encoding="utf-8") as out:
            out.write(text)
    except FileExistsError:
        raise UsageError(
            f"wf new: {path} exists; pass --force to overwrite it, or pick another NAME"
        ) from None
    except OSError as exc:
        raise UsageError(f"wf new: cannot write {path} ({exc.strerror or exc})") from None
    return path
