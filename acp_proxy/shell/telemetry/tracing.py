"""OpenTelemetry traces: the SDK set-up behind ``tracing: {enabled: true}``.

Contract: owns the tracer provider (exporter chosen by the standard ``OTEL_*`` variables, never
overriding one the user set; a batch span processor behind a byte budget; attribute limits), the
routing of the SDK's own log records into the proxy's logging, and the bounded flush at exit.
The spans themselves are ``acp_proxy.shell.telemetry.session_spans``'s. Imported only when tracing
is
enabled; the SDK is the ``otel`` extra, and its absence is a clear error that says how to add
it for the way acp-proxy was installed.

Off the hot path: spans are handed to a ``BatchSpanProcessor``, whose own thread exports them;
in front of it, spans awaiting export are bounded in number (its queue's size,
``OTEL_BSP_MAX_QUEUE_SIZE``) and in bytes (``trace_bounds.MAX_EXPORT_BYTES``), so a dead or slow
collector never blocks the session's task nor grows the proxy's memory. At exit the proxy waits
at most ``FLUSH_S`` for the last spans (a daemon thread exports them), and not at all for a
collector that is not answering (``trace_bounds.ByteBudget.shutdown``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import anyio

from acp_proxy.config import TracingConfig
from acp_proxy.shell.log.logsetup import get_logger
from acp_proxy.shell.session import hooks
from acp_proxy.shell.telemetry.session_spans import SessionTracing
from acp_proxy.shell.telemetry.trace_bounds import (
    FLUSH_S,
    ByteBudget,
    ExportWatch,
    install_log_bridge,
    max_queue_spans,
    span_limits,
)
from acp_proxy.telemetry.propagation import NAME, TraceContext

OTEL_PACKAGES = "opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"


class MissingExtra(Exception):
    """The ``otel`` extra is not installed."""


def install_hint(
    prefix: str = sys.prefix, executable: str = sys.executable, direct_url: str | None = None
) -> str:
    """The command that adds the ``otel`` extra to this installation of acp-proxy (acp-proxy
    is not on the package index: ``pip install 'acp-proxy[otel]'`` would fail).

    From a checkout (editable or not, as recorded in the installation's ``direct_url.json``):
    that path with ``[otel]``; pipx: ``pipx inject``; ``uv tool``: reinstall with the extra;
    otherwise the extra's two packages into the running interpreter's environment.
    """
    if direct_url is None:
        direct_url = _direct_url()
    source = editable = None
    try:
        info = json.loads(direct_url) if direct_url else {}
        url = urlparse(info.get("url", ""))
        if url.scheme == "file":
            source = unquote(url.path)
            editable = bool(info.get("dir_info", {}).get("editable"))
    except (ValueError, AttributeError):
        pass
    parts = Path(prefix).parts
    if "pipx" in parts and "venvs" in parts:
        return f"pipx inject acp-proxy {OTEL_PACKAGES}"
    if "uv" in parts and "tools" in parts and source is not None:
        return f"uv tool install --reinstall '{source}[otel]'"
    if source is not None and Path(source).is_dir():
        flag = "-e " if editable else ""
        return f"{executable} -m pip install {flag}'{source}[otel]'"
    return f"{executable} -m pip install {OTEL_PACKAGES}"


def _direct_url() -> str | None:
    from importlib import metadata

    # Every installation on the path (a checkout's ``*.egg-info`` in the current directory
    # comes first and records no origin): the first that says where it came from.
    for dist in metadata.distributions(name="acp-proxy"):
        text = dist.read_text("direct_url.json")
        if text:
            return text
    return None


class _PresetIds:
    """The SDK's id generator, except that the next span may be given its ids in advance (the
    ones the ``TraceContext`` middleware already wrote into the forwarded request)."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self.span_id: int | None = None
        self.trace_id: int | None = None

    def generate_span_id(self) -> int:
        value, self.span_id = self.span_id, None
        return value if value is not None else int(self.fallback.generate_span_id())

    def generate_trace_id(self) -> int:
        value, self.trace_id = self.trace_id, None
        return value if value is not None else int(self.fallback.generate_trace_id())

    def is_trace_id_random(self) -> bool:
        # Preset trace ids come from ``random.getrandbits(128)`` or from a parent's trace.
        return bool(self.fallback.is_trace_id_random())


def _exporter(environ: Mapping[str, str]) -> Any:
    """The span exporter ``OTEL_TRACES_EXPORTER`` names (default ``otlp``, over HTTP/protobuf)."""
    name = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if name == "none":
        return None
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)  # stdout carries the protocol
    if name != "otlp":
        raise MissingExtra(f"OTEL_TRACES_EXPORTER={name!r}: supported are otlp, console, none")
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    )
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise MissingExtra(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc"
            ) from exc
        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


