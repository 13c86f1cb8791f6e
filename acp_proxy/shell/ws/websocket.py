"""A WebSocket connection as the proxy's NDJSON byte stream, and what both of its ends share.

Contract: owns ``WsStream``: one upgraded connection (over TCP, or TLS for ``wss://``) seen by
the session as the newline-delimited JSON-RPC it reads and writes everywhere else. The rule of
the mapping (the Streamable HTTP & WebSocket transport of ACP): one JSON-RPC message (or batch)
per text frame. Each received text message becomes one line, its bytes unchanged, followed by
``\\n``; each line the session writes becomes one text frame, its bytes unchanged, without the
``\\n``. The one rewrite: a received message with a raw line break (pretty-printed JSON) has each
``\\n`` turned into a space (JSON whitespace: the message means the same, and stays one line).
A connection that has sent no frame for ``ws_ping_interval`` seconds sends a ping (while the
session waits for the peer's next message), so that proxies and load balancers on the way (nginx
closes a proxied WebSocket after 60 s without data by default) do not end a quiet session; no
pong is awaited (a peer that is paused is not dead; one whose host vanished is found by TCP
keepalive). The session's end of input (``send_eof``) sends nothing (a WebSocket has no half-
close); the close frame (1000) goes when the connection is closed. A binary frame is refused
(close 1003); a message over ``max_frame_bytes`` (the proxy's line limit) closes the connection
with 1009 before it is buffered whole. The protocol is ``websockets``' Sans-I/O layer, without
compression (no extension is offered or accepted: a small compressed frame cannot expand into a
large one).

Also here: the bearer token (``load_token``: a file or an environment variable, never the
command line) and the TLS contexts of both ends. The token is never logged: errors name the
file or the variable, not the content. Imports ``websockets``: loaded only for a ws address.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import ssl
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from acp_proxy.config import Config
from acp_proxy.shell.streams.transports import STREAM_ERRORS

# A refusal or a close: how long the peer has to take the last bytes and close its side, and
# how much of its input is read meanwhile (as streams.close_with).
CLOSE_S = 1.0
DRAIN_BYTES = 256 * 1024
# A request head (the upgrade request, the 101 response): 8 KiB, the HTTP endpoints' bound.
MAX_HEAD = 8 * 1024
WEBSOCKET_ERRORS = (*STREAM_ERRORS, OSError, ssl.SSLError)

# The protocols' own logger, silenced for good: at DEBUG, websockets logs every header of the
# upgrade (the Authorization header with it), and a middleware may turn the root logger's DEBUG
# on. The proxy logs the connections itself (structlog), never a header.
SILENT = logging.getLogger("acp_proxy.websocket")
SILENT.propagate = False
SILENT.setLevel(logging.CRITICAL + 1)
SILENT.addHandler(logging.NullHandler())


class TokenError(Exception):
    """The token cannot be read; the message names where it was looked for, never its value."""


def load_token(config: Config) -> str | None:
    """The bearer token of ``auth:`` (``token_file``, else ``token_env``); ``None`` when neither
    is set. Raises ``TokenError``: an unreadable or empty file, an unset variable."""
    auth = config.auth
    if auth.token_file is not None:
        try:
            text = Path(auth.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise TokenError(f"auth.token_file {auth.token_file}: {reason}") from None
        if not text:
            raise TokenError(f"auth.token_file {auth.token_file} is empty")
        return text
    if auth.token_env is not None:
        text = os.environ.get(auth.token_env, "").strip()
        if not text:
            raise TokenError(f"auth.token_env: the variable {auth.token_env} is not set or empty")
        return text
    return None


def token_file_exposed(config: Config) -> bool:
    """Whether the token file can be read by other users (group or others bits)."""
    if config.auth.token_file is None:
        return False
    try:
        mode = os.stat(config.auth.token_file).st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IRWXG | stat.S_IRWXO))


def server_tls(config: Config) -> ssl.SSLContext:
    """The TLS context of a ``wss://`` listener (``tls.cert``, ``tls.key``; TLS 1.2 or later).
    Raises ``ValueError`` saying what is missing or cannot be loaded."""
    tls = config.tls
    if tls.cert is None or tls.key is None:
        raise ValueError("a wss:// listener needs tls: {cert: FILE, key: FILE} in the config")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load tls.cert {tls.cert} / tls.key {tls.key}: {exc}") from None
    return context


def client_tls(config: Config) -> ssl.SSLContext:
    """The TLS context of ``--connect wss://``: the system's authorities, or ``tls.ca``."""
    try:
        context = ssl.create_default_context(cafile=config.tls.ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load tls.ca {config.tls.ca}: {exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def send_all(transport: anyio.abc.ByteStream, chunks: list[bytes]) -> None:
    """Write what the protocol has to send (``data_to_send``; ``b""`` is its end of stream),
    the frames of one call in one write."""
    data = b"".join(chunks)
    if data:
        await transport.send(data)
    if chunks and not chunks[-1]:  # nothing follows the end of stream
        with contextlib.suppress(NotImplementedError, *WEBSOCKET_ERRORS):
            await transport.send_eof()


async def close_transport(transport: anyio.abc.ByteStream, last: bytes = b"") -> None:
    """Send ``last`` (a refusal), end the stream, read what the peer still sends until it
    closes (bounded by ``CLOSE_S`` and ``DRAIN_BYTES``: a close without a reset, as
    ``streams.close_with``), then close."""
    try:
        with anyio.move_on_after(CLOSE_S):
            if last:
                await transport.send(last)
            with contextlib.suppress(NotImplementedError):
                await transport.send_eof()
            drained = 0
            while drained <= DRAIN_BYTES:
                drained += len(await transport.receive())
    except WEBSOCKET_ERRORS:
        pass
    finally:
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(*WEBSOCKET_ERRORS):
                await transport.aclose()


class WsStream(anyio.abc.ByteStream):
    """An open WebSocket connection as NDJSON bytes (see the module's rules).

    ``receive`` and ``send`` may run at once (the session's reader and writer): the protocol's
    output goes out under one lock, in the order it was made."""

    # The outbox's direct write (``outbox.Outbox``: a write without a task switch), present on
    # a server's connection over a plain socket (``ws://``); see ``_try_send``.
    try_send: Callable[[bytes | memoryview], int]

    def __init__(
        self, transport: anyio.abc.ByteStream, protocol: Protocol, *, ping_s: float = 0.0
    ) -> None:
        self.transport = transport
        self.protocol = protocol
        self.ping_s = ping_s  # 0: never ping
        # Whom the client's token names (a JWT's issuer and subject), when it names someone:
        # only the same principal may reattach to the sessions it leaves (``detach_grace``).
        self.principal: str | None = None
        self.sent_at = time.monotonic()  # when a frame last went out (see ``_receive``)
        self._ready: collections.deque[bytes] = collections.deque()
        self._fragments: bytearray | None = None  # a message's fragments so far
        self._partial = b""  # a line the session has not finished writing
        self._pending = b""  # frames made by _try_send that the kernel did not take yet
        self._ended = False  # no more messages will come (close frame, EOF, error)
        self._lock = anyio.Lock()
        raw = getattr(transport, "try_send", None)
        if protocol.side is Side.SERVER and callable(raw):
            self._raw_try_send: Callable[[bytes], int] = raw
            self.try_send = self._try_send

    def _try_send(self, data: bytes | memoryview) -> int:
        """Frame the whole lines of ``data`` and write them without waiting. Returns how much of
        ``data`` was taken: all of its lines, or (when the kernel took only part of their
        frames) all but the last line's ``\\n``, so that the outbox's writer calls ``send`` with
        that byte, and ``send`` writes the frames' rest first (``_pending``); 0 when nothing
        may be written now (a write in flight, a frame's rest, a line begun, not open)."""
        if (
            self._pending
            or self._partial
            or self._lock.locked()
            or self.protocol.state is not State.OPEN
        ):
            return 0
        data = bytes(data)
        end = data.rfind(b"\n")
        if end < 0:
            return 0
        protocol = self.protocol
        out = protocol.data_to_send()  # a pong, made by a receive, goes first
        for line in data[:end].split(b"\n"):
            if line:
                protocol.send_text(line)
        out += protocol.data_to_send()
        framed = b"".join(out)
        written = self._raw_try_send(framed)
        self.sent_at = time.monotonic()
        if written == len(framed):
            return end + 1
        self._pending = framed[written:]
        return end

    @property
    def close_code(self) -> int | None:
        return self.protocol.close_code

    async def flush(self) -> None:
        async with self._lock:
            chunks = self.protocol.data_to_send()
            if self._pending:  # made before anything the protocol holds now
                chunks.insert(0, self._pending)
                self._pending = b""
            if chunks:
                self.sent_at = time.monotonic()
            await send_all(self.transport, chunks)

    async def _receive(self) -> bytes:
        """The transport's next bytes; meanwhile a ping each time ``ping_s`` passes without a
        frame sent. (A cancelled transport receive consumes nothing: the socket's and TLS's.)"""
        if not self.ping_s:
            return await self.transport.receive()
        while True:
            wait = self.sent_at + self.ping_s - time.monotonic()
            if wait > 0:
                with anyio.move_on_after(wait):
                    return await self.transport.receive()
                continue
            if self.protocol.state is State.OPEN:
                self.protocol.send_ping(b"")
                with contextlib.suppress(*WEBSOCKET_ERRORS):
                    await self.flush()
            self.sent_at = time.monotonic()

    def absorb(self, events: list[Any]) -> None:
        """Take frames that came with the handshake's last read."""
        for event in events:
            self._take(event)

    def _take(self, frame: Any) -> None:
        if not isinstance(frame, Frame):
            return
        if frame.opcode is Opcode.TEXT:
            if frame.fin:
                self._deliver(frame.data)
            else:
                self._fragments = bytearray(frame.data)
        elif frame.opcode is Opcode.CONT and self._fragments is not None:
            # One buffer, not one entry per frame: empty continuation frames never bring a
            # message nearer its size limit, so a list of them would grow without bound.
            self._fragments += frame.data
            if frame.fin:
                self._deliver(bytes(self._fragments))
                self._fragments = None
        elif frame.opcode is Opcode.BINARY:
            self.protocol.fail(1003, "ACP messages are text frames")
            self._ended = True
        elif frame.opcode is Opcode.CLOSE:
            self._ended = True

    def _deliver(self, data: Any) -> None:
        if b"\n" in data:
            data = data.replace(b"\n", b" ")
        self._ready.append(bytes(data) + b"\n")

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._ready:
            if self._ended or self.protocol.state is State.CLOSED:
                raise anyio.EndOfStream
            try:
                data = await self._receive()
            except (anyio.EndOfStream, *WEBSOCKET_ERRORS):
                self.protocol.receive_eof()
                self._ended = True
            else:
                self.protocol.receive_data(data)
                if self.protocol.parser_exc is not None:
                    self._ended = True
            for event in self.protocol.events_received():
                self._take(event)
            with contextlib.suppress(*WEBSOCKET_ERRORS):
                await self.flush()
        # Every whole line ready, up to max_bytes, in one piece: the session handles a read's
        # lines together (one write toward the agent for all the messages of a read).
        ready = self._ready
        data = ready.popleft()
        if len(data) > max_bytes:
            data, rest = data[:max_bytes], data[max_bytes:]
            ready.appendleft(rest)
            return data
        if ready and len(data) + len(ready[0]) <= max_bytes:
            parts = [data]
            size = len(data)
            while ready and size + len(ready[0]) <= max_bytes:
                part = ready.popleft()
                parts.append(part)
                size += len(part)
            data = b"".join(parts)
        return data

    async def send(self, item: bytes) -> None:
        lines = (self._partial + bytes(item)).split(b"\n")
        self._partial = lines.pop()
        if self.protocol.state is not State.OPEN:
            raise anyio.BrokenResourceError("the WebSocket connection is closing")
        for line in lines:
            if line:
                self.protocol.send_text(line)
        try:
            await self.flush()
        except WEBSOCKET_ERRORS as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc

    half_close = False  # see send_eof

    async def send_eof(self) -> None:
        """The end of what the session sends. A WebSocket has no half-close (a close frame
        ends both directions: the peer answers it and closes), so nothing is sent: answers
        may still come, and the close frame goes with ``aclose``."""
        await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            if self.protocol.state is State.OPEN:
                self.protocol.send_close(1000)
            with anyio.move_on_after(CLOSE_S), contextlib.suppress(*WEBSOCKET_ERRORS):
                await self.flush()
            with contextlib.suppress(*WEBSOCKET_ERRORS):
                await self.transport.aclose()
