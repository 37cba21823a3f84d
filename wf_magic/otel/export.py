"""Sends a run's spans through the official OpenTelemetry SDK's OTLP/HTTP (protobuf) exporter.

The SDK is the optional extra ``wf_magic[otel]``, imported here only, when something is sent.
Spans are built as ``ReadableSpan`` objects with the journal's ids and times (no tracer, no
id generator), so the same journal always sends the same spans. What was sent where is kept
per run (the Store's export cursor): a live export sends only what is new or changed.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..redact import Redactor, mask_url
from ..store import Store
from .endpoint import ExportFailed
from .journal import read_run
from .records import SCHEMA_URL, SpanRecord
from .spans import build_spans

BATCH = 256
"""Spans per OTLP request."""
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.common.http",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportReport:
    """What one export of one run did."""

    run_id: str
    trace_id: str
    """32 hex digits: where a receiver shows the run."""
    spans: int
    """Spans the journal holds as settled."""
    sent: int
    """Spans sent by this export (a live export skips those already sent unchanged)."""


def export_run(
    store: Store,
    run_id: str,
    *,
    url: str,
    headers: Mapping[str, str],
    redactor: Redactor,
    content: bool = False,
    timeout_s: float = 10.0,
    only_new: bool = False,
) -> ExportReport:
    """Send the spans of ``run_id`` to the OTLP/HTTP traces ``url`` and record them as sent.

    Args:
        only_new: skip the spans the cursor says were sent to ``url`` as they are now.

    Raises:
        UsageError: no such run, or the ``otel`` extra is not installed.
        ExportFailed: the receiver did not take them within ``timeout_s``.
    """
    spans = build_spans(
        read_run(store, run_id, content=content), redactor=redactor, content=content
    )
    where = mask_url(url)
    sent = store.otel_sent(run_id, where) if only_new else {}
    todo = [s for s in spans if sent.get(s.span_hex) != s.fingerprint()]
    for start in range(0, len(todo), BATCH):
        batch = todo[start : start + BATCH]
        send_spans(batch, url=url, headers=headers, timeout_s=timeout_s, run_id=run_id)
        store.mark_otel_sent(run_id, where, {s.span_hex: s.fingerprint() for s in batch})
    trace = f"{spans[0].trace_id:032x}" if spans else ""
    return ExportReport(run_id=run_id, trace_id=trace, spans=len(spans), sent=len(todo))


def send_spans(
    spans: Sequence[SpanRecord],
    *,
    url: str,
    headers: Mapping[str, str],
    timeout_s: float,
    run_id: str,
) -> None:
    """POST ``spans`` as one OTLP request through the SDK's exporter.

    Raises:
        UsageError: the ``otel`` extra is not installed.
        ExportFailed: not accepted (the exporter's own retries included) within ``timeout_s``.
    """
    if not spans:
        return
    sdk = _sdk()
    exporter = sdk.exporter(endpoint=url, headers=dict(headers), timeout=timeout_s)
    try:
        with _quiet_sdk() as said:
            result = exporter.export([_readable(sdk, s) for s in spans])
    finally:
        exporter.shutdown()
    if result != sdk.success:
        reason = said[-1] if said else "the receiver did not accept the request"
        raise ExportFailed(run_id=run_id, url=url, spans=len(spans), reason=_one_line(reason))


# -- the SDK, imported when something is sent ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Sdk:
    exporter: Any
    success: Any
    readable: Any
    context: Any
    event: Any
    kinds: Mapping[str, Any]
    status: Any
    error: Any
    flags: Any
    resource: Any
    scope: Any


_SDK: _Sdk | None = None
_SDK_LOCK = threading.Lock()


def _sdk() -> _Sdk:
    global _SDK
    with _SDK_LOCK:
        if _SDK is None:
            _SDK = _load_sdk()
        return _SDK


def _load_sdk() -> _Sdk:
    # The exporter's requests imports urllib3's SOCKS support, which warns on import when
    # PySocks is absent (nobody asked for a SOCKS proxy): not a line for a user's stderr.
    warnings.filterwarnings("ignore", message="SOCKS support in urllib3", module="urllib3")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.trace.export import SpanExportResult
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags
        from opentelemetry.trace.status import Status
    except ImportError as exc:
        raise UsageError(
            "OpenTelemetry export needs the otel extra: pip install 'wf_magic[otel]' "
            f"({exc.name or 'opentelemetry'} is not installed)."
        ) from exc
    for name in _SDK_LOGGERS:
        logging.getLogger(name).addFilter(_CAPTURE)
    version = _version()
    return _Sdk(
        exporter=OTLPSpanExporter,
        success=SpanExportResult.SUCCESS,
        readable=ReadableSpan,
        context=SpanContext,
        event=Event,
        kinds={"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT},
        status=Status,
        error=StatusCode.ERROR,
        flags=TraceFlags(TraceFlags.SAMPLED),
        resource=Resource.create(
            {"service.name": "wf_magic", "service.version": version}, schema_url=SCHEMA_URL
        ),
        scope=InstrumentationScope("wf_magic", version, schema_url=SCHEMA_URL),
    )


def _readable(sdk: _Sdk, span: SpanRecord) -> Any:
    context = sdk.context(span.trace_id, span.span_id, is_remote=False, trace_flags=sdk.flags)
    parent = (
        sdk.context(span.trace_id, span.parent_id, is_remote=False, trace_flags=sdk.flags)
        if span.parent_id is not None
        else None
    )
    events = [
        sdk.event(e.name, attributes=dict(e.attributes), timestamp=_ns(e.at_s)) for e in span.events
    ]
    status = sdk.status(sdk.error, span.error) if span.error is not None else sdk.status()
    return sdk.readable(
        name=span.name,
        context=context,
        parent=parent,
        resource=sdk.resource,
        attributes=dict(span.attributes),
        events=events,
        kind=sdk.kinds[span.kind],
        status=status,
        start_time=_ns(span.start_s),
        end_time=_ns(span.end_s),
        instrumentation_scope=sdk.scope,
    )


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("wf_magic")
    except PackageNotFoundError:
        return "0"


# -- the exporter's log lines, taken instead of printed -------------------------------------------
class _Capture(logging.Filter):
    """Takes the SDK exporter's log records on a thread that is sending (they become the one
    line wf_magic says); other threads' records pass (an application's own OTel use)."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        said: list[str] | None = getattr(self.local, "said", None)
        if said is None:
            return True
        said.append(record.getMessage())
        return False


_CAPTURE = _Capture()


@contextmanager
def _quiet_sdk() -> Iterator[list[str]]:
    said: list[str] = []
    _CAPTURE.local.said = said
    try:
        yield said
    finally:
        _CAPTURE.local.said = None


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 300 else line[:299] + "…"
