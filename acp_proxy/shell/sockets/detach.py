"""``detach_grace``: an agent that outlives its client's connection, and reattaching to it.

Contract: owns the sessions a ``--listen`` server keeps across client connections. A
``HeldSession`` runs one agent session (``runtime.run_agent_session``, or
``run_remote_agent_session`` for the agent behind ``--connect``) against a client side of its
own (``_ClientRx`` and ``_ClientTx``: the PumpSession reads and writes them as if they were the
socket), and plugs real client connections in and out of it. When the client's connection ends, the
agent, its running turn and its sessions stay for ``detach_grace`` seconds; what the agent sends
meanwhile is kept (``wire.attach.Ledger``, bounded, counted in the buffer budget); a new connection
that sends ``initialize`` then ``session/load`` (or ``session/resume``) naming one of its sessions
gets the replay and goes live (``HeldSession.reattach``; the opening that leads there is
``reattach.opening``'s). When the grace time ends with no reattach, the agent's requests are
answered (``cancelled`` for a permission request) and the agent is stopped with the stdio ladder.
Only whole lines cross between connections.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from acp_proxy.config import Config
from acp_proxy.shell.session import hooks
from acp_proxy.shell.session.buffer_budget import process_budget
from acp_proxy.shell.sockets.streams import PrefixedReceiveStream
from acp_proxy.shell.streams.transports import STREAM_ERRORS, NonBlockingSend
from acp_proxy.wire.attach import (
    Ledger,
    error,
)

_ID = b'"id"'
_T = TypeVar("_T")
# Bytes from the client queued toward the session before the client's reader waits.
_ROOM = 256 * 1024
# The JSON-RPC error code of a refused reattach (implementation-defined server error).
REFUSED = -32000


class _Turn:
    """One writer toward the client at a time (the session's writer, a reattach's replay, the
    grace expiry): a lock that does not yield when it is free (``anyio.Lock`` checkpoints on
    every acquire, a cost per write of a streaming session)."""

    def __init__(self) -> None:
        self.busy = False
        self._free = anyio.Event()

    def locked(self) -> bool:
        return self.busy

    async def __aenter__(self) -> None:
        while self.busy:
            if self._free.is_set():
                self._free = anyio.Event()
            await self._free.wait()
        self.busy = True

    async def __aexit__(self, *exc: object) -> None:
        self.busy = False
        self._free.set()


class _ClientRx(anyio.abc.ByteReceiveStream):
    """The session's client input: whole lines from whichever client is attached, then EOF
    once the session gives up waiting (``close``). A cancelled receive consumes nothing."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._closed = False
        self._more = anyio.Event()
        self._room = anyio.Event()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._chunks:
            if self._closed:
                raise anyio.EndOfStream
            if self._more.is_set():
                self._more = anyio.Event()
            await self._more.wait()
        await anyio.lowlevel.checkpoint()
        data = self._chunks.popleft()
        if len(data) > max_bytes:
            self._chunks.appendleft(data[max_bytes:])
            data = data[:max_bytes]
        self._queued -= len(data)
        self._room.set()
        return data

    async def feed(self, data: bytes) -> None:
        while self._queued > _ROOM and not self._closed:
            if self._room.is_set():
                self._room = anyio.Event()
            await self._room.wait()
        if self._closed:
            raise anyio.ClosedResourceError
        self._chunks.append(data)
        self._queued += len(data)
        self._more.set()

    def close(self) -> None:
        self._closed = True
        self._more.set()
        self._room.set()

    async def aclose(self) -> None:
        self.close()


class _ClientTx(anyio.abc.ByteSendStream):
    """The session's client output: ``HeldSession.write``."""

    def __init__(self, held: HeldSession) -> None:
        self._held = held

    async def send(self, item: bytes) -> None:
        await self._held.write(bytes(item))

    def try_send(self, data: bytes | memoryview) -> int:
        """The outbox's direct write (see ``Outbox``): notifications go straight to the attached
        client's socket, as without ``detach_grace``; anything else takes ``send`` (0)."""
        return self._held.try_write(data)

    async def aclose(self) -> None:
        await anyio.lowlevel.checkpoint()


