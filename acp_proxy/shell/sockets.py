"""Socket transports (issue 5): ``--listen`` (clients over TCP/Unix) and ``--connect`` (the agent).

Contract: owns socket addresses (parsing and the loopback rule), listening sockets (Unix socket
files: mode, stale/live detection, removal), accepting connections, connecting to an agent,
the connection limit, the opening of a connection (HTTP guard, handshake timeout), and the
server's signal handling. Each accepted connection is one session of ``runtime`` (its own agent
process or agent connection, its own ``pipeline.Connection``, its own queues), started only once
the client's first line has arrived and is not HTTP (issue 10); beyond that opening line this
module never looks inside a frame.

Framing over a socket is the same newline-delimited JSON-RPC as stdio: ACP defines only the stdio
transport, so NDJSON over TCP/Unix is this proxy's convention, not part of the protocol.

Sockets are driven through ``transports.FdStream`` (non-blocking fd, chunked reads, the runtime's
``try_send`` fast path), the same stream type as stdio, so a socket costs what a pipe costs.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import re
import signal
import socket
import stat
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Literal

import anyio
import anyio.abc
import anyio.lowlevel
import orjson

from acp_proxy.config import Config
from acp_proxy.shell import hooks
from acp_proxy.shell.logsetup import get_logger
from acp_proxy.shell.process import (
    STDOUT_LINGER_S,
    describe_status,
    exit_code_of,
    spawn_agent,
)
from acp_proxy.shell.spawn import SpawnError
from acp_proxy.shell.transports import FdStream

EXIT_FAILURE = 1  # cannot listen / cannot connect / agent connection lost
EXIT_USAGE = 2  # bad address, non-loopback without --allow-remote
# JSON-RPC 2.0 reserves -32000..-32099 for implementation-defined server errors.
SERVER_ERROR = -32000
LISTEN_BACKLOG = 128
# Refusals (over --max-connections) draining at once; beyond that the accept loop waits for one
# to finish (new connections wait in the listen backlog) rather than close one without a word.
MAX_REFUSING = 128
# How long a connection being closed with a message (refusal, HTTP, handshake timeout) may take
# to take the message and close its side, and how much of its input is read meanwhile.
REFUSAL_S = 1.0
DRAIN_BYTES = 256 * 1024
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_HELP = "tcp://HOST:PORT, tcp://[IPV6]:PORT or unix:///ABSOLUTE/PATH"


# -- addresses (pure) ---------------------------------------------------------------------------


class AddressError(ValueError):
    """A ``--listen`` / ``--connect`` URL that is not valid; the message says what would be."""


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed socket URL: ``tcp`` with ``host``/``port``, or ``unix`` with ``path``."""

    scheme: Literal["tcp", "unix"]
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


