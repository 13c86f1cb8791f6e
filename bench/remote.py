"""``--listen ws://`` beside ``--listen unix://``: round trip and throughput, as ratios.

    python bench/remote.py [--trips 2000] [--messages 20000] [--window 500]

Contract: measures and reports, never asserts. Starts two proxies in the same run, each serving
``bench/echo_agent.py`` (one agent per connection): one on a Unix socket, one on
``ws://127.0.0.1`` with a bearer token (``auth.token_file``). Against each: ``--trips``
sequential ``session/prompt`` round trips (p50 and p99 wall time, and the proxy's user + system
CPU per round trip, ``/proc/PID/stat``), then ``--messages`` requests pipelined ``--window`` at
a time (messages per second, proxy CPU per message). The Unix client is a plain socket; the
WebSocket client is ``websockets``' sync client (its framing and masking are part of what a
remote editor pays, so the wall-time ratio includes the client's side; the CPU ratio is the
proxy's alone). Prints each figure and the ratio ws / unix, measured in this run. Blocks
alternate between the two so that the machine's drift is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from websockets.sync.client import connect as ws_connect

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
AGENT = [sys.executable, str(BENCH / "echo_agent.py")]
TOKEN = "bench-token-0123456789abcdef"
INIT = {"protocolVersion": 2, "info": {"name": "bench", "version": "1"}, "capabilities": {}}
PROMPT = {"sessionId": "s", "prompt": [{"type": "text", "text": "ping"}]}


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _request(rid: int, method: str, params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()


def _start(url: str, config: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "acp_proxy", "--log-format", "json"),
            *("--config", str(config), "--listen", url, "--", *AGENT),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=str(ROOT),
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        event = json.loads(line) if line.startswith(b"{") else {}
        if event.get("event") == "listening":
            return proc, str(event["address"])
    raise SystemExit(f"the proxy at {url} did not start")


class Unix:
    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(address.removeprefix("unix://"))
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data + b"\n")

    def recv(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def close(self) -> None:
        self.sock.close()


class Ws:
    def __init__(self, address: str) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        self.opened = ws_connect(
            address, additional_headers=headers, compression=None, max_size=None
        )
        self.ws = self.opened.__enter__()

    def send(self, data: bytes) -> None:
        self.ws.send(data, text=True)

    def recv(self) -> bytes:
        got = self.ws.recv(decode=False)
        assert isinstance(got, bytes)
        return got

    def close(self) -> None:
        self.opened.__exit__(None, None, None)


def _trips(client: Unix | Ws, start: int, count: int) -> list[float]:
    out = []
    for rid in range(start, start + count):
        t0 = time.perf_counter()
        client.send(_request(rid, "session/prompt", PROMPT))
        client.recv()
        out.append(time.perf_counter() - t0)
    return out


def _flood(client: Unix | Ws, start: int, count: int, window: int) -> None:
    rid = start
    while rid < start + count:
        n = min(window, start + count - rid)
        for i in range(n):
            client.send(_request(rid + i, "session/prompt", PROMPT))
        for _ in range(n):
            client.recv()
        rid += n


def _alternate(
    pids: dict[str, int], run: Callable[[str, int], object], blocks: int
) -> dict[str, float]:
    """Run ``run(name, block)`` for each variant, alternating; the proxy CPU each spent."""
    cpu = dict.fromkeys(pids, 0.0)
    for block in range(blocks):
        for name, pid in pids.items():
            before = _cpu_s(pid)
            run(name, block)
            cpu[name] += _cpu_s(pid) - before
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--window", type=int, default=500)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    token = tmp / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    config = tmp / "c.yaml"
    config.write_text(f"auth: {{token_file: {token}}}\n")
    procs = {}
    clients: dict[str, Unix | Ws] = {}
    try:
        for name, url in (("unix", f"unix://{tmp / 's.sock'}"), ("ws", "ws://127.0.0.1:0/acp")):
            proc, address = _start(url, config)
            procs[name] = proc
            clients[name] = Unix(address) if name == "unix" else Ws(address)
            clients[name].send(_request(0, "initialize", INIT))
            clients[name].recv()
        pids = {name: p.pid for name, p in procs.items()}
        blocks = 10
        trips: dict[str, list[float]] = {name: [] for name in procs}
        per = max(1, args.trips // blocks)

        def trip_block(name: str, block: int) -> None:
            trips[name] += _trips(clients[name], 1 + block * per, per)

        trip_cpu = _alternate(pids, trip_block, blocks)
        walls: dict[str, float] = dict.fromkeys(procs, 0.0)
        flood_per = max(args.window, args.messages // blocks)

        def flood_block(name: str, block: int) -> None:
            t0 = time.perf_counter()
            _flood(clients[name], 10**7 + block * flood_per, flood_per, args.window)
            walls[name] += time.perf_counter() - t0

        flood_cpu = _alternate(pids, flood_block, blocks)
    finally:
        for client in clients.values():
            client.close()
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)
    rows = {}
    for name in procs:
        times = sorted(trips[name])
        sent = flood_per * blocks
        rows[name] = {
            "rtt_p50_us": statistics.median(times) * 1e6,
            "rtt_p99_us": times[int(len(times) * 0.99) - 1] * 1e6,
            "cpu_per_trip_us": trip_cpu[name] / len(times) * 1e6,
            "msgs_per_s": sent / walls[name],
            "cpu_per_msg_us": flood_cpu[name] / sent * 1e6,
        }
    print(f"{'':18}{'unix://':>12}{'ws://':>12}{'ws / unix':>12}")
    for key in rows["unix"]:
        u, w = rows["unix"][key], rows["ws"][key]
        print(f"{key:18}{u:12.1f}{w:12.1f}{w / u:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
