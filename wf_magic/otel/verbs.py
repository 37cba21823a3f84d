"""The Engine's OpenTelemetry verbs as a mixin: ``export_otel`` and the live exporter it keeps."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from ..bus import EventBus
from ..run import RunRef
from ..store import Store
from .endpoint import parse_headers, traces_url
from .export import ExportReport, export_run
from .live import LiveExporter

ENDPOINT_ENV = "WF_MAGIC_OTLP_ENDPOINT"
"""The OTLP endpoint of live export when ``Engine(otlp_endpoint=...)`` names none."""


class OtelVerbs:
    """``export_otel`` (one run, now) and live export (``Engine(otlp_endpoint=...)``)."""

    store: Store
    bus: EventBus
    otlp: LiveExporter | None
    """The live exporter (None: live export is off)."""

    def resolve_run_id(self, run_id: RunRef) -> str:
        raise NotImplementedError

    def export_otel(
        self,
        run: RunRef,
        *,
        endpoint: str,
        headers: Mapping[str, str] | Iterable[str] | None = None,
        content: bool = False,
        timeout_s: float = 10.0,
    ) -> ExportReport:
        """Send ``run`` as one OpenTelemetry trace to the OTLP/HTTP ``endpoint`` (docs/otel.md).

        Every settled span is sent; their ids come from the run and dispatch ids, so sending
        again adds no span at the receiver.

        Args:
            endpoint: the receiver's base URL (``/v1/traces`` is appended unless present).
            headers: ``{name: value}`` or ``["name=value", ...]`` (a collector's auth).
            content: attach prompts and outputs, redacted (off by default).

        Raises:
            UsageError: a bad endpoint or header, an unknown run, the ``otel`` extra missing.
            ExportFailed: the receiver did not take the spans.
        """
        url, sent_headers = traces_url(endpoint), parse_headers(headers)
        run_id = self.resolve_run_id(run)
        report = export_run(
            self.store,
            run_id,
            url=url,
            headers=sent_headers,
            redactor=self.store.scrubber.redactor(run_id),
            content=content,
            timeout_s=timeout_s,
        )
        return report

    def _live_export(
        self,
        endpoint: str | None,
        headers: Mapping[str, str] | Iterable[str] | None,
        content: bool,
    ) -> LiveExporter | None:
        """The live exporter of ``endpoint`` (or ``$WF_MAGIC_OTLP_ENDPOINT``), subscribed to
        the bus; None when neither names one."""
        endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or None
        if endpoint is None:
            return None
        exporter = LiveExporter(
            self.store,
            url=traces_url(endpoint),
            headers=parse_headers(headers),
            redactor_of=self.store.scrubber.redactor,
            content=content,
        )
        self.bus.subscribe(exporter.observe)
        return exporter
