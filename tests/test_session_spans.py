"""The spans of one session, driven in process: the open spans it holds are bounded (requests,
turns and tool calls together), the oldest ended and counted past the bound."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from acp_proxy.shell.session_spans import MAX_OPEN_SPANS, SessionTracing
from acp_proxy.shell.tracing import _PresetIds
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.notes import FrameInfo, Observed, VersionNegotiated

C2A = Direction.CLIENT_TO_AGENT


def _tracing() -> tuple[SessionTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    tracing = SimpleNamespace(
        ids=_PresetIds(RandomIdGenerator()), tracer=provider.get_tracer("t"), admit=lambda: True
    )
    session = SimpleNamespace(connection=SimpleNamespace(chain=SimpleNamespace(links=[])))
    return SessionTracing(tracing, session), exporter


def _prompt(i: int) -> Observed:
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": i,
        "method": "session/prompt",
        "params": {"sessionId": f"s{i}", "prompt": []},
    }
    raw = orjson.dumps(message)
    info = FrameInfo(C2A, "session/prompt", i, None, len(raw), ())
    return Observed(C2A, raw, None, (), (info,), "message")


def test_open_spans_are_bounded_the_oldest_ended_and_counted() -> None:
    spans, exporter = _tracing()
    spans.on_notes((VersionNegotiated(1),), 0.0)
    extra = 100
    for i in range(MAX_OPEN_SPANS + extra):
        spans.on_notes((_prompt(i),), float(i))
    assert not spans.broken
    assert len(spans.open) == len(spans.turn_spans) == MAX_OPEN_SPANS
    assert spans.evicted == extra
    ended = exporter.get_finished_spans()
    assert len(ended) == extra
    # The oldest turns went first, each marked.
    attributes = [dict(s.attributes or {}) for s in ended]
    assert [a["rpc.jsonrpc.request_id"] for a in attributes] == [str(i) for i in range(extra)]
    assert all(a["acp.evicted"] is True for a in attributes)
    spans.on_end(None, 1e6)
    assert len(exporter.get_finished_spans()) == MAX_OPEN_SPANS + extra
    assert not spans.open and not spans.turn_spans and not spans.requests


class StuckExporter(SpanExporter):
    """A span exporter whose export never returns until it is shut down (a collector that
    accepts and never answers, with the exporter's own long timeout)."""

    def __init__(self) -> None:
        import threading

        self.stopped = threading.Event()
        self.exporting = threading.Event()

    def export(self, spans: Any) -> SpanExportResult:
        self.exporting.set()
        self.stopped.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.stopped.set()


def test_the_exporter_is_shut_down_within_the_deadline() -> None:
    import threading

    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from acp_proxy.shell.trace_bounds import ByteBudget

    exporter = StuckExporter()
    budget = ByteBudget(BatchSpanProcessor(exporter, schedule_delay_millis=1))
    provider = TracerProvider()
    provider.add_span_processor(budget)  # type: ignore[arg-type]
    provider.get_tracer("t").start_span("x").end()
    assert exporter.exporting.wait(10)  # the export thread is stuck in the collector
    done = threading.Event()

    def shutdown() -> None:
        budget.shutdown(timeout_millis=50)
        done.set()

    threading.Thread(target=shutdown, daemon=True).start()
    # The deadline passed, the exporter was told to stop (its stuck export then ends) and the
    # shutdown returned: nothing is left waiting on the collector.
    assert done.wait(10)
    assert exporter.stopped.is_set()
