"""A relay on the official Python SDK (``agent-client-protocol``), for bench/run.py.

Contract: ``python bench/peer_sdk_relay.py AGENT_CMD [ARG...]`` with the SDK importable
(bench/setup_peers.py installs it into bench/build/peers/py). Two ``acp.connection.Connection``
objects, one on our stdio and one on the agent's pipes, each with a handler that forwards what it
receives to the other side (a request waits for the other side's response). What a user would
write to put a Python-SDK middle box between an editor and an agent; like the conductor it
renumbers request ids. It ends, as a sidecar does, when the agent's output ends (EOF, or the
SDK's receive loop stopping: it fails on a JSON-RPC batch, a list it cannot ``.get`` from):
what was read is flushed to the client, the agent's stdin closed and the agent reaped. When the
client closes its input first, the agent's stdin is closed and the relay waits for its output
to end.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from acp.connection import Connection
from acp.stdio import stdio_streams

LIMIT = 64 * 1024 * 1024


async def main(argv: list[str]) -> int:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=LIMIT
    )
    assert proc.stdin is not None and proc.stdout is not None
    reader, writer = await stdio_streams(limit=LIMIT)
    side: dict[str, Connection] = {}

    def forward(to: str) -> Any:
        async def handler(method: str, params: Any, is_notification: bool) -> Any:
            if is_notification:
                await side[to].send_notification(method, params)
                return None
            return await side[to].send_request(method, params)

        return handler

    side["client"] = Connection(forward("agent"), writer, reader, listening=False)
    side["agent"] = Connection(forward("client"), proc.stdin, proc.stdout, listening=False)
    client_loop = asyncio.ensure_future(side["client"].main_loop())
    agent_loop = asyncio.ensure_future(side["agent"].main_loop())
    await asyncio.wait({client_loop, agent_loop}, return_when=asyncio.FIRST_COMPLETED)
    if not agent_loop.done():  # the client closed its input: the agent's turn to finish
        proc.stdin.close()
        await asyncio.wait({agent_loop})
    for _ in range(3):  # let the handlers of the last messages queue their sends
        await asyncio.sleep(0)
    await side["client"].close()  # the sender writes out its queue first
    proc.stdin.close()
    await proc.wait()
    client_loop.cancel()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
