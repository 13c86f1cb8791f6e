"""Round trips through the proxy and its peers: wall time and the CPU of the process in the path.

Contract: measures and reports, never asserts. Starts, side by side, the echo agent
(``bench/echo_agent.py``) directly and behind each variant (the minimal asyncio relay, the
conductor when ``bench/setup_peers.py`` installed it, the proxy, and with ``--baseline-ref REF``
the proxy at git ``REF``), then sends sequential ``session/prompt`` requests, in blocks that
alternate between the variants, and prints per variant the p50 and p99 round trip and the user +
system CPU of the process in the path (``/proc/PID/stat``, not its children) per round trip. CPU
per round trip is what each wake-up and hop costs, and it is far steadier than wall time on a
shared machine (the goal: fewer wake-ups and task switches per message on the hot path).

Usage: ``python bench/rtt_cpu.py [--pairs N] [--baseline-ref REF]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import setup_peers
from startup import export_ref

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


INIT = {"protocolVersion": 2, "info": {"name": "c", "version": "1"}, "capabilities": {}}
PROMPT = {"sessionId": "s", "prompt": [{"type": "text", "text": "ping"}]}


def round_trips(proc: subprocess.Popen[bytes], pairs: int) -> None:
    """``initialize``, then ``pairs`` sequential ``session/prompt`` requests, each waiting for its
    response; then the client's EOF (the steady measures' session: ``instructions.py
    --round-trips``, ``bytecodes.py``)."""
    assert proc.stdin is not None
    _call(proc, _request(0, "initialize", INIT))
    for rid in range(1, pairs + 1):
        _call(proc, _request(rid, "session/prompt", PROMPT))
    proc.stdin.close()


def _request(rid: int, method: str, params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()


def _call(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    os.write(proc.stdin.fileno(), data + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            raise EOFError("the variant closed its output")
        buf += chunk


def variants(baseline_ref: str | None) -> dict[str, tuple[list[str], dict[str, str], Path]]:
    agent = [PY, str(BENCH / "echo_agent.py")]
    env = dict(os.environ)
    proxy = [PY, "-m", "acp_proxy", "--log-level", "warning", "--", *agent]
    out = {
        "direct": (agent, env, ROOT),
        "asyncio-relay": ([PY, str(BENCH / "relay_asyncio.py"), *agent], env, ROOT),
    }
    build = BENCH / "build"
    if setup_peers.ensure(build, install=False).get("conductor") is None:
        cenv = {**env, "CONDUCTOR_MODULE": str(setup_peers.conductor_module(build))}
        out["conductor"] = (["node", str(BENCH / "peer_conductor.mjs"), *agent], cenv, ROOT)
    if baseline_ref is not None:
        tree = export_ref(baseline_ref)
        benv = {**env, "PYTHONPATH": str(tree)}
        out[f"proxy@{baseline_ref}"] = (proxy, benv, tree)  # its own cwd: python -m puts it first
    out["proxy"] = (proxy, {**env, "PYTHONPATH": str(ROOT)}, ROOT)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=10_000)
    ap.add_argument("--baseline-ref")
    args = ap.parse_args()
    procs = {
        name: subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        for name, (argv, env, cwd) in variants(args.baseline_ref).items()
    }
    for proc in procs.values():
        _call(proc, _request(0, "initialize", INIT))
        for i in range(300):  # warm up
            _call(proc, _request(1 + i, "session/prompt", PROMPT))
    samples: dict[str, list[float]] = {name: [] for name in procs}
    cpu = dict.fromkeys(procs, 0.0)
    rid = 1000
    block = max(1, args.pairs // 10)
    for _ in range(args.pairs // block):
        for name, proc in procs.items():
            before = _cpu_s(proc.pid)
            for _ in range(block):
                rid += 1
                data = _request(rid, "session/prompt", PROMPT)
                t = time.perf_counter_ns()
                _call(proc, data)
                samples[name].append((time.perf_counter_ns() - t) / 1000)
            cpu[name] += _cpu_s(proc.pid) - before
    print("| path | p50 µs | p99 µs | CPU µs / round trip |")
    print("|---|---|---|---|")
    for name, xs in samples.items():
        xs.sort()
        p50, p99 = xs[len(xs) // 2], xs[int(len(xs) * 0.99)]
        print(f"| {name} | {p50:.0f} | {p99:.0f} | {cpu[name] / len(xs) * 1e6:.0f} |")
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
