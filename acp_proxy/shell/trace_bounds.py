"""What keeps tracing bounded and quiet: a byte and a count budget on spans waiting for export,
attribute limits, a bounded flush at exit, and the OpenTelemetry SDK's own log records routed
through the proxy's logging.

Contract: owns ``MAX_EXPORT_BYTES`` (spans ended but not yet exported, whatever the collector
does; in number, the batch queue's size), ``MAX_ATTRIBUTE_CHARS`` (any span attribute or event
value; the user's ``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` wins when set), the exit flush
(``FLUSH_S`` at most, and no wait at all on a collector that is not answering: see
``ByteBudget.shutdown``) and ``SdkLogBridge`` (the SDK's ``logging`` records become proxy log
events, rate-limited per kind). Imported only with tracing.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final

from acp_proxy.shell.logsetup import get_logger

MAX_EXPORT_BYTES: Final = 16 * 1024 * 1024  # estimated size of spans waiting for the exporter
MAX_QUEUE_SPANS: Final = 2048  # the SDK's default OTEL_BSP_MAX_QUEUE_SIZE
FLUSH_S: Final = 1.0  # at exit: the longest the proxy waits for the last spans
EXPORT_PATIENCE_S: Final = 0.5  # at exit: an export running longer is a collector not answering
MAX_ATTRIBUTE_CHARS: Final = 4096  # longest string kept in a span attribute or event
MAX_SPAN_ATTRIBUTES: Final = 64
MAX_SPAN_EVENTS: Final = 32
SPAN_OVERHEAD: Final = 512  # bytes counted per span beside its attribute and event text
LOG_EVERY_S: Final = 10.0  # a repeated SDK message: the first, then a count every 10 s
MAX_LOG_KINDS: Final = 256  # distinct SDK messages remembered for rate limiting


def span_limits(environ: Mapping[str, str]) -> Any:
    """The SDK's ``SpanLimits``: our bounds, except where the user set an ``OTEL_*`` limit
    (``None`` makes the SDK read the environment variable)."""
    from opentelemetry.sdk.trace import SpanLimits

    def ours(value: int, *names: str) -> int | None:
        return None if any(n in environ for n in names) else value

    return SpanLimits(
        max_attribute_length=ours(
            MAX_ATTRIBUTE_CHARS,
            "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        ),
        max_span_attribute_length=ours(
            MAX_ATTRIBUTE_CHARS,
            "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        ),
        max_span_attributes=ours(
            MAX_SPAN_ATTRIBUTES, "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT"
        ),
        max_events=ours(MAX_SPAN_EVENTS, "OTEL_SPAN_EVENT_COUNT_LIMIT"),
    )


def max_queue_spans(environ: Mapping[str, str]) -> int:
    """The batch queue's size in spans: ``OTEL_BSP_MAX_QUEUE_SIZE`` when it is a number (as the
    SDK reads it), else the SDK's default."""
    try:
        return int(environ.get("OTEL_BSP_MAX_QUEUE_SIZE", MAX_QUEUE_SPANS))
    except ValueError:
        return MAX_QUEUE_SPANS


def estimate(span: Any) -> int:
    """A span's size as the exporter will hold it: its text plus a fixed overhead."""
    size = SPAN_OVERHEAD + len(span.name)
    for key, value in (span.attributes or {}).items():
        size += len(key) + (len(value) if isinstance(value, str) else 16)
    for event in span.events or ():
        size += 64 + len(event.name)
        for key, value in (event.attributes or {}).items():
            size += len(key) + (len(value) if isinstance(value, str) else 16)
    return size


class ExportWatch:
    """The span exporter as the batch processor sees it: the real one, watched. It knows whether
    the collector took the last export (``failed``) and since when an export is running
    (``started``), which is what the exit needs to know to wait, or not. Once ``closed``, an
    export is refused at once, never handed to the exporter (nor to its retries)."""

    def __init__(self, inner: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.clock = clock
        self.failed = False  # the last export did not reach the collector
        self.started: float | None = None  # the running export's start
        self.closed = False
        self.lost = 0  # spans refused once closed
        self.changed = threading.Condition()  # an export started or ended; the exporter closed

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        with self.changed:
            if self.closed:
                self.lost += len(spans)
                return SpanExportResult.FAILURE
            self.started = self.clock()
            self.changed.notify_all()
        result = SpanExportResult.FAILURE
        try:
            result = self.inner.export(spans)
            return result
        finally:
            with self.changed:
                self.started = None
                self.failed = result is not SpanExportResult.SUCCESS
                self.changed.notify_all()

    def shutdown(self, *_: Any, **__: Any) -> None:
        """Close: the exporter is shut down (a retry waiting on a dead collector ends) and
        every later export is refused. Once, whoever calls first."""
        with self.changed:
            if self.closed:
                return
            self.closed = True
            self.changed.notify_all()
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))

    def answering(self) -> bool:
        """Whether the collector looks alive: the last export went through and none has been
        running for more than ``EXPORT_PATIENCE_S`` (the exporter retrying, or waiting on a
        collector that accepts and never answers)."""
        started = self.started
        late = started is not None and self.clock() - started > EXPORT_PATIENCE_S
        return not (self.failed or late)


