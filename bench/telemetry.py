"""The cost of metrics and tracing (issue 12): CPU per message and added latency, on and off.

Contract: measures and prints; asserts nothing. Three variants of the real proxy
(``python -m acp_proxy``) in front of ``bench/echo_agent.py``, interleaved, same run:

  * ``off``: no telemetry (the default);
  * ``metrics``: ``--metrics tcp://127.0.0.1:0`` (scraped once at the end);
  * ``tracing``: ``tracing: {enabled: true}``, exporting over OTLP/HTTP to a local receiver in
    this process (a thread that accepts and discards).

Two scenarios per variant: ``stream`` (N requests written at once, every response read:
CPU seconds of the proxy process, from ``wait4``, minus those of a run with no request, so
start-up and imports are not counted; per message = per request + response) and
``pingpong`` (one request at a time: median and p99 round trip). Usage:
``python bench/telemetry.py [--messages N] [--pairs N] [--reps N]``.
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


def _cmd(variant: str, config: Path) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = [sys.executable, "-m", "acp_proxy", "--log-level", "warning"]
    if variant == "metrics":
        args += ["--metrics", "tcp://127.0.0.1:0"]
    if variant == "tracing":
        args += ["--config", str(config)]
    return [*args, "--", *AGENT], env


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
    ap.add_argument("--pairs", type=int, default=2_000, help="sequential round trips")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    server = HTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    variants = ("off", "metrics", "tracing")
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    rtt: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tracing.yaml"
        config.write_text("tracing: {enabled: true}\n")
        for _ in range(args.reps):
            for v in variants:  # interleaved: drift on a shared machine hits all alike
                cpu[v].append(stream(v, config, args.messages) - stream(v, config, 0))
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
    server.shutdown()


if __name__ == "__main__":
    main()