def parse_address(url: str, *, listen: bool) -> Address:
    """Parse ``tcp://host:port``, ``tcp://[v6]:port`` or ``unix:///abs/path``.

    Port 0 (an ephemeral port, logged once bound) is allowed only for ``listen``.
    Raises ``AddressError``.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("tcp", "unix"):
        raise AddressError(f"{url!r}: expected {_HELP}")
    if scheme == "unix":
        if not rest.startswith("/"):
            raise AddressError(
                f"{url!r}: a Unix socket path must be absolute (three slashes: "
                f"unix:///run/acp.sock)"
            )
        if "\0" in rest:
            raise AddressError(f"{url!r}: a Unix socket path cannot contain NUL")
        return Address("unix", path=rest)
    if "/" in rest or "?" in rest or "#" in rest:
        raise AddressError(f"{url!r}: a tcp address has no path: expected tcp://HOST:PORT")
    host, colon, port_text = rest.rpartition(":")
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise AddressError(f"{url!r}: expected tcp://[IPV6]:PORT")
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise AddressError(f"{url!r}: {host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise AddressError(f"{url!r}: put an IPv6 address in brackets: tcp://[{host}]:PORT")
    if not colon:
        raise AddressError(f"{url!r}: missing :PORT (expected tcp://HOST:PORT)")
    if not host:
        raise AddressError(f"{url!r}: missing HOST (expected tcp://HOST:PORT)")
    if not port_text.isdigit() or not (0 if listen else 1) <= int(port_text) <= 65535:
        low = 0 if listen else 1
        raise AddressError(f"{url!r}: the port must be a number from {low} to 65535")
    return Address("tcp", host=host, port=int(port_text))


def is_loopback_ip(text: str) -> bool:
    """True for 127.0.0.0/8, ::1 and their IPv4-mapped forms; False for anything else."""
    try:
        ip = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


# -- the opening of a connection (pure) ---------------------------------------------------------
# A browser lets any web page send an HTTP request to a loopback port (a form POST, fetch, a
# WebSocket upgrade); its body could be a JSON-RPC line the agent would act on (cross-protocol
# request, the class of CVE-2025-49596). No ACP client starts with an HTTP request line, so one
# is refused before any agent exists. Request methods of RFC 9110 section 9 plus PATCH (RFC 5789),
# and the HTTP/2 connection preface (RFC 9113 section 3.4).
HTTP_OPENINGS: Final = (
    b"GET ",
    b"POST ",
    b"OPTIONS ",
    b"PUT ",
    b"HEAD ",
    b"CONNECT ",
    b"DELETE ",
    b"PATCH ",
    b"TRACE ",
    b"PRI * HTTP/2",
)
_LONGEST_OPENING: Final = max(len(token) for token in HTTP_OPENINGS)
# At most this much of a first line is held before the session starts (README "Bounds").
OPENING_HOLD_BYTES: Final = 64 * 1024
# What framing.LineSplitter counts as whitespace (bytes.isspace): such lines carry no message.
_BLANK: Final = re.compile(rb"[ \t\n\r\x0b\x0c]*")


class Opening(Enum):
    """What the first bytes of a connection are, so far."""

    MORE = "more"  # undecided: need more input
    FRAME = "frame"  # a first line (complete, or longer than the frame limit) that is not HTTP
    HTTP = "http"  # an HTTP request line or the HTTP/2 preface
    EMPTY = "empty"  # the client closed without sending anything but blank lines


class OpeningReader:
    """The first bytes of a ``--listen`` connection, held until they decide what it is.

    ``feed`` each chunk; ``end`` at EOF. ``buffer`` is what to hand to the session once the
    answer is ``FRAME``: the bytes as received, except whitespace-only lines before the first
    message (which framing drops anyway), so memory stays bounded by ``limit`` (the frame limit:
    a first line longer than that is handed over as it is, for the session to reject).
    ``method`` names the HTTP method (``PRI`` for the HTTP/2 preface) once the answer is ``HTTP``.
    """

    __slots__ = ("_limit", "_scanned", "_text_at", "buffer", "method")

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray()
        self.method = ""
        self._limit = limit
        self._text_at = -1  # index of the first non-blank byte in ``buffer``; -1: none yet
        self._scanned = 0  # where the search for a newline (or a non-blank byte) resumes

    def feed(self, data: bytes) -> Opening:
        """The verdict with ``data`` appended (``MORE`` until it is decided)."""
        self.buffer += data
        if self._text_at < 0:
            # Before ``_scanned`` everything is blank and has no newline (complete blank lines
            # were dropped): only the new bytes need looking at.
            blank = _BLANK.match(self.buffer, self._scanned)
            assert blank is not None  # the pattern matches the empty string
            text_at = blank.end()
            cut = self.buffer.rfind(b"\n", self._scanned, text_at) + 1
            del self.buffer[:cut]
            text_at -= cut
            if text_at == len(self.buffer):  # still nothing but blanks
                self._scanned = text_at
                return Opening.FRAME if text_at > self._limit else Opening.MORE
            self._text_at = self._scanned = text_at
        head = bytes(self.buffer[self._text_at : self._text_at + _LONGEST_OPENING])
        for token in HTTP_OPENINGS:
            if head.startswith(token):
                self.method = token.partition(b" ")[0].decode()
                return Opening.HTTP
        if any(token.startswith(head) for token in HTTP_OPENINGS):
            return Opening.MORE  # e.g. "PO": could still become "POST "
        if self.buffer.find(b"\n", self._scanned) >= 0 or len(self.buffer) > self._limit:
            return Opening.FRAME
        if len(self.buffer) - self._text_at > OPENING_HOLD_BYTES:
            # Not HTTP, and a long first line: hand it over now rather than hold it here, where
            # the process-wide buffer budget does not see it (12 clients x 15 MiB first lines
            # held 180 MiB outside the budget).
            return Opening.FRAME
        self._scanned = len(self.buffer)
        return Opening.MORE

    def end(self) -> Opening:
        """The verdict at EOF: an unterminated first line is still a frame (framing delivers
        it at EOF), and a prefix of an HTTP opening that never completed is not HTTP."""
        return Opening.EMPTY if self._text_at < 0 else Opening.FRAME


def http_forbidden() -> bytes:
    """The reply to an HTTP request: a minimal 403 with ``Connection: close``, so a browser
    fails the request at once instead of waiting; no CORS header, so a page cannot read it."""
    body = (
        b"acp-proxy: this socket speaks ACP (newline-delimited JSON-RPC), not HTTP; "
        b"HTTP requests are refused\n"
    )
    return (
        b"HTTP/1.1 403 Forbidden\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\n"
        b"Connection: close\r\n"
        b"\r\n" % len(body)
    ) + body


# -- streams ------------------------------------------------------------------------------------


SOCKET_BUFFER = 1024 * 1024


class SocketStream(FdStream):
    """A connected stream socket as an ``FdStream``; ``send_eof`` half-closes (SHUT_WR)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # Frames are small and interactive: do not let Nagle hold a response back.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Like the 1 MiB pipe buffers of stdio (transports.enlarge_pipe): a bigger kernel buffer
        # means fewer partial writes, so the proxy rarely has a backlog toward a fast peer and
        # stays on its direct-write path (issue 6). Unix sockets default to ~200 KiB, less than
        # one read. The kernel caps it (net.core.wmem_max); failure is harmless.
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        self.sock = sock
        fd = sock.fileno()
        super().__init__(fd, fd, close_fds=False)
        self._eof_sent = False

    async def send_eof(self) -> None:
        if not self._eof_sent:
            self._eof_sent = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)
        await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await super().aclose()
        self.sock.close()


