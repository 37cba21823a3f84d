"""Text bound for a terminal with its control characters made visible, so a model's answer
can show an escape sequence but never send one (:func:`visible`).

What is escaped, as Python writes it (``\\x1b``, ``\\x9b``, ``\\u202e``):

- C0 controls (U+0000–U+001F) except newline and tab, which the multi-line summaries
  (``wf run``'s result, ``wf status``, ``wf show``) need for their layout and which move the
  cursor only as text does; a carriage return is escaped (it would let a line overwrite what
  came before it);
- DEL (U+007F) and the C1 controls (U+0080–U+009F: ``\\x9b`` is a one-byte CSI on some
  terminals);
- the bidirectional embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069), which
  reorder what a reader sees;
- the line and paragraph separators (U+2028, U+2029).

ESC is a C0 control, so every ANSI/OSC/DCS sequence loses its introducer and prints as
text. The function is idempotent (an escaped text has no control character left) and the
only place that decides this; it imports nothing.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab written as its escape
    (ESC → ``\\x1b``), so a terminal prints it instead of acting on it."""
    return _CONTROL.sub(_escaped, text)


def visible_line(text: str) -> str:
    """:func:`visible` for a one-line slot (a progress line): newline and tab escaped too."""
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")
