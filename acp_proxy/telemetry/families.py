"""Histograms and Prometheus metric families built from plain dicts.

Contract: owns the bucket layouts and the conversion of the proxy's lock-free counters and
histograms into ``prometheus_client`` families at scrape time. Pure; ``prometheus_client`` is
imported only when a family is built (a scrape).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

PREFIX: Final = "acp_proxy"

# Request durations: ACP requests go from milliseconds (initialize, fs/read_text_file) to many
# minutes (a session/prompt turn, a permission request waiting for a human).
DURATION_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)

Counter = dict[tuple[str, ...], int]


def bump(counter: dict[tuple[str, ...], Any], key: tuple[str, ...], n: float = 1) -> None:
    counter[key] = counter.get(key, 0) + n


@dataclass(slots=True)
class Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        value = max(value, 0.0)
        self.buckets[bisect_left(DURATION_BUCKETS, value)] += 1
        self.total += value
        self.count += 1


def observe(table: dict[tuple[str, ...], Histogram], key: tuple[str, ...], value: float) -> None:
    hist = table.get(key)
    if hist is None:
        hist = table[key] = Histogram()
    hist.observe(value)


def counter_family(
    name: str, doc: str, labels: Sequence[str], values: dict[tuple[str, ...], Any]
) -> Any:
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def gauge_family(name: str, doc: str, labels: Sequence[str], values: dict[Any, float]) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
    for key, value in values.items():
        family.add_metric(list(key), value)
    return family


def histogram_family(
    name: str, doc: str, labels: Sequence[str], values: dict[tuple[str, ...], Histogram]
) -> Any:
    from prometheus_client.core import HistogramMetricFamily

    family = HistogramMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
    for key, h in sorted(values.items()):
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip((*DURATION_BUCKETS, float("inf")), h.buckets, strict=True):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        family.add_metric(list(key), buckets, h.total)
    return family
