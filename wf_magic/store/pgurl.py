"""What a ``postgresql://`` state URL says about its schema and whether libpq can read it: the
``?schema=`` name (never a system schema), a libpq ``options=-csearch_path=X`` honoured as
the schema or refused, and one-line errors for a malformed URL (:func:`chosen_schema`,
:func:`url_problem`).

It reads the URL only: nothing here connects (store/pgopen.py does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from ..errors import UsageError, clip

SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""A plain lowercase schema name: one that needs no quoting in PostgreSQL."""
_RESERVED = re.compile(r"information_schema|pg_.*")
"""System schemas: ``information_schema``, ``pg_catalog``, ``pg_temp*``, ``pg_toast*``; the
server reserves every ``pg_`` name for itself."""
_OPTION = re.compile(r"(?:-c\s*|--)([A-Za-z_.]+)=((?:\\.|[^\s\\])*)")
"""One ``-c name=value`` (or ``-cname=value``, ``--name=value``) in libpq's ``options``: words
split on white space, a backslash escapes the next character."""


def chosen_schema(
    query: Sequence[tuple[str, str]], shown: str, *, environ: Mapping[str, str] | None = None
) -> str:
    """The schema a state URL's query names: ``schema=``, else the ``search_path`` its libpq
    ``options`` (or ``$PGOPTIONS``) set, else ``public``.

    Raises:
        UsageError: a name that is not plain lowercase, a system schema, a ``search_path`` of
            several schemas, or a ``search_path`` that contradicts ``schema=``.
    """
    schemas = [v for k, v in query if k == "schema"]
    options = [v for k, v in query if k == "options"]
    env = os.environ if environ is None else environ
    where = "options" if options else "$PGOPTIONS"
    path = _search_path(options[-1] if options else env.get("PGOPTIONS", ""))
    schema = schemas[-1] if schemas else None
    if path is not None:
        names = [p.strip().strip('"') for p in path.split(",") if p.strip()]
        if len(names) != 1:
            raise UsageError(
                f"State {shown}: {where} sets search_path={clip(path, 60)!r}; a state lives in "
                "one schema: name it with ?schema=NAME (and drop search_path from options)."
            )
        if schema is not None and names[0] != schema:
            raise UsageError(
                f"State {shown}: {where} sets search_path={names[0]!r} but ?schema={schema!r}; "
                "name one schema (?schema=NAME) and drop search_path from options."
            )
        schema = names[0]
    schema = "public" if schema is None else schema
    _check_name(schema, shown)
    return schema


def _search_path(options: str) -> str | None:
    """The value ``-c search_path=…`` sets in libpq ``options`` (the last one), or None."""
    found = None
    for name, value in _OPTION.findall(options):
        if name.lower().replace("-", "_") == "search_path":
            found = re.sub(r"\\(.)", r"\1", value)
    return found


def _check_name(schema: str, shown: str) -> None:
    if not SCHEMA_NAME.fullmatch(schema):
        raise UsageError(
            f"State {shown}: schema {clip(repr(schema), 80)} is not a plain lowercase name "
            "([a-z_][a-z0-9_]*, at most 63 characters); choose another ?schema=NAME."
        )
    if _RESERVED.fullmatch(schema):
        raise UsageError(
            f"State {shown}: schema {schema!r} is a PostgreSQL system schema "
            "(information_schema, pg_catalog, pg_temp*, pg_toast*: every pg_ name is the "
            "server's); choose another ?schema=NAME."
        )


def url_problem(url: str) -> str | None:
    """Why libpq cannot read ``url`` (a bad percent-escape, an unknown parameter, a port that
    is no port), or None; said without the URL, whose password the message must not show."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            return f"invalid port {clip(repr(port), 40)} (expected 1 to 65535)"
    return None
