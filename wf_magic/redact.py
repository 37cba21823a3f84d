"""Scrub secrets (environment values, secret params, credential shapes) from journaled text."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

from .redact_shapes import ANY_TRIGGER, RULES
from .redact_shapes import MASK as MASK  # re-exported: the mask and the secret-name tests
from .redact_shapes import is_secret_key as is_secret_key
from .redact_shapes import looks_secret as looks_secret

MIN_SECRET_LEN = 8
"""Shorter values are not treated as secrets: masking ``1`` or ``true`` would wreck every text."""
PREFIX_MIN = 12
"""The shortest piece of a known secret masked where a text was clipped inside the secret.

Shorter pieces are left: they are mostly a key format's fixed start (``sk-live-``,
``github_pat_``), which innocent text may quote; twelve characters reach into the random part.
"""
CLIP_MARKS = ("…", "...", "\\u2026", "'", '"', "`")
"""What may follow the start of a clipped secret: an ellipsis (as text or JSON-escaped), or
the closing quote of a clipped value quoted in a message (``got str: 'sk-live-abcd…'``).
The end of a secret whose start was cut off (a tail kept) is masked at the start of a text
or after an ellipsis (``…ghij0123 exited``)."""
_ELLIPSES = ("…", "...")
PIECE_MIN = 4
"""The shortest piece of a known secret masked where it touches an ellipsis (``_ELLIPSES``).

