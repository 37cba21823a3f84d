"""Credential shapes: the rules that mask a value by what surrounds it (``api_key=…``,
``Authorization: Bearer …``, ``<password>…</password>``, a URL's password, known key
formats), whoever's it is; and the names that say a param, key or variable holds a secret.
``redact.Redactor`` runs these rules after masking the secret values it knows."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

MASK = "***"

_SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH", re.IGNORECASE
)
# Stricter, for keys inside JSON values (model outputs): the name must *end* in a secret
# word, so ``keywords``, ``author`` or ``max_tokens`` keep their values.
_SECRET_WORD = (
    r"(?:api[_-]?key|apikey|(?:access|private|secret)[_-]?key|secret|token|password|passwd|pwd"
    r"|passphrase|credentials?|auth|authorization)"
)
_SECRET_KEY = re.compile(rf"(?i){_SECRET_WORD}$")
_TEXT_WORD = _SECRET_WORD[:-1] + "|signature)"
"""The secret words of free text: a JSON key's, and ``signature`` (``X-Amz-Signature=``)."""
_TEXT_KEY = re.compile(rf"(?i){_TEXT_WORD}$")


_UNQUOTED = r"[^\s\"'`\\&,;<>{}]"
"""A character of an unquoted value: one ends at a space, a quote, a backslash (the escaped
quote of JSON inside JSON), a pair separator (``&``, ``,``, ``;``) or a bracket."""
_BLANK = r"(?:[ \t]++|\\++t)*+"
"""Blanks around a separator: spaces and tabs, a tab JSON-escaped once or more (``\\t``)."""
_NAMED_VALUE = "".join(
    (
        _TEXT_WORD,
        r"(?:\\*+[\"'`])?",  # the name's closing quote (``"``, ``\\"`` in JSON inside JSON)
        # the separator, maybe URL-encoded: an assignment (``=``) or a label (``:``)
        _BLANK + r"(?:(?P<eq>=>?+|:=|%3d)|:|%3a)" + _BLANK,
        r"(?:\\*+(?:(?P<dq>\")|(?P<sq>['`])))?",  # the value's opening quote, if any
        r"(?:(?:bearer|basic|token|digest)(?:[ \t]|\\++t)" + _BLANK + ")?+",  # a scheme, kept
        # A quoted value runs to its closing quote, spaces included (inside single quotes a
        # double one ends it too: JSON around it stays JSON); an unquoted one to a delimiter
        # (_LINE_VALUE takes the rest of a ``NAME=value with spaces`` line). After a label
        # (``:``) _is_value tells a value from the prose of a message.
        r"(?P<secret>(?(dq)(?:[^\"\\\r\n]++|\\++(?!\"))+"
        r"|(?(sq)(?:(?!(?P=sq))[^\"\\\r\n]|\\++(?![\"'`]))+"
        r"|" + _UNQUOTED + r"++)))",
    )
)
"""A value named by a secret word, wherever the name ends: the word need not start a name
(``db_password``, ``?api_key=``), and the separator may be quoted, escaped or URL-encoded.
Masked at any length. Linear: every quantifier is possessive or followed by nothing that
could make it give back."""
_LINE_VALUE = "".join(
    (
        r"(?m)^[ \t]*+(?:export[ \t]++)?[a-z0-9_.\-]*?",
        _TEXT_WORD,
        r"[ \t]*+=[ \t]*+",
        rf"(?P<secret>{_UNQUOTED}++(?:[ \t]++(?!--|[^\s=:\"'`]*+[=:]){_UNQUOTED}++)*+)",
    )
)
"""An unquoted value with spaces where its ``NAME=`` starts the line (a ``.env`` or config
line: ``PASSWORD=hun ter22``): to the end of the line, a delimiter, or the next ``name=``
pair or ``--option`` on it. In running text a value ends at a blank (a message goes on after it:
``… at http://h/v1?key=*** could not connect``); quote one that holds spaces."""
_PLACEHOLDERS = frozenset({"value", "<value>", "$value", "...", "…", "***"})
"""What help texts put where a value goes (``--param api_key=VALUE``, ``{'api_key': ...}``):
no secret, and masking it would garble the advice."""
_LITERALS = frozenset({"null", "none", "true", "false", "nil", "undefined"})
"""Unquoted words after ``name:`` that say there is no secret (``"token": null``)."""
_PROSE_NEXT = re.compile(r"[ \t]++[^\s]")
_STRONG_NAME = re.compile(r"(?i)(?:password|passwd|passphrase|pwd|secret|credentials?)\b")
"""Names whose label is always followed by a value, never by prose (``password: hunter
and more`` masks ``hunter``): the prose rule is for ``key`` and ``token`` names, which error
messages use as field names (``params.api_key: unknown …``)."""


