"""The tracing exit: what is queued goes to a collector that answers, within the deadline, and a
collector that is not answering (its last export failed, or the export in progress hangs) is not
waited for: no request is sent to it at exit, and its retries are abandoned. Ending spans past
the export queue's size costs a comparison, never the SDK's overflow path.

Driven in process with the real ``Tracing`` set-up (the real batch processor and OTLP/HTTP
exporter) against local collectors that answer, refuse with 503, or never answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from telemetry_harness import running_receiver

from acp_proxy.config import TracingConfig
from acp_proxy.shell import trace_bounds, tracing
from acp_proxy.shell.trace_bounds import ByteBudget

HANG_GUARD_S = 30.0  # only a hang guard: every wait below ends on an event


class Holder:
    """A span processor that keeps every span it is given: a collector that never answers."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: Any) -> None:
        self.spans.append(span)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


def test_spans_past_the_queue_size_are_dropped_before_any_other_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    estimated = [0]
    real = trace_bounds.estimate

    def counted(span: Any) -> int:
        estimated[0] += 1
        return real(span)

    monkeypatch.setattr(trace_bounds, "estimate", counted)
    holder = Holder()
    budget = ByteBudget(holder, max_spans=10)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(budget)  # type: ignore[arg-type]
    for _ in range(100):
        provider.get_tracer("t").start_span("x").end()
    assert len(holder.spans) == estimated[0] == budget.spans == 10
    assert budget.dropped == 90
    holder.spans.clear()
    import gc

    gc.collect()
    assert budget.spans == budget.held == 0  # exported: the shares come back


def test_the_batch_queue_and_the_budget_share_one_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "7")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "5")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    traced = tracing.Tracing(TracingConfig(enabled=True), {"OTEL_BSP_MAX_QUEUE_SIZE": "7"})
    assert traced.budget is not None
    assert traced.budget.max_spans == traced.budget.inner._batch_processor._max_queue_size == 7
    traced.flush()


class Collector:
    """A local OTLP/HTTP collector that answers every POST with ``status`` (or, with
    ``status=None``, reads it and never answers), counting the requests."""

    def __init__(self, status: int | None) -> None:
        self.requests = 0
        self.got = threading.Event()
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests += 1
                owner.got.set()
                if status is None:
                    owner.release.wait(HANG_GUARD_S)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # daemon threads

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def collector(request: pytest.FixtureRequest) -> Iterator[Collector]:
    c = Collector(request.param)
    threading.Thread(target=c.server.serve_forever, daemon=True).start()
    yield c
    c.release.set()
    c.server.shutdown()
    c.server.server_close()


def _tracing(monkeypatch: pytest.MonkeyPatch, endpoint: str, **env: str) -> tracing.Tracing:
    import os

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # A deadline no exit can reach by waiting: the exit must end on what it knows.
    monkeypatch.setattr(tracing, "FLUSH_S", 600.0)
    return tracing.Tracing(TracingConfig(enabled=True), os.environ)


def _spans(traced: tracing.Tracing, n: int) -> None:
    for i in range(n):
        traced.tracer.start_span(f"s{i}").end()


def _flush(traced: tracing.Tracing) -> None:
    done = threading.Event()

    def flush() -> None:
        traced.flush()
        done.set()

    threading.Thread(target=flush, daemon=True).start()
    assert done.wait(HANG_GUARD_S), "the exit waited on a collector that is not answering"


@pytest.mark.parametrize("collector", [503], indirect=True)
def test_no_request_at_exit_to_a_collector_whose_last_export_failed(
    monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    traced = _tracing(
        monkeypatch,
        collector.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="600000",  # the worker exports only when told
        OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="0.5",  # one attempt: the next backoff is past it
    )
    assert traced.budget is not None
    _spans(traced, 3)
    traced.budget.force_flush()
    assert collector.requests == 1  # the collector refused the export
    _spans(traced, 5)
    _flush(traced)
    assert collector.requests == 1  # nothing sent, nothing retried at exit
    assert traced.watch is not None and traced.watch.lost == 5 and traced.watch.closed


@pytest.mark.parametrize("collector", [None], indirect=True)
def test_an_export_that_hangs_at_exit_is_abandoned(
    monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    traced = _tracing(
        monkeypatch,
        collector.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="600000",
        OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="600",
    )
    _spans(traced, 3)
    # The exit's own export goes to a collector that reads it and never answers, with an
    # exporter whose timeout is long: the exit gives it its patience only.
    _flush(traced)
    assert collector.got.is_set() and collector.requests == 1
    assert traced.watch is not None and traced.watch.closed


def test_a_collector_that_answers_gets_every_queued_span_at_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with running_receiver() as receiver:
        traced = _tracing(monkeypatch, receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="600000")
        _spans(traced, 1500)  # three batches
        _flush(traced)
        assert len(receiver.spans) == 1500


def test_open_turns_past_the_queue_size_are_not_even_ended_at_the_sessions_end() -> None:
    from types import SimpleNamespace

    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from test_session_spans import _prompt

    from acp_proxy.shell.session_spans import SessionTracing
    from acp_proxy.shell.tracing import _PresetIds
    from acp_proxy.wire.notes import VersionNegotiated

    class Ends(Holder):
        """Counts every span the SDK ends (a processor ahead of the budget)."""

        def _on_ending(self, span: Any) -> None:
            pass

    ends, held = Ends(), Holder()
    budget = ByteBudget(held, max_spans=10)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(ends)  # type: ignore[arg-type]
    provider.add_span_processor(budget)  # type: ignore[arg-type]
    traced = SimpleNamespace(
        ids=_PresetIds(RandomIdGenerator()), tracer=provider.get_tracer("t"), admit=budget.admit
    )
    session = SimpleNamespace(connection=SimpleNamespace(chain=SimpleNamespace(links=[])))
    spans = SessionTracing(traced, session)
    spans.on_notes((VersionNegotiated(1),), 0.0)
    for i in range(100):
        spans.on_notes((_prompt(i),), float(i))
    spans.on_end(None, 1e6)
    assert not spans.broken and not spans.open and not spans.turn_spans
    # The collector took nothing: 10 spans fill the queue, 90 more are counted and never ended.
    assert len(ends.spans) == len(held.spans) == 10
    assert budget.dropped == 90