An ellipsis is where a text was cut, so what touches it is a cut piece whatever its length:
``…Zq9xW4vT7p…`` (a map value clipped ten characters into a secret) or ``…9aS2dF4gH6`` (the
kept end of a stderr tail). Shorter pieces would mask every word that shares a secret's first
letters.
"""
_CUT_MARKS = ("…", "...", "\\u2026")
"""The ellipses as text may hold them: as is, as three dots, JSON-escaped (``\\u2026``)."""


class Redactor:
    """Replaces known secret values and credential-looking strings with ``***``.

    Build one per drive with :meth:`from_environ` (plus the run's secret-looking params)
    and pass every journaled text or JSON value through it.
    """

    __slots__ = ("_secrets", "_heads", "_by_start")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        """Create a redactor for explicit secret values.

        Args:
            secrets: Values to mask wherever they occur; values shorter than
                ``MIN_SECRET_LEN`` characters are ignored. Each is also masked in its
                JSON-escaped and ``repr`` forms (as a JSON column or a message quotes it),
                and so is a clipped piece of one (at least ``PREFIX_MIN`` characters)
                that ends where the text was clipped (see ``CLIP_MARKS``), and any piece of
                one (at least ``PIECE_MIN`` characters) touching an ellipsis.
        """
        kept = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}
        self._secrets: frozenset[str] = frozenset(kept)
        forms = {f for s in kept for f in _forms(s)}
        by_start: dict[str, list[str]] = {}
        for form in sorted(forms, key=lambda f: (-len(f), f)):  # longest first
            by_start.setdefault(form[:MIN_SECRET_LEN], []).append(form)
        self._by_start = by_start
        """A secret's forms by their first ``MIN_SECRET_LEN`` characters."""
        heads = sorted({f[:PREFIX_MIN] for f in forms}, key=lambda h: (-len(h), h))
        self._heads = re.compile("|".join(map(re.escape, heads))) if heads else None
        """Where a secret, or a clipped piece of one, may start: its first characters."""

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
        lowered = text.lower()
        if ANY_TRIGGER.search(lowered) is not None:
            for rule in RULES:
                masked = rule.apply(out, lowered)
                if masked is not out:  # the next rule reads positions of this text
                    out, lowered = masked, masked.lower()
        heads = self._heads
        if heads is not None:
            # Masking can splice a new occurrence together (``x`` + ``***`` + ``yyyy``);
            # every pass shortens the text, so iterating to a fixpoint terminates.
            while True:
                masked = self._mask_known(out, heads)
                if masked is out:
                    break
                out = masked
        return text if out == text else out

    def _mask_known(self, text: str, heads: re.Pattern[str]) -> str:
        """``text`` with each known secret, and each clipped piece of one, masked (one pass)."""
        text = self._mask_cuts(self._mask_tails(text))
        parts: list[str] = []
        pos = start = 0
        while (found := heads.search(text, start)) is not None:
            at = found.start()
            length = self._known_at(text, at)
            if length:
                parts += (text[pos:at], MASK)
                pos = start = at + length
            else:
                start = at + 1
        if not parts:
            return text
        parts.append(text[pos:])
        return "".join(parts)

    def _mask_tails(self, text: str) -> str:
        """``text`` with the kept end of a secret masked at its start and after each ``…``."""
        starts = [0]
        for mark in _ELLIPSES:
            found = text.find(mark)
            while found >= 0:
                starts.append(found + len(mark))
                found = text.find(mark, found + 1)
        parts: list[str] = []
        pos = 0
        for at in sorted(set(starts)):
            length = self._tail_at(text, at) if at >= pos else 0
            if length:
                parts += (text[pos:at], MASK)
                pos = at + length
        if not parts:
            return text
        parts.append(text[pos:])
        return "".join(parts)

    def _mask_cuts(self, text: str) -> str:
        """``text`` with a piece of a secret (``PIECE_MIN`` characters or more) masked on
        either side of each ellipsis: the start of one before it, the end of one after it."""
        marks = sorted(
            (found, len(mark)) for mark in _CUT_MARKS for found in _occurrences(text, mark)
        )
        if not marks:
            return text
        parts: list[str] = []
        pos = 0
        for at, width in marks:
            if at < pos:
                continue  # inside a piece already masked
            before = self._head_before(text, at, floor=pos)
            after = self._tail_after(text, at + width)
            if before or after:
                parts += (text[pos : at - before], MASK if before else "", text[at : at + width])
                parts.append(MASK if after else "")
                pos = at + width + after
        if not parts:
            return text
        parts.append(text[pos:])
        return "".join(parts)

    def _head_before(self, text: str, end: int, *, floor: int) -> int:
        """How many characters before ``end`` (after ``floor``) start a known secret."""
        best = 0
        last = text[max(end - PIECE_MIN, floor) : end]
        for forms in self._by_start.values():
            for form in forms:
                if len(last) < PIECE_MIN or last not in form:
                    continue  # the cheap test: most ellipses touch no secret
                top = min(len(form), end - floor)
                for n in range(top, max(PIECE_MIN, best + 1) - 1, -1):
                    if text.startswith(form[:n], end - n):
                        best = n
                        break
        return best

    def _tail_after(self, text: str, at: int) -> int:
        """How many characters from ``at`` end a known secret (its start cut off)."""
        best = 0
        first = text[at : at + PIECE_MIN]
        for forms in self._by_start.values():
            for form in forms:
                if len(first) < PIECE_MIN or first not in form:
                    continue
                top = min(len(form), len(text) - at)
                for n in range(top, max(PIECE_MIN, best + 1) - 1, -1):
                    if text.startswith(form[len(form) - n :], at):
                        best = n
                        break
        return best

    def _tail_at(self, text: str, at: int) -> int:
        """How many characters from ``at`` are the end of a known secret (its start cut off)."""
        piece = text[at : at + PREFIX_MIN]
        if len(piece) < PREFIX_MIN:
            return 0
        best = 0
        for forms in self._by_start.values():
            for form in forms:
                found = form.find(piece, 1)
                while found > 0:
                    if len(form) - found > best and text.startswith(form[found:], at):
                        best = len(form) - found
                    found = form.find(piece, found + 1)
        return best

    def _known_at(self, text: str, at: int) -> int:
        """How many characters from ``at`` are a known secret or a clipped piece of one."""
        best = 0
        for form in self._by_start.get(text[at : at + MIN_SECRET_LEN], ()):
            if text.startswith(form, at):
                return len(form)  # the forms are longest first: a whole one wins
            if len(form) > PREFIX_MIN and best < len(form):
                n = _common_length(text, at, form)
                if n >= PREFIX_MIN and n > best and _clipped_at(text, at + n):
                    best = n
        return best

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


URL_SECRET_PARAMS = frozenset({"key", "sig", "signature", "x-amz-signature", "x-goog-signature"})
"""Query parameters that carry a credential though their name is no secret word: an API key
(``?key=AIza…``) or a signed URL's signature (Azure SAS ``sig``, S3 and GCS presigning)."""
_URL_PARAM = re.compile(r"(?<=[?&;#])([^=&;#?]*)=([^&;#]*)")
_URL_PASSWORD = re.compile(r"^(\s*[A-Za-z][A-Za-z0-9+.\-]*://[^/?#@:]*:)[^/?#]*@")
"""A URL's userinfo password: to the authority's last ``@`` (a password may hold one)."""


def mask_url(url: str) -> str:
    """``url`` as wf_magic stores and shows it: credentials replaced by ``***``.

    The userinfo's password (``https://user:***@host``), the value of each query or
    fragment parameter named by a secret word (``api_key``, ``access_token``, ``password``,
    see :func:`is_secret_key`) or in :data:`URL_SECRET_PARAMS`, and any other credential
    shape the redactor knows. The rest is kept byte for byte (nothing is re-encoded), so a
    masked URL still says where a document came from. Never raises.
    """

    def param(found: re.Match[str]) -> str:
        name = unquote(found.group(1)).strip()
        if found.group(2) and (is_secret_key(name) or name.lower() in URL_SECRET_PARAMS):
            return f"{found.group(1)}={MASK}"
        return found.group(0)

    url = _URL_PASSWORD.sub(r"\g<1>" + MASK + "@", url, count=1)
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=-1)
    if cut >= 0:
        url = url[:cut] + _URL_PARAM.sub(param, url[cut:])
    return _SHAPES.redact(url)