def _is_value(found: re.Match[str]) -> bool:
    """Whether the unquoted word after ``name:`` (or ``--name``) is a value, not prose.

    The rule: a word holding anything but letters (``pass1``, ``ya29.a0``, ``s3-cr3t``) is a
    value; so is a word of letters alone that ends its line or field (``token: abc,``), and
    any word after a password, passphrase, secret or credential label. After a key or token
    label, a word of letters followed by another word on its line starts a sentence, an
    error's prose (``params.api_key: unknown JSON Schema keyword(s)``, ``Token: see below``),
    and is kept; so are ``null``, ``true``, ``false``. An assigned (``name=value``) or quoted
    value is always a value.
    """
    groups = found.groupdict()
    if found.group("secret").lower() in _PLACEHOLDERS:  # rules may match the lowered text
        return False
    if groups.get("eq") is not None or groups.get("dq") or groups.get("sq"):
        return True
    word = found.group("secret")
    if word.lower() in _LITERALS:
        return False
    if not word.rstrip(".!?:").isalpha() or _STRONG_NAME.match(found.group(0)):
        return True
    return _PROSE_NEXT.match(found.string, found.end("secret")) is None


@dataclass(frozen=True, slots=True)
class _Rule:
    """One credential shape: a regex whose ``secret`` group is masked, and cheap substrings
    that must occur for it to run."""

    pattern: re.Pattern[str]
    """Searched in the lower-cased text when ``lowered`` (a case-sensitive scan of it is 4×
    faster than a case-insensitive one of the text), so written in lower case."""
    triggers: tuple[str, ...]
    """The regex only runs when one of these occurs (``in`` is ~100x cheaper than a scan)."""
    lowered: bool = False
    check: Callable[[re.Match[str]], bool] | None = None
    """A match is masked only when this holds (None: always)."""
    folded: re.Pattern[str] | None = None
    """The pattern matched case-insensitively: for a text whose lower case has another
    length (``İ`` lowers to two characters), where positions in the two would not agree."""

    @classmethod
    def of(
        cls,
        pattern: str,
        triggers: tuple[str, ...],
        *,
        lowered: bool = False,
        check: Callable[[re.Match[str]], bool] | None = None,
    ) -> _Rule:
        folded = re.compile(pattern, re.IGNORECASE) if lowered else None
        return cls(re.compile(pattern), triggers, lowered, check, folded)

    def apply(self, text: str, lowered: str) -> str:
        """``text`` with the ``secret`` group of each match masked (``lowered`` is its lower
        case); the very object when nothing matched."""
        haystack, pattern = (lowered, self.pattern) if self.lowered else (text, self.pattern)
        if not any(t in haystack for t in self.triggers):
            return text
        if self.folded is not None and len(lowered) != len(text):
            haystack, pattern = text, self.folded
        parts: list[str] = []
        pos = 0
        for found in pattern.finditer(haystack):
            if self.check is not None and not self.check(found):
                continue
            start, end = found.span("secret")
            parts += (text[pos:start], MASK)
            pos = end
        if not parts:
            return text
        parts.append(text[pos:])
        return "".join(parts)


