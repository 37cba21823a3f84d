"""Where a state lives: a folder (SQLite, the embedded default) or a ``postgresql://`` URL.

Every door that takes a state (``--db``, ``WF_MAGIC_HOME``, ``Engine(state_dir=…)``,
``%config WorkflowMagics.state_dir``) passes it through :func:`parse_state` before anything
turns it into a path, so a URL is never taken as a folder name.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import UsageError
from ..redact import mask_url
from .pgurl import chosen_schema

DB_FILENAME = "state.db"
URL_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True, slots=True)
class PgLocation:
    """A state on a PostgreSQL server: one schema of one database.

    Attributes:
        url: what psycopg connects with (the ``schema`` query part taken out).
        schema: the schema holding the state's tables (created if missing).
        where: the URL as messages show it: the password never appears.
        local_dir: this machine's folder for what is not journal (the seal key unless
            ``WF_MAGIC_SECRET_KEY_FILE`` names one, exec process sidecars, agent homes).
    """

    url: str
    schema: str
    where: str
    local_dir: Path

    @property
    def lock_key(self) -> int:
        """The advisory lock key of this state's write transactions (a signed 64-bit int)."""
        digest = hashlib.sha256(f"wf_magic:{self.schema}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)


def is_database_url(value: object) -> bool:
    """Whether ``value`` names a database (``scheme://…``) rather than a folder."""
    return isinstance(value, str) and "://" in value


def parse_state(value: str | os.PathLike[str] | PgLocation) -> Path | PgLocation:
    """A folder as a ``Path``; a ``postgresql://`` URL as a :class:`PgLocation`.

    Raises:
        UsageError: a URL of another scheme, or a bad ``schema`` name.
    """
    if isinstance(value, PgLocation):
        return value
    value = os.fspath(value)
    if not is_database_url(value):
        return Path(value)
    text = str(value)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - read for its ValueError: a port that is no number
    except ValueError as exc:
        raise UsageError(
            f"State {mask_url(_masked_text(text))} is not a readable URL ({exc}); write it as "
            "postgresql://USER@HOST[:PORT]/DB?schema=NAME (percent-encode a reserved "
            "character in the user or password)."
        ) from None
    if parts.scheme not in URL_SCHEMES:
        raise UsageError(
            f"State {mask_url(text)!r} is neither a folder nor a postgresql:// URL; use a "
            "directory, or postgresql://USER@HOST/DB?schema=NAME."
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = chosen_schema(query, mask_url(text))  # never a system schema; options honoured
    rest = [(k, v) for k, v in query if k != "schema"]
    # Spelt out, not urlunsplit: that drops the "//" of an empty host (postgresql:///db).
    url = f"postgresql://{parts.netloc}{parts.path}" + (f"?{urlencode(rest)}" if rest else "")
    where = _masked(f"postgresql://{parts.netloc}{parts.path}") + f"?schema={schema}"
    return PgLocation(url=url, schema=schema, where=where, local_dir=_local_dir(where))


def _masked_text(text: str) -> str:
    """``text``, which urlsplit cannot read, with the password of its userinfo (what follows
    ``USER:`` up to the last ``@``) masked."""
    head, sep, tail = text.partition("://")
    if "@" not in tail:
        return text
    userinfo, host = tail.rsplit("@", 1)
    user, colon, _ = userinfo.partition(":")
    return f"{head}{sep}{user}{':***' if colon else ''}@{host}"


def _masked(url: str) -> str:
    """``url`` with any password replaced by ``***`` (what ``where``, and so the local
    folder's name, is made of: kept as it was; messages show :func:`mask_url`)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, ""))


def _local_dir(where: str) -> Path:
    """``$WF_MAGIC_LOCAL_DIR``, else a folder of the user's cache named after the state."""
    override = os.environ.get("WF_MAGIC_LOCAL_DIR")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tag = hashlib.sha256(where.encode()).hexdigest()[:16]
    return cache / "wf_magic" / f"pg-{tag}"