def mask_text(text: str) -> str:
    """``text`` with the credential shapes masked (no known secret values): each URL's
    password and credential parameters as :func:`mask_url` masks them, ``token=…``,
    ``Bearer …`` and the rest. For messages built from what a library or server said."""
    return _SHAPES.redact(text)


def secret_strings(value: Any, *, secret: bool = False) -> list[str]:
    """The strings a redactor must mask in ``value`` (params, say): every string under a
    secret-looking name at any depth (``api_key``, ``conf.gh_token``), numbers as their text;
    with ``secret``, every string and number in ``value``."""
    out: list[str] = []

    def walk(value: Any, *, secret: bool) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, secret=secret or (isinstance(k, str) and is_secret_key(k)))
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v, secret=secret)
        elif secret and isinstance(value, str):
            out.append(value)
        elif secret and isinstance(value, int | float) and not isinstance(value, bool):
            out.append(str(value))

    walk(value, secret=secret)
    return out


def _forms(secret: str) -> set[str]:
    """A secret as text may quote it: as is, JSON-escaped (ASCII or not), inside a ``repr``,
    and with its whitespace folded to single spaces (a message put on one line)."""
    forms = {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        " ".join(secret.split()),
    }
    return {f for f in forms if len(f) >= MIN_SECRET_LEN}


def _occurrences(text: str, mark: str) -> list[int]:
    """Where ``mark`` occurs in ``text``."""
    found, out = text.find(mark), []
    while found >= 0:
        out.append(found)
        found = text.find(mark, found + 1)
    return out


def _common_length(text: str, at: int, form: str) -> int:
    """How many characters of ``form`` ``text`` repeats from ``at``."""
    limit = min(len(form), len(text) - at)
    n = 0
    while n < limit and text[at + n] == form[n]:
        n += 1
    return n


def _clipped_at(text: str, end: int) -> bool:
    """Whether ``text`` ends at ``end`` or goes on with a clip mark (``CLIP_MARKS``)."""
    return end == len(text) or text.startswith(CLIP_MARKS, end)


_SHAPES = Redactor()
"""Credential shapes only: no known secret values."""
