"""``detach_grace`` on the server's side: a new connection's opening, and held agents' lives.

Contract: owns what ``--listen`` does with a connection when ``detach_grace`` is on
(``serve_detachable``): while agents are held, a new connection's ``initialize`` may be answered
from a held agent's answer and its ``session/load`` / ``session/resume`` may reattach it to that
agent (``opening``); otherwise a new agent is started (or, with ``--connect``, connected to)
and held (``HeldSession``, ``detach``),
running in the server's task group until it ends (``run_held``: the record's end, the log line,
the server's count of held agents). The server (``server``) keeps the table of held agents and
stops them at shutdown.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.abc

from acp_proxy.config import Config
from acp_proxy.shell.agent.process import describe_status, spawn_agent
from acp_proxy.shell.agent.spawn import SpawnError
from acp_proxy.shell.sockets.address import Address
from acp_proxy.shell.sockets.connect import ConnectError, connect
from acp_proxy.shell.sockets.detach import HeldSession
from acp_proxy.shell.sockets.opening import error_line
from acp_proxy.shell.sockets.streams import PrefixedReceiveStream, close_with
from acp_proxy.shell.streams.transports import STREAM_ERRORS
from acp_proxy.wire.attach import initialize_request, reattach_request, response

_LEFT = "client left before joining a session"


class Server(Protocol):
    """What a held agent needs of its server (``server._Server``)."""

    config: Config
    agent_argv: list[str]
    agent_address: Address | None
    holds: dict[int, HeldSession]
    tasks: anyio.abc.TaskGroup | None

    def maybe_idle(self) -> None: ...


async def serve_detachable(
    server: Server,
    conn: int,
    stream: anyio.abc.ByteStream,
    first: bytes,
    *,
    shutdown: anyio.Event,
    log: Any,
    principal: str | None = None,
) -> str:
    """Serve connection ``conn`` (its first line ``first`` read): join a held agent
    (``opening``) or start one that outlives this connection; returns the connection's status.
    ``principal``: whom the connection's token names; it joins only agents held for the same
    one, and the agent it starts is held for it."""
    from acp_proxy.shell.record.recorder import open_recorder

    config = server.config
    opened: tuple[bytes, Any] | str = "closed at shutdown before a session"
    async with anyio.create_task_group() as tg:

        async def on_shutdown() -> None:
            await shutdown.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(on_shutdown)
        opened = await opening(server.holds, stream, first, config, log, principal=principal)
        tg.cancel_scope.cancel()
    if isinstance(opened, str):
        return opened
    head, answered = opened
    held = HeldSession(config, conn, log, principal)
    if answered is not None:
        held.ledger.swallow(answered)
    address = server.agent_address
    if address is None:
        try:
            agent = await spawn_agent(server.agent_argv, config.agent)
        except SpawnError as exc:
            log.error("cannot start the agent", error=str(exc))
            await close_with(stream, error_line(f"acp-proxy: cannot start the agent: {exc}"))
            return f"agent not started: {exc}"
        held.log = log = log.bind(agent_pid=agent.pid)
        log.info("agent started", agent=server.agent_argv)
        held.recorder = open_recorder(config, log=log, agent=server.agent_argv, conn=conn)
        observers = [held.recorder] if held.recorder else []

        async def run() -> tuple[str, dict[str, Any], int | None]:
            rc, session = await held.run(agent, observers)
            status = f"agent {describe_status(rc)}" if rc is not None else "failed"
            return status, session.summary(), rc

    else:
        # The agent behind ``--connect``: its connection is held like a spawned agent, and
        # closed (half-closed first, as at a connection's end) when the grace time ends.
        label = str(address)
        try:
            agent_stream = await connect(address, config.connect_timeout_s, config)
        except ConnectError as exc:
            log.error("cannot connect to the agent", error=str(exc))
            await close_with(stream, error_line(f"acp-proxy: {exc}"))
            return str(exc)
        held.recorder = open_recorder(config, log=log, connect=label, conn=conn)
        observers = [held.recorder] if held.recorder else []

        async def run() -> tuple[str, dict[str, Any], int | None]:
            try:
                lost, session = await held.run_remote(agent_stream, label, observers)
            finally:
                with anyio.CancelScope(shield=True):
                    await agent_stream.aclose()
            status = f"agent connection to {label} " + ("lost" if lost else "closed")
            return status, session.summary(), None

    server.holds[conn] = held
    held.attach_first(stream)
    assert server.tasks is not None
    server.tasks.start_soon(run_held, server, held, run)
    await held.serve(stream, PrefixedReceiveStream(head, stream))
    return "agent session ended" if held.ended.is_set() else "client detached"


async def run_held(
    server: Server,
    held: HeldSession,
    run: Callable[[], Awaitable[tuple[str, dict[str, Any], int | None]]],
) -> None:
    """Run ``held``'s agent session to its end (``run``: its status, summary and the agent's
    return code, ``None`` for an agent on a socket), then finish its record and forget it."""
    from acp_proxy.shell.record.recorder import exit_info

    status = "failed"
    rc: int | None = None
    summary: dict[str, Any] = {}
    recorder = held.recorder
    try:
        status, summary, rc = await run()
    except Exception:  # isolation, as for a connection
        held.log.exception("session failed")
    finally:
        if recorder is not None:
            with anyio.CancelScope(shield=True):
                info = exit_info(rc) if rc is not None else {"status": status}
                await anyio.to_thread.run_sync(recorder.finish, info)
        del server.holds[held.id]
        server.maybe_idle()
        held.log.info("agent session ended", status=status, **summary)


class LineReader:
    """Whole lines from a connection that has not joined a session yet."""

    def __init__(self, rx: anyio.abc.ByteReceiveStream, max_bytes: int) -> None:
        self._rx = rx
        self._buffer = b""
        self._max = max_bytes

    async def line(self) -> bytes | None:
        """The next line without its newline; ``None`` at EOF, an error or an oversize line."""
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > self._max:
                return None
            try:
                self._buffer += await self._rx.receive()
            except (anyio.EndOfStream, *STREAM_ERRORS):
                return None
        line, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
        return line

    def rest(self) -> bytes:
        data, self._buffer = self._buffer, b""
        return data


def latest_with_init(
    holds: dict[int, HeldSession], version: object, principal: str | None = None
) -> HeldSession | None:
    """The newest held session of ``principal`` whose agent answered ``initialize`` with
    protocol ``version`` (what a new connection's ``initialize`` asking for it is answered from
    while it may be a reattach)."""
    for held in reversed(holds.values()):
        result = held.ledger.init_result
        if (
            result is not None
            and result.get("protocolVersion") == version
            and held.joinable
            and held.principal == principal
        ):
            return held
    return None


def find(
    holds: dict[int, HeldSession], session: str, principal: str | None = None
) -> HeldSession | None:
    """The held agent of ``principal`` that has ``session``. Another principal's is never
    found: a load naming it is a load like any other (a new agent), whether it exists or not."""
    for held in holds.values():
        if session in held.ledger.sessions and held.joinable and held.principal == principal:
            return held
    return None


async def opening(
    holds: dict[int, HeldSession],
    client: anyio.abc.ByteStream,
    first: bytes,
    config: Config,
    log: Any,
    *,
    principal: str | None = None,
) -> tuple[bytes, Any] | str:
    """A new connection's opening while agents are held: an ``initialize`` asking for the
    protocol version a held agent answered with is answered from that answer, then a
    ``session/load`` / ``session/resume`` naming a held session reattaches to it (served
    here). Returns ``(what to send a new agent first, the id of an initialize the proxy
    answered already)``, or the connection's status when it is over."""
    if not holds:
        return first, None
    reader = LineReader(PrefixedReceiveStream(first, client), config.max_frame_bytes)
    line1 = await reader.line()
    if line1 is None:
        return _LEFT
    init = initialize_request(line1)
    template = latest_with_init(holds, init[1], principal) if init is not None else None
    if init is None or template is None:
        return line1 + b"\n" + reader.rest(), None
    rid = init[0]
    try:
        await client.send(response(rid, template.ledger.init_result) + b"\n")
    except STREAM_ERRORS:
        return _LEFT
    while True:
        with anyio.move_on_after(config.handshake_timeout_s):
            line2 = await reader.line()
        if line2 is None:
            return _LEFT
        request = reattach_request(line2)
        held = find(holds, request[2], principal) if request is not None else None
        if request is None or held is None:
            return line1 + b"\n" + line2 + b"\n" + reader.rest(), rid
        refusal = await held.reattach(client, reader.rest(), request, line2)
        if refusal is None:
            return f"reattached to the agent of connection {held.id}; client left"
        try:
            await client.send(refusal + b"\n")
        except STREAM_ERRORS:
            return _LEFT
        log.info("reattach refused", session=request[2])


__all__ = ["LineReader", "find", "latest_with_init", "opening", "run_held", "serve_detachable"]
