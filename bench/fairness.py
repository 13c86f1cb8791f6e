"""``--listen`` fairness: a well-behaved client's round trips beside clients that hog the budget.

    python bench/fairness.py [--hogs 24] [--coalesce on|off] [--budget 256MiB] [--frame 64MiB]
                             [--park]

Starts ``acp-proxy --listen`` with an agent per connection that answers every request and, after
a ``stream`` request, writes notifications without end. ``--hogs`` clients send ``stream`` and
never read (or, with ``--park``, send 60 MiB of an unfinished line each); after ``--fill``
seconds a new client makes ``--trips`` round trips; prints the median and p99 latency, or how
many got no answer within ``--timeout`` seconds. Uses whatever ``acp_proxy`` is importable
(``PYTHONPATH``), so the same script measures two trees.
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
from typing import Any

import anyio
import anyio.abc

AGENT = str(Path(__file__).resolve().parent / "flood_agent.py")


def _request(rid: int, method: str) -> bytes:
    return (
        json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": {}}).encode() + b"\n"
    )


async def _line(stream: anyio.abc.ByteStream, buf: bytearray) -> bytes:
    while b"\n" not in buf:
        buf += await stream.receive()
    i = buf.index(b"\n")
    line = bytes(buf[: i + 1])
    del buf[: i + 1]
    return line


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp())
    sock = tmp / "s"
    config = tmp / "c.yaml"
    config.write_text(
        f"max_buffer_bytes: {args.budget}\nmax_frame_bytes: {args.frame}\n"
        f"coalesce:\n  enabled: {args.coalesce == 'on'}\n"
    )
    log = (tmp / "log").open("wb")
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "--config",
            str(config),
            "--listen",
            f"unix://{sock}",
            "--",
            sys.executable,
            AGENT,
        ],
        stdin=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        while not sock.exists():
            await anyio.sleep(0.05)
        hogs: list[tuple[anyio.abc.ByteStream, Any]] = []
        for _ in range(args.hogs):
            hog = await anyio.connect_unix(str(sock))
            await hog.send(_request(0, "initialize"))
            if args.park:
                part = b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"t":"' + b"p" * (60 << 20)

                async def park(h: anyio.abc.ByteStream = hog, part: bytes = part) -> None:
                    with anyio.move_on_after(args.fill + 5):
                        await h.send(part)

                hogs.append((hog, park))
            else:
                await hog.send(_request(1, "stream"))
                hogs.append((hog, None))
        async with anyio.create_task_group() as tg:
            for _, park in hogs:
                if park is not None:
                    tg.start_soon(park)
            await anyio.sleep(args.fill)
            good = await anyio.connect_unix(str(sock))
            buf = bytearray()
            times: list[float] = []
            missing = 0
            for i in range(args.trips):
                started = time.perf_counter()
                await good.send(_request(i, "initialize" if i == 0 else "ping"))
                with anyio.move_on_after(args.timeout) as scope:
                    await _line(good, buf)
                if scope.cancelled_caught:
                    missing = args.trips - i
                    break
                times.append(time.perf_counter() - started)
            tg.cancel_scope.cancel()
        if times:
            times.sort()
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            print(
                f"hogs={args.hogs} park={args.park} coalesce={args.coalesce} "
                f"budget={args.budget}: {len(times)} round trips, median "
                f"{statistics.median(times) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"
                + (f", {missing} with no answer in {args.timeout:g} s" if missing else "")
            )
        else:
            print(
                f"hogs={args.hogs} park={args.park} coalesce={args.coalesce} "
                f"budget={args.budget}: no answer in {args.timeout:g} s"
            )
    finally:
        proxy.kill()
        proxy.wait()
        log.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--hogs", type=int, default=24)
    parser.add_argument("--coalesce", choices=("on", "off"), default="on")
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--frame", default="64MiB", help="max_frame_bytes")
    parser.add_argument("--park", action="store_true")
    parser.add_argument("--fill", type=float, default=10.0)
    parser.add_argument("--trips", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=10.0)
    anyio.run(main, parser.parse_args())
    os._exit(0)
