"""Helpers for the telemetry tests: a proxy subprocess whose JSON log is read as it comes, and
a minimal HTTP GET against its metrics endpoint.

Not a test module. Every wait is bounded by ``anyio.fail_after`` (no timed assertions).
"""

from __future__ import annotations

import json
from collections.abc import Callable
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