class PrefixedReceiveStream(anyio.abc.ByteReceiveStream):
    """``first`` (bytes already read from ``rest``, e.g. the opening line), then ``rest``."""

    def __init__(self, first: bytes, rest: anyio.abc.ByteReceiveStream) -> None:
        self._first = first
        self._rest = rest

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._first:
            # The checkpoint comes first, so a cancelled receive consumes nothing (the runtime
            # relies on that to stop without losing a frame).
            await anyio.lowlevel.checkpoint()
            data, self._first = self._first, b""
            return data
        return await self._rest.receive(max_bytes)

    async def aclose(self) -> None:
        self._first = b""
        await self._rest.aclose()


# -- listening ----------------------------------------------------------------------------------


class ListenError(Exception):
    """The proxy cannot listen where asked; ``exit_code`` is 2 (usage) or 1 (environment)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(slots=True)
class Listener:
    """Bound, listening sockets for one address, and the Unix socket file they own."""

    address: Address  # the bound address (an ephemeral port resolved)
    sockets: list[socket.socket]
    unix_identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file we created
    closed: bool = False

    def close(self) -> None:
        """Stop listening and remove our Unix socket file (only if it is still ours)."""
        if self.closed:
            return
        self.closed = True
        for sock in self.sockets:
            sock.close()
        if self.unix_identity is not None:
            path = self.address.path
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                # Another proxy may have replaced a file we thought stale: never remove theirs.
                if (st.st_dev, st.st_ino) == self.unix_identity:
                    os.unlink(path)


async def open_listener(address: Address, *, allow_remote: bool, log: Any) -> Listener:
    """Bind and listen on ``address``. Raises ``ListenError`` with a one-line reason."""
    if address.scheme == "unix":
        return await _listen_unix(address, log)
    return await _listen_tcp(address, allow_remote=allow_remote, log=log)


async def _listen_tcp(address: Address, *, allow_remote: bool, log: Any) -> Listener:
    try:
        infos = await anyio.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    ips = list(dict.fromkeys((family, str(sockaddr[0])) for family, *_, sockaddr in infos))
    remote = [ip for _, ip in ips if not is_loopback_ip(ip)]
    if remote and not allow_remote:
        raise ListenError(
            f"refusing to listen on {address}: {', '.join(remote)} is not a loopback address "
            "(anyone who can reach it could drive the agent); pass --allow-remote "
            "(allow_remote: true in the config) to accept remote clients",
            EXIT_USAGE,
        )
    if remote:
        log.warning(
            "listening on a non-loopback address: traffic is unauthenticated and unencrypted; "
            "anyone who can reach it can drive the agent",
            address=str(address),
            addresses=remote,
        )
    sockets: list[socket.socket] = []
    port = address.port
    try:
        for family, ip in ips:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            # SO_REUSEADDR only skips TIME_WAIT; a live listener on the port still fails.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((ip, port))
            port = sock.getsockname()[1]  # port 0: the others share the first one's port
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(
                f"cannot listen on {address}: port {port} is already in use "
                "(another process is listening on it)"
            ) from exc
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    return Listener(Address("tcp", host=address.host, port=port), sockets)


def _unix_is_live(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # e.g. EAGAIN (backlog full) or a timeout: someone is there
    finally:
        probe.close()
    return True


async def _listen_unix(address: Address, log: Any) -> Listener:
    path = address.path
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ListenError(
                f"cannot listen on {address}: {path} exists and is not a socket; "
                "refusing to replace it"
            )
        if _unix_is_live(path):
            raise ListenError(f"cannot listen on {address}: another process is listening on {path}")
        log.info("replacing a stale socket file (nothing listening on it)", path=path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Create the file as 0600 from the start (no window with wider permissions): the umask
    # applies to bind(). Nothing else in this process creates files while the loop starts up.
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(
                f"cannot listen on {address}: {path} was created by another process"
            ) from exc
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    finally:
        os.umask(old_umask)
    try:
        os.chmod(path, 0o600)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
        st = os.lstat(path)
    except OSError as exc:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    return Listener(address, [sock], unix_identity=(st.st_dev, st.st_ino))


# -- connecting ---------------------------------------------------------------------------------


class ConnectError(Exception):
    """The agent's address could not be reached (refused, unresolvable, timed out)."""


