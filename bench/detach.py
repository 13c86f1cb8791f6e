"""What ``detach_grace`` costs an attached session: ``--listen`` streaming with and without it.

    python bench/detach.py [--count 200000] [--rounds 3] [--text 120]

Starts ``acp-proxy --listen unix://...`` (coalescing off) twice per round, without and with
``--detach-grace 60``, with ``tests/tiny_agent.py`` as the agent; one client asks it for
``--count`` ``session/update`` notifications and reads them all and the answer. Prints, per
variant, the median wall time and the proxy's CPU time (user + system, from ``/proc``), and the
ratios with/without: a held session's client side splits what the agent writes into lines only
where a chunk holds an ``"id"`` key, so notifications should cost next to nothing more. Uses
whatever ``acp_proxy`` is importable (``PYTHONPATH``), so the same script measures two trees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, "-S", str(ROOT / "tests" / "tiny_agent.py")]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _one(grace: float, count: int, text: str) -> tuple[float, float]:
    tmp = Path(tempfile.mkdtemp())
    sock = tmp / "s"
    config = tmp / "c.yaml"
    config.write_text("coalesce: {enabled: false}\n")
    cmd = [sys.executable, "-m", "acp_proxy", "--config", str(config), "--log-level", "warning"]
    cmd += ["--listen", f"unix://{sock}", "--detach-grace", str(grace), "--", *AGENT]
    proxy = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:  # bound before it listens: a refused connect is tried again
            try:
                stream = await anyio.connect_unix(str(sock))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                await anyio.sleep(0.01)
        request = {"jsonrpc": "2.0", "id": 1, "method": "_test/stream"}
        request["params"] = {"count": count, "tag": text}
        cpu0 = _cpu_s(proxy.pid)
        t0 = time.perf_counter()
        await stream.send(json.dumps(request).encode() + b"\n")
        end = b'{"jsonrpc":"2.0","id":1,"result":{"streamed":%d}}\n' % count
        tail = b""
        while not tail.endswith(end):
            tail = (tail + await stream.receive(1 << 20))[-len(end) :]
        wall = time.perf_counter() - t0
        cpu = _cpu_s(proxy.pid) - cpu0
        await stream.aclose()
        return wall, cpu
    finally:
        proxy.terminate()
        proxy.wait()


async def main(args: argparse.Namespace) -> None:
    text = "t" * args.text
    results: dict[str, list[tuple[float, float]]] = {"detach_grace 0": [], "detach_grace 60": []}
    for _ in range(args.rounds):
        results["detach_grace 0"].append(await _one(0, args.count, text))
        results["detach_grace 60"].append(await _one(60, args.count, text))
    medians = {}
    for name, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        medians[name] = (wall, cpu)
        print(f"{name:16} wall {wall:.3f} s  proxy cpu {cpu:.3f} s  ({args.count} frames)")
    base, held = medians["detach_grace 0"], medians["detach_grace 60"]
    print(f"ratio with/without: wall {held[0] / base[0]:.3f}, proxy cpu {held[1] / base[1]:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--text", type=int, default=120)
    anyio.run(main, parser.parse_args())
