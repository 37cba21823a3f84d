r"""The offline ``scripted`` runner: deterministic replies from a rule table or a function.

``replies`` maps an exact prompt (surrounding whitespace ignored) to its reply; then
rules are tried in order; the first whose ``match`` (a regex searched in the rendered prompt,
or the argv joined by spaces) hits answers::

    runners:
      scripted:
        replies:
          "Say hello.": "Hello!"            # exact prompt → reply
        rules:
          - match: "Outline"
            reply: {sections: [intro, method, results]}   # text or JSON
            tokens_in: 40                                   # optional fixed counts
            tokens_out: 12
          - match: "Gate feedback"          # a retried loop sees the judge's feedback
            reply: "better text"
          - match: "(?s)Judge.*better"       # the runner can play the gate judge too
            reply: {complete: true, feedback: "", missing: []}
          - match: "flaky"
            error: transient                # or permanent: the attempt fails

A string reply containing ``{{`` is a Jinja template over ``prompt``, ``item``, ``index``
and ``groups`` (the regex groups). With no matching rule the reply is derived from the prompt:
an instance of the output schema when one is set, an accepting verdict for a judge, else the
text ``scripted reply <hash>: <first line>``. Tokens are counted by a simple tokenizer (words
and punctuation marks), so the same prompt always costs the same. A reply longer than the
unit's token offer (``UnitRequest.max_tokens``, what the run budget has left) stops at the
offer, as a real model's would: ``tokens_out`` is the offer and the output the reply's text
cut after that many tokens (a cut JSON reply is text that fails the step's schema).

A ``match`` regex is checked when the plan is frozen, because Python's ``re`` backtracks and
holds the GIL while it does: no timeout can stop a search once it started. A pattern whose
search could take exponential time (a repeat or alternatives inside a repeat: ``(a+)+``,
``(a|aa)*``) or time growing faster than the text's length squared (``a*a*b``, unanchored
``.*a.*b``) is refused, naming the rule. A pattern whose search may take quadratic time
(``\w+\W``, ``(?s)Judge.*better``) searches texts of up to :data:`QUADRATIC_TEXT_CHARS`
characters (fewer with alternatives or optional parts); a longer prompt fails the attempt
(permanent). Anchoring at the start (``^``, ``\A``) takes one power off.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from re import _parser  # type: ignore[attr-defined]  # the parser re.compile itself uses
from typing import Any

from ..errors import RunnerError
from ..hashing import sha256_text
from .base import BaseRunner, RunnerContext, UnitRequest, UnitResult
from .function import call_with_timeout
from .pricing import OFFLINE, PRICE_OPTIONS, PriceTable

_TOKEN = re.compile(r"\w+|[^\w\s]")
_RULE_KEYS = {"match", "reply", "tokens_in", "tokens_out", "error", "sleep_s", "model", "kind"}
_UNIT_KINDS = ("prompt", "exec", "python", "judge")
MAX_RULE_TOKENS = 10**12
"""A rule's fixed token count; sums of many still fit SQLite's 64-bit integers."""
MAX_SLEEP_S = 86_400.0
MAX_MATCH_DEGREE = 2
"""A ``match`` search may take time growing at most as the text's length squared."""
MAX_MATCH_CHOICES = 64
"""A ``match`` pattern may combine at most this many ways of alternatives and optional parts."""
QUADRATIC_TEXT_CHARS = 10_000
"""The longest text a quadratic ``match`` searches (about a second at the very worst); a
pattern with alternatives or optional parts searches less, so that its work stays as bounded."""
_SMALL_COUNT = 16
"""A fixed count (``x{3}``) up to this is unrolled like written-out copies of ``x``."""


def count_tokens(text: str) -> int:
    """Deterministic token count: words and punctuation marks."""
    return len(_TOKEN.findall(text))