async def connect(address: Address, timeout: float) -> SocketStream:
    """Connect to the agent at ``address`` within ``timeout`` seconds. Raises ``ConnectError``."""
    try:
        with anyio.fail_after(timeout):
            return await _connect(address)
    except TimeoutError:
        raise ConnectError(
            f"cannot connect to the agent at {address}: no answer within {timeout:g} s "
            "(--connect-timeout)"
        ) from None
    except OSError as exc:
        raise ConnectError(
            f"cannot connect to the agent at {address}: {exc.strerror or exc}"
        ) from exc


async def _connect(address: Address) -> SocketStream:
    if address.scheme == "unix":
        targets: list[tuple[int, Any]] = [(socket.AF_UNIX, address.path)]
    else:
        infos = await anyio.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
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


# -- serving (--listen) -------------------------------------------------------------------------


def _error_line(message: str) -> bytes:
    """A JSON-RPC error response with ``id: null`` (JSON-RPC 2.0 section 5: the id of the
    request could not be determined): the only way to tell a client why before any request."""
    return (
        orjson.dumps(
            {"jsonrpc": "2.0", "id": None, "error": {"code": SERVER_ERROR, "message": message}}
        )
        + b"\n"
    )


def shutdown_bound_s(config: Config) -> float:
    """The longest a graceful shutdown may take before the remaining agents are killed: the
    ladder (grace, SIGTERM, grace) plus the runtime's stdout linger, plus slack."""
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

    async def run(self, signals: AsyncIterator[signal.Signals]) -> None:
        async with anyio.create_task_group() as outer:
            outer.start_soon(self._watch_signals, signals, outer.cancel_scope)
            async with anyio.create_task_group() as conns:
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
                if self.active:
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
            if not self.stopping.is_set():
                self.log.info("signal received; shutting down", signal=signum.name)
                self.stopping.set()
            else:
                # A second signal: do not wait for the ladder.
                self.log.warning("second signal; killing all agents now", signal=signum.name)
                cancel_all.cancel()

    async def _accept_loop(self, sock: socket.socket, conns: anyio.abc.TaskGroup) -> None:
        while True:
            try:
                client, peer = sock.accept()
            except BlockingIOError:
                await anyio.wait_readable(sock)
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: back off instead of spinning; sessions will free some.
                    self.log.error("cannot accept a connection", error=exc.strerror)
                    await anyio.sleep(0.1)
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EINTR):
                    continue
                raise
            peer_text = _peer_text(peer, sock.family)
            if len(self.active) >= self.config.max_connections:
                self.refused += 1
                self.log.warning(
                    "connection refused: too many connections",
                    peer=peer_text,
                    max_connections=self.config.max_connections,
                )
                # The line goes out at once (a new socket's send buffer is empty); draining
                # until the client closes is what may wait, and what is bounded.
                stream = SocketStream(client)
                line = _error_line(
                    f"acp-proxy: too many connections (max_connections "
                    f"{self.config.max_connections}); try again later"
                )
                try:
                    line = line[stream.try_send(line) :]
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
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
        self, conn: _Conn, stream: SocketStream, peer: str, log: Any
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
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
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
            await close_with(stream, _error_line(message))
            return None, f"handshake timeout: no request within {timeout:g} s"
        return None, "closed at shutdown before a request"

    async def _session(self, conn: _Conn, client: socket.socket, peer: str) -> None:
        from acp_proxy.shell.recorder import Recorder, exit_info, open_recorder
        from acp_proxy.shell.runtime import run_agent_session, run_remote_agent_session

        log = self.log.bind(conn=conn.id)
        stream = SocketStream(client)
        started = time.monotonic()
        log.info("connection opened", peer=peer, open=len(self.active))
        status = "closed"
        summary: dict[str, Any] = {}
        recorder: Recorder | None = None
        rc: int | None = None
        try:
            first, status = await self._opening(conn, stream, peer, log)
            if first is None:
                return
            # The agent starts only now: a client that sends nothing, or an HTTP request,
            # never costs an agent (issue 10).
            client_rx = PrefixedReceiveStream(first, stream)
            if self.agent_address is None:
                try:
                    agent = await spawn_agent(self.agent_argv, self.config.agent)
                except SpawnError as exc:
                    status = f"agent not started: {exc}"
                    log.error("cannot start the agent", error=str(exc))
                    message = f"acp-proxy: cannot start the agent: {exc}"
                    await close_with(stream, _error_line(message))
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
            else:
                label = str(self.agent_address)
                try:
                    agent_stream = await connect(self.agent_address, self.config.connect_timeout_s)
                except ConnectError as exc:
                    status = str(exc)
                    log.error("cannot connect to the agent", error=str(exc))
                    await close_with(stream, _error_line(f"acp-proxy: {exc}"))
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
                recorder.finish(exit_info(rc) if rc is not None else {"status": status})
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            del self.active[conn.id]
            if not self.active:
                self.idle.set()
            log.info(
                "connection closed",
                status=status,
                duration_s=round(time.monotonic() - started, 3),
                **summary,
            )


