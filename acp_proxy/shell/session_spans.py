"""The spans of one session: JSON-RPC requests, and each prompt turn as one tree.

Contract: owns the ``SessionObserver`` that turns a session's ``Observed`` notes into
OpenTelemetry spans. A span per request crossing the proxy in either direction (named after the
method, ``rpc.*`` attributes, ended by its response, by the proxy's error when the peer went
away, or by the end of the session). A prompt turn (``acp_proxy.telemetry.turns``: in v1 up to
the prompt response, in v2 up to the idle ``state_update``) is one ``invoke_agent`` span, the
``session/prompt`` request's own span kept open to the turn's end; its tool calls
(``execute_tool``), the agent's requests during the turn (``fs/*``, ``terminal/*``,
``session/request_permission``) and ``session/cancel`` are its children. Names follow the
OpenTelemetry GenAI conventions (docs/telemetry.md has the mapping). Imported only with tracing.

Ids of forwarded requests come from the ``TraceContext`` middleware's decisions, so the span the
next hop sees as its parent is exactly this one. A request read before the version is known
(the middleware does not run yet) is still parented to the ``traceparent`` it carries.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final, Protocol

import orjson

from acp_proxy.shell.logsetup import get_logger
from acp_proxy.shell.trace_bounds import MAX_ATTRIBUTE_CHARS
from acp_proxy.telemetry import labels as L
from acp_proxy.telemetry import turns as T
from acp_proxy.telemetry.propagation import Decision, SpanIds, TraceContext, parse_traceparent
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.pipeline import Note, Observed, VersionNegotiated


class PresetIds(Protocol):
    """The ids the next span is given in advance (``tracing``'s id generator)."""

    span_id: int | None
    trace_id: int | None


class Tracing(Protocol):
    """What a session's spans use of the process's tracing set-up (``tracing.Tracing``): a
    protocol, so that this module never imports the one that imports it."""

    @property
    def ids(self) -> PresetIds: ...

    @property
    def tracer(self) -> Any: ...

    def admit(self) -> bool:
        """Whether an ended span can still be queued for export; when not, it is counted as
        dropped (and the caller does not end it: that work would be thrown away)."""
        ...


# Open spans of one session, requests, turns and tool calls together (an open SDK span with
# our attributes holds about 3 KiB: some 13 MiB at the bound). Past it the oldest open span is
# ended at once (status error, ``acp.evicted``) and counted; the count is logged at the end.
MAX_OPEN_SPANS: Final = 4_096
_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT


def _hashable_id(value: object) -> bool:
    return value is not None and type(value) in (str, int, float)


def _loads(raw: bytes) -> list[Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return value if isinstance(value, list) else [value]


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _text(value: object) -> str | None:
    """A peer's string, cut to what a span attribute keeps (the SDK cuts too; this keeps the
    whole string from being held by the span until then)."""
    return value[:MAX_ATTRIBUTE_CHARS] if isinstance(value, str) else None


class SessionTracing:
    """The ``SessionObserver`` of one session: starts and ends its spans (see the module)."""

    def __init__(self, tracing: Tracing, session: Any) -> None:
        self.tracing = tracing
        self.session = session
        self.version: int | None = None
        self.agent_name: str | None = None
        self.requests: OrderedDict[tuple[Direction, Any], Any] = OrderedDict()
        self.initialize_ids: set[Any] = set()
        self.turns = T.TurnTracker()
        self.turn_spans: dict[int, Any] = {}  # id(Turn) -> its invoke_agent span
        self.tool_spans: dict[int, Any] = {}  # id(Tool) -> its execute_tool span
        # Every open span held in those three tables, oldest first: id(span) -> (table, key).
        self.open: OrderedDict[int, tuple[dict[Any, Any], Any]] = OrderedDict()
        self.evicted = 0  # open spans ended early because the session held MAX_OPEN_SPANS
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
        *,
        remote: SpanIds | None = None,
        remote_meta: dict[str, Any] | None = None,
        kind: str = "SERVER",
    ) -> Any:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
        from opentelemetry.trace.span import TraceState

        context = None
        tracestate = baggage = None
        if decision is not None:
            ids: SpanIds = decision.ids
            self.tracing.ids.span_id = ids.span_id
            self.tracing.ids.trace_id = ids.trace_id
            remote = decision.parent
            tracestate, baggage = decision.tracestate, decision.baggage
        elif remote_meta is not None:
            tracestate = _str(remote_meta.get("tracestate"))
            baggage = _str(remote_meta.get("baggage"))
        if remote is not None:
            state = TraceState.from_header([tracestate or ""])
            context = trace.set_span_in_context(
                NonRecordingSpan(
                    SpanContext(
                        remote.trace_id,
                        remote.span_id,
                        is_remote=True,
                        trace_flags=TraceFlags(remote.flags),
                        trace_state=state,
                    )
                )
            )
            if baggage:
                from opentelemetry.baggage.propagation import W3CBaggagePropagator

                # A header value is a list (a str would be read as its first character).
                context = W3CBaggagePropagator().extract({"baggage": [baggage]}, context)
        elif parent is not None:
            context = trace.set_span_in_context(parent)
        else:
            from opentelemetry.context import Context

            context = Context()  # a new trace, never the ambient context
        span = self.tracing.tracer.start_span(
            name, context=context, kind=getattr(SpanKind, kind), attributes=attributes
        )
        # An unsampled parent makes a non-recording span: the ids are not used; drop them.
        self.tracing.ids.span_id = self.tracing.ids.trace_id = None
        return span

    def _end(
        self, span: Any, code: object = None, message: object = None, *, failed: bool = False
    ) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.open.pop(id(span), None)
        if not self.tracing.admit():
            return  # the export queue is full: dropped, counted, at the cost of a comparison
        if code is not None or failed:
            text = _text(message)
            if type(code) is int:
                span.set_attribute("rpc.jsonrpc.error_code", code)
                span.set_attribute("error.type", str(code))
            if text is not None:
                span.set_attribute("rpc.jsonrpc.error_message", text)
            span.set_status(Status(StatusCode.ERROR, text))
        span.end()

    def _hold(self, table: dict[Any, Any], key: Any, span: Any) -> None:
        """Keep the open ``span`` in ``table`` under ``key``, within ``MAX_OPEN_SPANS``."""
        table[key] = span
        self.open[id(span)] = (table, key)
        while len(self.open) > MAX_OPEN_SPANS:
            _, (oldest_table, oldest_key) = self.open.popitem(last=False)
            oldest = oldest_table.pop(oldest_key, None)
            if oldest is not None:
                self.evicted += 1
                oldest.set_attribute("acp.evicted", True)
                self._end(oldest, None, "too many open spans in the session", failed=True)

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
            for note in notes:
                if type(note) is VersionNegotiated:
                    assert isinstance(note, VersionNegotiated)
                    self.version = self.turns.version = note.version
                elif type(note) is Observed:
                    assert isinstance(note, Observed)
                    if note.messages:
                        self._observed(note, now)
        except Exception as exc:
            self._failed(exc)

    def _observed(self, note: Observed, now: float) -> None:
        interesting = any(
            (m.method is not None and _hashable_id(m.id))
            or (m.method is None and m.answers is not None)
            or m.update_kind in T.UPDATE_KINDS
            or m.method == "session/cancel"
            for m in note.messages
        )
        if not interesting:
            return
        forwarded = note.sent is None or bool(note.sent)
        for message in _loads(note.raw):
            if isinstance(message, dict):
                self._message(note.direction, message, forwarded, now)

    def _message(
        self, direction: Direction, message: dict[str, Any], forwarded: bool, now: float
    ) -> None:
        method = message.get("method")
        rid = message.get("id")
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        session_id = params.get("sessionId")
        session_id = session_id if isinstance(session_id, str) else None
        is_request = isinstance(method, str) and _hashable_id(rid)
        if is_request and forwarded:
            self._request(direction, str(method), rid, session_id, params)
        if forwarded or not is_request:
            self._turn_events(self.turns.feed(direction, message, now), message)
        if method is None and _hashable_id(rid):
            span = self.requests.pop((direction.reverse, rid), None)
            if span is None:
                return
            if rid in self.initialize_ids and direction is _A2C:
                self.initialize_ids.discard(rid)
                self._agent_info(message.get("result"))
            error = message.get("error")
            if isinstance(error, dict):
                self._end(span, error.get("code"), error.get("message"))
            else:
                self._end(span)

    def _agent_info(self, result: object) -> None:
        if isinstance(result, dict):
            info = result.get("info", result.get("agentInfo"))  # v2 ``info``, v1 ``agentInfo``
            if isinstance(info, dict):
                self.agent_name = _text(info.get("name"))

    def _request(
        self,
        direction: Direction,
        method: str,
        rid: Any,
        session_id: str | None,
        params: dict[str, Any],
    ) -> None:
        attributes: dict[str, Any] = {
            "rpc.system": "jsonrpc",
            "rpc.method": method,
            "rpc.jsonrpc.version": "2.0",
            "rpc.jsonrpc.request_id": _text(str(rid)),
            "acp.direction": str(direction),
        }
        if session_id is not None:
            attributes["acp.session_id"] = _text(session_id)
            attributes["gen_ai.conversation.id"] = _text(session_id)
        if self.version is not None:
            attributes["acp.protocol_version"] = self.version
        middleware = self._decisions()
        decision = middleware.decided.pop((direction, rid), None) if middleware else None
        remote = None
        meta: dict[str, Any] | None = None
        parent = None
        if decision is None:
            # The middleware did not run (the version is not known yet, or no traceparent):
            # reading the sender's traceparent is harmless, and keeps the span in its trace.
            meta = params.get("_meta")
            meta = meta if isinstance(meta, dict) else None
            remote = parse_traceparent(meta.get("traceparent")) if meta is not None else None
            turn = self.turns.turns.get(session_id) if session_id is not None else None
            if remote is None and direction is _A2C and turn is not None:
                # The agent asks the client something during a turn: part of that turn.
                parent = self.turn_spans.get(id(turn))
        name, kind = method, "SERVER"
        if method == "session/prompt" and direction is _C2A and session_id is not None:
            name = f"invoke_agent {self.agent_name}" if self.agent_name else "invoke_agent"
            attributes["gen_ai.operation.name"] = "invoke_agent"
            if self.agent_name:
                attributes["gen_ai.agent.name"] = self.agent_name
            kind = "CLIENT"  # the proxy invokes the agent on the client's behalf
        elif method == "initialize" and direction is _C2A:
            self.initialize_ids.add(rid)
        span = self._start(
            name,
            attributes,
            parent,
            decision,
            remote=remote,
            remote_meta=meta if remote is not None else None,
            kind=kind,
        )
        key = (direction, rid)
        old = self.requests.pop(key, None)
        if old is not None:  # a reused id: the earlier request gets no answer we can match
            self._end(old, None, "its id was reused before an answer", failed=True)
        self._hold(self.requests, key, span)

    # -- turns ----------------------------------------------------------------------------------

    def _turn_events(self, events: list[T.TurnEvent], message: dict[str, Any]) -> None:
        for event in events:
            if isinstance(event, T.TurnStarted):
                # The prompt request's span is the turn's: it ends with the turn, not its
                # response.
                span = self.requests.pop((_C2A, event.turn.request_id), None)
                if span is not None:
                    self._hold(self.turn_spans, id(event.turn), span)
            elif isinstance(event, T.TurnEnded):
                self._turn_ended(event, message)
            elif isinstance(event, T.FirstOutput):
                span = self.turn_spans.get(id(event.turn))
                if span is not None:
                    span.set_attribute("acp.turn.first_output", event.kind)
                    span.set_attribute(
                        "acp.turn.time_to_first_output_s", event.at - event.turn.start
                    )
                    span.add_event("first_output", {"acp.output": event.kind})
            elif isinstance(event, T.ToolStarted | T.ToolUpdated):
                self._tool(event.tool)
            elif isinstance(event, T.ToolEnded):
                span = self.tool_spans.pop(id(event.tool), None)
                if span is not None:
                    self._tool_attributes(span, event.tool)
                    span.set_attribute("acp.tool_call.final_status", event.status)
                    failed = event.status not in ("completed", "cancelled")
                    self._end(span, None, f"tool call {event.status}", failed=failed)
            elif isinstance(event, T.PermissionAnswered):
                span = self.requests.get((_A2C, event.permission.request_id))
                if span is not None:
                    span.set_attribute("acp.permission.outcome", event.outcome)
                    span.set_attribute("acp.permission.wait_s", event.end - event.permission.start)
            elif isinstance(event, T.Cancelled):
                self._cancelled(event)
            elif isinstance(event, T.CostReported) and event.session_id in self.turns.turns:
                turn = self.turns.turns[event.session_id]
                span = self.turn_spans.get(id(turn))
                if span is not None:
                    currency = str(event.currency)[:16]
                    span.add_event(
                        "usage_update",
                        {"acp.cost.increase": event.amount, "acp.cost.currency": currency},
                    )

    def _turn_ended(self, event: T.TurnEnded, message: dict[str, Any]) -> None:
        turn = event.turn
        span = self.turn_spans.pop(id(turn), None)
        if span is None:
            return
        if not self.tracing.admit():
            self.open.pop(id(span), None)
            return
        span.set_attribute("acp.stop_reason", event.stop_reason)
        raw = _text(event.raw_stop_reason)
        if raw is not None:
            span.set_attribute("gen_ai.response.finish_reasons", [raw])
        for name, n in turn.tokens.items():
            key = {
                "input": "gen_ai.usage.input_tokens",
                "output": "gen_ai.usage.output_tokens",
                "cached_read": "gen_ai.usage.cache_read.input_tokens",
                "cached_write": "gen_ai.usage.cache_creation.input_tokens",
            }.get(name, f"acp.usage.{name}_tokens")
            span.set_attribute(key, n)
        span.set_attribute("acp.turn.tool_calls", turn.tools)
        if turn.cancelled:
            span.set_attribute("acp.turn.cancelled", True)
        if turn.accepted is not None:
            span.set_attribute("acp.turn.accepted_s", turn.accepted - turn.start)
        error = message.get("error") if "method" not in message else None
        if isinstance(error, dict) and message.get("id") == turn.request_id:
            self._end(span, error.get("code"), error.get("message"))
        elif event.stop_reason in (L.ERROR, L.SESSION_END):
            span.set_attribute("error.type", event.stop_reason)
            self._end(span, None, f"turn ended: {event.stop_reason}", failed=True)
        else:
            self._end(span)

    def _tool_attributes(self, span: Any, tool: T.Tool) -> None:
        if tool.kind is not None:
            span.set_attribute("acp.tool_call.kind", _text(tool.kind))
        if tool.status is not None:
            span.set_attribute("acp.tool_call.status", _text(tool.status))
        if tool.name is not None:
            span.set_attribute("gen_ai.tool.name", _text(tool.name))
        if tool.title is not None:
            span.set_attribute("acp.tool_call.title", _text(tool.title))

    def _tool(self, tool: T.Tool) -> None:
        span = self.tool_spans.get(id(tool))
        if span is None:
            turn_span = self.turn_spans.get(id(tool.turn)) if tool.turn is not None else None
            attributes = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.call.id": _text(tool.tool_call_id),
                "gen_ai.conversation.id": _text(tool.session_id),
                "acp.session_id": _text(tool.session_id),
                "acp.tool_call_id": _text(tool.tool_call_id),  # as before the GenAI names
            }
            span = self._start("execute_tool", attributes, turn_span, kind="INTERNAL")
            self._hold(self.tool_spans, id(tool), span)
        self._tool_attributes(span, tool)
        if tool.name is not None:
            span.update_name(f"execute_tool {_text(tool.name)}")

    def _cancelled(self, event: T.Cancelled) -> None:
        turn_span = self.turn_spans.get(id(event.turn)) if event.turn is not None else None
        attributes = {
            "rpc.system": "jsonrpc",
            "rpc.method": "session/cancel",
            "rpc.jsonrpc.version": "2.0",
            "acp.direction": str(_C2A),
            "acp.session_id": _text(event.session_id),
            "gen_ai.conversation.id": _text(event.session_id),
        }
        self._start("session/cancel", attributes, turn_span).end()  # a notification: no wait
        if turn_span is not None:
            turn_span.add_event("session/cancel")

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        """The proxy's errors for requests left in flight end their spans."""
        if self.broken:
            return
        try:
            for frame in frames:
                for message in _loads(frame):
                    if isinstance(message, dict) and _hashable_id(message.get("id")):
                        self._generated(direction, message, now)
        except Exception as exc:
            self._failed(exc)

    def _generated(self, direction: Direction, message: dict[str, Any], now: float) -> None:
        rid = message["id"]
        self._turn_events(self.turns.answered_by_proxy(direction.reverse, rid, now), message)
        span = self.requests.pop((direction.reverse, rid), None)
        if span is not None:
            error = message.get("error")
            error = error if isinstance(error, dict) else {}
            span.set_attribute("acp.answered_by_proxy", True)
            self._end(span, error.get("code"), error.get("message"))

    def on_end(self, session: Any, now: float) -> None:
        if self.broken:
            return
        try:
            self._turn_events(self.turns.end(now), {})
            for span in self.tool_spans.values():
                self._end(span)
            self.tool_spans.clear()
            for span in self.turn_spans.values():
                self._end(span, None, "the session ended before the turn did", failed=True)
            self.turn_spans.clear()
            for span in self.requests.values():
                self._end(span, None, "the session ended before an answer", failed=True)
            self.requests.clear()
            self.open.clear()
            if self.evicted or self.turns.evicted:
                get_logger().warning(
                    "tracing bounds reached: the oldest open spans and turns were ended early",
                    spans_evicted=self.evicted,
                    max_open_spans=MAX_OPEN_SPANS,
                    turns_evicted=self.turns.evicted,
                    max_open_turns=T.MAX_OPEN,
                )
        except Exception as exc:
            self._failed(exc)
