"""``--listen``: serve clients on a socket, one session (and one agent) per connection.

Contract: owns the server: accepting connections, the connection limit (a refused client is
told why), the opening of each connection (the HTTP guard, the handshake timeout; the agent
starts only once the client's first line is in and is not HTTP), running each connection as one
session of ``runtime`` (its own agent process or agent connection, its own ``Connection``, its
own queues; one session's failure never takes down the others), and the server's signals and
graceful shutdown (a bound, then the remaining agents are killed). Beyond the opening line it
never looks inside a frame.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from acp_proxy.config import Config
from acp_proxy.shell.agent.process import (
    STDOUT_LINGER_S,
    describe_status,
    exit_code_of,
    spawn_agent,
)
from acp_proxy.shell.agent.spawn import SpawnError
from acp_proxy.shell.log.logsetup import get_logger, say_fatal
from acp_proxy.shell.session import hooks
from acp_proxy.shell.sockets.address import EXIT_USAGE, Address, AddressError, parse_address
from acp_proxy.shell.sockets.connect import ConnectError, connect
from acp_proxy.shell.sockets.listening import Listener, ListenError, open_listener
from acp_proxy.shell.sockets.opening import Opening, OpeningReader, error_line, http_forbidden
from acp_proxy.shell.sockets.serving import accept
from acp_proxy.shell.sockets.streams import PrefixedReceiveStream, SocketStream, close_with
from acp_proxy.shell.streams.transports import STREAM_ERRORS

if TYPE_CHECKING:
    from acp_proxy.shell.sockets.detach import HeldSession
    from acp_proxy.shell.ws.wsserver import WsServer

# Refusals (over --max-connections) draining at once; beyond that the accept loop waits for one
# to finish (new connections wait in the listen backlog) rather than close one without a word.
MAX_REFUSING = 128
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def shutdown_bound_s(config: Config) -> float:
    """The longest a graceful shutdown may take before the remaining agents are killed: the
    ladder (grace, SIGTERM, grace) plus the stdout linger of each, plus slack."""
    return 2 * config.agent.grace_period_s + 3 * STDOUT_LINGER_S + 1.0


@dataclass(slots=True)
class _Conn:
    id: int
    shutdown: anyio.Event = field(default_factory=anyio.Event)


class _Server:
    def __init__(
        self,
        config: Config,
        agent_argv: Sequence[str],
        agent_address: Address | None,
        listener: Listener,
        log: Any,
    ) -> None:
        self.config = config
        self.agent_argv = list(agent_argv)
        self.agent_address = agent_address
        self.listener = listener
        self.log = log
        self.active: dict[int, _Conn] = {}
        self.next_id = 1
        self.refusal_slots = anyio.Semaphore(MAX_REFUSING)
        self.stopping = anyio.Event()
        self.idle = anyio.Event()
        self.accepted = 0
        self.refused = 0
        # detach_grace: agents kept across client connections, by their first connection's id.
        self.holds: dict[int, HeldSession] = {}
        self.tasks: anyio.abc.TaskGroup | None = None
        self.websocket: WsServer | None = None  # a ws:// or wss:// listener's upgrade

    async def run(self, signals: AsyncIterator[signal.Signals]) -> None:
        async with anyio.create_task_group() as outer:
            outer.start_soon(self._watch_signals, signals, outer.cancel_scope)
            async with anyio.create_task_group() as conns:
                self.tasks = conns
                async with anyio.create_task_group() as accepting:
                    for sock in self.listener.sockets:
                        accepting.start_soon(self._accept_loop, sock, conns)
                    hooks.listening(True)
                    await self.stopping.wait()
                    hooks.listening(False)
                    accepting.cancel_scope.cancel()
                self.listener.close()  # stop accepting; the Unix socket file goes now
                bound = shutdown_bound_s(self.config)
                self.log.info(
                    "stopped accepting; closing sessions",
                    open=len(self.active),
                    bound_s=bound,
                )
                for conn in self.active.values():
                    conn.shutdown.set()
                for held in self.holds.values():
                    held.shutdown.set()
                if self.active or self.holds:
                    with anyio.move_on_after(bound) as waited:
                        await self.idle.wait()
                    if waited.cancelled_caught:
                        # Each session's own clean-up SIGKILLs its agent group when cancelled.
                        self.log.warning(
                            "sessions still open after the shutdown bound; killing their agents",
                            open=len(self.active),
                            bound_s=bound,
                        )
                conns.cancel_scope.cancel()
            outer.cancel_scope.cancel()

    async def _watch_signals(
        self, signals: AsyncIterator[signal.Signals], cancel_all: anyio.CancelScope
    ) -> None:
        async for signum in signals:
            reloaders = hooks.reloaders() if signum is signal.SIGHUP else ()
            if reloaders and not self.stopping.is_set():
                # A daemon's reload: the budgets' limits are read again; nothing stops.
                for reload in reloaders:
                    reload()
                self.log.info("signal received; configuration reloaded", signal=signum.name)
                continue
            if not self.stopping.is_set():
                self.log.info("signal received; shutting down", signal=signum.name)
                self.stopping.set()
            else:
                # A second signal: do not wait for the ladder.
                self.log.warning("second signal; killing all agents now", signal=signum.name)
                cancel_all.cancel()

    async def _accept_loop(self, sock: socket.socket, conns: anyio.abc.TaskGroup) -> None:
        while True:
            # Out of descriptors: it backs off instead of spinning; sessions will free some.
            client, peer = await accept(sock, self.log)
            peer_text = _peer_text(peer, sock.family)
            detached = sum(1 for held in self.holds.values() if held.client is None)
            if len(self.active) + detached >= self.config.max_connections:
                self.refused += 1
                self.log.warning(
                    "connection refused: too many connections",
                    peer=peer_text,
                    max_connections=self.config.max_connections,
                )
                # The line goes out at once (a new socket's send buffer is empty); draining
                # until the client closes is what may wait, and what is bounded.
                stream = SocketStream(client)
                line = error_line(
                    f"acp-proxy: too many connections (max_connections "
                    f"{self.config.max_connections}); try again later"
                )
                if self.websocket is not None:  # an HTTP answer (none over TLS)
                    line = self.websocket.busy(self.config.max_connections)
                try:
                    line = line[stream.try_send(line) :]
                except STREAM_ERRORS:
                    line = b""  # the client is gone (reset): close() below is all there is
                try:
                    await self.refusal_slots.acquire()
                except BaseException:  # cancelled: the server is stopping
                    client.close()
                    raise
                conns.start_soon(self._refuse, stream, line)
                continue
            conn = _Conn(self.next_id)
            self.next_id += 1
            self.accepted += 1
            self.active[conn.id] = conn
            self.idle = anyio.Event()
            conns.start_soon(self._session, conn, client, peer_text)

    async def _refuse(self, stream: SocketStream, rest: bytes) -> None:
        """Finish sending the refusal line (``rest``: what the kernel did not take at once),
        then close without a reset (``close_with``)."""
        try:
            await close_with(stream, rest)
        finally:
            self.refusal_slots.release()

    async def _opening(
        self, conn: _Conn, stream: anyio.abc.ByteStream, peer: str, log: Any
    ) -> tuple[bytes | None, str]:
        """Read until the client's first line is in (``(its bytes, "")``), or say why not
        (``(None, status)``, the connection closed with a message where one is due).

        An HTTP request line gets a 403 (``http_forbidden``); no first line within
        ``handshake_timeout`` gets a JSON-RPC error line: a client that connects and stays
        silent (or trickles a line) must not hold a slot forever. A server shutdown ends the
        wait.
        """
        timeout = self.config.handshake_timeout_s
        reader = OpeningReader(self.config.max_frame_bytes)
        verdict = Opening.MORE
        lost = False
        async with anyio.create_task_group() as tg:

            async def on_shutdown() -> None:
                await conn.shutdown.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(on_shutdown)
            with anyio.move_on_after(timeout) as timer:
                try:
                    while verdict is Opening.MORE:
                        verdict = reader.feed(await stream.receive())
                except anyio.EndOfStream:
                    verdict = reader.end()
                except STREAM_ERRORS:  # reset or closed
                    lost = True
            tg.cancel_scope.cancel()
        if verdict is Opening.FRAME:
            return bytes(reader.buffer), ""
        if verdict is Opening.HTTP:
            log.warning(
                "HTTP request refused: this socket speaks ACP, not HTTP (a web page can make a "
                "browser send requests to a loopback port)",
                peer=peer,
                method=reader.method,
            )
            await close_with(stream, http_forbidden())
            return None, f"refused: an HTTP request ({reader.method})"
        if verdict is Opening.EMPTY:
            return None, "client closed the connection before sending a request"
        if lost:
            return None, "client connection lost before a request"
        if timer.cancelled_caught:
            log.warning(
                "handshake timeout: no request; closing the connection",
                peer=peer,
                handshake_timeout_s=timeout,
            )
            message = (
                f"acp-proxy: no request within {timeout:g} s of connecting "
                "(handshake_timeout); closing the connection"
            )
            await close_with(stream, error_line(message))
            return None, f"handshake timeout: no request within {timeout:g} s"
        return None, "closed at shutdown before a request"

    async def _session(self, conn: _Conn, client: socket.socket, peer: str) -> None:
        from acp_proxy.shell.record.recorder import Recorder, exit_info, open_recorder
        from acp_proxy.shell.session.runtime import run_agent_session, run_remote_agent_session

        log = self.log.bind(conn=conn.id)
        stream: anyio.abc.ByteStream = SocketStream(client)
        started = time.monotonic()
        log.info("connection opened", peer=peer, open=len(self.active))
        status = "closed"
        summary: dict[str, Any] = {}
        recorder: Recorder | None = None
        rc: int | None = None
        principal: str | None = None  # whom the client's token names (a JWT's iss and sub)
        try:
            if self.websocket is not None:
                upgraded, status = await self.websocket.upgrade(stream, peer, log)
                if upgraded is None:
                    return
                stream = upgraded
                principal = upgraded.principal
            first, status = await self._opening(conn, stream, peer, log)
            if first is None:
                return
            if self.config.detach_grace_s > 0:
                from acp_proxy.shell.sockets.reattach import serve_detachable

                status = await serve_detachable(
                    self,
                    conn.id,
                    stream,
                    first,
                    shutdown=conn.shutdown,
                    log=log,
                    principal=principal,
                )
                return
            # The agent starts only now: a client that sends nothing, or an HTTP request,
            # never costs an agent.
            client_rx = PrefixedReceiveStream(first, stream)
            if self.agent_address is None:
                try:
                    agent = await spawn_agent(self.agent_argv, self.config.agent)
                except SpawnError as exc:
                    status = f"agent not started: {exc}"
                    log.error("cannot start the agent", error=str(exc))
                    # Each request the client sent is answered with why (its first one is
                    # read already); with none to answer, one line with a null id says it.
                    from anyio.streams.stapled import StapledByteStream

                    from acp_proxy.shell.session.startfail import answer_start_failure

                    both = StapledByteStream(stream, client_rx)
                    answered = await answer_start_failure(both, str(exc), log)
                    message = f"acp-proxy: cannot start the agent: {exc}"
                    await close_with(stream, b"" if answered else error_line(message))
                    return
                log = log.bind(agent_pid=agent.pid)
                log.info("agent started", agent=self.agent_argv)
                recorder = open_recorder(self.config, log=log, agent=self.agent_argv, conn=conn.id)
                rc, session = await run_agent_session(
                    self.config,
                    agent,
                    client_rx,
                    stream,
                    log=log,
                    shutdown=conn.shutdown,
                    observers=[recorder] if recorder else [],
                )
                status = f"agent {describe_status(rc)}"
                summary = {"exit_code": exit_code_of(rc), **session.summary()}
                if not conn.shutdown.is_set() and not session.stats.client_eof:
                    await self._linger(conn, stream, client_rx, session, log)
            else:
                label = str(self.agent_address)
                try:
                    agent_stream = await connect(
                        self.agent_address, self.config.connect_timeout_s, self.config
                    )
                except ConnectError as exc:
                    status = str(exc)
                    log.error("cannot connect to the agent", error=str(exc))
                    await close_with(stream, error_line(f"acp-proxy: {exc}"))
                    return
                recorder = open_recorder(self.config, log=log, connect=label, conn=conn.id)
                try:
                    lost, session = await run_remote_agent_session(
                        self.config,
                        agent_stream,
                        client_rx,
                        stream,
                        log=log,
                        shutdown=conn.shutdown,
                        agent_label=label,
                        observers=[recorder] if recorder else [],
                    )
                finally:
                    with anyio.CancelScope(shield=True):
                        await agent_stream.aclose()
                status = f"agent connection to {label} " + ("lost" if lost else "closed")
                summary = session.summary()
        except Exception as exc:  # isolation: one session's bug never takes down the others
            status = f"internal error: {type(exc).__name__}: {exc}"
            log.exception("session failed")
        finally:
            if recorder is not None:
                # Off the event loop: a record file that takes nothing more holds only this
                # connection's end (up to the recorder's exit wait), never the others.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(
                        recorder.finish, exit_info(rc) if rc is not None else {"status": status}
                    )
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            del self.active[conn.id]
            self.maybe_idle()
            log.info(
                "connection closed",
                status=status,
                duration_s=round(time.monotonic() - started, 3),
                **summary,
            )

    def maybe_idle(self) -> None:
        if not self.active and not self.holds:
            self.idle.set()

    async def _linger(
        self,
        conn: _Conn,
        stream: anyio.abc.ByteStream,
        client_rx: PrefixedReceiveStream,
        session: Any,
        log: Any,
    ) -> None:
        """The agent died with the client still there: answer what it sends next with the
        error its requests in flight got (``runtime.answer_after_death``, as on stdio), until
        it closes its side, is silent for the linger time, or the server shuts down."""
        from anyio.streams.stapled import StapledByteStream

        from acp_proxy.shell.session.runtime import answer_after_death

        async with anyio.create_task_group() as tg:

            async def on_shutdown() -> None:
                await conn.shutdown.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(on_shutdown)
            await answer_after_death(session, StapledByteStream(stream, client_rx), log)
            tg.cancel_scope.cancel()


def _peer_text(peer: Any, family: int) -> str:
    if family == socket.AF_UNIX:
        return "unix"
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def run_listen(config: Config, agent_argv: Sequence[str]) -> int:
    """``--listen``: serve clients on ``config.listen``, one agent (process or ``--connect``
    connection) per client, until SIGINT/SIGTERM/SIGHUP; returns the exit code (0 after a
    graceful shutdown, 1 or 2 when it cannot listen)."""
    assert config.listen is not None
    log = get_logger()
    try:
        address = parse_address(config.listen, listen=True)
        agent_address = parse_address(config.connect, listen=False) if config.connect else None
    except AddressError as exc:
        print(f"acp-proxy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # Signals are caught from before the "listening" line on: whoever waits for that line (a
    # supervisor, a test) may stop the proxy right after it and still get a graceful exit.
    with anyio.open_signal_receiver(*_SIGNALS) as signals:
        return await _serve(config, agent_argv, address, agent_address, signals=signals, log=log)


async def _serve(
    config: Config,
    agent_argv: Sequence[str],
    address: Address,
    agent_address: Address | None,
    *,
    signals: AsyncIterator[signal.Signals],
    log: Any,
) -> int:
    websocket: WsServer | None = None
    try:
        if address.websocket:
            from acp_proxy.shell.ws.wsconfig import MISSING, available

            if not available():
                raise ValueError(MISSING)
            from acp_proxy.shell.ws.wsserver import websocket_server

            websocket = websocket_server(config, address, log)
            listener = await open_listener(
                address.socket_address(),
                allow_remote=websocket.consent,
                log=log,
                exposure=websocket.exposure,
                remote_note=websocket.remote_note,
            )
            websocket.bind(listener.sockets)
        else:
            listener = await open_listener(address, allow_remote=config.allow_remote, log=log)
    except ValueError as exc:  # a WebSocket listener's token or certificate
        say_fatal(log, "cannot listen", f"{address}: {exc}")
        return EXIT_USAGE
    except ListenError as exc:
        say_fatal(log, "cannot listen", str(exc))
        return exc.exit_code
    shown = websocket.url if websocket is not None else str(listener.address)
    server = _Server(config, agent_argv, agent_address, listener, log.bind(listen=shown))
    server.websocket = websocket
    log.info(
        "listening",
        address=shown,
        agent=list(agent_argv) or None,
        connect=str(agent_address) if agent_address else None,
        max_connections=config.max_connections,
        handshake_timeout_s=config.handshake_timeout_s,
        detach_grace_s=config.detach_grace_s,
        config=config.source,
        rules=list(config.rule_names),
    )
    started = time.monotonic()
    try:
        await server.run(signals)
    finally:
        listener.close()
    log.info(
        "exit",
        exit_code=0,
        accepted=server.accepted,
        refused=server.refused,
        duration_s=round(time.monotonic() - started, 3),
    )
    return 0