def truncate_tokens(text: str, limit: int) -> str:
    """``text`` up to the end of its ``limit``-th token (:func:`count_tokens`' tokens)."""
    if limit <= 0:
        return ""
    for number, token in enumerate(_TOKEN.finditer(text), start=1):
        if number == limit:
            return text[: token.end()]
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One scripted rule (see the module docstring)."""

    match: re.Pattern[str]
    reply: Any = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    error: str | None = None
    sleep_s: float = 0.0
    model: str | None = None
    kind: str | None = None
    text_limit: int | None = None
    """The longest text ``match`` searches (None: any); set at parse for a quadratic pattern."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any], index: int) -> Rule:
        """Build a rule from its mapping form (ValueError naming the rule on bad input)."""
        where = f"scripted rule {index}"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping with match and reply")
        unknown = set(raw) - _RULE_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {sorted(map(str, unknown))}")
        if "match" not in raw:
            raise ValueError(f"{where}: `match` (a regex) is required")
        if not isinstance(raw["match"], str | int | float) or isinstance(raw["match"], bool):
            raise ValueError(f"{where}: `match` must be a regex string")
        try:
            pattern = re.compile(str(raw["match"]))
        except (re.error, RecursionError, OverflowError) as exc:
            raise ValueError(f"{where}: invalid regex: {exc}") from None
        degree, choices = match_cost(pattern, where=where)
        error = raw.get("error")
        if error is not None and error not in ("transient", "permanent"):
            raise ValueError(f"{where}: error must be transient or permanent")
        kind = raw.get("kind")
        if kind is not None and kind not in _UNIT_KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(_UNIT_KINDS)}")
        model = raw.get("model")
        if model is not None and not isinstance(model, str):
            raise ValueError(f"{where}: model must be a string")
        sleep_s = raw.get("sleep_s", 0)
        if not _is_number(sleep_s) or not 0 <= sleep_s <= MAX_SLEEP_S:
            raise ValueError(f"{where}: sleep_s must be a number of seconds, 0 to {MAX_SLEEP_S:g}")
        _check_reply(raw.get("reply"), where)
        return cls(
            match=pattern,
            reply=raw.get("reply"),
            tokens_in=_tokens(raw, "tokens_in", where),
            tokens_out=_tokens(raw, "tokens_out", where),
            error=error,
            sleep_s=float(sleep_s),
            model=model,
            kind=kind,
            text_limit=(
                int(QUADRATIC_TEXT_CHARS / math.sqrt(choices))
                if degree == MAX_MATCH_DEGREE
                else None
            ),
        )


def match_cost(pattern: re.Pattern[str], *, where: str) -> tuple[int, int]:
    """A search's worst-case work on a text of length n: (degree, choices), about choices
    times n to the power degree.

    Each unbounded repeat (``*``, ``+``, ``{m,}``, ``{m,n}`` with a large n) can be retried at
    every length, and an unanchored search starts at every position; optional parts and
    alternatives multiply the work by a constant (at most :data:`MAX_MATCH_CHOICES`).

    Raises:
        ValueError: naming ``where`` when the search could take exponential time or time
            growing faster than n squared.
    """
    shown = pattern.pattern if len(pattern.pattern) <= 60 else pattern.pattern[:57] + "..."
    items = list(_parser.parse(pattern.pattern))
    try:
        degree, choices = _cost(items)
    except _Nested as exc:
        raise ValueError(
            f"{where}: match {shown!r} may take exponential time ({exc} inside a repeat, as "
            "in (a+)+ or (a|aa)*); repeat a plain character class instead"
        ) from None
    except RecursionError:
        raise ValueError(f"{where}: match {shown!r} nests its groups too deeply") from None
    anchored = (
        bool(items)
        and str(items[0][0]) == "AT"
        and (
            str(items[0][1]) == "AT_BEGINNING_STRING"
            or (str(items[0][1]) == "AT_BEGINNING" and not pattern.flags & re.MULTILINE)
        )
    )
    degree += 0 if anchored else 1
    if degree > MAX_MATCH_DEGREE:
        raise ValueError(
            f"{where}: match {shown!r} may take time growing as the prompt's length to the "
            f"power {degree} (repeats such as *, + or {{m,n}}, and an unanchored start, add one "
            f"each; at most {MAX_MATCH_DEGREE}): anchor it with ^ or \\A, or use fewer repeats"
        )
    if choices > MAX_MATCH_CHOICES:
        raise ValueError(
            f"{where}: match {shown!r} combines more than {MAX_MATCH_CHOICES} ways of its "
            "alternatives (|) and optional parts (?); split it into several rules"
        )
    return degree, choices


class _Nested(Exception):
    """A repeat holds a repeat or alternatives (its text says which)."""


def _cost(items: Iterable[tuple[Any, Any]]) -> tuple[int, int]:
    """(degree, choices) of a parsed sequence: degrees add up, choices multiply."""
    degree, choices = 0, 1
    for op, av in items:
        d, c = _item_cost(str(op), av)
        degree, choices = degree + d, min(choices * c, MAX_MATCH_CHOICES + 1)
    return degree, choices