class ByteBudget:
    """A span processor in front of the SDK's batch processor: a span that would take the
    spans ended and not yet exported over ``max_spans`` in number (the batch queue's size, so
    that queue never overflows) or over ``budget`` in estimated size is dropped (counted in
    ``dropped``; past the count, at the cost of a comparison). A span's share is released when
    the span object is freed (exported, or dropped), so the counts never drift."""

    def __init__(
        self,
        inner: Any,
        budget: int = MAX_EXPORT_BYTES,
        max_spans: int = MAX_QUEUE_SPANS,
        watch: ExportWatch | None = None,
    ) -> None:
        self.inner = inner
        self.budget = budget
        self.max_spans = max_spans
        self.watch = watch
        self.held = 0
        self.spans = 0
        self.dropped = 0
        self._lock = threading.Lock()  # the exporter thread frees spans

    def _release(self, size: int) -> None:
        with self._lock:
            self.held -= size
            self.spans -= 1

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.inner.on_start(span, parent_context=parent_context)

    def admit(self) -> bool:
        """Whether a span ended now would be queued: when the count is at ``max_spans`` it
        is counted as dropped at once, and its owner need not end it at all (at a session's
        end, thousands of open spans with the collector down cost a comparison each)."""
        if self.spans >= self.max_spans:  # read without the lock: only this thread adds
            self.dropped += 1
            return False
        return True

    def on_end(self, span: Any) -> None:
        if self.spans >= self.max_spans:
            self.dropped += 1
            return
        size = estimate(span)
        with self._lock:
            if self.held + size > self.budget:
                self.dropped += 1
                return
            self.held += size
            self.spans += 1
        weakref.finalize(span, self._release, size)
        self.inner.on_end(span)

    def _on_ending(self, span: Any) -> None:  # SDK >= 1.34 calls it on every processor
        hook = getattr(self.inner, "_on_ending", None)
        if hook is not None:
            hook(span)

    def shutdown(self, timeout_millis: int | None = None) -> None:
        """Shut the batch processor and its exporter down, exporting what is queued first,
        within ``timeout_millis`` (blocking). With an ``ExportWatch`` the wait ends as soon as
        the collector is not answering (an export failed, or one ran longer than
        ``EXPORT_PATIENCE_S``): the exporter is closed then, its retries abandoned and what is
        left in the queue dropped (``watch.lost``). A collector already not answering when the
        exit begins is not waited for at all."""
        processor = getattr(self.inner, "_batch_processor", None)
        if timeout_millis is None or not callable(getattr(processor, "shutdown", None)):
            processor = None  # an SDK < 1.34: its shutdown takes no deadline
        watch = self.watch
        if watch is None or timeout_millis is None:
            if processor is not None:
                processor.shutdown(timeout_millis=timeout_millis)
            else:
                self.inner.shutdown()
            return
        if not watch.answering():
            watch.shutdown()
        done = threading.Event()

        def stop() -> None:
            try:
                if processor is not None:
                    processor.shutdown(timeout_millis=timeout_millis)
                else:
                    self.inner.shutdown()
            finally:
                with watch.changed:
                    done.set()
                    watch.changed.notify_all()

        deadline = watch.clock() + timeout_millis / 1000
        threading.Thread(target=stop, name="acp-proxy-trace-shutdown", daemon=True).start()
        with watch.changed:
            while not done.is_set() and not watch.closed and watch.answering():
                left = deadline - watch.clock()
                if left <= 0:
                    break
                started = watch.started
                if started is not None:  # wake when this export runs out of patience
                    left = min(left, started + EXPORT_PATIENCE_S - watch.clock() + 0.001)
                watch.changed.wait(max(left, 0.001))
        # Done, out of time, or a collector not answering: closed, its retries abandoned. What
        # is left in the queue is refused at once (and counted); an export stuck in a
        # connection that never answers is left to the daemon threads.
        watch.shutdown()
        with watch.changed:
            while not done.is_set() and watch.started is None and deadline > watch.clock():
                watch.changed.wait(deadline - watch.clock())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class SdkLogBridge(logging.Handler):
    """The SDK's ``logging`` records (``opentelemetry.*``) as proxy log events: same format and
    destination as every other event (``--log-format``, ``--log-file``), never stdout. Each
    kind of message (logger and message template) is logged the first time, then at most once
    every ``LOG_EVERY_S`` seconds with the count of repeats (``repeated``)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # kind -> (last logged, muted)
        self._mutex = threading.Lock()  # the exporter thread logs too

    def emit(self, record: logging.LogRecord) -> None:
        try:
            kind = (record.name, str(record.msg)[:200])
            now = time.monotonic()
            with self._mutex:
                last = self._seen.get(kind)
                if last is not None and now - last[0] < LOG_EVERY_S:
                    self._seen[kind] = (last[0], last[1] + 1)
                    return
                repeated = last[1] if last is not None else 0
                if last is None and len(self._seen) >= MAX_LOG_KINDS:
                    self._seen.pop(next(iter(self._seen)))
                self._seen[kind] = (now, 0)
            message = record.getMessage()[:MAX_ATTRIBUTE_CHARS]
            log = get_logger()
            fields: dict[str, Any] = {"logger": record.name, "message": message}
            if repeated:
                fields["repeated"] = repeated
            if record.exc_info and record.exc_info[1] is not None:
                fields["error"] = repr(record.exc_info[1])[:MAX_ATTRIBUTE_CHARS]
            if record.levelno >= logging.ERROR:
                log.error("opentelemetry sdk", **fields)
            else:
                log.warning("opentelemetry sdk", **fields)
        except Exception:  # a log handler never raises into the SDK, nor prints on its own
            return


def install_log_bridge() -> SdkLogBridge:
    """Route the ``opentelemetry`` loggers through the proxy's logging (no propagation to the
    root logger, whose last-resort handler prints plain lines on stderr)."""
    bridge = SdkLogBridge()
    logger = logging.getLogger("opentelemetry")
    logger.addHandler(bridge)
    logger.propagate = False
    return bridge
