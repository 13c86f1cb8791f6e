"""``--connect`` retries until ``--connect-timeout``: a sidecar may start before its agent.

"Connection refused" (TCP) and a socket file that does not exist yet (Unix) are retried with a
growing pause until the deadline; the session then runs as if the agent had been there first.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import anyio
import anyio.abc
import pytest
from proxy_harness import TIMEOUT, Lines, Ran, init_response, request, run

pytestmark = pytest.mark.anyio

PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]
# The agent appears this long after the proxy started trying.
LATE_S = 0.8


async def _agent(stream: anyio.abc.SocketStream) -> None:
    lines = Lines(stream)
    assert await lines.line() == request(1, "initialize", {})
    await stream.send(init_response(1, version=1))
    await lines.rest()
    await stream.aclose()


async def test_connect_waits_for_a_unix_agent_that_starts_later(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    result: dict[str, Ran] = {}

    async def proxy() -> None:
        cmd = [*PROXY, "--connect", f"unix://{path}", "--connect-timeout", "5"]
        result["ran"] = await run(cmd, request(1, "initialize", {}))

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(proxy)
            await anyio.sleep(LATE_S)
            listener = await anyio.create_unix_listener(path)
            async with listener, anyio.create_task_group() as serving:
                serving.start_soon(listener.serve, _agent)
                while "ran" not in result:
                    await anyio.sleep(0.02)
                serving.cancel_scope.cancel()
    ran = result["ran"]
    assert (ran.rc, ran.stdout) == (0, init_response(1, version=1)), ran.stderr


async def test_connect_waits_for_a_tcp_agent_that_starts_later() -> None:
    with socket.socket() as probe:  # a free port: refused until the agent listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result: dict[str, Ran] = {}

    async def proxy() -> None:
        cmd = [*PROXY, "--connect", f"tcp://127.0.0.1:{port}", "--connect-timeout", "5"]
        result["ran"] = await run(cmd, request(1, "initialize", {}))

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(proxy)
            await anyio.sleep(LATE_S)
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
            async with listener, anyio.create_task_group() as serving:
                serving.start_soon(listener.serve, _agent)
                while "ran" not in result:
                    await anyio.sleep(0.02)
                serving.cancel_scope.cancel()
    ran = result["ran"]
    assert (ran.rc, ran.stdout) == (0, init_response(1, version=1)), ran.stderr


async def test_connect_refused_gives_up_at_the_timeout(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/nobody.sock"
    started = time.monotonic()
    ran = await run([*PROXY, "--connect", url, "--connect-timeout", "0.6"], request(1, "x"))
    took = time.monotonic() - started
    assert (ran.rc, ran.stdout) == (1, b"")
    assert (
        f"acp-proxy: cannot connect to the agent at {url}: No such file or directory "
        "(tried for 0.6 s, --connect-timeout)\n".encode()
        in ran.stderr
    )
    assert took >= 0.6
