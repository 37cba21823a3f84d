"""The docs name every `wf` verb: README's CLI summary has each verb with its options,
`wf --help` lists each, and docs/sweeps.md and docs/evaluations.md name the sweep verbs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wf_magic.cli import build_parser
from wf_magic.verbs import SWEEP_VERBS, VERBS, OneOf, Option, verb_names

ROOT = Path(__file__).resolve().parent.parent
CLI_VERBS = verb_names("cli")


def cli_summary(readme: str) -> str:
    """The code block under README's ``## CLI`` heading."""
    section = readme.split("\n## CLI\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```\n", 2)[1]


def mentions(text: str) -> dict[str, str]:
    """Each verb written as ``wf VERB`` in `text`, with the text up to the next such mention
    (its usage line: arguments and options), joined over every mention of it."""
    names = sorted(CLI_VERBS, key=len, reverse=True)  # "sweep-status" before "sweep"
    found = list(re.finditer(rf"\bwf ({'|'.join(map(re.escape, names))})(?![\w-])", text))
    usage: dict[str, str] = {}
    for m, after in zip(found, [*found[1:], None], strict=True):
        end = len(text) if after is None else after.start()
        usage[m[1]] = usage.get(m[1], "") + text[m.end() : end]
    return usage


def cli_options(name: str) -> list[str]:
    """The ``--flags`` verb `name` has on the ``wf`` command."""
    (verb,) = [v for v in VERBS if v.name == name]
    items: list[Option] = []
    for item in verb.options:
        items += item.options if isinstance(item, OneOf) else (item,)
    return [o.flag for o in items if "cli" in o.faces and o.flag.startswith("--")]


def undocumented(summary: str) -> list[str]:
    """What the CLI summary `summary` leaves out: a verb, or a verb's option on its line."""
    usage = mentions(summary)
    missing = [f"wf {name}" for name in CLI_VERBS if name not in usage]
    for name in CLI_VERBS:
        for flag in cli_options(name):
            if name in usage and not re.search(rf"{re.escape(flag)}(?![\w-])", usage[name]):
                missing.append(f"wf {name} {flag}")
    return missing


def test_the_readme_cli_summary_has_every_verb_with_its_options() -> None:
    summary = cli_summary((ROOT / "README.md").read_text())
    assert len(CLI_VERBS) >= 29
    assert undocumented(summary) == []


def test_the_readme_cli_summary_names_no_verb_wf_lacks() -> None:
    summary = cli_summary((ROOT / "README.md").read_text())
    written = set(re.findall(r"\bwf ([a-z][a-z-]*)", summary))
    assert written - set(CLI_VERBS) == set()


@pytest.mark.parametrize("name", CLI_VERBS)
def test_a_verb_dropped_from_the_summary_is_reported(name: str) -> None:
    """The check above fails for any one verb left out of the README."""
    summary = cli_summary((ROOT / "README.md").read_text())
    dropped = re.sub(rf"\bwf {re.escape(name)}(?![\w-])", "wf ", summary)
    assert undocumented(dropped) == [f"wf {name}"]


def test_an_option_dropped_from_its_verb_line_is_reported() -> None:
    summary = cli_summary((ROOT / "README.md").read_text())
    assert "[--by AXIS ...]" in summary
    assert undocumented(summary.replace("[--by AXIS ...]", "")) == ["wf sweep-summary --by"]


def test_wf_help_lists_every_verb_with_its_help() -> None:
    text = " ".join(build_parser().format_help().split())
    for verb in VERBS:
        if "cli" in verb.faces:
            assert f"{verb.name} {' '.join(verb.help.split())}" in text, verb.name
    assert "sweep-summary print a sweep's metrics: per group and score, mean with its 95 % " in text


def test_the_sweep_docs_name_every_sweep_verb() -> None:
    sweeps = mentions((ROOT / "docs" / "sweeps.md").read_text())
    assert [v.name for v in SWEEP_VERBS if v.name not in sweeps] == []
    evaluations = mentions((ROOT / "docs" / "evaluations.md").read_text())
    assert "--by AXIS" in evaluations["sweep-summary"]
    assert "--format table|csv|json" in evaluations["sweep-summary"]
