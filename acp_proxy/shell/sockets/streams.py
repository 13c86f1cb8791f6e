"""Connected sockets as byte streams: the session's side of a socket, and closing it politely.

Contract: owns a connected stream socket as a ``transports.FdStream`` (options: no Nagle, TCP
keepalive, large kernel buffers; ``send_eof`` half-closes), the opening line put back in front of
the stream it was read from, and closing a connection with a last message (``close_with``) so
that the client reads the message and EOF, not a reset. Only moves bytes; never looks inside a
frame.
"""

from __future__ import annotations

import contextlib
import socket
import termios

import anyio
import anyio.abc
import anyio.lowlevel

from acp_proxy.shell.streams.transports import STREAM_ERRORS, FdStream, ioctl_int

# How long a connection being closed with a message (refusal, HTTP, handshake timeout) may take
# to take the message and close its side, and how much of its input is read meanwhile.
REFUSAL_S = 1.0
DRAIN_BYTES = 256 * 1024
SOCKET_BUFFER = 1024 * 1024
# TCP keepalive on every TCP connection (listened or connected): a peer whose host vanished
# (a laptop closed, a network dropped, no FIN or RST ever sent) is found after KEEPALIVE_IDLE_S
# of silence plus KEEPALIVE_COUNT unanswered probes KEEPALIVE_INTERVAL_S apart (about two
# minutes), and its session ends or detaches as if the peer had closed. The kernel answers the
# probes, so a peer that is alive but paused (not reading, stopped) is never taken for dead.
KEEPALIVE_IDLE_S = 60
KEEPALIVE_INTERVAL_S = 15
KEEPALIVE_COUNT = 4


class SocketStream(FdStream):
    """A connected stream socket as an ``FdStream``; ``send_eof`` half-closes (SHUT_WR)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # Frames are small and interactive: do not let Nagle hold a response back.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keepalive(sock)
        # Like the 1 MiB pipe buffers of stdio (transports.enlarge_pipe): a bigger kernel buffer
        # means fewer partial writes, so the proxy rarely has a backlog toward a fast peer and
        # stays on its direct-write path. Unix sockets default to ~200 KiB, less than
        # one read. The kernel caps it (net.core.wmem_max); failure is harmless.
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        self.sock = sock
        fd = sock.fileno()
        super().__init__(fd, fd, close_fds=False)
        self._eof_sent = False

    def unread(self) -> int | None:
        """Bytes sent that the peer has not read yet: a Unix socket's send queue (``SIOCOUTQ``:
        what the peer has not consumed). TCP's counts only what is not yet acknowledged, not
        what waits unread on the peer's side, so it says ``None``."""
        if self.sock.family != socket.AF_UNIX or self._write_closed:
            return None
        return ioctl_int(self.sock.fileno(), termios.TIOCOUTQ)

    async def send_eof(self) -> None:
        if not self._eof_sent:
            self._eof_sent = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)
        await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await super().aclose()
        self.sock.close()


def keepalive(sock: socket.socket) -> None:
    """Turn TCP keepalive on with the module's timings (where the platform has them; failure
    leaves the connection as it was)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ):
            option = getattr(socket, name, None)  # Linux names; macOS has TCP_KEEPALIVE
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


class PrefixedReceiveStream(anyio.abc.ByteReceiveStream):
    """``first`` (bytes already read from ``rest``, e.g. the opening line), then ``rest``."""

    def __init__(self, first: bytes, rest: anyio.abc.ByteReceiveStream) -> None:
        self._first = first
        self._rest = rest

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._first:
            # The checkpoint comes first, so a cancelled receive consumes nothing (the reader
            # relies on that to stop without losing a frame).
            await anyio.lowlevel.checkpoint()
            data, self._first = self._first, b""
            return data
        return await self._rest.receive(max_bytes)

    async def aclose(self) -> None:
        self._first = b""
        await self._rest.aclose()


async def close_with(stream: anyio.abc.ByteStream, data: bytes) -> None:
    """Send ``data`` (a refusal, an error line, a 403) and close, so that the client reads it
    and then EOF, not a reset.

    Closing a TCP socket with unread input makes Linux send a RST instead of a FIN (RFC 2525
    section 2.17), and a RST can destroy data still in flight to the client, as well as read
    as ``ECONNRESET`` instead of the message. So: send, half-close (the FIN follows the data),
    read and discard what the client sends until it closes its side, then close. Bounded by
    ``REFUSAL_S`` and ``DRAIN_BYTES``: a client that neither reads nor closes gets closed anyway.
    (SO_LINGER would not help: it bounds how long close() waits for unsent data; the reset for
    unread input is sent regardless.)
    """
    try:
        with anyio.move_on_after(REFUSAL_S):
            if data:
                await stream.send(data)
            await stream.send_eof()
            drained = 0
            while drained <= DRAIN_BYTES:
                drained += len(await stream.receive())
    except STREAM_ERRORS:
        pass
    finally:
        with anyio.CancelScope(shield=True):
            await stream.aclose()
