"""``--connect``: the agent is reached over a socket instead of spawned.

Contract: owns connecting to an agent's address within a timeout (``connect``, also used by the
``--listen`` server for each client), and the ``--connect`` mode with the client on stdio
(``run_connect``: one session, its signals, the recorder, the exit summary and code). The
session's lifecycle over the connection (half-close, grace period, lost-connection errors) is
``runtime.run_remote_agent_session``'s.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
from typing import Any

import anyio
import anyio.abc

from acp_proxy.config import Config
from acp_proxy.shell.log.logsetup import get_logger, say_fatal
from acp_proxy.shell.sockets.address import (
    EXIT_FAILURE,
    EXIT_USAGE,
    Address,
    AddressError,
    parse_address,
)
from acp_proxy.shell.sockets.listening import resolve_tcp
from acp_proxy.shell.sockets.streams import SocketStream


class ConnectError(Exception):
    """The agent's address could not be reached (refused, unresolvable, timed out)."""


# "Not there yet": errors retried until the deadline (an agent that starts after the proxy, a
# sidecar started before its agent). Others (a name that does not resolve, a permission) fail
# at once.
_NOT_YET = frozenset(
    (errno.ECONNREFUSED, errno.ENOENT, errno.ECONNRESET, errno.ECONNABORTED, errno.EAGAIN)
)
# The pause between tries: doubles from the first to the last, never past the deadline.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 0.5


async def connect(
    address: Address, timeout: float, config: Config | None = None
) -> anyio.abc.ByteStream:
    """Connect to the agent at ``address`` within ``timeout`` seconds, trying again (with a
    growing pause) while it refuses or its socket file does not exist yet; a ``ws://`` /
    ``wss://`` address is then upgraded (``wsclient``, with ``config``'s token and TLS).
    Raises ``ConnectError`` with the last reason."""
    if address.websocket:
        from acp_proxy.shell.ws.wsconfig import MISSING, available

        if not available():
            raise ConnectError(MISSING)
        from acp_proxy.shell.ws.wsclient import UpgradeRefused, upgrade

        stream = await _connect_socket(address.socket_address(), timeout)
        try:
            return await upgrade(stream, address, config or Config(), timeout)
        except UpgradeRefused as exc:
            raise ConnectError(f"cannot connect to the agent at {address}: {exc}") from None
    return await _connect_socket(address, timeout)


async def _connect_socket(address: Address, timeout: float) -> SocketStream:
    deadline = time.monotonic() + timeout
    pause = RETRY_FIRST_S
    while True:
        try:
            with anyio.fail_after(max(deadline - time.monotonic(), RETRY_FIRST_S)):
                return await _connect(address)
        except TimeoutError:
            raise ConnectError(
                f"cannot connect to the agent at {address}: no answer within {timeout:g} s "
                "(--connect-timeout)"
            ) from None
        except OSError as exc:
            left = deadline - time.monotonic()
            if exc.errno not in _NOT_YET or left <= 0:
                tried = f" (tried for {timeout:g} s, --connect-timeout)" if left <= 0 else ""
                raise ConnectError(
                    f"cannot connect to the agent at {address}: {exc.strerror or exc}{tried}"
                ) from exc
            await anyio.sleep(min(pause, left))
            pause = min(pause * 2, RETRY_MAX_S)


async def _connect(address: Address) -> SocketStream:
    if address.scheme == "unix":
        targets: list[tuple[int, Any]] = [(socket.AF_UNIX, address.path)]
    else:
        infos = await resolve_tcp(address)
        targets = [(family, sockaddr) for family, *_, sockaddr in infos]
    error: OSError = OSError(errno.EHOSTUNREACH, "no address to connect to")
    for family, sockaddr in targets:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            code = sock.connect_ex(sockaddr)
            if code in (errno.EINPROGRESS, errno.EAGAIN):
                await anyio.wait_writable(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise OSError(code, os.strerror(code))
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return SocketStream(sock)
    raise error


async def run_connect(config: Config, *, client_stream: anyio.abc.ByteStream | None = None) -> int:
    """``--connect`` with the client on stdio: one session to the agent at ``config.connect``.

    Returns 0 when the session ended normally (client EOF or a signal, then the agent closed),
    1 when the connection could not be made or was lost (in-flight requests were answered with
    -32603 first), 2 for a bad address.
    """
    from acp_proxy.shell.session.runtime import run_remote_agent_session, shutdown_on_signals
    from acp_proxy.shell.streams.transports import stdio_stream

    assert config.connect is not None
    log = get_logger()
    try:
        address = parse_address(config.connect, listen=False)
    except AddressError as exc:
        print(f"acp-proxy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    log.info(
        "connecting to the agent",
        address=str(address),
        timeout_s=config.connect_timeout_s,
        config=config.source,
        rules=list(config.rule_names),
    )
    try:
        agent_stream = await connect(address, config.connect_timeout_s, config)
    except ConnectError as exc:
        say_fatal(log, "cannot connect to the agent", str(exc))
        return EXIT_FAILURE
    from acp_proxy.shell.record.recorder import open_recorder

    recorder = open_recorder(config, log=log, connect=str(address))
    client = client_stream if client_stream is not None else stdio_stream()
    shutdown = anyio.Event()
    started = time.monotonic()

    try:
        async with anyio.create_task_group() as tg:
            on_signal = "signal received; closing the session"
            tg.start_soon(shutdown_on_signals, shutdown, log, on_signal)
            lost, session = await run_remote_agent_session(
                config,
                agent_stream,
                client,
                client,
                log=log,
                shutdown=shutdown,
                agent_label=str(address),
                observers=[recorder] if recorder else [],
            )
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await agent_stream.aclose()
            if client_stream is None:
                await client.aclose()
    code = EXIT_FAILURE if lost else 0
    if recorder is not None:
        recorder.finish({"status": f"agent connection {'lost' if lost else 'closed'}"})
    if lost:
        message = f"the connection to the agent at {address} was lost"
        log.error(message)
        print(f"acp-proxy: {message}", file=sys.stderr)
    log.info(
        "exit",
        status=f"agent connection {'lost' if lost else 'closed'}",
        exit_code=code,
        duration_s=round(time.monotonic() - started, 3),
        **session.summary(),
    )
    return code
