"""Scenario 7: acp-proxy as a proxy component inside the TypeScript conductor.

Contract: runs ``bench/component.py``'s measures (which can also be run alone) within the suite:
the round trip (p50, p99, added to direct) and the throughput of updates toward the client,
directly, through acp-proxy standalone, through the conductor alone and through the conductor
with ``acp-proxy component``, all in one run. Measures; never asserts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import component
from harness import Harness
from rows import Row, fmt, skipped, status, table

SCENARIO = 7
PROFILE = "component"
# The suite's variant ids (``s7/component/<id>``) for bench/component.py's variants.
IDS = {
    "direct": "direct",
    "proxy": "proxy-annotate",
    "conductor": "conductor",
    "conductor+component": "conductor-component",
}


def run(h: Harness, log: Callable[[str], None]) -> list[Row]:
    s = h.s
    pairs = min(s.latency_pairs, 3000)
    updates = 2000 if s.quick else 20000
    module, missing = component.conductor_module(s.build_dir)
    reasons = {
        "direct": None,
        "proxy": h.skip_reason("proxy-annotate"),
        "conductor": missing or h.skip_reason("conductor"),
        "conductor+component": missing or h.skip_reason("conductor") or h.proxy_error,
    }
    variants = [v for v in component.VARIANTS if reasons[v] is None]
    rows = [
        skipped(SCENARIO, PROFILE, IDS[v], component.TITLES[v], reasons[v] or "")
        for v in component.VARIANTS
        if reasons[v] is not None
    ]
    try:
        measured = component.measure(
            variants, component.bench_env(module), pairs, updates, max(1, s.reps)
        )
    except (OSError, TimeoutError, EOFError) as exc:
        log(f"scenario 7: {type(exc).__name__}: {exc}")
        return rows + [
            Row(SCENARIO, PROFILE, IDS[v], component.TITLES[v], "error", str(exc)) for v in variants
        ]
    for m in measured:
        metrics = {k: m[k] for k in ("rtt_p50_us", "rtt_p99_us", "added_p50_us")}
        metrics |= {"updates_per_s": m["updates_per_s"], "delivered": m["delivered"]}
        metrics |= {"updates": updates, "round_trips": pairs}
        rows.append(Row(SCENARIO, PROFILE, IDS[m["variant"]], m["title"], metrics=metrics))
    order = list(IDS.values())
    return sorted(rows, key=lambda r: order.index(r.variant))


def markdown(rows: list[dict[str, Any]], out: list[str]) -> None:
    """Section 7: the component's table."""
    out.append("### 7. acp-proxy as a proxy component of the TypeScript conductor")
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != SCENARIO:
            continue
        st = status(r)
        mm = r["metrics"]
        cells = (
            [st, "", "", "", ""]
            if st
            else [
                fmt(mm["rtt_p50_us"], 0),
                fmt(mm["rtt_p99_us"], 0),
                fmt(mm["added_p50_us"], 0),
                fmt(mm["updates_per_s"], 0),
                f"{mm['delivered']} of {mm['updates']}",
            ]
        )
        body.append([r["title"], *cells])
    table(
        out,
        [
            "path",
            "round trip p50 (µs)",
            "p99 (µs)",
            "added p50 (µs)",
            "updates/s toward the client",
            "frames the client got",
        ],
        body,
    )
    out.append(
        "The conductor rows use the npm package bench/setup_peers.py installs (pinned). Fewer "
        "frames than updates: the proxy coalesced updates for a client that fell behind (its "
        "default), which leaves the client's state the same."
    )
    out.append("")
