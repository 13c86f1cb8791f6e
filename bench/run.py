"""The acp-proxy benchmark suite: one command, ratios against same-run baselines.

Contract: owns the benchmark harness. It generates (or reuses) the data sets of
``bench/generate.py``, runs every variant of every scenario interleaved (repetition 1 of every
variant, then repetition 2, ...), and prints a Markdown table per scenario to stdout and writes
all numbers to a JSON file. It measures and reports; it never asserts a timing.

Scenarios:
  1. throughput agent -> client (MB/s, messages/s) per profile: ``cat`` between two pipes, a C
     byte relay, the minimal Python line relay and orjson parse+inject relay
     (``bench/relay_min.py``), and the proxy with a pass-through config and with the annotation
     rule (each with coalescing on, the default, and off), and with config/example.yaml;
  2. CPU per message (user+sys of the relay process from ``os.wait4``, minus the same variant's
     start-up cost measured on an empty data set, divided by the messages), same runs as 1;
  3. round-trip latency of sequential small request/response pairs, direct vs through the proxy;
  4. peak RSS (``ru_maxrss``, via bench/spawn_rusage.c) with a 10 MB line, over a ~1 GB stream
     against one pass, and with a slow client (coalescing on and off);
  5. TCP and Unix-socket throughput relative to stdio (``--listen``), or an "n/a" row;
  6. start-up wall and CPU time of ``acp-proxy -- true`` against the minimal relay's
     (``bench/startup.py``);
  9. the permission policy's decision cost with 200 rules, p50 and p99 per request, and a frame
     it does not concern without and with it (``bench/policy.py``). Scenarios 1 and 2 also run
     the pass-through and annotation configurations with a team policy beside their rules
     (``bench/policy-team.yaml``) and compare them with the same rules without one.

The peers (installed by ``bench/setup_peers.py``, skipped with the reason when they
are not): the TypeScript conductor with no components and with one annotating component, and a
relay on the official Python SDK, are rows of scenarios 1, 2, 3, 4 and 6 (scenario 5: an "n/a"
row each, neither can listen). Both renumber request ids, so their agent is
``replay_agent.py --renumber`` (it answers the ids it receives); their output is checked as JSON
(message by message, agent requests' ids aside) instead of byte for byte, and the output cell
says what came out (the conductor drops JSON-RPC batches; the SDK's Connection stops reading at
the first one).

Usage: ``python bench/run.py`` (full, ~50 MB per data set) or ``python bench/run.py --quick``
(seconds; the CI smoke run); ``--brief`` prints scenario 1's table alone for mixed-v2 and four
variants (what ``.ci/run`` shows as information); ``--out results.json``; ``--help`` for the
rest.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import setup_peers
from generate import DEFAULT_SEED, ensure, parse_size
from harness import BENCH, ROOT, Harness, Settings
from rows import Row
from scenarios import SCENARIOS, throughput
from variants import PROFILES

SCHEMA = "acp-proxy-bench/1"
# ``--brief``: what .ci/run prints after the cost guard, as information.
BRIEF_PROFILES = (("mixed", 2),)
BRIEF_VARIANTS = ("py-line", "py-inject", "proxy-passthrough", "proxy-annotate")


# -- settings -------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> tuple[Settings, Path | None, set[int]]:
    ap = argparse.ArgumentParser(
        description="Run the acp-proxy benchmark suite.",
        epilog="Full run: python bench/run.py --out bench/results/latest.json",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny data, 1 repetition, the first profile only in scenarios 1-2 (CI smoke run)",
    )
    ap.add_argument(
        "--brief",
        action="store_true",
        help="the short throughput table .ci/run prints (information, never a failure): "
        "scenario 1 on mixed-v2 alone, the Python relays and the proxy with the pass-through "
        "and the annotation rules, quick data, 1 repetition, no start-up CPU; that table only",
    )
    ap.add_argument("--out", type=Path, help="write the JSON results here")
    ap.add_argument("--reps", type=int, help="interleaved repetitions (default 3, quick 1)")
    ap.add_argument("--size", type=parse_size, help="throughput data set size (default 50M)")
    ap.add_argument("--latency-pairs", type=int, help="request/response pairs (default 10000)")
    ap.add_argument(
        "--long-repeat", type=int, help="passes for the long stream (default 20: ~1 GB)"
    )
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument(
        "--scenarios",
        type=lambda t: {int(x) for x in t.split(",")},
        default={1, 2, 3, 4, 5, 6, 7, 9},
        help="comma-separated subset, e.g. 3,4 (default: all but 8; 1 and 2 share their runs; "
        "6 is start-up; 8 is a client that falls behind, bench/slow_client.py; 9 is the "
        "policy's decision cost, bench/policy.py)",
    )
    ap.add_argument(
        "--baseline-ref",
        help="scenario 8: also run the proxy of this git ref (e.g. 5a1562d), interleaved",
    )
    ap.add_argument("--data-dir", type=Path, default=BENCH / "data")
    ap.add_argument("--build-dir", type=Path, default=BENCH / "build")
    ap.add_argument("--annotate-config", type=Path, default=BENCH / "rules-annotate.yaml")
    ap.add_argument("--passthrough-config", type=Path, default=BENCH / "rules-passthrough.yaml")
    a = ap.parse_args(argv)
    q = bool(a.quick or a.brief)
    example = ROOT / "config" / "example.yaml"
    work = Path(tempfile.mkdtemp(prefix="acp-bench-"))
    s = Settings(
        quick=q,
        reps=a.reps or (1 if q else 3),
        size=a.size or (parse_size("256K") if q else parse_size("50M")),
        bigline_size=parse_size("1M") if q else 10 * 1024 * 1024,
        burst_size=parse_size("256K") if q else parse_size("16M"),
        latency_pairs=a.latency_pairs or (300 if q else 10_000),
        long_repeat=a.long_repeat or (4 if q else 20),
        slow_read_bytes=4096,
        slow_sleep_s=0.0002 if q else 0.001,
        seed=a.seed,
        data_dir=a.data_dir.resolve(),
        build_dir=a.build_dir.resolve(),
        work_dir=work,
        annotate_config=a.annotate_config.resolve(),
        passthrough_config=a.passthrough_config.resolve(),
        example_config=example if example.exists() else None,
        baseline_ref=a.baseline_ref,
        profiles=BRIEF_PROFILES if a.brief else None,
        variants=BRIEF_VARIANTS if a.brief else None,
        startup_cpu=not a.brief,
    )
    return s, a.out, {1} if a.brief else set(a.scenarios)


# -- output ---------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_mb = None
    with suppress(OSError, ValueError, IndexError):
        mem_mb = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "mem_mb": mem_mb,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }


def markdown(result: dict[str, Any]) -> str:
    rows = [r for r in result["rows"]]
    meta = result["meta"]
    m = meta["machine"]
    load = ", ".join(f"{x:.2f}" for x in m["loadavg_start"])
    out = [
        f"## acp-proxy benchmark ({'quick' if meta['quick'] else 'full'} run, {meta['started']})",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['mem_mb']} MB RAM, {m['os']}, Python "
        f"{m['python']}; load average at start {load}. "
        f"{meta['reps']} interleaved repetition(s); cells are median [min..max]. "
        f"Data sets: {meta['size_bytes'] / 2**20:.2f} MiB each, seed {meta['seed']}.",
        "",
    ]

    for scenario in SCENARIOS:
        scenario.markdown(rows, out)
    if result.get("startup"):
        import startup  # bench/startup.py

        out.append("### 6. Start-up (stdin at EOF; the proxy spawns `true`; see bench/startup.py)")
        out.append("")
        out.append(startup.markdown(result["startup"]))
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    s, out_path, scenarios = parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    h = Harness(s)
    machine = machine_info()  # before the runs: its load average is the one at the start
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    try:
        h.build_c()
        h.check_proxy()
        # The peers (installed here unless --quick, which only uses what is there).
        h.peer_errors = setup_peers.ensure(s.build_dir, install=not s.quick)
        for peer, why in h.peer_errors.items():
            if why:
                log(f"peer {peer} skipped: {why}")
        if h.c_error:
            log(f"C relay skipped: {h.c_error}")
        if h.proxy_error:
            log(f"proxy rows skipped: {h.proxy_error}")
        log(f"generating data sets (cached in {s.data_dir})")
        for profile, version in s.profiles or PROFILES:
            ensure(s.data_dir, profile, version, s.size, s.seed)
        rows: list[Row] = []
        for scenario in SCENARIOS:
            if scenario.numbers & scenarios:
                log(scenario.progress)
                rows += scenario.run(h, log)
        startup_result: dict[str, Any] | None = None
        if 6 in scenarios and h.proxy_error is None:
            log("scenario 6: start-up")
            import startup  # bench/startup.py

            startup_result = startup.run(5 if s.quick else 20, build_dir=s.build_dir)
    finally:
        shutil.rmtree(s.work_dir, ignore_errors=True)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "meta": {
            "started": started,
            "duration_s": time.perf_counter() - t0,
            "quick": s.quick,
            "reps": s.reps,
            "size_bytes": s.size,
            "bigline_bytes": s.bigline_size,
            "burst_bytes": s.burst_size,
            "latency_pairs": s.latency_pairs,
            "long_stream_passes": s.long_repeat,
            "seed": s.seed,
            "machine": machine,
            "proxy_available": h.proxy_error is None,
            "proxy_error": h.proxy_error,
            "c_relay_error": h.c_error,
            "rss_source": "spawn_rusage launcher" if h.launcher else "wait4 (inflated, no cc)",
            "loadavg_end": os.getloadavg(),
        },
        "rows": [r.to_json() for r in rows],
        "startup": startup_result,
    }
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    print(brief_markdown(result) if s.variants is not None else markdown(result), flush=True)
    return 0


def brief_markdown(result: dict[str, Any]) -> str:
    """``--brief``: the throughput table alone, under one line saying what it is."""
    meta = result["meta"]
    out = [
        f"Throughput, for information (bench/run.py --brief: {meta['size_bytes'] / 2**20:.2f} "
        f"MiB, {meta['reps']} repetition; a shared machine moves these figures 2-5 x):",
        "",
    ]
    throughput.markdown_throughput(result["rows"], out)
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
