"""The reader of one direction of a session: read chunks, run them through the core, hand on.

Contract: owns reading one peer's byte stream (its ``LineSplitter``, its stop flag, when it
started waiting, its cancel scope) and running each chunk through the pure ``Connection``
synchronously; what the core returns goes to the session's ``dispatch``, which queues and writes
it. It never parses JSON, never decides what a message becomes, and never waits for the other
direction's traffic.

Before each read it waits for three things only (backpressure in one direction stops reading
*from the sender of that direction* only): room in the queue toward the receiver, room for the
replies this sender provoked, and the process's buffer budget. Per direction one reader reads
large chunks and runs the whole chunk through the core in one call: no task, thread hop or write
per message, and the order per direction is the order of arrival.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from acp_proxy.shell.session.buffer_budget import READ_SIZE, BufferBudget, Share
from acp_proxy.shell.streams.outbox import Outbox
from acp_proxy.shell.streams.transports import (
    HANDLED,
    HANDLED_WAKE,
    NOT_HANDLED,
    STREAM_ERRORS,
    ChunkConsumer,
)
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.pipeline import AS_CAME, Connection, Result
from acp_proxy.wire.framing import LineSplitter

# What the session does with what the core returned for a read: (direction, result, the outbox
# toward the receiver, the outbox back toward the sender).
Dispatch = Callable[[Direction, Result, Outbox, Outbox], None]


class Reader:
    """The reader of ``direction``: ``run`` reads until EOF or ``stop``."""

    __slots__ = ("_scope", "direction", "receiving", "splitter", "stopping", "waiting")

    def __init__(self, direction: Direction, max_frame_bytes: int) -> None:
        self.direction = direction
        self.splitter = LineSplitter(max_frame_bytes)
        self.stopping = False  # stop() was called: read no more
        self.receiving: float | None = None  # when it started waiting in receive() (None: not)
        # What it waits for before its next read, if anything: "room" (in the queue toward the
        # receiver) or "reply room" (the replies owed to the sender); for the watchdog.
        self.waiting: str | None = None
        self._scope: anyio.CancelScope | None = None

    def stop(self) -> None:
        """Stop reading as if the peer had sent EOF (a frame being read is never split)."""
        self.stopping = True
        if self._scope is not None:
            self._scope.cancel()

    async def run(
        self,
        rx: anyio.abc.ByteReceiveStream,
        *,
        connection: Connection,
        forward: Outbox,
        back: Outbox,
        budget: BufferBudget | Share,
        dispatch: Dispatch,
        account: Callable[[], None],
    ) -> None:
        """Read ``rx`` to its end (or ``stop``); ``forward`` is the outbox toward the receiver,
        ``back`` the one toward the sender (for the replies the proxy owes it); ``account`` is
        called when what the session's buffers hold changed (``budget``)."""
        # The whole chunk goes through the core in one call, and its frames are queued without
        # awaiting: the queue may overshoot its bound by one chunk's frames, which keeps memory
        # bounded (read size + one maximal frame) and the hot path free of per-frame awaits.
        direction = self.direction
        splitter = self.splitter
        single_line = splitter.single_line
        handle_many = connection.handle_many
        handle_line = connection.handle_line
        reserved = 0

        def handle(chunk: bytes, line: bytes | None) -> None:
            """One chunk through the core and out (synchronous); ``line``: what
            ``single_line(chunk)`` gave."""
            # The complete lines of the chunk travel as one block
            # (``acp_proxy.wire.connection.blocks``: one
            # scan finds the lines that need the per-line path; the runs between them are
            # forwarded whole). Backlog or not: a joined run that has to wait in the outbound
            # queue is split into its lines there, so coalescing still merges them
            # (the queue's merge pass). Going line by line under backlog made a proxy that fell
            # behind slower still (docs/performance.md, "Figures behind the code").
            events: list[Any] | bool
            if line is not None:  # the interactive case, one line a read: fewer steps
                events = True
                got = handle_line(direction, line)
                if got is AS_CAME:  # tracked, on as it came
                    got = Result((OutFrame(line, None, connection.version),))
                dispatch(direction, got, forward, back)
            else:
                events = splitter.feed_blocks(chunk)
                if events:
                    dispatch(direction, handle_many(direction, events, join=True), forward, back)
            account()
            budget.add(-READ_SIZE)  # the read reserved before this chunk was read
            if (events or not splitter.buffered) and budget.owned_by(splitter):
                budget.release_owner(splitter)  # its line is complete

        def consume(chunk: bytes) -> int:
            """A chunk read by the stream's readiness callback while this reader is parked in
            ``receive_or_handled`` is handled right there, without waking the reader task (one
            loop iteration and one task switch less per message). When the next read may follow
            at once (the same three conditions as the loop's waits below), the callback reserves
            it and the reader stays parked; otherwise the reader wakes to wait. Not while
            stopping: the reader takes the chunk, as without a consumer."""
            if self.stopping:
                return NOT_HANDLED
            line = single_line(chunk)
            if line is not None:
                # The round trip's step: one line, forwarded as it came and written at once.
                # Nothing any buffer holds changed (the splitter holds no partial line, the
                # outbox wrote it whole), so no accounting is due, and the read this chunk
                # reserved is kept for the next one when the budget would grant it again.
                got = handle_line(direction, line)
                if got is AS_CAME:  # a request or response, tracked: on as it came
                    written = forward.write_line(line)
                else:
                    written = (
                        len(got.forward) == 1
                        and not got.reply
                        and not got.notes
                        and forward.write_line(got.forward[0].raw)
                    )
                if written:
                    if forward.tail:
                        account()
                    if (
                        budget.keep_read(splitter)
                        and forward.queue.has_room()
                        and back.has_reply_room()
                    ):
                        self.receiving = time.monotonic()
                        return HANDLED
                    budget.add(-READ_SIZE)
                    budget.release_owner(splitter)
                else:
                    if got is AS_CAME:
                        got = Result((OutFrame(line, None, connection.version),))
                    dispatch(direction, got, forward, back)
                    account()
                    budget.add(-READ_SIZE)
                    budget.release_owner(splitter)
            else:
                handle(chunk, None)
            if (
                forward.queue.has_room()
                and back.has_reply_room()
                and budget.try_reserve_read(splitter, splitter.buffered)
            ):
                self.receiving = time.monotonic()
                return HANDLED
            return HANDLED_WAKE

        receive: Callable[[int], Awaitable[bytes | None]] = rx.receive
        if isinstance(rx, ChunkConsumer):
            rx.set_consumer(consume)
            receive = rx.receive_or_handled
        # One cancel scope for the whole loop (``stop`` cancels it): the only awaits are the
        # waits for room and ``receive``, and a cancelled receive consumes nothing, while each
        # chunk is dispatched synchronously, so stopping never loses or splits a frame.
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self.stopping:
                scope.cancel()
            try:
                while True:
                    if not forward.queue.has_room():
                        self.waiting = "room"
                        await forward.wait_room()
                    if not back.has_reply_room():
                        self.waiting = "reply room"
                        await back.wait_reply_room()
                    self.waiting = None
                    reserved = await budget.reserve_read(splitter, splitter.buffered)
                    self.receiving = time.monotonic()
                    try:
                        chunk = await receive(reserved)
                    except STREAM_ERRORS:
                        break
                    finally:
                        self.receiving = None
                    if chunk is not None:
                        handle(chunk, single_line(chunk))  # gives the reserved read back
                    # (``None``: the consumer handled what was read, and gave back the reserved
                    # read of the last chunk it handled without reserving another.)
                    reserved = 0
            finally:
                self.waiting = None
                if isinstance(rx, ChunkConsumer):
                    rx.set_consumer(None)
                if reserved:
                    budget.add(-reserved)
                budget.release_owner(splitter)
        self._scope = None
        if not scope.cancel_called:  # real EOF: a last line without its newline still counts
            tail = splitter.end()
            if tail:
                dispatch(direction, handle_many(direction, tail), forward, back)
        account()
