"""A test playing the conductor of ``acp-proxy component``: its process, handshakes, envelopes."""

from __future__ import annotations

import sys

import anyio
import orjson
from proxy_harness import REPO, TESTS, TIMEOUT, Lines, proxy_env

CONDUCTORS = TESTS / "conductors"


SPEC_CONDUCTOR = CONDUCTORS / "spec_conductor.py"


ANNOTATE = REPO / "bench" / "rules-annotate.yaml"


EXACT = CONDUCTORS / "annotate-exact.yaml"


COMPONENT = [sys.executable, "-m", "acp_proxy", "component"]


INIT_PARAMS = b'{"protocolVersion":2,"clientCapabilities":{"fs":{"readTextFile":true}}}'


TW_PARAMS = b'{"protocolVersion":2,"_meta":{"proxy":true}}'


INIT_RESULT = b'{"protocolVersion":2,"agentCapabilities":{},"authMethods":[]}'


INIT_LINE = {
    "official": b'{"jsonrpc":"2.0","id":0,"method":"proxy/initialize","params":'
    + INIT_PARAMS
    + b"}",
    "sacp": b'{"jsonrpc":"2.0","id":0,"method":"_proxy/initialize","params":' + INIT_PARAMS + b"}",
    "thinkwell": b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":' + TW_PARAMS + b"}",
}


ENVELOPE = {
    "official": (b"proxy/successor", b"proxy/successor"),
    "sacp": (b"_proxy/successor", b"_proxy/successor"),
    "thinkwell": (b"_proxy/successor/request", b"_proxy/successor/notification"),
}


class Component:
    """A running ``acp-proxy component`` driven by the test as its conductor."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self.out = Lines(process.stdout)

    async def send(self, *lines: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(b"".join(line + b"\n" for line in lines))

    async def line(self) -> bytes:
        with anyio.fail_after(TIMEOUT):
            return (await self.out.line()).rstrip(b"\n")

    async def close(self) -> tuple[int, bytes]:
        """Close its stdin (the conductor goes away): its exit code and its stderr."""
        assert self.process.stdin is not None and self.process.stderr is not None
        await self.process.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            rest = await self.out.rest()
            rc = await self.process.wait()
            err = b""
            async for chunk in self.process.stderr:
                err += chunk
        # Requests still in flight when the conductor left get -32603 errors (written into a
        # closing connection: harmless, and the same rule as standalone); nothing else.
        for line in rest.splitlines():
            assert orjson.loads(line)["error"]["code"] == -32603, rest
        return rc, err


async def start(*args: str) -> Component:
    process = await anyio.open_process(
        [*COMPONENT, "--log-format", "json", *args], env=proxy_env(), cwd=str(REPO)
    )
    return Component(process)


def wrapped(dialect: str, ident: bytes | None, method: bytes, params: bytes) -> bytes:
    """An envelope exactly as the component builds it (members in JSON-RPC order)."""
    request, notification = ENVELOPE[dialect]
    head = b'{"jsonrpc":"2.0"' + (b',"id":' + ident if ident is not None else b"")
    name = request if ident is not None else notification
    return (
        head
        + b',"method":"'
        + name
        + b'","params":{"method":"'
        + method
        + b'","params":'
        + params
        + b"}}"
    )


async def handshake(comp: Component, dialect: str) -> None:
    await comp.send(INIT_LINE[dialect])
    params = TW_PARAMS if dialect == "thinkwell" else INIT_PARAMS
    assert await comp.line() == wrapped(dialect, b"0", b"initialize", params)
    await comp.send(b'{"jsonrpc":"2.0","id":0,"result":' + INIT_RESULT + b"}")
    answer = await comp.line()
    if dialect == "thinkwell":  # the TypeScript conductor refuses an answer without it
        assert answer == (
            b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2,"agentCapabilities":{},'
            b'"authMethods":[],"_meta":{"proxy":true}}}'
        )
    else:
        assert answer == b'{"jsonrpc":"2.0","id":0,"result":' + INIT_RESULT + b"}"
