"""Telemetry: what the proxy reports about itself, computed without I/O.

Contract: ``metrics`` turns the pipeline's ``Observed`` notes into Prometheus counters, gauges
and a request-duration histogram; ``propagation`` is the W3C trace-context rewrite of
``params._meta`` (a middleware). Both are pure: no clock (times are passed in), no socket, no
logging. Serving them (the HTTP responder, the OTLP exporter) is the shell's job
(``acp_proxy.shell.telemetry``, ``acp_proxy.shell.tracing``). Imported only when enabled.
"""
