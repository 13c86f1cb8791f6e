"""The cost of metrics and tracing: CPU per message and added latency, on and off.

Contract: measures and prints; asserts nothing. Four variants of the real proxy
(``python -m acp_proxy``), interleaved, same run:

  * ``off``: no telemetry (the default);
  * ``metrics``: ``--metrics tcp://127.0.0.1:0`` (scraped once at the end);
  * ``tracing``: ``tracing: {enabled: true}``, exporting over OTLP/HTTP to a local receiver in
    this process (a thread that accepts and discards);
  * ``both``: metrics and tracing.

Three scenarios per variant: ``stream`` (N requests written at once to ``bench/echo_agent.py``,
every response read: CPU seconds of the proxy process, from ``wait4``, minus those of a run with
no request, so start-up and imports are not counted; per message = per request + response),
``turns`` (the same measure with whole v2 prompt turns: the demo agent answers each prompt with
its scripted turn, 13 frames with a tool call and the idle ``state_update``: what the turn
metrics and spans follow) and ``pingpong`` (one request at a time: median and p99 round trip).
Usage: ``python bench/telemetry.py [--messages N] [--turns N] [--pairs N] [--reps N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
AGENT = [sys.executable, str(BENCH / "echo_agent.py")]
DEMO_AGENT = [sys.executable, "-m", "acp_proxy.demo.agent"]
NEW = b'{"jsonrpc":"2.0","id":"n","method":"session/new","params":{"cwd":"/w"}}\n'


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _request(i: int, method: str = "session/prompt") -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":{"sessionId":"s1","prompt":'
        b'[{"type":"text","text":"hello"}]}}\n' % (i, method.encode())
    )


INIT = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}\n'


def _cmd(variant: str, config: Path, agent: list[str] = AGENT) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = [sys.executable, "-m", "acp_proxy", "--log-level", "warning"]
    if variant in ("metrics", "both"):
        args += ["--metrics", "tcp://127.0.0.1:0"]
    if variant in ("tracing", "both"):
        args += ["--config", str(config)]
    return [*args, "--", *agent], env


def turns(variant: str, config: Path, n: int) -> tuple[float, int]:
    """Proxy CPU seconds for ``n`` whole v2 prompt turns of the demo agent, and the frames
    that crossed the proxy (both ways)."""
    cmd, env = _cmd(variant, config, DEMO_AGENT)
    prompts = b"".join(
        b'{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{"sessionId":'
        b'"sess_demo_001","prompt":[{"type":"text","text":"go"}]}}\n' % i
        for i in range(1, n + 1)
    )
    data = INIT + NEW + prompts
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, env=env, cwd=ROOT)
        assert proc.stdin is not None
        proc.stdin.write(data)
        proc.stdin.close()
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        lines = out.read().count(b"\n")
    assert os.waitstatus_to_exitcode(status) == 0, status
    return usage.ru_utime + usage.ru_stime, lines + 2 + n


def stream(variant: str, config: Path, n: int) -> float:
    """Proxy CPU seconds for ``n`` requests and their responses."""
    cmd, env = _cmd(variant, config)
    data = INIT + b"".join(_request(i) for i in range(1, n + 1))
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, env=env, cwd=ROOT)
        assert proc.stdin is not None
        proc.stdin.write(data)
        proc.stdin.close()
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        lines = out.read().count(b"\n")
    assert os.waitstatus_to_exitcode(status) == 0 and lines == n + 1, (status, lines)
    return usage.ru_utime + usage.ru_stime


def pingpong(variant: str, config: Path, pairs: int) -> list[float]:
    """Round-trip seconds of ``pairs`` sequential requests."""
    cmd, env = _cmd(variant, config)
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT, bufsize=0
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(INIT)
    proc.stdout.readline()
    times = []
    for i in range(1, pairs + 1):
        frame = _request(i)
        t0 = time.perf_counter()
        proc.stdin.write(frame)
        proc.stdout.readline()
        times.append(time.perf_counter() - t0)
    proc.stdin.close()
    proc.wait()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000, help="requests in the stream run")
    ap.add_argument("--turns", type=int, default=1_000, help="v2 prompt turns in the turns run")
    ap.add_argument("--pairs", type=int, default=2_000, help="sequential round trips")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    server = HTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    variants = ("off", "metrics", "tracing", "both")
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    turn_cpu: dict[str, list[float]] = {v: [] for v in variants}
    turn_frames = 0
    rtt: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tracing.yaml"
        config.write_text("tracing: {enabled: true}\n")
        for _ in range(args.reps):
            for v in variants:  # interleaved: drift on a shared machine hits all alike
                cpu[v].append(stream(v, config, args.messages) - stream(v, config, 0))
                spent, turn_frames = turns(v, config, args.turns)
                turn_cpu[v].append(spent - turns(v, config, 0)[0])
                rtt[v].extend(pingpong(v, config, args.pairs))
    base_cpu = statistics.median(cpu["off"])
    messages = 2 * args.messages  # each request and its response cross the proxy
    print(
        f"{args.messages} requests + responses per stream run (start-up subtracted), "
        f"{args.reps} reps (median)"
    )
    print(f"{'variant':<10}{'CPU s':>8}{'us/msg':>9}{'+us/msg':>9}{'rtt p50 us':>12}{'p99 us':>9}")
    for v in variants:
        c = statistics.median(cpu[v])
        q = statistics.quantiles(rtt[v], n=100)
        print(
            f"{v:<10}{c:>8.2f}{c / messages * 1e6:>9.1f}{(c - base_cpu) / messages * 1e6:>9.1f}"
            f"{statistics.median(rtt[v]) * 1e6:>12.0f}{q[98] * 1e6:>9.0f}"
        )
    base_turn = statistics.median(turn_cpu["off"])
    print(
        f"\n{args.turns} v2 prompt turns of the demo agent ({turn_frames} frames both ways, "
        f"start-up subtracted), {args.reps} reps (median)"
    )
    print(f"{'variant':<10}{'CPU s':>8}{'us/frame':>10}{'+us/frame':>11}{'+us/turn':>10}")
    for v in variants:
        c = statistics.median(turn_cpu[v])
        added = c - base_turn
        print(
            f"{v:<10}{c:>8.2f}{c / turn_frames * 1e6:>10.1f}"
            f"{added / turn_frames * 1e6:>11.1f}{added / args.turns * 1e6:>10.0f}"
        )
    server.shutdown()


if __name__ == "__main__":
    main()
