"""Helpers for the telemetry tests: a proxy subprocess whose JSON log is read as it comes, a
minimal HTTP GET against its metrics endpoint, and a local OTLP/HTTP trace receiver.

Not a test module. Every wait is bounded by ``anyio.fail_after`` (no timed assertions).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import anyio
import anyio.abc
from prometheus_client.parser import text_string_to_metric_families
from proxy_harness import TIMEOUT, Lines

Sample = tuple[str, dict[str, str], float]


class LogReader:
    """The proxy's stderr (``--log-format json``), one event at a time."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream) -> None:
        self.lines = Lines(stream)
        self.seen: list[dict[str, Any]] = []

    async def until(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        with anyio.fail_after(TIMEOUT):
            while True:
                line = await self.lines.line()
                if not line.startswith(b"{"):
                    continue
                event: dict[str, Any] = json.loads(line)
                self.seen.append(event)
                if predicate(event):
                    return event

    async def event(self, name: str) -> dict[str, Any]:
        return await self.until(lambda e: e.get("event") == name)


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    return host.strip("[]"), int(port)


async def http_get(address: str, path: str, method: str = "GET") -> tuple[int, bytes, bytes]:
    """(status, head, body) of one request to ``tcp://HOST:PORT``."""
    host, port = host_port(address)
    with anyio.fail_after(TIMEOUT):
        async with await anyio.connect_tcp(host, port) as stream:
            await stream.send(
                f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            )
            chunks = []
            while True:
                try:
                    chunks.append(await stream.receive())
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), head, body


async def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` parsed with ``prometheus_client.parser``: (sample name, labels) -> value."""
    status, _, body = await http_get(address, "/metrics")
    assert status == 200
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """One sample's value (0 when the series does not exist)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    return sum(
        v
        for (n, lab), v in samples.items()
        if n == name and all(dict(lab).get(k) == want for k, want in labels.items())
    )


class Receiver:
    """A local OTLP/HTTP trace receiver: POST /v1/traces, protobuf bodies, spans kept."""

    def __init__(self) -> None:
        spans: list[Any] = []
        self.spans = spans
        self.lock = threading.Lock()
        lock = self.lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest,
                )

                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with lock:
                    for rs in request.resource_spans:
                        for ss in rs.scope_spans:
                            spans.extend((rs.resource, s) for s in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@contextlib.contextmanager
def running_receiver() -> Iterator[Receiver]:
    """A ``Receiver`` serving on an ephemeral loopback port for the ``with`` block."""
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


def attrs(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        out[kv.key] = value_of(kv.value)
    return out


def value_of(value: Any) -> Any:
    got = getattr(value, value.WhichOneof("value"))
    if value.WhichOneof("value") == "array_value":
        return [value_of(v) for v in got.values]
    return got
