"""Scrub secrets (environment values, secret params, credential shapes) from journaled text."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MASK = "***"
MIN_SECRET_LEN = 8
"""Shorter values are not treated as secrets: masking ``1`` or ``true`` would wreck every text."""

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# Stricter, for keys inside JSON values (model outputs): the name must *end* in a secret
# word, so ``keywords``, ``author`` or ``max_tokens`` keep their values.
_SECRET_WORD = (
    r"(?:api[_-]?key|apikey|(?:access|private|secret)[_-]?key|secret|token|password|passwd|pwd"
    r"|credentials?|auth|authorization)"
)
_SECRET_KEY = re.compile(rf"(?i){_SECRET_WORD}$")


@dataclass(frozen=True, slots=True)
class _Rule:
    """One credential shape: a regex, its replacement and cheap substrings that must occur."""

    pattern: re.Pattern[str]
    replacement: str | Callable[[re.Match[str]], str]
    triggers: tuple[str, ...]
    """The regex only runs when one of these occurs (``in`` is ~100x cheaper than a scan)."""
    lowered: bool = False
    """Match the triggers against the lower-cased text."""

    def apply(self, text: str, lowered: str) -> str:
        haystack = lowered if self.lowered else text
        if not any(t in haystack for t in self.triggers):
            return text
        return self.pattern.sub(self.replacement, text)


# Credential-looking strings, whoever they belong to. Each keeps a recognisable label
# (``Bearer``, ``api_key=``, ``sk-``) so a redacted message still says what was there.
_RULES: tuple[_Rule, ...] = (
    # "Bearer abc…", "Basic abc…": long and with a digit, so "Basic understanding" stays.
    _Rule(
        re.compile(r"(?i)\b(bearer|basic)(\s+)(?=[a-z._~+/=\-]*[0-9])[a-z0-9._~+/=\-]{16,}"),
        r"\1\2" + MASK,
        ("bearer", "basic"),
        lowered=True,
    ),
    # name=value, name: value, "name": "value" where the name ends in a secret word;
    # ``max_tokens`` or ``token_count`` do not end in one, so they stay readable.
    # Possessive quantifiers keep this linear: it runs on every journal write.
    _Rule(
        re.compile(
            r"(?<![A-Za-z0-9_.\-])([A-Za-z0-9_.\-]++)([\"']?\s*+[:=]\s*+[\"']?)"
            r"(?!(?i:bearer|basic)\b)(?!\*\*\*)[^\s\"'&,;<>{}]{6,}"
        ),
        lambda m: m.group(1) + m.group(2) + MASK if _SECRET_KEY.search(m.group(1)) else m.group(0),
        ("key", "secret", "token", "passw", "pwd", "credential", "auth"),
        lowered=True,
    ),
    _Rule(re.compile(r"(://[^/\s:@]+:)[^/\s@]+@"), r"\1" + MASK + "@", ("://",)),
    # Well-known key formats: OpenAI/Anthropic, GitHub, Slack, AWS, Hugging Face, Google.
    _Rule(
        re.compile(r"\b(sk-)(?:proj-|ant-|live-|test-)?[A-Za-z0-9_\-]{16,}"), r"\1" + MASK, ("sk-",)
    ),
    _Rule(
        re.compile(r"\b(gh[pousr]_)[A-Za-z0-9]{20,}"),
        r"\1" + MASK,
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    _Rule(re.compile(r"\b(xox[abprs]-)[A-Za-z0-9\-]{10,}"), r"\1" + MASK, ("xox",)),
    _Rule(re.compile(r"\b(AKIA)[0-9A-Z]{16}\b"), r"\1" + MASK, ("AKIA",)),
    _Rule(re.compile(r"\b(hf_)[A-Za-z0-9]{30,}"), r"\1" + MASK, ("hf_",)),
    _Rule(re.compile(r"\b(AIza)[0-9A-Za-z_\-]{35}"), r"\1" + MASK, ("AIza",)),
)


_ANY_TRIGGER = re.compile(
    "|".join(sorted({re.escape(t) for rule in _RULES for t in rule.triggers})), re.IGNORECASE
)
"""Any rule's trigger, case-folded: text without one (most of it) skips every rule at once."""


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name suggests a secret (``API_KEY``, ``GH_TOKEN``, …).

    A substring test: broad on purpose, for the environment's SHOUTED names.
    """
    return bool(_SECRET_NAME.search(name))


@functools.lru_cache(maxsize=4096)
def is_secret_key(name: str) -> bool:
    """Whether a param or JSON key names a secret: it ends in one (``api_key``, ``db_password``).

    Stricter than :func:`looks_secret`, so ``keywords``, ``author`` or ``max_tokens`` do not.
    Cached: every journaled value's keys are asked, and they are mostly the same few.
    """
    return bool(_SECRET_KEY.search(name))


class Redactor:
    """Replaces known secret values and credential-looking strings with ``***``.

    Build one per drive with :meth:`from_environ` (plus the run's secret-looking params)
    and pass every journaled text or JSON value through it.
    """

    __slots__ = ("_secrets", "_literal")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        """Create a redactor for explicit secret values.

        Args:
            secrets: Values to mask wherever they occur; values shorter than
                ``MIN_SECRET_LEN`` characters are ignored.
        """
        kept = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}
        self._secrets: frozenset[str] = frozenset(kept)
        # Longest first, so a secret that contains another is masked whole.
        ordered = sorted(kept, key=lambda s: (-len(s), s))
        self._literal = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] | None = None, *, extra: Iterable[str] = ()
    ) -> Redactor:
        """A redactor for the values of secret-looking environment variables plus ``extra``.

        Args:
            environ: The environment to read (default ``os.environ``).
            extra: Further secret values, e.g. params whose name looks secret.
        """
        env = os.environ if environ is None else environ
        values = [v.strip() for name, v in env.items() if looks_secret(name)]
        return cls([*values, *extra])

    def with_secrets(self, extra: Iterable[str]) -> Redactor:
        """A new redactor masking this one's secrets and ``extra``."""
        return Redactor([*self._secrets, *extra])

    @property
    def secret_count(self) -> int:
        """How many literal secret values are masked."""
        return len(self._secrets)

    def redact(self, text: str) -> str:
        """``text`` with every secret value and credential-looking string masked.

        Returns the very same object when nothing needed masking.
        """
        if not text:
            return text
        out = text
        if _ANY_TRIGGER.search(text) is not None:
            lowered = text.lower()
            for rule in _RULES:
                out = rule.apply(out, lowered)
        literal = self._literal
        if literal is not None:
            # Masking can splice a new occurrence together (``x`` + ``***`` + ``yyyy``);
            # every pass shortens the text, so iterating to a fixpoint terminates.
            while True:
                masked = literal.sub(MASK, out)
                if masked == out:
                    break
                out = masked
        return text if out == text else out

    def redact_value(self, value: Any) -> Any:
        """``value`` (JSON-like: dicts, lists, tuples, strings) with every string redacted.

        A string under a secret-looking key is masked whole. Returns the very same
        object when nothing changed, so clean values are never copied.
        """
        return self._value(value, secret_key=False)

    def _value(self, value: Any, *, secret_key: bool) -> Any:
        if isinstance(value, str):
            if secret_key and value:
                return MASK
            return self.redact(value)
        if isinstance(value, dict):
            return self._dict(value)
        if isinstance(value, list | tuple):
            items = [self._value(v, secret_key=secret_key) for v in value]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return tuple(items) if isinstance(value, tuple) else items
        return value

    def _dict(self, value: dict[Any, Any]) -> dict[Any, Any]:
        changed = False
        out: dict[Any, Any] = {}
        for key, item in value.items():
            is_secret = isinstance(key, str) and is_secret_key(key)
            new = self._value(item, secret_key=is_secret)
            changed = changed or new is not item
            out[key] = new
        return out if changed else value
