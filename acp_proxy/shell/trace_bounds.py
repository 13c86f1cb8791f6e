"""What keeps tracing bounded and quiet: a byte budget on spans waiting for export, attribute
limits, and the OpenTelemetry SDK's own log records routed through the proxy's logging.

Contract: owns ``MAX_EXPORT_BYTES`` (spans ended but not yet exported, whatever the collector
does), ``MAX_ATTRIBUTE_CHARS`` (any span attribute or event value; the user's
``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` wins when set) and ``SdkLogBridge`` (the SDK's
``logging`` records become proxy log events, rate-limited per kind). Imported only with tracing.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Final

from acp_proxy.shell.logsetup import get_logger

MAX_EXPORT_BYTES: Final = 16 * 1024 * 1024  # estimated size of spans waiting for the exporter
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


class ByteBudget:
    """A span processor in front of the SDK's batch processor: a span that would take the
    estimated size of spans ended and not yet exported over ``budget`` is dropped (counted in
    ``dropped``). A span's share is released when the span object is freed (exported, or
    dropped by the batch processor's own queue bound), so the count never drifts."""

    def __init__(self, inner: Any, budget: int = MAX_EXPORT_BYTES) -> None:
        self.inner = inner
        self.budget = budget
        self.held = 0
        self.dropped = 0
        self._lock = threading.Lock()  # the exporter thread frees spans

    def _release(self, size: int) -> None:
        with self._lock:
            self.held -= size

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: Any) -> None:
        size = estimate(span)
        with self._lock:
            if self.held + size > self.budget:
                self.dropped += 1
                return
            self.held += size
        weakref.finalize(span, self._release, size)
        self.inner.on_end(span)

    def _on_ending(self, span: Any) -> None:  # SDK >= 1.34 calls it on every processor
        hook = getattr(self.inner, "_on_ending", None)
        if hook is not None:
            hook(span)

    def shutdown(self, timeout_millis: int | None = None) -> None:
        """Shut the batch processor and its exporter down: what is queued is exported, then the
        exporter stops (a retry waiting on a dead collector ends). With ``timeout_millis`` the
        processor waits at most that long for its export thread (SDK >= 1.34, whose shutdown
        takes a deadline; an older one is given none: the caller bounds its own wait)."""
        processor = getattr(self.inner, "_batch_processor", None)
        if timeout_millis is not None and callable(getattr(processor, "shutdown", None)):
            processor.shutdown(timeout_millis=timeout_millis)  # type: ignore[union-attr]
        else:
            self.inner.shutdown()

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
