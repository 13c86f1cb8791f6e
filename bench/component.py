"""Bench scenario: acp-proxy as a proxy component inside the TypeScript conductor.

Contract: ``python bench/component.py [--round-trips N] [--updates K] [--json FILE]`` measures, in
one run and on the same machine state, the added round trip and the throughput of

* ``direct``: the client and the agent alone;
* ``proxy``: acp-proxy standalone (``--config bench/rules-annotate.yaml -- AGENT``);
* ``conductor``: the TypeScript conductor alone (``@thinkwell/conductor``, no components);
* ``conductor+component``: the conductor with ``acp-proxy component`` (same rules) before the
  agent;

and prints a Markdown table (``--json``: the numbers too). The conductor is the one
``bench/setup_peers.py`` installs (pinned); without it (or node) its rows say why they are
missing. The conductor is driven by tests/conductors/thinkwell.mjs (its MCP bridge off), for
both of its rows.

Round trip: ``session/prompt`` answered at once by ``bench/echo_agent.py``, the variants taken
in turn block by block (so drift on a loaded machine hits all alike); p50 and p99, and what each
adds to ``direct``'s p50. Throughput: on one ``session/prompt``, the agent (this file with
``--agent K``) writes K ``tool_call_update`` notifications (about 400 bytes each; the rule
annotates each) and then the response; the client reads until the response. Updates per second
(the agent's, from the prompt to the response), best of ``--repeat``, and how many frames the
client got for them: fewer when the proxy coalesced updates toward a client that fell behind
(acp-proxy's default; the state the client ends with is the same).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DRIVER = REPO / "tests" / "conductors" / "thinkwell.mjs"
RULES = BENCH / "rules-annotate.yaml"
PY = sys.executable
VARIANTS = ("direct", "proxy", "conductor", "conductor+component")
TITLES = {
    "direct": "client -> agent, direct",
    "proxy": "acp-proxy standalone (annotate)",
    "conductor": "TypeScript conductor alone",
    "conductor+component": "TypeScript conductor + acp-proxy component (annotate)",
}
INIT = {
    "protocolVersion": 2,
    "info": {"name": "bench-client", "version": "1.0.0"},
    "capabilities": {},
}


def request(rid: int, method: str, params: dict[str, Any]) -> bytes:
    message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


# -- the streaming agent (--agent K) --------------------------------------------------------------


def run_agent(count: int) -> int:
    """Answer initialize and session/new; on session/prompt write ``count`` updates, then the
    response. Exits at EOF."""
    out = sys.stdout.buffer
    pad = "x" * 250
    for line in sys.stdin.buffer:
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:
            continue
        method, rid = msg["method"], msg["id"]
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": 2,
                "info": {"name": "bench-stream-agent", "version": "1.0.0"},
                "capabilities": {},
            }
        elif method == "session/new":
            result = {"sessionId": "sess_bench"}
        else:
            chunks = []
            for i in range(count):
                update = {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": f"call_{i % 64}",
                    "status": "in_progress",
                    "content": [{"type": "content", "content": {"type": "text", "text": pad}}],
                }
                params = {"sessionId": "sess_bench", "update": update}
                note = {"jsonrpc": "2.0", "method": "session/update", "params": params}
                chunks.append(json.dumps(note, separators=(",", ":")).encode() + b"\n")
                if len(chunks) == 256:
                    out.write(b"".join(chunks))
                    chunks = []
            out.write(b"".join(chunks))
            result = {"messageId": f"msg_{rid}"}
        response = {"jsonrpc": "2.0", "id": rid, "result": result}
        out.write(json.dumps(response, separators=(",", ":")).encode() + b"\n")
        out.flush()
    return 0


# -- clients --------------------------------------------------------------------------------------


class Client:
    """A client on a child's pipes: write a request, read lines until its response."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd, self.rfd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.buf = b""

    def call(self, data: bytes, rid: int, timeout: float = 60.0) -> int:
        """Send ``data``; read until the response to ``rid``; return how many lines came."""
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view) :]
        want = b'"id":%d,' % rid
        lines = 0
        while True:
            while b"\n" not in self.buf:
                ready, _, _ = select.select([self.rfd], [], [], timeout)
                if not ready:
                    raise TimeoutError("no response")
                chunk = os.read(self.rfd, 1 << 20)
                if not chunk:
                    raise EOFError("EOF before the response")
                self.buf += chunk
            # every complete line at once: count them, look for the response among them
            end = self.buf.rfind(b"\n")
            block, self.buf = self.buf[: end + 1], self.buf[end + 1 :]
            lines += block.count(b"\n")
            for line in block.splitlines():
                if want in line and b'"method"' not in line:
                    return lines

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def conductor_module(build_dir: Path = BENCH / "build") -> tuple[Path | None, str | None]:
    """The installed conductor's ``dist/index.js``, or None and why not."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import setup_peers

    module = setup_peers.conductor_module(build_dir)
    if shutil.which("node") is None:
        return None, "node is not installed"
    if not module.exists():
        return None, "not installed (run python bench/setup_peers.py)"
    return module, None


def argv_of(variant: str, agent: list[str]) -> list[str]:
    component = [PY, "-m", "acp_proxy", "component", "--config", str(RULES)]
    if variant == "direct":
        return agent
    if variant == "proxy":
        return [PY, "-m", "acp_proxy", "--config", str(RULES), "--", *agent]
    if variant == "conductor":
        return ["node", str(DRIVER), json.dumps(agent)]
    return ["node", str(DRIVER), json.dumps(component), json.dumps(agent)]


def start(variant: str, agent: list[str], env: dict[str, str]) -> Client:
    client = Client(argv_of(variant, agent), env)
    client.call(request(0, "initialize", INIT), 0)
    client.call(request(1, "session/new", {"cwd": "/workspace", "mcpServers": []}), 1)
    return client


def round_trips(variants: list[str], env: dict[str, str], pairs: int) -> dict[str, list[float]]:
    agent = [PY, str(BENCH / "echo_agent.py")]
    clients = {v: start(v, agent, env) for v in variants}
    samples: dict[str, list[float]] = {v: [] for v in variants}
    prompt = {"sessionId": "sess_echo", "prompt": [{"type": "text", "text": "ping"}]}
    rid = 2
    block = max(1, min(200, pairs // 10))
    try:
        for c in clients.values():  # warm-up
            for _ in range(min(100, pairs // 5)):
                c.call(request(rid, "session/prompt", prompt), rid)
                rid += 1
        done = 0
        while done < pairs:
            n = min(block, pairs - done)
            for v, c in clients.items():
                for _ in range(n):
                    data = request(rid, "session/prompt", prompt)
                    t0 = time.perf_counter()
                    c.call(data, rid)
                    samples[v].append(time.perf_counter() - t0)
                    rid += 1
            done += n
    finally:
        for c in clients.values():
            c.close()
    return samples


def throughput(variant: str, env: dict[str, str], updates: int, repeat: int) -> tuple[float, int]:
    agent = [PY, str(Path(__file__).resolve()), "--agent", str(updates)]
    client = start(variant, agent, env)
    prompt = {"sessionId": "sess_bench", "prompt": [{"type": "text", "text": "go"}]}
    best, delivered = 0.0, 0
    try:
        for i in range(repeat):
            rid = 10 + i
            t0 = time.perf_counter()
            lines = client.call(request(rid, "session/prompt", prompt), rid)
            elapsed = time.perf_counter() - t0
            if updates / elapsed > best:
                best, delivered = updates / elapsed, lines - 1
    finally:
        client.close()
    return best, delivered


def percentile(xs: list[float], p: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def measure(
    variants: list[str], env: dict[str, str], pairs: int, updates: int, repeat: int
) -> list[dict[str, Any]]:
    """One row per variant (``variant``, ``title``, the round trip's ``rtt_p50_us``,
    ``rtt_p99_us``, ``added_p50_us`` over ``direct``, ``updates_per_s``, ``delivered``);
    ``direct`` must be among ``variants``. ``env`` carries CONDUCTOR_MODULE for the conductor."""
    rtt = round_trips(variants, env, pairs)
    rates = {v: throughput(v, env, updates, repeat) for v in variants}
    base = statistics.median(rtt["direct"])
    rows = []
    for v in variants:
        p50, p99 = statistics.median(rtt[v]), percentile(rtt[v], 0.99)
        rows.append(
            {
                "variant": v,
                "title": TITLES[v],
                "rtt_p50_us": round(p50 * 1e6, 1),
                "rtt_p99_us": round(p99 * 1e6, 1),
                "added_p50_us": round((p50 - base) * 1e6, 1),
                "updates_per_s": round(rates[v][0]),
                "delivered": rates[v][1],
            }
        )
    return rows


def bench_env(module: Path | None) -> dict[str, str]:
    """The children's environment: this checkout importable, the conductor's module named."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if module is not None:
        env["CONDUCTOR_MODULE"] = str(module)
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--updates", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--agent", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.agent is not None:
        return run_agent(args.agent)
    module, missing = conductor_module()
    variants = list(VARIANTS) if module is not None else ["direct", "proxy"]
    rows = measure(variants, bench_env(module), args.round_trips, args.updates, args.repeat)
    print(
        "| variant | round trip p50 (µs) | p99 (µs) | added p50 (µs) | updates/s "
        f"| frames the client got for {args.updates} updates |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['title']} | {r['rtt_p50_us']} | {r['rtt_p99_us']} | {r['added_p50_us']} "
            f"| {r['updates_per_s']:,} | {r['delivered']:,} |"
        )
    if module is None:
        print(f"\nconductor rows missing: {missing}")
    if args.json is not None:
        settings = {"round_trips": args.round_trips, "updates": args.updates, "repeat": args.repeat}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
