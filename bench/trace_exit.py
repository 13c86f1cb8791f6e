"""How long the proxy takes to exit after the client's EOF with many turns left open, with and
without tracing, whatever the collector does.

Contract: measures and prints; asserts nothing. The real proxy (``python -m acp_proxy``) in front
of an agent that answers ``initialize`` and never a prompt. The client writes N v1
``session/prompt`` requests (turns that stay open; past the proxy's in-flight bound they are
answered with an error) and a last request the agent answers, waits for that answer (so the
backlog is not counted), then closes its end: the time from that EOF to the proxy's exit is
the measure.
Variants, interleaved, same run: ``off`` (no tracing), ``refused`` (tracing, nothing listens on
the collector's port), ``silent`` (tracing, a collector that accepts and never answers) and
``live`` (tracing, a local collector that accepts and discards). ``--root`` times another
checkout too (say, the main branch) in the same run, the way to compare before and after.
Usage: ``python bench/trace_exit.py [--turns N] [--reps N] [--root DIR]...``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
AGENT = r"""
import sys
for line in sys.stdin:
    if '"initialize"' in line:
        sys.stdout.write('{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}\n')
        sys.stdout.flush()
    elif '"_bench/sync"' in line:
        sys.stdout.write('{"jsonrpc":"2.0","id":"sync","result":{}}\n')
        sys.stdout.flush()
"""
SYNC = b'{"jsonrpc":"2.0","id":"sync","method":"_bench/sync","params":{}}\n'
INIT = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n'


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _prompts(n: int) -> bytes:
    return b"".join(
        b'{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{"sessionId":"s%d",'
        b'"prompt":[]}}\n' % (i, i)
        for i in range(1, n + 1)
    )


def exit_after_eof(root: Path, config: Path | None, endpoint: str, data: bytes) -> float:
    """Seconds from the client's EOF to the proxy's exit, once every prompt was read."""
    env = dict(os.environ, PYTHONPATH=str(root), OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    cmd = [sys.executable, "-m", "acp_proxy", "--log-level", "error"]
    if config is not None:
        cmd += ["--config", str(config)]
    cmd += ["--", sys.executable, "-c", AGENT]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=root, bufsize=0
    )
    assert proc.stdin is not None and proc.stdout is not None
    writer = threading.Thread(target=proc.stdin.write, args=(data,), daemon=True)
    writer.start()
    for line in proc.stdout:
        if line.startswith(b'{"jsonrpc":"2.0","id":"sync"'):
            break
    writer.join()
    start = time.perf_counter()
    proc.stdin.close()
    proc.stdout.read()
    proc.wait()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=100_000, help="prompts left open")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--root", action="append", default=[], help="another checkout to time")
    args = ap.parse_args()
    roots = [ROOT, *(Path(r).resolve() for r in args.root)]
    data = INIT + _prompts(args.turns) + SYNC
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # accepts (the backlog) and never answers
    live = HTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=live.serve_forever, daemon=True).start()
    endpoints = {
        "off": "http://127.0.0.1:9",
        "refused": f"http://127.0.0.1:{refused.getsockname()[1]}",
        "silent": f"http://127.0.0.1:{silent.getsockname()[1]}",
        "live": f"http://127.0.0.1:{live.server_address[1]}",
    }
    times: dict[tuple[Path, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tracing.yaml"
        config.write_text("tracing: {enabled: true}\n")
        for _ in range(args.reps):
            for root in roots:
                for variant, endpoint in endpoints.items():  # interleaved
                    used = None if variant == "off" else config
                    spent = exit_after_eof(root, used, endpoint, data)
                    times.setdefault((root, variant), []).append(spent)
    print(f"exit after the client's EOF, {args.turns} turns open, {args.reps} reps (median)")
    print(f"{'checkout':<28}{'variant':<10}{'exit s':>8}{'x off':>8}")
    for root in roots:
        base = statistics.median(times[(root, "off")])
        for variant in endpoints:
            spent = statistics.median(times[(root, variant)])
            print(f"{str(root)[-27:]:<28}{variant:<10}{spent:>8.2f}{spent / base:>8.1f}")
    live.shutdown()


if __name__ == "__main__":
    main()
