"""Scenario 4: peak RSS with a long line, with a slow client, and over a long stream.

Contract: measures the peak resident memory (``ru_maxrss``, through the rusage launcher when it
was built) of each variant with a 10 MB line, with a client that reads slowly (coalescing on and
off), and over a ~1 GB stream against one pass. Measures; never asserts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from generate import Dataset, ensure
from harness import Harness, Run
from rows import Row, fmt, skipped, stats, status, table
from variants import (
    PEER_VARIANTS,
    VARIANT_TITLES,
)


def run(h: Harness, log: Callable[[str], None]) -> list[Row]:
    s = h.s
    rows: list[Row] = []
    big = ensure(s.data_dir, "bigline", 2, s.bigline_size, s.seed)
    target_mb = 3 * s.bigline_size / 2**20 + 40
    variants = ["py-line", "py-inject", "proxy-passthrough", "proxy-annotate", *PEER_VARIANTS]
    runs: dict[str, list[Run]] = {v: [] for v in variants}
    for _ in range(s.reps):
        for v in variants:
            if h.skip_reason(v) is None:
                runs[v].append(h.stream(v, big))
    for v in variants:
        title = f"{VARIANT_TITLES[v]}: one {s.bigline_size / 2**20:.0f} MiB line"
        reason = h.skip_reason(v)
        if reason:
            rows.append(skipped(4, "bigline", v, title, reason))
            continue
        ok = [r for r in runs[v] if r.ok]
        if not ok:
            rows.append(
                Row(4, "bigline", v, title, "error", runs[v][0].error if runs[v] else "no run")
            )
            continue
        rss = stats([r.maxrss_kb / 1024 for r in ok])
        assert rss is not None
        check: dict[str, Any] = {"lines_out": [r.out_lines for r in ok], "lines_in": big.lines}
        if v in PEER_VARIANTS:
            check["json"] = [r.json_check for r in ok]
        rows.append(
            Row(
                4,
                "bigline",
                v,
                title,
                metrics={"peak_rss_mb": rss, "line_mb": s.bigline_size / 2**20},
                ratios={"target": {"median": rss["median"] / target_mb, "target_mb": target_mb}},
                check=check,
            )
        )
        log(f"  s4 bigline {v}: peak RSS {rss['median']:.1f} MiB (target {target_mb:.0f} MiB)")

    rows += long_stream_rows(h, log)

    burst = ensure(s.data_dir, "burst", 2, s.burst_size, s.seed)
    configs = {
        "proxy-coalesce-on": h.coalesce_config(s.passthrough_config, True),
        "proxy-coalesce-off": h.coalesce_config(s.passthrough_config, False),
    }
    slow_titles = {
        "py-line": "Python line relay, slow client",
        "proxy-coalesce-on": "acp-proxy, slow client, coalescing on",
        "proxy-coalesce-off": "acp-proxy, slow client, coalescing off",
        "conductor": "TypeScript conductor (no components), slow client",
        "sdk-relay": "Python SDK relay, slow client",
    }
    for v, title in slow_titles.items():
        reason = h.skip_reason("proxy-passthrough" if v.startswith("proxy") else v)
        if reason:
            rows.append(skipped(4, "slow-client", v, title, reason))
            continue
        r = h.stream(
            "proxy-passthrough" if v.startswith("proxy") else v,
            burst,
            config=configs.get(v),
            slow=True,
        )
        if not r.ok:
            rows.append(Row(4, "slow-client", v, title, "error", r.error))
            continue
        rows.append(
            Row(
                4,
                "slow-client",
                v,
                title,
                metrics={
                    "messages_in": float(burst.messages),
                    "messages_out": float(r.out_lines),
                    "bytes_in": float(burst.bytes),
                    "bytes_out": float(r.out_bytes),
                    "peak_rss_mb": r.maxrss_kb / 1024,
                    "wall_s": r.wall_s,
                },
                check={"identical": r.identical, "json": r.json_check},
            )
        )
        peak = r.maxrss_kb / 1024
        log(f"  s4 slow {v}: {burst.messages} -> {r.out_lines} msgs, RSS {peak:.1f} MiB")
    return rows


def long_stream_rows(h: Harness, log: Callable[[str], None]) -> list[Row]:
    """Peak RSS of the proxy (and of the peers) for one pass of a notification stream and for
    ``long_repeat`` passes (~1 GB in the full run): the target is that it does not grow with
    stream length. Row ids: ``proxy-1x``, ``proxy-long``, ``conductor-1x``, ... The Python-SDK
    relay streams the v1 data set: it stops reading at the first batch, and v2's has some."""
    s = h.s
    who = {
        "proxy": ("proxy-passthrough", "acp-proxy, pass-through rules", 2),
        "conductor": ("conductor", "TypeScript conductor (no components)", 2),
        "sdk-relay": ("sdk-relay", "Python SDK relay, notify-v1 (no batches)", 1),
    }
    rows: list[Row] = []
    for prefix, (variant, name, version) in who.items():
        ds = ensure(s.data_dir, "notify", version, s.size, s.seed)
        body = ds.bytes - header_bytes(ds)
        reason = h.skip_reason(variant)
        first: Run | None = None
        for k in (1, s.long_repeat):
            v = f"{prefix}-1x" if k == 1 else f"{prefix}-long"
            total_mb = (ds.bytes + (k - 1) * body) / 1e6
            title = f"{name}: {total_mb:,.0f} MB stream ({k} pass(es))"
            if reason:
                rows.append(skipped(4, "long-stream", v, title, reason))
                continue
            r = h.stream(variant, ds, repeat=k)
            if k == 1:
                first = r
            if not r.ok:
                rows.append(Row(4, "long-stream", v, title, "error", r.error))
                continue
            metrics = {
                "peak_rss_mb": r.maxrss_kb / 1024,
                "stream_mb": total_mb,
                "mb_s": total_mb / r.xfer_s,
            }
            ratios: dict[str, Any] = {}
            if k != 1 and first is not None and first.ok:
                ratios["vs_1x"] = {"median": r.maxrss_kb / first.maxrss_kb}
            rows.append(Row(4, "long-stream", v, title, metrics=metrics, ratios=ratios))
            log(f"  s4 long {v}: {total_mb:,.0f} MB, peak RSS {r.maxrss_kb / 1024:.1f} MiB")
    return rows