class Tracing:
    """The ``ProcessObserver`` behind ``tracing.enabled``: owns the tracer provider."""

    def __init__(self, config: TracingConfig, environ: Mapping[str, str]) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        except ImportError as exc:
            raise MissingExtra(
                f"tracing needs the OpenTelemetry SDK (the otel extra): {install_hint()}"
            ) from exc
        from acp_proxy import __version__

        self.config = config
        attributes: dict[str, str] = {"service.version": __version__}
        named = "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        if "OTEL_SERVICE_NAME" not in environ and not named:
            attributes["service.name"] = "acp-proxy"
        self.ids = _PresetIds(RandomIdGenerator())
        self.provider = TracerProvider(
            resource=Resource.create(attributes),
            id_generator=self.ids,  # type: ignore[arg-type]
            # Never block the interpreter's exit on a dead collector: ``flush`` is bounded.
            shutdown_on_exit=False,
            span_limits=span_limits(environ),
        )
        exporter = _exporter(environ)
        self.budget: ByteBudget | None = None
        self.watch: ExportWatch | None = None
        if exporter is not None:
            # The same queue size for the processor and the budget in front of it, so that the
            # processor's queue never overflows (each overflow logs, and costs, on the session's
            # task): the budget drops the span first, at the cost of a comparison.
            queue = max_queue_spans(environ)
            self.watch = ExportWatch(exporter)
            processor = BatchSpanProcessor(self.watch, max_queue_size=queue)  # type: ignore[arg-type]
            self.budget = ByteBudget(processor, max_spans=queue, watch=self.watch)
            self.provider.add_span_processor(self.budget)  # type: ignore[arg-type]
        self.tracer = self.provider.get_tracer("acp_proxy", __version__)

    # -- hooks.ProcessObserver ------------------------------------------------------------------

    def session_observer(self, session: Any) -> SessionTracing:
        return SessionTracing(self, session)

    def admit(self) -> bool:
        """Whether an ended span can still be queued for export (see ``ByteBudget.admit``)."""
        return self.budget is None or self.budget.admit()

    def agent_exited(self, returncode: int) -> None:
        pass

    def listening(self, accepting: bool) -> None:
        pass

    def detach_event(self, event: str, replayed: int) -> None:
        """``detach_grace``: one span per detach, reattach (with the frames replayed), refusal,
        takeover or expired grace time, so that a trace shows where a session changed hands."""
        if not self.admit():
            return
        span = self.tracer.start_span(
            f"acp-proxy {event}",
            attributes={"acp_proxy.detach.event": event, "acp_proxy.detach.replayed": replayed},
        )
        span.end()

    def flush(self) -> None:
        """Export what is left and shut the exporter down, with a deadline of ``FLUSH_S``, and
        none of it spent on a collector that is not answering (blocking: see
        ``run_with_tracing``)."""
        if self.budget is not None:
            self.budget.shutdown(int(FLUSH_S * 1000))


def with_trace_context(config: Any) -> Any:
    """``config`` with the ``TraceContext`` middleware appended (last in the chain)."""
    import dataclasses

    from acp_proxy.config import MiddlewareSpec

    inject = config.tracing.inject
    spec = MiddlewareSpec(NAME, lambda: TraceContext(inject), use=NAME)
    return dataclasses.replace(config, middleware=(*config.middleware, spec))


async def run_with_tracing(
    config: TracingConfig, main: Callable[..., Awaitable[int]], *args: Any
) -> int:
    """Run ``main(*args)`` with tracing installed; flush (bounded) at the end."""
    log = get_logger()
    try:
        tracing = Tracing(config, os.environ)
    except MissingExtra as exc:
        print(f"acp-proxy: {exc}", file=sys.stderr)
        return 2
    log.info(
        "tracing",
        exporter=os.environ.get("OTEL_TRACES_EXPORTER", "otlp"),
        endpoint=os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"),
        inject=config.inject,
    )
    # Left in place at exit: the flush thread may still log after the proxy stops waiting.
    install_log_bridge()
    hooks.install(tracing)
    try:
        return await main(*args)
    finally:
        hooks.uninstall(tracing)
        # The exporter's shutdown exports what is queued, until its deadline or until the
        # collector proves not to answer: run it in a daemon thread and wait at most FLUSH_S, so
        # a dead collector never holds the proxy's exit (a worker thread of anyio's would: the
        # interpreter joins those at exit).
        done = threading.Event()

        def flush() -> None:
            try:
                tracing.flush()
            finally:
                done.set()

        threading.Thread(target=flush, name="acp-proxy-trace-flush", daemon=True).start()
        with anyio.CancelScope(shield=True), anyio.move_on_after(FLUSH_S):
            while not done.is_set():
                await anyio.sleep(0.02)
        budget, watch = tracing.budget, tracing.watch
        if budget is not None and watch is not None and (budget.dropped or watch.lost):
            log.warning(
                "spans dropped: the export queue was full, or the collector was not answering "
                "at exit",
                dropped=budget.dropped,
                limit_spans=budget.max_spans,
                limit_bytes=budget.budget,
                lost_at_exit=watch.lost,
            )