def _item_cost(op: str, av: Any) -> tuple[int, int]:
    if op in ("SUBPATTERN", "ATOMIC_GROUP", "ASSERT", "ASSERT_NOT"):
        return _cost(av if op == "ATOMIC_GROUP" else av[-1])
    if op in ("BRANCH", "GROUPREF_EXISTS"):
        ways = [
            _cost(b) if b is not None else (0, 1) for b in (av[1] if op == "BRANCH" else av[1:])
        ]
        return max(d for d, _ in ways), sum(c for _, c in ways)
    if op == "GROUPREF":
        return 1, 1  # compares as many characters as the group holds
    if op not in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        return 0, 1  # one character, a class or an anchor
    low, high, body = av
    degree, choices = _cost(body)
    if low == high <= _SMALL_COUNT:
        return degree * high, min(choices**high, MAX_MATCH_CHOICES + 1)
    if high <= 1:
        return degree, choices + 1  # tried once, or skipped
    if degree:
        raise _Nested("a repeat")
    if choices > 1:
        raise _Nested("alternatives or an optional part")
    return 1, 1


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _tokens(raw: Mapping[str, Any], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_RULE_TOKENS:
        raise ValueError(f"{where}: {key} must be a whole number from 0 to {MAX_RULE_TOKENS}")
    return value


def _check_reply(reply: Any, where: str) -> None:
    """A templated reply must parse now, not at the first dispatch."""
    if isinstance(reply, str) and "{{" in reply:
        from ..templates import TemplateError, references

        try:
            references(reply)
        except TemplateError as exc:
            raise ValueError(f"{where}: reply: {exc}") from None


ReplyFunction = Callable[[UnitRequest], Any]


def _reply_text(reply: Any) -> str:
    """A reply as the text its tokens are counted on; "" for one that is no JSON value (the
    driver fails such an output before it is journaled)."""
    try:
        return json.dumps(reply, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return ""


class ScriptedRunner(BaseRunner):
    """Deterministic, offline runner answering from rules or a function."""

    ANSWER_OPTIONS: frozenset[str] = frozenset({"rules", "replies", "model"})
    """Every option picks replies: all are part of each unit's input hash."""

    def __init__(
        self,
        rules: Sequence[Mapping[str, Any] | Rule] = (),
        *,
        replies: Mapping[str, Any] | None = None,
        fn: ReplyFunction | None = None,
        model: str = "scripted-1",
    ):
        exact = [
            Rule(match=re.compile(r"^\s*" + re.escape(prompt.strip()) + r"\s*$"), reply=reply)
            for prompt, reply in (replies or {}).items()
        ]
        parsed = [r if isinstance(r, Rule) else Rule.parse(r, i) for i, r in enumerate(rules)]
        self.rules = [*exact, *parsed]
        self.fn = fn
        self.model = model
        if fn is not None or not any(rule.sleep_s for rule in self.rules):
            # A reply function is the caller's Python: it may block, raise KeyboardInterrupt
            # or count on the drive's thread; replies that take no time have nothing to wait
            # for (a hop to the model loop and back would cost a no-op unit 1.7x). Both run
            # where run() always ran them (the drive thread for a lone unit, a worker thread
            # in a map); only rules with a sleep_s, a model's latency, wait on the loop.
            vars(self)["arun"] = None

    @classmethod
    def from_context(cls, ctx: RunnerContext) -> ScriptedRunner:
        """Factory: ``rules`` and ``replies`` from the plan's ``runners: {<name>: {...}}``."""
        unknown = set(ctx.options) - {"rules", "replies", "model"} - PRICE_OPTIONS
        if unknown:
            raise RunnerError(
                f"runner {ctx.name!r}: unknown option(s) {sorted(unknown)}; the scripted runner "
                "takes rules, replies, model, prices and local"
            )
        PriceTable.parse(ctx.options, where=f"runners.{ctx.name}")  # refused now, not later
        rules = ctx.options.get("rules", [])
        replies = ctx.options.get("replies")
        model = ctx.options.get("model", "scripted-1")
        try:
            if not isinstance(rules, list):
                raise ValueError("rules must be a list of {match, reply} mappings")
            if replies is not None and not isinstance(replies, Mapping):
                raise ValueError("replies must map a prompt to its reply")
            if not isinstance(model, str):
                raise ValueError("model must be a string")
            for prompt, reply in (replies or {}).items():
                _check_reply(reply, f"reply to {str(prompt)[:40]!r}")
            return cls(rules, replies=replies, model=model)
        except ValueError as exc:
            raise RunnerError(f"runner {ctx.name!r}: {exc}") from exc

    def run(self, request: UnitRequest) -> UnitResult:
        """Answer ``request``; past ``request.timeout_s`` the attempt fails, transient.

        The timeout binds a rule's ``sleep_s`` and a reply function alike: the reply is
        computed in a worker thread that is abandoned at the deadline (see
        :func:`~wf_magic.runners.function.call_with_timeout`).
        """
        return call_with_timeout(
            lambda: self._answer(request), request.timeout_s, what="scripted reply"
        )

    async def arun(self, request: UnitRequest) -> UnitResult:
        """:meth:`run` as a coroutine: a rule's ``sleep_s`` is awaited (no thread is held),
        cut at ``request.timeout_s`` like ``run`` cuts it. A runner with a reply function, or
        whose rules never sleep, has none (``arun`` is None on it: the drive calls ``run``)."""
        text = _text_of(request)
        rule, found = self._find(text, request)
        if rule is not None and rule.sleep_s:
            timeout_s = request.timeout_s
            if timeout_s is not None and rule.sleep_s > timeout_s:
                await asyncio.sleep(timeout_s)
                raise RunnerError(
                    f"scripted reply timed out after {timeout_s:g}s; the call was cancelled",
                    transient=True,
                )
            await asyncio.sleep(rule.sleep_s)
        return self._reply(text, rule, found, request)

    def _answer(self, request: UnitRequest) -> UnitResult:
        text = _text_of(request)
        rule, found = self._find(text, request)
        if rule is not None and rule.sleep_s:
            time.sleep(rule.sleep_s)
        return self._reply(text, rule, found, request)

    def _reply(
        self, text: str, rule: Rule | None, found: re.Match[str] | None, request: UnitRequest
    ) -> UnitResult:
        if rule is not None and rule.error:
            raise RunnerError(
                f"scripted {rule.error} error (rule /{rule.match.pattern}/)",
                transient=rule.error == "transient",
            )
        if self.fn is not None and rule is None:
            reply = self.fn(request)
        elif rule is not None:
            reply = _render_reply(rule.reply, text, request, found)
        else:
            reply = _default_reply(text, request)
        if isinstance(reply, str) and request.output_schema is not None:
            try:
                reply = json.loads(reply)
            except ValueError:
                pass  # the engine validates and feeds the mismatch back
        reply_text = reply if isinstance(reply, str) else _reply_text(reply)
        tokens_out = (
            rule.tokens_out if rule and rule.tokens_out is not None else count_tokens(reply_text)
        )
        cap = request.max_tokens
        if cap is not None and tokens_out > cap:
            # Like a real model offered `cap` tokens: the reply stops there (a JSON reply
            # cut short no longer parses, and the step's schema check says so).
            reply, tokens_out = truncate_tokens(reply_text, max(cap, 0)), max(cap, 0)
        model = rule.model if rule and rule.model else request.model
        return UnitResult(
            output=reply,
            tokens_in=rule.tokens_in if rule and rule.tokens_in is not None else count_tokens(text),
            tokens_out=tokens_out,
            model=model or self.model,
            # A model the workflow named is priced like the real one (an offline budget demo
            # stops where a real run would); the runner's own model is never looked up.
            provider=None if model else OFFLINE,
        )

    def _find(self, text: str, request: UnitRequest) -> tuple[Rule | None, re.Match[str] | None]:
        for rule in self.rules:
            if rule.kind is not None and rule.kind != request.kind:
                continue
            if rule.text_limit is not None and len(text) > rule.text_limit:
                raise RunnerError(
                    f"scripted rule /{rule.match.pattern}/ may take time quadratic in the "
                    f"text's length, and this one has {len(text):,} characters (over "
                    f"{rule.text_limit:,}); anchor the pattern with ^ or \\A, or drop a repeat"
                )
            found = rule.match.search(text)
            if found:
                return rule, found
        return None, None


def _text_of(request: UnitRequest) -> str:
    return request.prompt if request.prompt is not None else " ".join(request.argv or ())


def _render_reply(reply: Any, text: str, request: UnitRequest, found: re.Match[str] | None) -> Any:
    if isinstance(reply, str) and "{{" in reply:
        from ..templates import render_text  # Jinja is imported only for templated replies

        groups = [found.group(0), *found.groups()] if found else []
        return render_text(
            reply, {"prompt": text, "item": request.item, "index": request.index, "groups": groups}
        )
    return reply


def _default_reply(text: str, request: UnitRequest) -> Any:
    if request.kind == "judge":
        return {"complete": True, "feedback": "", "missing": []}
    if request.output_schema is not None:
        return instance_of(request.output_schema, seed=text)
    first = text.strip().splitlines()[0][:80] if text.strip() else ""
    return f"scripted reply {sha256_text(text)[:8]}: {first}"


def instance_of(schema: Mapping[str, Any], *, seed: str) -> Any:
    """A deterministic value satisfying a simple JSON Schema (derived from ``seed``)."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties", {})
        return {k: instance_of(v, seed=f"{seed}/{k}") for k, v in props.items()}
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        item = schema.get("items", {"type": "string"})
        return [instance_of(item, seed=f"{seed}/{i}") for i in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", 0)
        return int(low) if kind == "integer" else float(low)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = f"item-{sha256_text(seed)[:6]}"
    min_len = int(schema.get("minLength", 0))
    return text + "x" * max(0, min_len - len(text))
