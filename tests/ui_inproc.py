"""The live view's server in-process on a real listening socket, for the live-view tests that
need the hub at hand (what it holds, what it counts) while real requests reach it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from acp_proxy.shell.sockets.address import parse_address
from acp_proxy.shell.sockets.listening import open_listener
from acp_proxy.shell.ui.hub import UiHub
from acp_proxy.shell.ui.live_server import UiServer


@dataclass
class Served:
    server: UiServer
    port: int

    async def get(self, target: str, token: str = "t", **headers: str) -> tuple[int, bytes]:
        """One request (with the token) on a fresh connection: (status, body)."""
        sep = "&" if "?" in target else "?"
        head = f"GET {target}{sep}token={token} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        async with await anyio.connect_tcp("127.0.0.1", self.port) as stream:
            await stream.send((head + "\r\n").encode())
            data = b""
            while True:
                try:
                    data += await stream.receive(1 << 20)
                except anyio.EndOfStream:
                    break
        head_bytes, _, body = data.partition(b"\r\n\r\n")
        return int(head_bytes.split(b" ", 2)[1]), body


@asynccontextmanager
async def serving(hub: UiHub, **options: Any) -> AsyncIterator[Served]:
    """``hub``'s server on a free loopback port (token ``t``) until the block ends."""
    listener = await open_listener(
        parse_address("tcp://127.0.0.1:0", listen=True), allow_remote=False, log=None
    )
    port = listener.address.port
    server = UiServer(hub, token="t", port=port, names=["127.0.0.1"], allow_remote=False, **options)
    try:
        async with anyio.create_task_group() as tg:
            for sock in listener.sockets:
                tg.start_soon(server.serve, sock)
            yield Served(server, port)
            tg.cancel_scope.cancel()
    finally:
        listener.close()