def header_bytes(ds: Dataset) -> int:
    """Bytes of the first two lines (the handshake responses) of ``ds``'s agent file."""
    with open(ds.agent_path, "rb") as f:
        return len(f.readline()) + len(f.readline())


def markdown(rows: list[dict[str, Any]], out: list[str]) -> None:
    """Section 4: long line, slow client and long stream tables."""
    out.append("### 4. Peak RSS")
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 4 or r["profile"] != "bigline":
            continue
        st = status(r)
        mm, rr = r["metrics"], r["ratios"]
        body.append(
            [r["title"]]
            + (
                [st, "", ""]
                if st
                else [
                    fmt(mm["peak_rss_mb"]),
                    fmt(rr["target"]["target_mb"], 0),
                    fmt(rr["target"]["median"], 2),
                ]
            )
        )
    table(out, ["long line", "peak RSS MiB", "target MiB (3 x line + 40)", "vs target"], body)
    body = []
    for r in rows:
        if r["scenario"] != 4 or r["profile"] != "slow-client":
            continue
        st = status(r)
        mm = r["metrics"]
        body.append(
            [r["title"]]
            + (
                [st, "", "", "", ""]
                if st
                else [
                    fmt(mm["messages_in"], 0),
                    fmt(mm["messages_out"], 0),
                    fmt(mm["bytes_out"] / 2**20, 1),
                    fmt(mm["peak_rss_mb"]),
                    fmt(mm["wall_s"], 2),
                ]
            )
        )
    table(
        out,
        ["slow client", "messages in", "messages out", "MiB out", "peak RSS MiB", "wall s"],
        body,
    )
    body = []
    for r in rows:
        if r["scenario"] != 4 or r["profile"] != "long-stream":
            continue
        st = status(r)
        mm = r["metrics"]
        body.append(
            [r["title"]]
            + (
                [st, "", ""]
                if st
                else [fmt(mm["peak_rss_mb"]), fmt(mm["mb_s"]), fmt(r["ratios"].get("vs_1x"), 2)]
            )
        )
    table(out, ["long stream", "peak RSS MiB", "MB/s", "RSS vs 1 pass"], body)
