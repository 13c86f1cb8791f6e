"""Scenarios 1 and 2: throughput agent -> client, and CPU per message, from the same runs.

Contract: streams each data set profile through every variant (baselines, the proxy's
configurations, the peers), repetitions interleaved, and reports MB/s, messages/s and CPU per
message (start-up CPU measured on an empty data set and subtracted), each with ratios against
the baselines of the same repetition. Measures; never asserts a timing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from generate import Dataset, ensure
from harness import Harness, Run
from rows import Row, fmt, output_check, paired_ratios, skipped, stats, status, table
from variants import (
    BASELINES,
    PEER_VARIANTS,
    POLICY_VARIANTS,
    PROFILES,
    PROXY_VARIANTS,
    RATIO_BASES,
    VARIANT_TITLES,
)

STARTUP_SAMPLES = 3
QUICK_SKIP = "--quick: only the first profile runs"


def run(h: Harness, log: Callable[[str], None]) -> list[Row]:
    s = h.s
    variants = [*BASELINES, *PROXY_VARIANTS, *PEER_VARIANTS]
    if s.variants is not None:
        variants = [v for v in variants if v in s.variants]
    empty = ensure(s.data_dir, "empty", 2, 1, s.seed)
    # The CPU of a run on a stream of two messages, subtracted from every run of the variant:
    # the median of three interleaved runs (one sample moved by +-40 ms on this
    # machine, +-1.7 us per message on a 16 MiB data set, more than the difference measured).
    samples: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range((1 if s.quick else STARTUP_SAMPLES) if s.startup_cpu else 0):
        for v in variants:
            if h.skip_reason(v) is None:
                r = h.stream(v, empty)
                if r.ok:
                    samples[v].append(r.cpu_s)
                else:
                    log(f"  start-up run of {v} failed (not counted): {r.error}")
    startup = {v: statistics.median(xs) for v, xs in samples.items() if xs}
    rows: list[Row] = []
    for n, (profile, version) in enumerate(s.profiles or PROFILES):
        pname = f"{profile}-v{version}"
        if s.quick and n:
            # A quick run is a smoke run: every variant on the first profile; the others
            # would only repeat the same start-ups on other data.
            for v in variants:
                for scenario in (1, 2):
                    rows.append(skipped(scenario, pname, v, VARIANT_TITLES[v], QUICK_SKIP))
            continue
        ds = ensure(s.data_dir, profile, version, s.size, s.seed)
        runs: dict[str, list[Run]] = {v: [] for v in variants}
        for rep in range(s.reps):
            for v in variants:
                if h.skip_reason(v) is None:
                    r = h.stream(v, ds)
                    runs[v].append(r)
                    log(
                        f"  s1 {pname} rep {rep + 1}/{s.reps} {v}: "
                        + (f"{ds.bytes / r.xfer_s / 1e6:.1f} MB/s" if r.ok else f"ERROR {r.error}")
                    )

        def mb_s(r: Run, ds: Dataset = ds) -> float:
            return ds.bytes / r.xfer_s / 1e6

        def msg_s(r: Run, ds: Dataset = ds) -> float:
            return ds.messages / r.xfer_s

        def cpu_us(r: Run, ds: Dataset = ds, v: str = "") -> float:
            return max(0.0, r.cpu_s - startup.get(v, 0.0)) / ds.messages * 1e6

        for v in variants:
            title = VARIANT_TITLES[v]
            reason = h.skip_reason(v)
            if reason is not None:
                rows.append(skipped(1, pname, v, title, reason))
                rows.append(skipped(2, pname, v, title, reason))
                continue
            ok = [r for r in runs[v] if r.ok]
            errors = [r.error for r in runs[v] if not r.ok]
            check = {
                "messages_in": ds.messages,
                "lines_in": ds.lines,
                "bytes_in": ds.bytes,
                "lines_out": [r.out_lines for r in runs[v]],
                "identical": [r.identical for r in runs[v]],
                "errors": errors,
            }
            if v in PEER_VARIANTS:
                check["json"] = [r.json_check for r in runs[v]]
            if not ok:
                rows.append(
                    Row(1, pname, v, title, "error", errors[0] if errors else "no run", check=check)
                )
                rows.append(Row(2, pname, v, title, "error", errors[0] if errors else "no run"))
                continue

            def cpu_v(r: Run, v: str = v) -> float:
                return cpu_us(r, v=v)

            rows.append(
                Row(
                    1,
                    pname,
                    v,
                    title,
                    metrics={
                        "mb_s": stats([mb_s(r) for r in ok]),
                        "msg_s": stats([msg_s(r) for r in ok]),
                        "peak_rss_mb": stats([r.maxrss_kb / 1024 for r in ok]),
                    },
                    ratios={
                        b: paired_ratios(runs, v, b, mb_s) for b in (*RATIO_BASES, *_policy_base(v))
                    },
                    check=check,
                )
            )
            cpu_ratios: dict[str, Any] = {}
            for b in (*RATIO_BASES, *_policy_base(v)):
                ratio_list: list[float] = []
                for a, c in zip(runs[v], runs.get(b, []), strict=False):
                    if a.ok and c.ok and cpu_us(c, v=b) > 0:
                        ratio_list.append(cpu_v(a) / cpu_us(c, v=b))
                cpu_ratios[b] = stats(ratio_list)
            rows.append(
                Row(
                    2,
                    pname,
                    v,
                    title,
                    metrics={
                        "cpu_us_per_msg": stats([cpu_v(r) for r in ok]),
                        "startup_cpu_ms": startup.get(v, 0.0) * 1000,
                    },
                    ratios=cpu_ratios,
                )
            )
    return rows


def _policy_base(variant: str) -> tuple[str, ...]:
    """The variant a "with a policy" variant is compared with (the same rules, no policy)."""
    base = POLICY_VARIANTS.get(variant)
    return () if base is None else (base,)


def markdown(rows: list[dict[str, Any]], out: list[str]) -> None:
    """Sections 1 (throughput) and 2 (CPU per message)."""
    markdown_throughput(rows, out)
    markdown_cpu(rows, out)


def markdown_throughput(rows: list[dict[str, Any]], out: list[str]) -> None:
    """Section 1: throughput."""
    out.append(
        "### 1. Throughput agent → client (ratios: this row ÷ baseline, paired by repetition)"
    )
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 1:
            continue
        st = status(r)
        mm, rr = r["metrics"], r["ratios"]
        check = output_check(r["check"])
        body.append(
            [r["profile"], r["title"]]
            + (
                [st, "", "", "", "", "", ""]
                if st
                else [
                    fmt(mm["mb_s"]),
                    fmt(mm["msg_s"], 0),
                    fmt(rr.get("py-line"), 2),
                    fmt(rr.get("py-inject"), 2),
                    fmt(rr.get("c-relay"), 3),
                    fmt(rr.get("proxy-passthrough"), 2),
                    check,
                ]
            )
        )
    table(
        out,
        [
            "profile",
            "variant",
            "MB/s",
            "msgs/s",
            "vs py line",
            "vs py inject",
            "vs C relay",
            "vs proxy",
            "output",
        ],
        body,
    )


def markdown_cpu(rows: list[dict[str, Any]], out: list[str]) -> None:
    """Section 2: CPU per message."""
    out.append(
        "### 2. CPU per message (user+sys of the relay, start-up subtracted; lower is better)"
    )
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 2:
            continue
        st = status(r)
        mm, rr = r["metrics"], r["ratios"]
        body.append(
            [r["profile"], r["title"]]
            + (
                [st, "", "", "", ""]
                if st
                else [
                    fmt(mm["cpu_us_per_msg"], 2),
                    fmt(mm["startup_cpu_ms"], 0),
                    fmt(rr.get("py-line"), 2),
                    fmt(rr.get("py-inject"), 2),
                    fmt(rr.get("proxy-passthrough"), 2),
                ]
            )
        )
    table(
        out,
        [
            "profile",
            "variant",
            "µs CPU / msg",
            "start-up CPU ms",
            "vs py line",
            "vs py inject",
            "vs proxy",
        ],
        body,
    )
    _policy_markdown(rows, out)


def _policy_markdown(rows: list[dict[str, Any]], out: list[str]) -> None:
    """The rows with a team policy against the same rules without one (same run): frames no
    policy rule concerns keep their speed."""
    out.append(
        "#### With a policy configured (bench/policy-team.yaml; ratios: with ÷ without, the "
        "same rules, paired by repetition; 1.00 is no cost)"
    )
    out.append("")
    found = {(r["scenario"], r["profile"], r["variant"]): r for r in rows}
    body = []
    for (n, profile, variant), r in found.items():
        if n != 1 or variant not in POLICY_VARIANTS:
            continue
        base = POLICY_VARIANTS[variant]
        cpu = found.get((2, profile, variant))
        st = status(r)
        if st:
            body.append([profile, r["title"], st, "", ""])
            continue
        body.append(
            [
                profile,
                r["title"],
                fmt(r["ratios"].get(base), 3),
                fmt(cpu["ratios"].get(base), 3) if cpu and not status(cpu) else "-",
                output_check(r["check"]),
            ]
        )
    table(out, ["profile", "variant", "MB/s ratio", "CPU/msg ratio", "output"], body)
