"""How long the live view's event loop stalls while it answers a big ``/export`` or several
``/history`` requests.

Contract: a short, self-contained measure (not part of ``bench/run.py``'s table). In one
process, a hub holding about ``--mb`` MB of events (records mode, frames of 2 KB) is served on
a loopback port; a ticker task on the same event loop (where a session would run) sleeps 1 ms
at a time and records its largest overshoot while the requests are answered. Prints, for a Zed
export and for 8 concurrent ``/history``: the wall time, the ticker's worst stall, and the
process's peak RSS growth. Run it with ``PYTHONPATH=DIR`` to measure another source tree
(``git archive REV acp_proxy | tar -x -C DIR``). Never a timed assertion.

Usage: ``python bench/ui_export_latency.py [--mb N]``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import anyio

from acp_proxy.shell.sockets.address import parse_address
from acp_proxy.shell.sockets.listening import open_listener
from acp_proxy.shell.ui.hub import HubLimits, UiHub
from acp_proxy.shell.ui.live_server import UiServer


async def _get(port: int, target: str) -> int:
    request = f"GET {target}&token=t HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    size = 0
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request.encode())
        while True:
            try:
                size += len(await stream.receive(1 << 20))
            except anyio.EndOfStream:
                return size


async def main(mb: int) -> None:
    hub = UiHub(mode="records", limits=HubLimits(history_bytes=(mb + 8) * 1024 * 1024))
    conn = hub.open_session({"acp-proxy-record": 1})
    raw = (
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"%s"}}}}'
    )
    for n in range(mb * 1024 * 1024 // 2300):
        hub.add_line(conn, {"t": n / 1000, "dir": "agent_to_client", "raw": raw % ("x" * 2000)})
    hub.published()
    listener = await open_listener(
        parse_address("tcp://127.0.0.1:0", listen=True), allow_remote=False, log=None
    )
    port = listener.address.port
    server = UiServer(hub, token="t", port=port, names=["127.0.0.1"], allow_remote=False)
    stall = [0.0]
    running = [True]

    async def ticker() -> None:
        while running[0]:
            start = time.perf_counter()
            await anyio.sleep(0.001)
            stall[0] = max(stall[0], time.perf_counter() - start - 0.001)

    async with anyio.create_task_group() as tg:
        for sock in listener.sockets:
            tg.start_soon(server.serve, sock)
        for label, targets in (
            ("zed export", [f"/export?conn={conn}&format=zed"]),
            ("8 x /history", ["/history?since=0"] * 8),
        ):
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            stall[0] = 0.0
            running[0] = True
            tg.start_soon(ticker)
            start = time.perf_counter()
            async with anyio.create_task_group() as requests:
                for target in targets:
                    requests.start_soon(_get, port, target)
            wall = time.perf_counter() - start
            running[0] = False
            grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) // 1024
            print(
                f"{label:13} {wall:6.2f} s  loop stalled up to {stall[0] * 1000:7.1f} ms  "
                f"peak RSS +{grew} MB (history {hub.history.held // 2**20} MB)",
                flush=True,
            )
            await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    listener.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=64)
    anyio.run(main, parser.parse_args().mb)
    sys.exit(0)
