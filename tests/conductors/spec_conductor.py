"""A conductor for the tests, written from the proxy-chains spec text (not from acp_proxy).

    spec_conductor.py --dialect official|sacp [--trace FILE] [--id-base N] -- CMD_JSON... AGENT_JSON

Each CMD_JSON is the argv of one proxy component as a JSON array; the last is the agent. The
client is our stdin/stdout. Standard library only; it never imports acp_proxy, so a bug in the
component's envelope code cannot hide behind a shared one.

Routing, as the RFD "Agent Extensions via ACP Proxies" (agent-client-protocol
docs/rfds/proxy-chains.mdx) and the Rust conductor (rust-sdk
src/agent-client-protocol-conductor/src/conductor.rs) describe it:

* ``initialize`` from the client goes to the first component as ``proxy/initialize``
  (``_proxy/initialize`` in the Rust SDK 0.x-2.x dialect); a component's wrapped ``initialize``
  reaches the next component the same way, and the agent as a plain ``initialize``.
* Every other client message goes to the first component plain. A component's envelope
  (``proxy/successor`` / ``_proxy/successor``, params ``{method, params}``) goes to its successor,
  unwrapped; anything else a component sends goes to its predecessor: plain to the client, or
  wrapped in an envelope to the previous component. The agent's messages go to the last
  component wrapped.
* Request ids are allocated per connection (``--id-base`` is where each component connection's
  counter starts, so the component cannot assume the client's ids). Responses go back to where
  the request came from with the same result or error value.
* ``$/cancel_request`` is hop by hop: it names a request on the connection it arrives on, and
  the conductor cancels the request it forwarded, with that connection's id.
* When a component or the agent exits, the requests in flight to it are answered by the
  conductor itself with ``-32603`` ("Errors the conductor returns itself, for example because
  the successor has exited, are not wrapped results"), then the chain is shut down.

``--trace FILE``: every line written to or read from a component or the agent, as
``<conn> <to|from> <exact bytes>`` lines (the tests check the component's wire byte for byte).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

CLIENT = -1  # the client's connection index
GONE_CODE = -32603


class Conductor:
    def __init__(self, dialect: str, commands: list[list[str]], trace: Any, id_base: int) -> None:
        self.init_method = "proxy/initialize" if dialect == "official" else "_proxy/initialize"
        self.envelope = "proxy/successor" if dialect == "official" else "_proxy/successor"
        self.commands = commands
        self.agent = len(commands) - 1
        self.trace = trace
        self.procs: list[asyncio.subprocess.Process] = []
        self.next_id: dict[int, int] = {CLIENT: 0}
        self.id_base = id_base
        # (connection, id we sent on it) -> (origin connection, origin id)
        self.pending: dict[tuple[int, Any], tuple[int, Any]] = {}
        # (origin connection, origin id) -> (connection, id we sent on it): for cancels
        self.forwarded: dict[tuple[int, Any], tuple[int, Any]] = {}
        self.stdout = sys.stdout.buffer
        self.done = asyncio.Event()

    # -- wire ----------------------------------------------------------------------------------

    def write(self, conn: int, message: dict[str, Any]) -> None:
        raw = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
        if conn == CLIENT:
            self.stdout.write(raw + b"\n")
            self.stdout.flush()
            return
        proc = self.procs[conn]
        if proc.stdin is None or proc.stdin.is_closing():
            return
        self.log(conn, b"to", raw)
        proc.stdin.write(raw + b"\n")

    def log(self, conn: int, way: bytes, raw: bytes) -> None:
        if self.trace is not None:
            name = b"agent" if conn == self.agent else b"component%d" % conn
            self.trace.write(name + b" " + way + b" " + raw + b"\n")
            self.trace.flush()

    def request(self, conn: int, method: str, params: Any, origin: tuple[int, Any]) -> None:
        out_id = self.next_id.setdefault(conn, self.id_base if conn != CLIENT else 0)
        self.next_id[conn] = out_id + 1
        self.pending[(conn, out_id)] = origin
        self.forwarded[origin] = (conn, out_id)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": out_id, "method": method}
        if params is not None:
            message["params"] = params
        self.write(conn, message)

    def notify(self, conn: int, method: str, params: Any) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.write(conn, message)

    def respond(self, conn: int, message: dict[str, Any]) -> None:
        origin = self.pending.pop((conn, message.get("id")), None)
        if origin is None:
            return
        self.forwarded.pop(origin, None)
        out: dict[str, Any] = {"jsonrpc": "2.0", "id": origin[1]}
        if "error" in message:
            out["error"] = message["error"]
        else:
            out["result"] = message.get("result")
        self.write(origin[0], out)

    def cancel(self, conn: int, params: Any) -> None:
        """Hop by hop: cancel what we forwarded for ``conn``'s request ``requestId``."""
        request_id = params.get("requestId") if isinstance(params, dict) else None
        target = self.forwarded.get((conn, request_id))
        if target is not None:
            self.notify(target[0], "$/cancel_request", {"requestId": target[1]})

    # -- routing -------------------------------------------------------------------------------

    def toward_successor(self, source: int, message: dict[str, Any]) -> None:
        """A message from the client (source CLIENT) or unwrapped from component ``source``."""
        target = source + 1
        method, params = message["method"], message.get("params")
        if method == "initialize" and target != self.agent:
            method = self.init_method
        if "id" in message:
            self.request(target, method, params, (source, message["id"]))
        else:
            self.notify(target, method, params)

    def toward_predecessor(self, source: int, message: dict[str, Any]) -> None:
        """A message component or agent ``source`` sent to its predecessor."""
        target = source - 1
        if target == CLIENT:
            if "id" in message:
                self.request(
                    CLIENT, message["method"], message.get("params"), (source, message["id"])
                )
            else:
                self.notify(CLIENT, message["method"], message.get("params"))
            return
        inner: dict[str, Any] = {"method": message["method"]}
        if "params" in message:
            inner["params"] = message["params"]
        if "id" in message:
            self.request(target, self.envelope, inner, (source, message["id"]))
        else:
            self.notify(target, self.envelope, inner)

    def from_client(self, message: dict[str, Any]) -> None:
        if "method" not in message:
            self.respond(CLIENT, message)
        elif message["method"] == "$/cancel_request":
            self.cancel(CLIENT, message.get("params"))
        else:
            self.toward_successor(CLIENT, message)

    def from_component(self, conn: int, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:
            self.respond(conn, message)
        elif method == "$/cancel_request":
            self.cancel(conn, message.get("params"))
        elif method == self.envelope and conn != self.agent:
            params = message.get("params") or {}
            inner: dict[str, Any] = {"method": params["method"]}
            if params.get("params") is not None:
                inner["params"] = params["params"]
            if inner["method"] == "$/cancel_request":  # the older wrapped form
                self.cancel(conn, inner.get("params"))
                return
            if "id" in message:
                inner["id"] = message["id"]
            self.toward_successor(conn, inner)
        else:
            self.toward_predecessor(conn, message)

    def gone(self, conn: int) -> None:
        """``conn`` exited: the conductor answers what was in flight to it itself."""
        for (target, out_id), origin in list(self.pending.items()):
            if target == conn:
                del self.pending[(target, out_id)]
                self.forwarded.pop(origin, None)
                error = {"code": GONE_CODE, "message": "successor exited"}
                self.write(origin[0], {"jsonrpc": "2.0", "id": origin[1], "error": error})

    # -- tasks ---------------------------------------------------------------------------------

    async def read_client(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 26)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            if line.strip():
                self.from_client(json.loads(line))
        self.done.set()

    async def read_component(self, conn: int) -> None:
        proc = self.procs[conn]
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            raw = line.rstrip(b"\n")
            self.log(conn, b"from", raw)
            if raw.strip():
                self.from_component(conn, json.loads(raw))
        await proc.wait()
        self.gone(conn)
        self.done.set()

    async def run(self) -> int:
        for argv in self.commands:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 26
            )
            self.procs.append(proc)
        tasks = [asyncio.create_task(self.read_component(i)) for i in range(len(self.procs))]
        tasks.append(asyncio.create_task(self.read_client()))
        await self.done.wait()
        # Shut the chain down: close every input, wait, then kill what is left.
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="spec_conductor.py")
    parser.add_argument("--dialect", choices=("official", "sacp"), default="official")
    parser.add_argument("--trace", metavar="FILE")
    parser.add_argument("--id-base", type=int, default=1000)
    parser.add_argument("commands", nargs="+", help="JSON argv arrays; the last is the agent")
    args = parser.parse_args()
    commands = [json.loads(text) for text in args.commands]
    trace = open(args.trace, "ab") if args.trace else None  # noqa: SIM115
    try:
        return asyncio.run(Conductor(args.dialect, commands, trace, args.id_base).run())
    finally:
        if trace is not None:
            trace.close()


if __name__ == "__main__":
    sys.exit(main())
