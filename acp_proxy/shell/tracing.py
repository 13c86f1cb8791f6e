"""OpenTelemetry traces (issue 12.2): a span per JSON-RPC request crossing the proxy.

Contract: owns the OpenTelemetry SDK set-up (exporter chosen by the standard ``OTEL_*``
variables, batch span processor) and the ``SessionObserver`` that turns a session's ``Observed``
notes into spans: one per request in either direction, named after the method, ended by its
response (or by the proxy's error when the peer went away, or by the end of the session); a
prompt turn's tool calls (``tool_call`` / ``tool_call_update``) as child spans of its
``session/prompt`` span, and requests the agent sends during a turn (``fs/*``,
``session/request_permission``, ``terminal/*``) under it too. Ids of forwarded requests come from
the ``TraceContext`` middleware's decisions (``acp_proxy.telemetry.propagation``), so the span
the next hop sees as its parent is exactly this one. Imported only when ``tracing.enabled``.

Off the hot path: spans are handed to a ``BatchSpanProcessor``, whose own thread exports them;
its queue is bounded (``OTEL_BSP_MAX_QUEUE_SIZE``, spans beyond it are dropped by the SDK), so a
dead or slow collector never blocks the session's task. At exit the proxy waits at most
``FLUSH_S`` for the last spans (a daemon thread exports them).

Semantic conventions: ``rpc.system=jsonrpc``, ``rpc.method``, ``rpc.jsonrpc.version``,
``rpc.jsonrpc.request_id``, ``rpc.jsonrpc.error_code`` / ``rpc.jsonrpc.error_message`` (OTel
"Semantic conventions for JSON-RPC"), plus ``acp.session_id``, ``acp.protocol_version`` and
``acp.direction``. Span kind SERVER: the proxy receives the request (like an ingress sidecar).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import orjson

from acp_proxy.config import TracingConfig
from acp_proxy.jsontypes import JsonValue
from acp_proxy.shell import hooks
from acp_proxy.shell.logsetup import get_logger
from acp_proxy.telemetry.propagation import NAME, Decision, SpanIds, TraceContext
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.pipeline import Note, Observed, VersionNegotiated

FLUSH_S = 2.0  # at exit: the longest the proxy waits for the exporter
MAX_OPEN = 10_000  # open spans per session (requests and tool calls), oldest ended beyond it
_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT
_TOOL_DONE = ("completed", "failed")


class MissingExtra(Exception):
    """The ``otel`` extra is not installed."""


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
                "tracing needs the OpenTelemetry SDK: pip install 'acp-proxy[otel]'"
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
        )
        exporter = _exporter(environ)
        if exporter is not None:
            self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("acp_proxy", __version__)

    # -- hooks.ProcessObserver ------------------------------------------------------------------

    def session_observer(self, session: Any) -> SessionTracing:
        return SessionTracing(self, session)

    def agent_exited(self, returncode: int) -> None:
        pass

    def listening(self, accepting: bool) -> None:
        pass

    def flush(self) -> None:
        """Export what is left (blocking: see ``run_with_tracing``)."""
        self.provider.force_flush(int(FLUSH_S * 1000))


def _hashable_id(value: JsonValue) -> bool:
    return value is not None and type(value) in (str, int, float)


def _loads(raw: bytes) -> list[Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return value if isinstance(value, list) else [value]


class SessionTracing:
    """The ``SessionObserver`` of one session: starts and ends its spans (see the module)."""

    def __init__(self, tracing: Tracing, session: Any) -> None:
        self.tracing = tracing
        self.session = session
        self.version: int | None = None
        self.requests: OrderedDict[tuple[Direction, Any], Any] = OrderedDict()
        self.prompts: dict[str, Any] = {}  # sessionId -> the open session/prompt span
        self.prompt_of: dict[int, str] = {}  # id(prompt span) -> its sessionId
        self.tools: OrderedDict[tuple[str, str], Any] = OrderedDict()  # (sessionId, toolCallId)
        self._middleware: TraceContext | bool | None = False  # False: not looked up yet
        self.broken = False

    def _decisions(self) -> TraceContext | None:
        if self._middleware is False:
            found = None
            for link in self.session.connection.chain.links:
                if isinstance(link.middleware, TraceContext):
                    found = link.middleware
            self._middleware = found
        assert not isinstance(self._middleware, bool)
        return self._middleware

    # -- spans ----------------------------------------------------------------------------------

    def _start(
        self,
        name: str,
        attributes: dict[str, Any],
        parent: Any = None,
        decision: Decision | None = None,
    ) -> Any:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
        from opentelemetry.trace.span import TraceState

        context = None
        if decision is not None:
            ids: SpanIds = decision.ids
            self.tracing.ids.span_id = ids.span_id
            self.tracing.ids.trace_id = ids.trace_id
            if decision.parent is not None:
                state = TraceState.from_header([decision.tracestate or ""])
                remote = SpanContext(
                    decision.parent.trace_id,
                    decision.parent.span_id,
                    is_remote=True,
                    trace_flags=TraceFlags(decision.parent.flags),
                    trace_state=state,
                )
                context = trace.set_span_in_context(NonRecordingSpan(remote))
            if decision.baggage:
                from opentelemetry.baggage.propagation import W3CBaggagePropagator

                context = W3CBaggagePropagator().extract({"baggage": decision.baggage}, context)
        elif parent is not None:
            context = trace.set_span_in_context(parent)
        else:
            from opentelemetry.context import Context

            context = Context()  # a new trace, never the ambient context
        span = self.tracing.tracer.start_span(
            name, context=context, kind=SpanKind.SERVER, attributes=attributes
        )
        # An unsampled parent makes a non-recording span: the ids are not used; drop them.
        self.tracing.ids.span_id = self.tracing.ids.trace_id = None
        return span

    def _end(
        self, span: Any, code: object = None, message: object = None, *, failed: bool = False
    ) -> None:
        from opentelemetry.trace import Status, StatusCode

        if code is not None or failed:
            if type(code) is int:
                span.set_attribute("rpc.jsonrpc.error_code", code)
            if isinstance(message, str):
                span.set_attribute("rpc.jsonrpc.error_message", message)
            span.set_status(Status(StatusCode.ERROR, message if isinstance(message, str) else None))
        span.end()

    # -- SessionObserver ------------------------------------------------------------------------

    def _failed(self, exc: Exception) -> None:
        # A tracing bug must never stop the session (observers must not raise): log it once
        # and stop tracing this session.
        self.broken = True
        get_logger().error("tracing failed; no more spans for this session", error=repr(exc))

    def on_notes(self, notes: tuple[Note, ...], now: float) -> None:
        if self.broken:
            return
        try:
            self._notes(notes)
        except Exception as exc:
            self._failed(exc)

    def _notes(self, notes: tuple[Note, ...]) -> None:
        for note in notes:
            if type(note) is VersionNegotiated:
                assert isinstance(note, VersionNegotiated)
                self.version = note.version
            elif type(note) is Observed:
                assert isinstance(note, Observed)
                if note.messages:
                    self._observed(note)

    def _observed(self, note: Observed) -> None:
        interesting = any(
            (m.method is not None and _hashable_id(m.id))
            or (m.method is None and m.answers is not None)
            or m.update_kind in ("tool_call", "tool_call_update")
            for m in note.messages
        )
        if not interesting:
            return
        forwarded = note.sent is None or bool(note.sent)
        for message in _loads(note.raw):
            if isinstance(message, dict):
                self._message(note.direction, message, forwarded)

    def _message(self, direction: Direction, message: dict[str, Any], forwarded: bool) -> None:
        method = message.get("method")
        rid = message.get("id")
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        session_id = params.get("sessionId")
        session_id = session_id if isinstance(session_id, str) else None
        if isinstance(method, str) and _hashable_id(rid):
            if forwarded:
                self._request(direction, method, rid, session_id)
        elif isinstance(method, str):
            if method == "session/update" and session_id is not None:
                self._update(session_id, params.get("update"))
        elif _hashable_id(rid):
            span = self.requests.pop((direction.reverse, rid), None)
            if span is None:
                return
            error = message.get("error")
            if isinstance(error, dict):
                self._end(span, error.get("code"), error.get("message"))
            else:
                self._end(span)
            self._request_ended(span)

    def _request(self, direction: Direction, method: str, rid: Any, session_id: str | None) -> None:
        attributes: dict[str, Any] = {
            "rpc.system": "jsonrpc",
            "rpc.method": method,
            "rpc.jsonrpc.version": "2.0",
            "rpc.jsonrpc.request_id": str(rid),
            "acp.direction": str(direction),
        }
        if session_id is not None:
            attributes["acp.session_id"] = session_id
        if self.version is not None:
            attributes["acp.protocol_version"] = self.version
        middleware = self._decisions()
        decision = middleware.decided.pop((direction, rid), None) if middleware else None
        parent = None
        if decision is None and direction is _A2C and session_id is not None:
            # The agent asks the client something during a turn: part of that turn.
            parent = self.prompts.get(session_id)
        span = self._start(method, attributes, parent, decision)
        key = (direction, rid)
        old = self.requests.pop(key, None)
        if old is not None:  # a reused id: the earlier request gets no answer we can match
            self._end(old, None, "its id was reused before an answer", failed=True)
        self.requests[key] = span
        if len(self.requests) > MAX_OPEN:
            _, oldest = self.requests.popitem(last=False)
            self._end(oldest, None, "too many requests in flight to trace", failed=True)
        if method == "session/prompt" and direction is _C2A and session_id is not None:
            self.prompts[session_id] = span
            self.prompt_of[id(span)] = session_id

    def _request_ended(self, span: Any) -> None:
        session_id = self.prompt_of.pop(id(span), None)
        if session_id is None or self.prompts.get(session_id) is not span:
            return
        del self.prompts[session_id]
        for key in [k for k in self.tools if k[0] == session_id]:
            self._end(self.tools.pop(key))

    def _update(self, session_id: str, update: Any) -> None:
        if not isinstance(update, dict):
            return
        kind = update.get("sessionUpdate")
        tool_id = update.get("toolCallId")
        if kind not in ("tool_call", "tool_call_update") or not isinstance(tool_id, str):
            return
        key = (session_id, tool_id)
        span = self.tools.get(key)
        if span is None:
            attributes: dict[str, Any] = {
                "acp.session_id": session_id,
                "acp.tool_call_id": tool_id,
            }
            if isinstance(update.get("kind"), str):
                attributes["acp.tool_kind"] = update["kind"]
            span = self._start("tool_call", attributes, self.prompts.get(session_id))
            self.tools[key] = span
            if len(self.tools) > MAX_OPEN:
                _, oldest = self.tools.popitem(last=False)
                self._end(oldest)
        status = update.get("status")
        if isinstance(status, str):
            span.set_attribute("acp.tool_status", status)
            if status in _TOOL_DONE:
                del self.tools[key]
                self._end(span, None, "tool call failed", failed=status == "failed")

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        """The proxy's errors for requests left in flight end their spans."""
        if self.broken:
            return
        try:
            self._generated(direction, frames)
        except Exception as exc:
            self._failed(exc)

    def _generated(self, direction: Direction, frames: tuple[bytes, ...]) -> None:
        for frame in frames:
            for message in _loads(frame):
                if isinstance(message, dict) and _hashable_id(message.get("id")):
                    span = self.requests.pop((direction.reverse, message["id"]), None)
                    if span is not None:
                        error = message.get("error")
                        error = error if isinstance(error, dict) else {}
                        span.set_attribute("acp.answered_by_proxy", True)
                        self._end(span, error.get("code"), error.get("message"))
                        self._request_ended(span)

    def on_end(self, session: Any, now: float) -> None:
        if self.broken:
            return
        try:
            self._ended()
        except Exception as exc:
            self._failed(exc)

    def _ended(self) -> None:
        for span in self.tools.values():
            self._end(span)
        self.tools.clear()
        for span in self.requests.values():
            self._end(span, None, "the session ended before an answer", failed=True)
        self.requests.clear()
        self.prompts.clear()
        self.prompt_of.clear()


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
    hooks.install(tracing)
    try:
        return await main(*args)
    finally:
        hooks.uninstall(tracing)
        # The SDK's flush exports synchronously, with the exporter's own retries and timeout
        # (10 s by default): run it in a daemon thread and wait at most FLUSH_S, so a dead
        # collector never holds the proxy's exit (a worker thread of anyio's would: the
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
