"""Where spans go: an OTLP/HTTP traces URL and its headers, checked before anything is sent."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

from ..errors import UsageError, WorkflowError
from ..redact import mask_url

TRACES_PATH = "/v1/traces"
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class ExportFailed(WorkflowError):
    """The OTLP receiver did not take a run's spans (unreachable, refused, too slow)."""

    def __init__(self, *, run_id: str, url: str, spans: int, reason: str) -> None:
        super().__init__(
            f"OpenTelemetry export of run {run_id} to {mask_url(url)} failed ({spans} spans not "
            f"sent): {reason.rstrip('. ')}. Check that an OTLP/HTTP receiver listens there, "
            "then export again.",
            run_id=run_id,
        )
        self.url = mask_url(url)


def traces_url(endpoint: str) -> str:
    """The traces URL of ``endpoint``: ``/v1/traces`` appended unless it ends so.

    Raises:
        UsageError: not an http(s) URL with a host.
    """
    text = endpoint.strip()
    parsed = urlsplit(text)
    if (
        parsed.scheme not in ("http", "https")
        or not parsed.hostname
        or any(c.isspace() for c in text)
    ):
        raise UsageError(
            f"OTLP endpoint: expected an http(s) URL such as http://127.0.0.1:4318 "
            f"(got {mask_url(text)!r}); pass --endpoint URL or set WF_MAGIC_OTLP_ENDPOINT."
        )
    path = parsed.path.rstrip("/")
    if not path.endswith(TRACES_PATH):
        path += TRACES_PATH
    return urlunsplit((parsed.scheme, parsed.netloc, path, parsed.query, ""))


def parse_headers(pairs: Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    """Headers for the receiver from ``k=v`` texts (or a mapping), checked.

    Raises:
        UsageError: an entry is not ``NAME=VALUE`` with a header name and a one-line value
            (the value is never echoed: it is often a credential).
    """
    if pairs is None:
        return {}
    items = list(pairs.items()) if isinstance(pairs, Mapping) else [_split(p) for p in pairs]
    out: dict[str, str] = {}
    for name, value in items:
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            shown = name[:40] if isinstance(name, str) else type(name).__name__
            raise UsageError(
                f"--headers: expected NAME=VALUE with NAME a header name (got {shown!r}=***)."
            )
        if not isinstance(value, str) or _BAD_VALUE.search(value):
            raise UsageError(
                f"--headers {name}: expected a one-line text value without control characters."
            )
        out[name] = value.strip()
    return out


def _split(pair: str) -> tuple[str, str]:
    name, sep, value = pair.partition("=")
    if not sep:
        raise UsageError(
            "--headers: expected NAME=VALUE, e.g. --headers Authorization='Basic …' "
            f"(got {len(pair)} characters without '='; run ids go before --headers)."
        )
    return name.strip(), value
