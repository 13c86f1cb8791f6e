"""Scenario 3: round-trip latency of sequential small request/response pairs.

Contract: measures the latency of request/response pairs sent one at a time, directly to the
echo agent and through each relay (the proxy, a minimal asyncio relay, the peers), the latency
each adds, and the CPU of the process in the path per round trip. Measures; never asserts.
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

from harness import BENCH, PY, Harness, env_with, tail_of, wait_rusage
from rows import Row, fmt, skipped, status, table
from variants import (
    PEER_VARIANTS,
    VARIANT_TITLES,
)


class LineClient:
    """A client on a pipe pair: write one request, read one response line."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.wfd = proc.stdin.fileno()
        self.rfd = proc.stdout.fileno()
        self.buf = b""

    def call(self, data: bytes, timeout: float = 30.0) -> bytes:
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view) :]
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.rfd], [], [], timeout)
            if not ready:
                raise TimeoutError("no response")
            chunk = os.read(self.rfd, 65536)
            if not chunk:
                raise EOFError("EOF before the response")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line


def _request(rid: int, method: str, params: dict[str, Any]) -> bytes:
    return (
        json.dumps(
            {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}, separators=(",", ":")
        ).encode()
        + b"\n"
    )


def run(h: Harness, log: Callable[[str], None]) -> list[Row]:
    s = h.s
    title = {
        "direct": "client -> echo agent, direct",
        "proxy-passthrough": "through acp-proxy (pass-through)",
    }
    title.update({v: VARIANT_TITLES[v] for v in PEER_VARIANTS})
    # The floor the round trip approaches, a two-way asyncio relay that only copies.
    title["asyncio-relay"] = "minimal asyncio relay (bench/relay_asyncio.py): the floor"
    variants = ["direct", "asyncio-relay", "proxy-passthrough"]
    reason = h.skip_reason("proxy-passthrough")
    if reason:
        variants = ["direct", "asyncio-relay"]
    agent = [PY, str(BENCH / "echo_agent.py")]
    peer_argv = {v: h.peer_argv(v, agent) for v in PEER_VARIANTS}
    peer_env = {v: h.peer_env(v) for v in PEER_VARIANTS}
    variants += [v for v in PEER_VARIANTS if h.skip_reason(v) is None]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stderr_path = h.tmp("latency-proxy-stderr.log")
    with open(stderr_path, "wb") as err:
        for v in variants:
            argv = (
                agent
                if v == "direct"
                else [PY, str(BENCH / "relay_asyncio.py"), *agent]
                if v == "asyncio-relay"
                else peer_argv[v]
                if v in peer_argv
                else h.proxy_argv(s.passthrough_config, agent)
            )
            procs[v] = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err if v != "direct" else None,
                env=peer_env.get(v) or env_with(),
                start_new_session=True,
            )
    clients = {v: LineClient(p) for v, p in procs.items()}
    samples: dict[str, list[float]] = {v: [] for v in variants}
    errors: dict[str, str] = {}
    init = {
        "protocolVersion": 2,
        "info": {"name": "bench-client", "version": "1.0.0"},
        "capabilities": {},
    }
    prompt = {"sessionId": "sess_echo", "prompt": [{"type": "text", "text": "ping"}]}
    warmup = min(200, s.latency_pairs // 5)
    block = max(1, min(500, s.latency_pairs // 10))
    for v, c in clients.items():
        try:
            c.call(_request(0, "initialize", init), timeout=60)
            c.call(_request(1, "session/new", {"cwd": "/workspace", "mcpServers": []}))
            for i in range(warmup):
                c.call(_request(2 + i, "session/prompt", prompt))
        except (OSError, TimeoutError, EOFError) as exc:
            errors[v] = f"{type(exc).__name__}: {exc}"
    rid = 10_000
    done = 0
    cpu_s = dict.fromkeys(variants, 0.0)  # the relay process's own CPU over its blocks
    while done < s.latency_pairs:
        n = min(block, s.latency_pairs - done)
        for v, c in clients.items():  # alternate blocks: direct, proxy, direct, proxy, ...
            if v in errors:
                continue
            out = samples[v]
            before = _proc_cpu_s(procs[v].pid)
            try:
                for _ in range(n):
                    rid += 1
                    req = _request(rid, "session/prompt", prompt)
                    t = time.perf_counter_ns()
                    c.call(req)
                    out.append((time.perf_counter_ns() - t) / 1000)
            except (OSError, TimeoutError, EOFError) as exc:
                errors[v] = f"{type(exc).__name__}: {exc}"
            cpu_s[v] += _proc_cpu_s(procs[v].pid) - before
        done += n
    for proc in procs.values():
        assert proc.stdin is not None and proc.stdout is not None
        with suppress(OSError):
            proc.stdin.close()
        wait_rusage(proc, 30)
        proc.stdout.close()
    rows: list[Row] = []
    pct: dict[str, dict[str, float]] = {}
    for v in ["direct", "asyncio-relay", "proxy-passthrough", *PEER_VARIANTS]:
        if v not in variants:
            why = h.skip_reason(v) if v in PEER_VARIANTS else reason
            rows.append(skipped(3, "rtt-v2", v, title[v], why or "unavailable"))
            continue
        xs = sorted(samples[v])
        if v in errors or not xs:
            why = errors.get(v, "no samples")
            if v != "direct":
                why += f"; proxy stderr: {tail_of(stderr_path)}"
            rows.append(Row(3, "rtt-v2", v, title[v], "error", why))
            continue
        pct[v] = {
            "p50_us": percentile(xs, 50),
            "p99_us": percentile(xs, 99),
            "max_us": xs[-1],
            "pairs": float(len(xs)),
            # CPU of the process in the path (for "direct": the echo agent) per round trip:
            # what each wake-up and hop costs, steadier than wall time on a shared machine.
            "cpu_us_per_rt": cpu_s[v] / len(xs) * 1e6,
        }
        rows.append(Row(3, "rtt-v2", v, title[v], metrics=dict(pct[v])))
        log(f"  s3 {v}: p50 {pct[v]['p50_us']:.0f} us, p99 {pct[v]['p99_us']:.0f} us")
    added_title = "added by the proxy (proxy - direct)"
    if "direct" in pct and "proxy-passthrough" in pct:
        d, p = pct["direct"], pct["proxy-passthrough"]
        rows.append(
            Row(
                3,
                "rtt-v2",
                "added",
                added_title,
                metrics={
                    "p50_us": p["p50_us"] - d["p50_us"],
                    "p99_us": p["p99_us"] - d["p99_us"],
                    "max_us": p["max_us"] - d["max_us"],
                },
                check={"target_p50_us": 100, "target_p99_us": 500},
            )
        )
    else:
        rows.append(skipped(3, "rtt-v2", "added", added_title, reason or "a side failed"))
    # What each peer adds, and the proxy's added latency as a fraction of it.
    for peer in ("asyncio-relay", *PEER_VARIANTS):
        peer_title = title[peer]
        if "direct" not in pct or peer not in pct:
            why = (h.skip_reason(peer) if peer in PEER_VARIANTS else None) or errors.get(
                peer, "a side failed"
            )
            rows.append(skipped(3, "rtt-v2", f"added-{peer}", f"added by {peer_title}", why))
            continue
        d, p = pct["direct"], pct[peer]
        added = {k: p[k] - d[k] for k in ("p50_us", "p99_us", "max_us")}
        ratios: dict[str, float] = {}
        if "proxy-passthrough" in pct:
            q = pct["proxy-passthrough"]
            for k in ("p50_us", "p99_us"):
                if added[k] > 0:
                    ratios[k] = (q[k] - d[k]) / added[k]
        rows.append(
            Row(
                3,
                "rtt-v2",
                f"added-{peer}",
                f"added by {peer_title} (peer - direct)",
                metrics=added,
                ratios=ratios,
            )
        )
    return rows


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` itself (not its children), from /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    k = max(0, min(len(sorted_xs) - 1, math.ceil(p / 100 * len(sorted_xs)) - 1))
    return sorted_xs[k]


def markdown(rows: list[dict[str, Any]], out: list[str]) -> None:
    """Section 3: the latency table and its targets."""
    out.append("### 3. Round-trip latency, sequential small request/response pairs (µs)")
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 3:
            continue
        st = status(r)
        mm, rr = r["metrics"], r.get("ratios") or {}
        vs = f"{fmt(rr.get('p50_us'), 2)} / {fmt(rr.get('p99_us'), 2)}" if rr else ""
        body.append(
            [r["title"]]
            + (
                [st, "", "", "", ""]
                if st
                else [
                    fmt(mm["p50_us"], 0),
                    fmt(mm["p99_us"], 0),
                    fmt(mm["max_us"], 0),
                    fmt(mm.get("cpu_us_per_rt"), 0),
                    vs,
                ]
            )
        )
    table(
        out,
        [
            "path",
            "p50",
            "p99",
            "max",
            "CPU µs / round trip (the process in the path)",
            "proxy's added ÷ this one's (p50 / p99)",
        ],
        body,
    )
    out.append(
        "Targets for the added latency: p50 ≤ 100 µs, p99 ≤ 500 µs; against the peers: ≤ 0.6 x the "
        "conductor's added p50 and ≤ 0.5 x its p99. The peers renumber request ids (the echo "
        "agent answers the ids it receives)."
    )
    out.append("")
