"""W3C trace context in ACP requests: parse ``traceparent``, rewrite it as a hop.

Contract: owns the ``traceparent`` syntax (W3C Trace Context, level 1, section 3.2) and the
``TraceContext`` middleware, which gives each forwarded request the proxy span's
``traceparent`` (ACP extensibility: the root ``_meta`` keys ``traceparent``, ``tracestate`` and
``baggage`` are reserved for W3C trace context). Pure: ids come from ``random.getrandbits``, no
clock, no I/O. The middleware only *decides* the proxy span's ids and records them in
``decided``; the shell's tracing observer (``acp_proxy.shell.telemetry.tracing``) starts the span
with
exactly those ids when it sees the request go through.

Placed last in the chain, so the proxy span's ``traceparent`` is what leaves; its ``Replace``
changes only ``params._meta.traceparent``, and the pipeline's lossless splice re-encodes only
that member (``tracestate``, ``baggage`` and every other byte stay as sent).
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.chain import (
    FORWARD,
    BaseMiddleware,
    Direction,
    MessageContext,
    Replace,
    Verdict,
)

NAME: Final = "trace-context"
# W3C: version-format = trace-id "-" parent-id "-" trace-flags, lowercase hex; version ff is
# invalid; a future version may append fields after a "-".
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\Z")
# Decisions kept for requests the observer has not seen yet (normally it sees each at once).
MAX_DECIDED = 10_000


@dataclass(frozen=True, slots=True)
class SpanIds:
    """A span's place in a trace: ids as integers, flags as the low 8 bits."""

    trace_id: int
    span_id: int
    flags: int

    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"


def parse_traceparent(value: object) -> SpanIds | None:
    """The ids of a valid ``traceparent`` header value, else ``None`` (W3C: start a new trace)."""
    if not isinstance(value, str):
        return None
    m = _TRACEPARENT.match(value.strip(" \t"))
    if m is None:
        return None
    version, trace, parent, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    trace_id, span_id = int(trace, 16), int(parent, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return SpanIds(trace_id, span_id, int(flags, 16))


def _hashable_id(value: JsonValue) -> bool:
    return value is not None and type(value) in (str, int, float)


@dataclass(frozen=True, slots=True)
class Decision:
    """The proxy span of one forwarded request: its ids and the context it continues."""

    ids: SpanIds
    parent: SpanIds | None  # the sender's span (from its traceparent), None: a new trace
    tracestate: str | None
    baggage: str | None


class TraceContext(BaseMiddleware):
    """Rewrites ``params._meta.traceparent`` of requests to the proxy span's (see the module).

    A request without a valid ``traceparent`` is left alone unless ``inject`` is set; then it
    gets one that starts a new (sampled) trace. Requests whose ``params`` is not an object (or
    absent, without ``inject``) are left alone: adding ``params`` to a request that has none
    changes what the receiver validates. So is a request whose ``_meta`` is present but not an
    object (``null`` included): only the ``traceparent`` member of an object is ever changed.
    """

    needles = (b'"method"',)

    def __init__(self, inject: bool = False) -> None:
        self.inject = inject
        self.decided: OrderedDict[tuple[Direction, JsonValue], Decision] = OrderedDict()

    @property
    def name(self) -> str:
        return NAME

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        method = message.get("method")
        rid = message.get("id")
        if not isinstance(method, str) or not _hashable_id(rid):
            return FORWARD  # notifications and responses carry no span of ours
        params = message.get("params")
        if params is None and "params" not in message and self.inject:
            params = {}
        if not isinstance(params, dict):
            return FORWARD
        raw_meta = params.get("_meta")
        if "_meta" in params and not isinstance(raw_meta, dict):
            # Not an object (null, a string, a list...): replacing it would change more than
            # the traceparent member; the request is forwarded as it came.
            return FORWARD
        meta = raw_meta if isinstance(raw_meta, dict) else None
        parent = parse_traceparent(meta.get("traceparent")) if meta is not None else None
        if parent is None and not self.inject:
            return FORWARD
        ids = SpanIds(
            parent.trace_id if parent is not None else random.getrandbits(128) or 1,
            random.getrandbits(64) or 1,
            parent.flags if parent is not None else 0x01,
        )
        tracestate = meta.get("tracestate") if meta is not None else None
        baggage = meta.get("baggage") if meta is not None else None
        decided = self.decided
        decided[(ctx.direction, rid)] = Decision(
            ids,
            parent,
            tracestate if isinstance(tracestate, str) else None,
            baggage if isinstance(baggage, str) else None,
        )
        if len(decided) > MAX_DECIDED:
            decided.popitem(last=False)
        new_meta: JsonObject = {**(meta or {}), "traceparent": ids.traceparent()}
        return Replace(({**message, "params": {**params, "_meta": new_meta}},))
