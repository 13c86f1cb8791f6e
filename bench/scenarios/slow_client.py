"""Scenario 8: a client that falls behind the agent (``bench/slow_client.py``).

Contract: runs ``slow_client.measure`` (the paused client, the fixed-rate reader, the no-merge
stream to a lagging client; the proxy with coalescing on and off, and the TypeScript conductor
when installed) with the suite's data directory, and turns its results into rows. Not in the
default ``--scenarios`` (it pauses for seconds by design): ``bench/run.py --scenarios 8``, with
``--baseline-ref REF`` the proxy of an older tree beside the current one (as
``bench/slow_client.py --baseline-ref REF``), ``--reps`` interleaved rounds.
Measures; never asserts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import slow_client
from harness import Harness
from rows import Row


def run(h: Harness, log: Callable[[str], None]) -> list[Row]:
    argv = ["--data-dir", str(h.s.data_dir), "--repeat", str(h.s.reps)]
    if h.s.baseline_ref:
        argv += ["--baseline-ref", h.s.baseline_ref]
    if h.s.quick:
        argv += ["--pause", "0.5", "--paused-mb", "8", "--rate-messages", "2000"]
        argv += ["--mergeable-pause", "0.5", "--mergeable-mb", "4"]
        argv += ["--lagging-messages", "2000"]
    results = slow_client.measure(slow_client.options(argv), log)
    rows: list[Row] = []
    for scenario, found in results.items():
        if scenario == "startup":
            continue
        for r in found:
            metrics = {
                k: float(v)
                for k, v in r.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
            extra = dict(r["extra"])
            vs = extra.pop("vs_off", None)
            metrics.update({k: float(v) for k, v in extra.items()})
            if vs:  # coalescing on against off, paired by round
                lo, hi = vs["after_first_ms_ci95"]
                metrics.update(
                    vs_off_after_first_ms=float(vs["after_first_ms_median"]),
                    vs_off_after_first_ms_ci_low=float(lo),
                    vs_off_after_first_ms_ci_high=float(hi),
                    vs_off_on_later_in=float(vs["on_later_in"]),
                    vs_off_rounds=float(vs["rounds"]),
                    vs_off_cpu_s=float(vs["cpu_s_median"]),
                )
            status = "ok" if r["ok"] else "error"
            title = f"{r['variant']}, {scenario}"
            rows.append(
                Row(8, f"slow-{scenario}", r["variant"], title, status, r["error"] or None, metrics)
            )
    return rows


def markdown(rows: list[dict[str, Any]], out: list[str]) -> None:
    mine = [r for r in rows if r["scenario"] == 8]
    out.append("\n### 8. A client that falls behind (bench/slow_client.py)\n")
    if not mine:
        out.append("(not run: `--scenarios 8`)")
        return
    out.append("| scenario | variant | CPU s | peak RSS MiB | has everything at s | share |")
    out.append("|---|---|---|---|---|---|")
    for r in mine:
        m = r["metrics"]
        share = m.get("messages_out", 0.0) / max(1.0, m.get("messages_in", 1.0))
        out.append(
            f"| {r['profile']} | {r['variant']} | {m.get('cpu_s', 0):.2f} | "
            f"{m.get('maxrss_mb', 0):.1f} | {m.get('wall_s', 0):.2f} | {share:.2f} |"
        )
    for r in mine:
        m = r["metrics"]
        if "vs_off_after_first_ms" in m:
            out.append(
                f"\n{r['profile']}, {r['variant']} against off, paired by round: last byte "
                f"{m['vs_off_after_first_ms']:+.1f} ms (95 % CI "
                f"{m['vs_off_after_first_ms_ci_low']:+.1f} to "
                f"{m['vs_off_after_first_ms_ci_high']:+.1f}), later in "
                f"{m['vs_off_on_later_in']:.0f} of {m['vs_off_rounds']:.0f} rounds, CPU "
                f"{m['vs_off_cpu_s']:+.3f} s"
            )
