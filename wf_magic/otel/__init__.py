"""OpenTelemetry export of runs: the journal as GenAI spans, sent over OTLP/HTTP (docs/otel.md).

``spans`` builds span records from a run's rows (no SDK import), ``journal`` reads those rows
through the Store, ``endpoint`` checks where to send, ``export`` sends through the official
SDK's OTLP exporter (imported only there), ``live`` exports in the background as a drive
journals.
"""
