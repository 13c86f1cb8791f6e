"""Telemetry: what the proxy reports about itself, computed without I/O.

Contract: ``metrics`` turns the pipeline's ``Observed`` notes into Prometheus counters, gauges
and histograms; ``turns`` follows prompt turns, tool calls and permission waits per protocol
version, and ``turn_metrics`` counts them, ``policy_metrics`` the policy's
decisions; ``labels`` bounds every label value; ``families``
builds the Prometheus families; ``propagation`` is the W3C trace-context rewrite of
``params._meta`` (a middleware); ``endpoint`` the metrics address forms. All pure: no clock
(times are passed in), no socket, no logging. Serving them (the HTTP responder, the OTLP
exporter, the spans) is the shell's job (``acp_proxy.shell.telemetry.metrics_server``,
``acp_proxy.shell.telemetry.tracing``, ``acp_proxy.shell.telemetry.session_spans``). Imported only
when enabled.
"""