async def close_with(stream: SocketStream, data: bytes) -> None:
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
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    finally:
        with anyio.CancelScope(shield=True):
            await stream.aclose()


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
    try:
        listener = await open_listener(address, allow_remote=config.allow_remote, log=log)
    except ListenError as exc:
        log.error("cannot listen", error=str(exc))
        print(f"acp-proxy: {exc}", file=sys.stderr)
        return exc.exit_code
    server = _Server(
        config, agent_argv, agent_address, listener, log.bind(listen=str(listener.address))
    )
    log.info(
        "listening",
        address=str(listener.address),
        agent=list(agent_argv) or None,
        connect=str(agent_address) if agent_address else None,
        max_connections=config.max_connections,
        handshake_timeout_s=config.handshake_timeout_s,
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


# -- connecting with the client on stdio (--connect) --------------------------------------------


async def run_connect(config: Config, *, client_stream: anyio.abc.ByteStream | None = None) -> int:
    """``--connect`` with the client on stdio: one session to the agent at ``config.connect``.

    Returns 0 when the session ended normally (client EOF or a signal, then the agent closed),
    1 when the connection could not be made or was lost (in-flight requests were answered with
    -32603 first), 2 for a bad address.
    """
    from acp_proxy.shell.runtime import run_remote_agent_session, shutdown_on_signals
    from acp_proxy.shell.transports import stdio_stream

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
        agent_stream = await connect(address, config.connect_timeout_s)
    except ConnectError as exc:
        log.error("cannot connect to the agent", error=str(exc))
        print(f"acp-proxy: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    from acp_proxy.shell.recorder import open_recorder

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


__all__ = [
    "HTTP_OPENINGS",
    "Address",
    "AddressError",
    "ConnectError",
    "ListenError",
    "Listener",
    "Opening",
    "OpeningReader",
    "PrefixedReceiveStream",
    "SocketStream",
    "close_with",
    "connect",
    "http_forbidden",
    "is_loopback_ip",
    "open_listener",
    "parse_address",
    "run_connect",
    "run_listen",
    "shutdown_bound_s",
]