class HeldSession:
    """One agent session that client connections attach to, one at a time."""

    def __init__(self, config: Config, hid: int, log: Any, principal: str | None = None) -> None:
        self.config = config
        self.id = hid
        self.log = log
        # Whom the first connection's token named (a JWT's issuer and subject): only a
        # connection of the same principal may reattach (``reattach.find``).
        self.principal = principal
        self.ledger = Ledger(config.detach_buffer_bytes, config.detach_buffer_frames)
        self.ledger.detach()  # until a client is attached, what the agent sends is kept
        self.rx = _ClientRx()
        self.tx = _ClientTx(self)
        self.client: anyio.abc.ByteStream | None = None
        self.shutdown = anyio.Event()  # the server stops
        self.ended = anyio.Event()  # the agent session is over
        self.expired = False  # the grace time ended: no reattach any more
        self.recorder: Any = None
        self.session: Any = None  # the PumpSession, once it runs
        self._partial = b""  # the start of a line the session has not finished writing
        self._cut = bytearray()  # the head of a line the client's socket took part of
        self._cut_lost = False  # ... and the client was lost before its end
        self._lock = _Turn()
        self._attached = anyio.Event()
        self._detached = anyio.Event()
        self._kick: anyio.CancelScope | None = None
        # The buffer is counted in the process's budget, from the pool (not a session's floor).
        self._budget = process_budget(config)
        self._counted = 0
        self.detached_at: float | None = None

    @property
    def joinable(self) -> bool:
        return not (self.expired or self.ended.is_set() or self.shutdown.is_set())

    # -- the agent's side ----------------------------------------------------------------------

    async def run(self, agent: Any, observers: list[Any]) -> tuple[int | None, Any]:
        """Run the spawned ``agent``'s session to its end (its return code and
        ``PumpSession``)."""
        from acp_proxy.shell.session.runtime import run_agent_session

        return await self._run(
            run_agent_session(
                self.config,
                agent,
                self.rx,
                self.tx,
                log=self.log,
                shutdown=self.shutdown,
                observers=observers,
                on_session=self._started,
            )
        )

    async def run_remote(
        self, agent_stream: anyio.abc.ByteStream, label: str, observers: list[Any]
    ) -> tuple[bool, Any]:
        """Run the session of the agent on ``agent_stream`` (``--connect``) to its end: whether
        its connection was lost, and the ``PumpSession``. The caller closes the stream."""
        from acp_proxy.shell.session.runtime import run_remote_agent_session

        return await self._run(
            run_remote_agent_session(
                self.config,
                agent_stream,
                self.rx,
                self.tx,
                log=self.log,
                shutdown=self.shutdown,
                agent_label=label,
                observers=observers,
                on_session=self._started,
            )
        )

    async def _run(self, session: Coroutine[Any, Any, _T]) -> _T:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._grace)
                result = await session
                tg.cancel_scope.cancel()
            return result
        finally:
            self.ended.set()
            self._budget.add(-self._counted)
            self._counted = 0

    def try_write(self, data: bytes | memoryview) -> int:
        """A non-blocking write of whole lines to the attached client, only when they hold no
        ``"id"`` key (notifications, which the ledger keeps nothing of while attached) and
        nothing waits before them; how much the socket took (0: use ``write``). A line the
        socket cut is finished by ``write`` (``_cut``)."""
        client = self.client
        if client is None or self._cut or self._partial or self._lock.locked():
            return 0
        if not isinstance(client, NonBlockingSend):  # a WebSocket: its frames go through write
            return 0
        raw = data if isinstance(data, bytes) else bytes(data)
        if _ID in raw:
            return 0
        written = client.try_send(raw)
        if written < len(raw):
            start = raw.rfind(b"\n", 0, written) + 1
            self._cut += raw[start:written]
        return written

    async def _finish_cut(self, piece: bytes, done: bool) -> None:
        """More of the line the client's socket cut (``done``: its end): to the same client;
        when that client is gone, the whole line is kept for the next one."""
        async with self._lock:
            client = self.client
            if client is not None and not self._cut_lost:
                try:
                    await client.send(piece)
                except STREAM_ERRORS:
                    self._lost(client)
                    self._cut_lost = True
            else:
                self._cut_lost = True
            self._cut += piece
            if done:
                line = bytes(self._cut[:-1])
                self._cut.clear()
                if self._cut_lost:
                    self._cut_lost = False
                    out = self.ledger.to_client(line)
                    if out is not None and self.client is not None:
                        await self._send(self.client, [out])
            self._count()

    async def _send(self, client: anyio.abc.ByteStream, lines: list[bytes]) -> None:
        try:
            await client.send(b"".join(line + b"\n" for line in lines))
        except STREAM_ERRORS:
            self._lost(client)
            for line in lines:
                self.ledger.requeue(line)
        else:
            self.ledger.written()

    def _started(self, session: Any) -> None:
        self.session = session

    async def write(self, data: bytes) -> None:
        """What the session writes toward the client: to the attached one, or kept."""
        if self._cut:  # the client has the head of a line (``try_write``): its rest first
            end = data.find(b"\n") + 1
            piece, data = (data, b"") if end == 0 else (data[:end], data[end:])
            await self._finish_cut(piece, end > 0)
            if not data:
                return
        if self._partial:
            data, self._partial = self._partial + data, b""
        end = data.rfind(b"\n") + 1
        if end < len(data):
            data, self._partial = data[:end], data[end:]
        if not data:
            return
        async with self._lock:
            client = self.client
            if client is not None and _ID not in data:
                lines: list[bytes] | None = None  # notifications only: as they are
                out = data
            else:
                lines = [o for line in data[:-1].split(b"\n") if (o := self.ledger.to_client(line))]
                out = b"".join(line + b"\n" for line in lines)
            self._count()
            if client is None or not out:
                return
            try:
                await client.send(out)
            except STREAM_ERRORS:
                self._lost(client)
                for line in lines if lines is not None else data[:-1].split(b"\n"):
                    self.ledger.requeue(line)
                self._count()
            else:
                self.ledger.written()

    def _count(self) -> None:
        held = self.ledger.buffered_bytes + len(self._partial) + len(self._cut)
        if held != self._counted and not self.ended.is_set():
            self._budget.add(held - self._counted)
            self._counted = held

    # -- attaching and detaching ---------------------------------------------------------------

    def _lost(self, client: anyio.abc.ByteStream) -> None:
        """``client`` is gone (EOF, an error, a takeover): keep the agent for the grace time."""
        if self.client is not client:
            return
        self.client = None
        self.ledger.detach()
        self.detached_at = time.monotonic()
        self._attached = anyio.Event()
        self._detached.set()
        if self.ended.is_set() or self.shutdown.is_set():
            return
        grace = self.config.detach_grace_s
        self.log.info(
            "client detached; keeping the agent",
            grace_s=grace,
            sessions=sorted(self.ledger.sessions),
        )
        self._event("detach", grace_s=grace, sessions=sorted(self.ledger.sessions))

    async def serve(self, client: anyio.abc.ByteStream, rx: anyio.abc.ByteReceiveStream) -> None:
        """Pump ``client``'s lines into the session until it leaves (or is taken over, or the
        session ends); ``client`` must be attached already (``attach_first`` / ``reattach``)."""
        async with anyio.create_task_group() as tg:
            self._kick = tg.cancel_scope

            async def on_end() -> None:
                await self.ended.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(on_end)
            try:
                await self._pump(rx)
            finally:
                self._lost(client)
                tg.cancel_scope.cancel()

    def attach_first(self, client: anyio.abc.ByteStream) -> None:
        self.client = client
        self.ledger.attached = True
        self._detached = anyio.Event()
        self._attached.set()

    async def _pump(self, rx: anyio.abc.ByteReceiveStream) -> None:
        partial = b""
        try:
            while True:
                data = await rx.receive()
                if partial:
                    data, partial = partial + data, b""
                end = data.rfind(b"\n") + 1
                if end < len(data):
                    data, partial = data[:end], data[end:]
                if not data:
                    continue
                if _ID in data:
                    lines = data[:-1].split(b"\n")
                    data = b"".join(self.ledger.from_client(line) + b"\n" for line in lines)
                await self.rx.feed(data)
        except STREAM_ERRORS:
            pass

    async def reattach(
        self,
        client: anyio.abc.ByteStream,
        rest: bytes,
        request: tuple[Any, str, str],
        raw: bytes,
    ) -> bytes | None:
        """A new connection asks for one of this agent's sessions (``request``: id, method,
        session; ``raw``: its line; ``rest``: what it sent after it). Serves the client and
        returns ``None``, or returns the error line that refuses it (the connection goes on)."""
        rid, method, sid = request
        if self.client is not None:
            if not self.config.takeover:
                self._event("reattach_refused", reason="attached", session=sid)
                return error(
                    rid,
                    REFUSED,
                    f"acp-proxy: session {sid} is attached to another connection (takeover: false)",
                    {"reason": "attached", "sessionId": sid},
                )
            self.log.info("session taken over by a new connection", session=sid)
            self._event("takeover", session=sid)
            if self._kick is not None:
                self._kick.cancel()
            await self._detached.wait()
        forwarded = False
        async with self._lock:
            ledger = self.ledger
            if ledger.overflowed:
                if not (ledger.load_session and method == "session/load"):
                    lost = ledger.lost
                    self._event("reattach_refused", reason="overflow", session=sid, lost=lost)
                    self.log.warning(
                        "reattach refused: the detach buffer overflowed", session=sid, lost=lost
                    )
                    hooks.detach_event("refused", 0)
                    return error(
                        rid,
                        REFUSED,
                        f"acp-proxy: cannot reattach session {sid}: the agent sent more than "
                        f"the detach buffer holds (detach_buffer_bytes "
                        f"{ledger.max_bytes}, detach_buffer_frames {ledger.max_frames}) while "
                        f"no client was attached; {lost} frames are lost",
                        {"reason": "detach_buffer_overflow", "sessionId": sid, "lost": lost},
                    )
                ledger.forward_after_overflow()
                forwarded = True
                frames: list[bytes] = []
                replay = None
            else:
                replay = ledger.reattach(rid, method, sid)
                frames = replay.frames
            try:
                if frames:
                    await client.send(b"".join(f + b"\n" for f in frames))
            except STREAM_ERRORS:
                ledger.detach()
                return None
            self.attach_first(client)
            self._count()
        away = time.monotonic() - (self.detached_at or time.monotonic())
        if replay is not None:
            self.log.info(
                "client reattached",
                session=sid,
                away_s=round(away, 3),
                replayed=replay.buffered,
                redelivered=replay.redelivered,
                answered=replay.answered,
                dropped=self.ledger.dropped,
            )
            self._event(
                "reattach",
                session=sid,
                away_s=round(away, 3),
                replayed=replay.buffered,
                redelivered=replay.redelivered,
            )
            hooks.detach_event("reattach", replay.buffered + replay.redelivered)
        else:
            self.log.info("client reattached; session/load forwarded to the agent", session=sid)
            self._event("reattach", session=sid, away_s=round(away, 3), forwarded=True)
            hooks.detach_event("reattach", 0)
        head = raw + b"\n" if forwarded else b""
        await self.serve(client, PrefixedReceiveStream(head + rest, client))
        return None

    async def _grace(self) -> None:
        """While detached for ``detach_grace`` seconds with no reattach: answer the agent's
        requests, then end the client side (the session stops the agent with the ladder)."""
        while True:
            await self._detached.wait()
            with anyio.move_on_after(self.config.detach_grace_s) as waited:
                await self._attached.wait()
            if not waited.cancelled_caught:
                continue
            async with self._lock:
                if self.client is not None:
                    continue
                answers = self.ledger.expire()
                self.expired = True
            grace = self.config.detach_grace_s
            self.log.info(
                "no client reattached within the grace time; stopping the agent",
                grace_s=grace,
                answered=len(answers),
                lost=self.ledger.lost,
            )
            self._event("detach_expired", grace_s=grace, answered=len(answers))
            hooks.detach_event("expired", 0)
            if answers:
                await self.rx.feed(b"".join(a + b"\n" for a in answers))
            self.rx.close()
            return

    def _event(self, name: str, **fields: object) -> None:
        if name == "detach":
            hooks.detach_event("detach", 0)
        elif name == "takeover":
            hooks.detach_event("takeover", 0)
        elif name == "reattach_refused" and fields.get("reason") == "attached":
            hooks.detach_event("refused", 0)
        # The record and the live view (the session's observers that take events).
        now = time.monotonic()
        for observer in self.session.observers if self.session is not None else ():
            told = getattr(observer, "event", None)
            if told is not None:
                told(name, now, **fields)


__all__ = ["REFUSED", "HeldSession"]
