"""Serving the telemetry the pure ``acp_proxy.telemetry`` computes.

Contract: ``metrics_server`` (the ``/metrics`` and health endpoints), ``tracing`` (the
OpenTelemetry SDK set-up, imported only when tracing is on), ``trace_bounds`` (the byte and count
budget on spans waiting for export), ``session_spans`` (one session's request and turn spans) and
``probe`` (the container's health probe, ``python -m acp_proxy.shell.telemetry.probe``).
"""