# Credential-looking strings, whoever they belong to. Each keeps a recognisable label
# (``Bearer``, ``api_key=``, ``sk-``) so a redacted message still says what was there.
_WORD_TRIGGERS = (
    "key",
    "secret",
    "token",
    "passw",
    "passphrase",
    "pwd",
    "credential",
    "auth",
    "signature",
)
RULES: tuple[_Rule, ...] = (
    # "Bearer abc…", "Basic abc…": long and with a digit, so "Basic understanding" stays.
    _Rule.of(
        r"\b(?:bearer|basic)\s+(?=[a-z._~+/=\-]*[0-9])(?P<secret>[a-z0-9._~+/=\-]{16,})",
        ("bearer", "basic"),
        lowered=True,
    ),
    # name=value, name: value, "name": "value" wherever the name ends in a secret word, as
    # a word of its own or inside one (``https://h/x?api_key=``, ``"config": "password=``,
    # ``url=…&private_token=``, ``{\"token\": \"…``): see _NAMED_VALUE.
    _Rule.of(_NAMED_VALUE, _WORD_TRIGGERS, lowered=True, check=_is_value),
    _Rule.of(_LINE_VALUE, _WORD_TRIGGERS, lowered=True),
    # <password>value</password>, <db:secret a="1">value</db:secret>: an XML-ish element.
    _Rule.of(
        r"<(?P<name>[a-z0-9_.:\-]++)(?:(?:\s|\\++[tnr])[^<>]*+)?>(?P<secret>[^<]++)</",
        _WORD_TRIGGERS,
        lowered=True,
        check=lambda found: _TEXT_KEY.search(found.group("name")) is not None,
    ),
    # ?key=…, &sig=…, &X-Amz-Signature=…: a query parameter that carries a credential though
    # its name is no secret word (mask_url's rule, wherever a URL or query string is quoted).
    _Rule.of(
        r"[?&;#](?:key|sig|x-goog-signature)=(?P<secret>[^&;#\s\"'`<>\\]++)",
        ("key=", "sig=", "signature="),
        lowered=True,
    ),
    # --password VALUE: a command line echoed into a message (``--password=VALUE`` is above),
    # at any length unless a short word of letters starts prose (``--token is required``).
    # The name is taken whole (possessive, from its start): linear however many dashes.
    _Rule.of(
        r"(?<![\w-])(?P<name>--[a-z0-9_.\-]++)[ \t]++(?!-)(?P<secret>" + _UNQUOTED + "++)",
        ("--",),  # every name it masks holds a word trigger too: ANY_TRIGGER stays lean
        lowered=True,
        check=lambda found: (
            _SECRET_KEY.search(found.group("name")) is not None
            and (len(found.group("secret")) >= 6 or _is_value(found))
        ),
    ),
    # curl -u user:password, --user=user:password, wget --password is above: a user's
    # password after its name and a colon (``-u origin main`` has no colon: kept).
    _Rule.of(
        r"(?<![\w-])(?:-u|--user)(?:[ \t]++|=)[^\s:\"']++:(?P<secret>[^\s\"']++)",
        ("-u", "--user"),
    ),
    _Rule.of(  # quoted: to the closing quote, spaces and all
        r"(?<![\w-])(?:-u|--user)(?:[ \t]++|=)(?P<q>[\"'])[^\s:\"']++:"
        r"(?P<secret>(?:(?!(?P=q))[^\r\n])++)",
        ("-u", "--user"),
    ),
    # scheme://user:password@host — to the last ``@`` before the path (a password may hold
    # one), the user may be empty (``redis://:password@host``).
    _Rule.of(r"://[^/\s:@]*+:(?P<secret>[^/\s?#\"'<>]*)@", ("://",)),
    # A PEM private key (also JSON-escaped, ``\\n`` for its newlines): its base64 body, to
    # wherever it stops (a clipped key too); the BEGIN/END lines stay to say what it was.
    _Rule.of(
        r"-----begin (?:[a-z0-9]+ )*private key-----(?P<secret>[a-z0-9+/=\s\\]++)",
        ("private key-----",),
        lowered=True,
    ),
    # Well-known key formats: OpenAI/Anthropic, GitHub, Slack, AWS, Hugging Face, Google.
    _Rule.of(r"\bsk-(?P<secret>(?:proj-|ant-|live-|test-)?[A-Za-z0-9_\-]{16,})", ("sk-",)),
    _Rule.of(r"\bgh[pousr]_(?P<secret>[A-Za-z0-9]{20,})", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    _Rule.of(r"\bxox[abprs]-(?P<secret>[A-Za-z0-9\-]{10,})", ("xox",)),
    _Rule.of(r"\bAKIA(?P<secret>[0-9A-Z]{16})\b", ("AKIA",)),
    _Rule.of(r"\bhf_(?P<secret>[A-Za-z0-9]{30,})", ("hf_",)),
    _Rule.of(r"\bAIza(?P<secret>[0-9A-Za-z_\-]{35})", ("AIza",)),
)


ANY_TRIGGER = re.compile(
    "|".join(sorted({re.escape(t.lower()) for rule in RULES for t in rule.triggers if t != "--"}))
)
"""Any rule's trigger, case-folded: text without one (most of it) skips every rule at once.
Searched in the lowered text: the same alternation matched case-insensitively took 15× as
long (90 ms over a 360 KB map output, which resume and the step spine redact several
times; 7.5 µs for a unit's one-line output)."""


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name suggests a secret (``API_KEY``, ``GH_TOKEN``, …).

    A substring test: broad on purpose, for the environment's SHOUTED names. wf_magic's own
    ``WF_MAGIC_SECRET_KEY_FILE`` names a path, not a secret: masking it would hide which
    file an error is about.
    """
    return name not in _PATHS_NOT_SECRETS and bool(_SECRET_NAME.search(name))


_PATHS_NOT_SECRETS = frozenset({"WF_MAGIC_SECRET_KEY_FILE"})


@functools.lru_cache(maxsize=4096)
def is_secret_key(name: str) -> bool:
    """Whether a param or JSON key names a secret: it ends in one (``api_key``, ``db_password``).

    Stricter than :func:`looks_secret`, so ``keywords``, ``author`` or ``max_tokens`` do not.
    Cached: every journaled value's keys are asked, and they are mostly the same few.
    """
    return bool(_SECRET_KEY.search(name))
