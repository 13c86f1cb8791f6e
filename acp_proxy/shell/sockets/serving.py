"""Serving on a listening socket: the one accept loop, and reading an HTTP request head.

Contract: owns binding an HTTP endpoint's listener in the event loop (``open_endpoint``:
``--metrics``, ``--ui``; or taking the one bound at start-up, ``acp_proxy.shell.sockets.early``),
taking connections off a listening socket (``accept``; ``serve`` runs a task per connection)
and reading what a client sent of its HTTP request head, bounded in size and time
(``read_head``). The servers decide the rest: ``--listen`` (``server``) its connection limit,
``/metrics`` (``shell.telemetry``) and the live view (``shell.ui.live_server``) which connections
they let in and what they answer; what a head means is
``acp_proxy.telemetry.endpoint.parse_head``'s job (pure).

Rules of ``accept``: it waits while no connection is pending; a connection aborted before it was
taken, or an interrupted call, is retried at once; any other error (out of descriptors, a
network error the kernel passes on from a pending connection) is reported to ``log`` and
retried after ``ACCEPT_BACKOFF_S``: the sessions come first, and a server never ends on it.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Coroutine
from typing import Any, Final

import anyio
import anyio.abc

from acp_proxy.shell.sockets.early import Endpoint, endpoint_address, refused, take_early
from acp_proxy.shell.sockets.listening import Listener, ListenError, open_listener
from acp_proxy.shell.streams.transports import STREAM_ERRORS

ACCEPT_BACKOFF_S: Final = 0.1
# The end of a request head: its blank line (bare LF as well, as HTTP/1.1 servers accept it).
HEAD_ENDS: Final = (b"\r\n\r\n", b"\n\n")
# The end of its first line, for a server that needs nothing more (``line_only``).
LINE_ENDS: Final = (b"\n",)

# What runs for one accepted connection (``None``: close it at once).
Start = Callable[[socket.socket], Callable[[], Coroutine[Any, Any, None]] | None]


async def open_endpoint(
    url: str, endpoint: Endpoint, *, allow_remote: bool, log: Any
) -> Listener | int:
    """The bound listener of ``endpoint`` at ``url`` (the one bound at start-up, if it was:
    ``early.take_early``), or the exit code of a refusal: 2 for an address that is not one
    (said on stderr), the listener's own code when it cannot be bound (said as the fatal
    "cannot serve WHAT")."""
    bound = take_early(endpoint, url)
    if bound is not None:
        return bound
    address = endpoint_address(url, endpoint)
    if isinstance(address, int):
        return address
    try:
        return await open_listener(
            address, allow_remote=allow_remote, log=log, exposure=endpoint.exposure
        )
    except ListenError as exc:
        return refused(endpoint, exc, log)


async def accept(sock: socket.socket, log: Any = None) -> tuple[socket.socket, Any]:
    """The next connection on ``sock`` (non-blocking, listening) and its peer's address; see
    the module's rules."""
    while True:
        try:
            return sock.accept()
        except BlockingIOError:
            await anyio.wait_readable(sock)
        except OSError as exc:
            if exc.errno in (errno.ECONNABORTED, errno.EINTR):
                continue
            if log is not None:
                log.error("cannot accept a connection", error=exc.strerror or str(exc))
            await anyio.sleep(ACCEPT_BACKOFF_S)


async def serve(sock: socket.socket, start: Start, log: Any = None) -> None:
    """Accept on ``sock`` until cancelled; ``start(client)`` says what runs for each connection,
    in a task of its own (``None``: the connection is closed unanswered). Never waits for a
    connection's task before accepting the next."""
    async with anyio.create_task_group() as tg:
        while True:
            client, _peer = await accept(sock, log)
            run = start(client)
            if run is None:
                client.close()
            else:
                tg.start_soon(run)


async def read_head(
    stream: anyio.abc.ByteReceiveStream,
    *,
    max_bytes: int,
    timeout_s: float,
    line_only: bool = False,
) -> bytes | None:
    """A client's request head: read until its blank line (with ``line_only``, the end of its
    request line), its EOF or ``timeout_s``, whichever comes first. The head up to and with
    that end; at EOF or the timeout, what came by then (whole or not: the parser decides).
    ``None`` when the head with its end is longer than ``max_bytes``: a head over the bound is
    refused, never parsed cut short."""
    ends = LINE_ENDS if line_only else HEAD_ENDS
    head = b""
    with anyio.move_on_after(timeout_s):
        while _past_end(head, ends) < 0 and len(head) <= max_bytes:
            try:
                head += await stream.receive(max_bytes)
            except STREAM_ERRORS:
                break
    cut = _past_end(head, ends)
    if cut >= 0:
        head = head[:cut]
    return head if len(head) <= max_bytes else None


def _past_end(head: bytes, ends: tuple[bytes, ...]) -> int:
    """Where the first of ``ends`` in ``head`` ends (-1: none is in it)."""
    found = [i + len(end) for end in ends if (i := head.find(end)) >= 0]
    return min(found, default=-1)


__all__ = [
    "ACCEPT_BACKOFF_S",
    "Start",
    "accept",
    "open_endpoint",
    "read_head",
    "serve",
]
