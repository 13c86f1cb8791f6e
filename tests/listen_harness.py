"""A running ``acp-proxy --listen ...`` as the socket and WebSocket tests drive it: its JSON log
events as they arrive (``Proxy``, ``listening``), the cheap agent ``tests/tiny_agent.py`` and what
it answers, and waiting for an agent process to be gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import orjson
from proxy_harness import REPO, TESTS, Lines, proxy_env, request

PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]
TINY = [sys.executable, "-S", str(TESTS / "tiny_agent.py")]
TIMEOUT = 20.0


class Proxy:
    """A running ``acp-proxy --listen ...``: its JSON log events as they arrive."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.events: list[dict[str, Any]] = []
        self.stderr = b""
        self._changed = anyio.Event()

    async def read_stderr(self) -> None:
        assert self.process.stderr is not None
        lines = Lines(self.process.stderr)
        while True:
            try:
                line = await lines.line()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
            self.stderr += line
            if line.startswith(b"{"):
                self.events.append(orjson.loads(line))
            self._changed.set()
            self._changed = anyio.Event()
        self._changed.set()

    async def event(self, name: str, **match: object) -> dict[str, Any]:
        """The first log event ``name`` whose fields include ``match`` (waits for it)."""
        while True:
            for event in self.events:
                if event["event"] == name and all(event.get(k) == v for k, v in match.items()):
                    return event
            if self.process.returncode is not None and self._changed.is_set():
                raise AssertionError(f"proxy exited without {name!r}: {self.stderr.decode()}")
            await self._changed.wait()

    def count(self, name: str) -> int:
        return sum(1 for event in self.events if event["event"] == name)

    async def address(self) -> str:
        return str((await self.event("listening"))["address"])

    async def connect(self) -> anyio.abc.ByteStream:
        address = await self.address()
        if address.startswith("unix://"):
            return await anyio.connect_unix(address.removeprefix("unix://"))
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        assert host == "127.0.0.1"  # never anywhere else
        return await anyio.connect_tcp("127.0.0.1", int(port))

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    async def wait(self) -> int:
        return await self.process.wait()


@contextlib.asynccontextmanager
async def listening(*args: str, agent: list[str] | None = None) -> AsyncIterator[Proxy]:
    cmd = [*PROXY, *args]
    if agent is not None:
        cmd += ["--", *agent]
    async with await anyio.open_process(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=proxy_env(),
        cwd=str(REPO),
    ) as process:
        proxy = Proxy(process)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(proxy.read_stderr)
                yield proxy
                with anyio.fail_after(TIMEOUT):
                    await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.CancelScope(shield=True):
                    await process.wait()
        # --listen never writes the protocol to stdout.
        assert process.stdout is not None
        with anyio.fail_after(5):
            assert await Lines(process.stdout).rest() == b""


async def exchange(lines: Lines, stream: anyio.abc.ByteStream, frame: bytes) -> bytes:
    await stream.send(frame)
    return await lines.line()


async def agent_pid(lines: Lines, stream: anyio.abc.ByteStream, rid: int = 99) -> int:
    answer = orjson.loads(await exchange(lines, stream, request(rid, "_test/pid")))
    return int(answer["result"]["pid"])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def gone(pid: int) -> None:
    """Wait until ``pid`` no longer exists (the proxy reaped it); bounded by the caller."""
    while alive(pid):
        await anyio.sleep(0.02)


def stream_note(tag: str) -> bytes:
    return (
        orjson.dumps(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": "s",
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": tag},
                    },
                },
            }
        )
        + b"\n"
    )


def echo(rid: int, params: object) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": {"echo": params}}) + b"\n"
