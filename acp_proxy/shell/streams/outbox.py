"""The outbox toward one side of a session: its bounded queues, its writes, its writer task.

Contract: owns what waits to be written toward one peer (frames forwarded from the other side in
a ``coalesce.OutboundQueue``, replies the proxy owes this side, the unwritten tail of a write),
writing it (``write_all``, the writer task, and the reader's direct writes when the writer is
idle), and the wake-ups between the reader that fills it and the writer that empties it. It never
decides what a frame becomes, never reads, and never closes its stream (the session does).

Every frame ready at once is written in ONE ``send``: no task, thread hop or write per message.
What the kernel did not take (``tail``) is written first, so no frame is split or reordered.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import anyio
import anyio.abc

from acp_proxy.base.values import value
from acp_proxy.shell.streams.transports import STREAM_ERRORS, NonBlockingSend
from acp_proxy.wire.coalesce.gate import GATE_PAUSED_S, GATE_UNREAD, WriteGate
from acp_proxy.wire.coalesce.queue import OutboundQueue, OutFrame
from acp_proxy.wire.written import after_written, frames_size, line_end_within, parts_of

# A frame (or the frames of one write) at least this big is written with writev (each frame,
# its newline) rather than copied; of more frames than ``_MAX_PARTS`` (two buffers each, within
# the kernel's 1,024) one copy is made.
_BIG_FRAME = 64 * 1024
_MAX_PARTS = 256
# What the writer takes from the queue for one write: about what a pipe holds (Linux: 64 KiB).
# The rest stays queued, where later updates still merge into it; handing the whole backlog to
# one write would commit it to the peer unmerged while the peer reads it slowly.
WRITE_CHUNK = 64 * 1024


@value(frozen=False)
class SideStats:
    """What one writer did (toward the client or toward the agent)."""

    writes: int = 0  # send() calls
    bytes: int = 0  # bytes handed to send()
    discarded: int = 0  # frames dropped because the peer was gone


# Replies the proxy itself owes a sender (error responses, middleware replies) wait in a small
# queue of their own per outbox, written ahead of forwarded frames: they never wait behind, nor
# make a reader wait for, the other direction's traffic (backpressure one way never blocks the
# other). Only when replies one sender provoked pile up unread beyond these bounds does the
# proxy stop reading that sender.
REPLY_QUEUE_FRAMES = 1024
REPLY_QUEUE_BYTES = 1024 * 1024


class Outbox:
    """The bounded queue toward one side, its writer's state, and the wake-ups between them.

    Two queues: ``queue`` for frames forwarded from the other side (coalescing, bounded by the
    config) and ``replies`` for frames the proxy answers this side with (bounded by the
    ``REPLY_QUEUE_*`` constants), which the writer serves first. Writes happen in two places,
    never at the same time: the writer task, and (the fast path) the reader task right after it
    queued frames, when the writer is idle and the stream can write without waiting
    (``try_send``). Either way everything ready is written in ONE call, and whatever the kernel
    did not take (``tail``) is written first by the writer task, so no frame is split.
    """

    __slots__ = (
        "_gate",
        "_ready",
        "_space",
        "broken",
        "busy",
        "closed",
        "finished",
        "gauged",
        "inflight",
        "parked",
        "queue",
        "replies",
        "reply_bytes",
        "stats",
        "tail",
        "try_send",
        "try_sendv",
        "tx",
        "unread",
    )

    def __init__(
        self, queue: OutboundQueue, tx: anyio.abc.ByteSendStream, stats: SideStats
    ) -> None:
        self.queue = queue
        self.tx = tx
        self.stats = stats
        # Streams over raw fds (FdStream) write without waiting, as they declare
        # (``NonBlockingSend``); others use send() only.
        self.try_send: Callable[[bytes | memoryview], int] | None = None
        self.try_sendv: Callable[[list[bytes | memoryview]], int] | None = None
        self.unread: Callable[[], int | None] | None = None
        if isinstance(tx, NonBlockingSend):
            self.try_send = tx.try_send
            self.try_sendv = tx.try_sendv if tx.VECTORED else None
            self.unread = tx.unread if tx.GAUGED else None
        self._gate = WriteGate()  # when to write while the queue merges (pure rules)
        # Whether the peer's unread bytes could be asked (a pipe, a Unix socket; not TCP): the
        # writer then merges while it waits for the peer (``queue.look``), not when it takes.
        self.gauged = False
        # What the kernel did not take yet of a direct write, in order (views, not copies: a
        # 10 MB frame is not duplicated when the pipe takes only part of it).
        self.tail: list[bytes | memoryview] = []
        self.replies: deque[bytes] = deque()  # frames (without newline) owed to this side
        self.reply_bytes = 0
        self.inflight = 0  # bytes inside the writer's current send()
        self.busy = False  # the writer task is inside tx.send()
        self.parked = False  # the writer task waits for a push, with no deadline
        self.broken = False  # the peer stopped reading: frames are discarded
        self.closed = False
        self.finished = anyio.Event()  # the writer task ended
        self._ready = anyio.Event()
        self._space = anyio.Event()

    def held(self) -> int:
        """Bytes this outbox keeps in memory (for the buffer budget)."""
        tail = 0
        for part in self.tail:
            tail += len(part)
        return self.queue.pending_bytes + self.reply_bytes + self.inflight + tail

    def has_reply_room(self) -> bool:
        return len(self.replies) < REPLY_QUEUE_FRAMES and self.reply_bytes < REPLY_QUEUE_BYTES

    def wake_writer(self) -> None:
        self._ready.set()

    def wake_reader(self) -> None:
        self._space.set()

    def reader_woken(self) -> bool:
        """A wake-up for the readers waiting on this outbox is pending (they have not run yet)."""
        return self._space.is_set()

    def writer_woken(self) -> bool:
        """A wake-up for the writer is pending (it has not run yet)."""
        return self._ready.is_set()

    def push(self, frames: tuple[OutFrame, ...], now: float) -> bool:
        """Queue ``frames`` in order (the reader waited for room before reading them).

        False when the frames need no flush: written at once, or dropped because the outbox is
        already closed (its writer is gone).
        """
        if self.closed:
            return False
        if self._writes_now():
            # No backlog: the peer keeps up, so write at once and never merge (coalescing
            # rule: while the consumer keeps up, every message is written as it comes). The
            # line the kernel cuts becomes the tail; the lines after it wait in the queue.
            self._write_direct(frames, now)
            return False
        push = self.queue.push
        for frame in frames:
            push(frame, now)
        return True

    def push_reply(self, frames: tuple[OutFrame, ...]) -> None:
        """Queue replies owed to this side, ahead of forwarded frames (never merged)."""
        if self.closed:
            return
        if (
            self.try_send is not None
            and not self.busy
            and not self.tail
            and not self.broken
            and not self.replies
        ):
            self._write_direct(frames)
            return
        for frame in frames:
            self.replies.append(frame.raw)
            self.reply_bytes += len(frame.raw) + 1
        self._ready.set()

    def write_line(self, raw: bytes) -> bool:
        """The round trip's write: ``push`` of one frame ``raw`` that is written at once, without
        building the frame tuple: True when written (the kernel's whole take, or its rest left
        as the ``tail`` for the writer), False when nothing was done and ``push`` must queue
        it (something waits before it, the queue is rate limited, or the frame is big)."""
        if self.closed or len(raw) >= _BIG_FRAME or not self._writes_now():
            return False
        self._send_now(raw + b"\n")
        return True

    def _writes_now(self) -> bool:
        """A forwarded frame may be written at once: the stream can write without waiting and
        nothing waits before the frame (no write in flight, no tail, no replies, an empty queue
        without a rate limit), and the peer still reads."""
        return (
            self.try_send is not None
            and not self.busy
            and not self.tail
            and not self.broken
            and not self.replies
            and len(self.queue) == 0
            and not self.queue.rate_limited
        )

    def _send_now(self, data: bytes) -> None:
        """One non-blocking write of ``data``; what the kernel did not take becomes the tail,
        for the writer task."""
        assert self.try_send is not None
        try:
            written = self.try_send(data)
        except STREAM_ERRORS:
            written = 0  # the writer task hits the same error and handles it
        self.stats.writes += 1
        self.stats.bytes += written
        self.note_write(written < len(data))
        if written < len(data):
            self.tail = [memoryview(data)[written:]]
            self._ready.set()

    def _write_direct(self, frames: tuple[OutFrame, ...], now: float | None = None) -> None:
        """Write ``frames`` at once; with ``now`` (forwarded frames), what the kernel does not
        take beyond the line it cut waits in the queue instead of the tail."""
        assert self.try_send is not None
        if (
            len(frames) == 1
            and len(frames[0].raw) >= _BIG_FRAME
            and self.try_sendv is not None
            and (now is None or self.unread is None or not self.queue.merging(now))
        ):
            # One big frame: writev the frame and its newline, no concatenated copy (a 10 MB
            # line is not held twice in memory).
            raw = frames[0].raw
            try:
                written = self.try_sendv([raw, b"\n"])
            except STREAM_ERRORS:
                written = 0
            self.stats.writes += 1
            self.stats.bytes += written
            if written < len(raw):
                self.tail = [memoryview(raw)[written:], b"\n"]
                self._ready.set()
            elif written == len(raw):
                self.tail = [b"\n"]
                self._ready.set()
            return
        if now is None:
            self._send_now(_joined(frames))
            return
        self._send_rest_queued(frames, now)

    def _send_rest_queued(self, frames: tuple[OutFrame, ...], now: float) -> None:
        """One non-blocking write of ``frames`` (each line ending in a newline). Only the line
        the kernel cuts is a tail; the whole lines after it wait in the queue, where later
        updates of a slow client's entities still merge into them (as a tail, a read's worth of
        updates went out unmerged every time the writer fell idle). While the queue merges, only
        what keeps the peer's unread bytes within ``GATE_UNREAD`` is written (whole lines); the
        rest waits in the queue too. A big write goes out with ``writev`` of the frames as they
        are (``written``), not joined: a read in full flow is two or three frames, and joining
        them copied the whole read twice more."""
        assert self.try_send is not None
        size = frames_size(frames)
        vector = size >= _BIG_FRAME and self.try_sendv is not None and len(frames) <= _MAX_PARTS
        data = None if vector else _joined(frames)
        offer = size
        if offer > GATE_UNREAD and self.unread is not None and self.queue.merging(now):
            unread = self.unread()
            if unread is not None and unread + offer > GATE_UNREAD:
                offer = line_end_within(frames, max(0, GATE_UNREAD - unread))
        try:
            if not offer:
                written = 0
            elif data is None:
                assert self.try_sendv is not None
                written = self.try_sendv(parts_of(frames, offer))
            else:
                written = self.try_send(data if offer == size else memoryview(data)[:offer])
        except STREAM_ERRORS:
            written = 0  # the writer task hits the same error and handles it
        self.stats.writes += 1
        self.stats.bytes += written
        self.note_write(written < offer or offer == 0)
        if written >= size:
            return
        tail, rest = after_written(frames, written)
        if tail:
            self.tail = tail
        self._ready.set()
        push = self.queue.push
        for frame in rest:
            push(frame, now)

    def note_write(self, partial: bool) -> None:
        """What a write says of the peer: a partial write, that it is behind; a complete one,
        that it keeps up. Once its unread bytes were asked, ``gate`` alone decides: a peer that
        reads everything at once still sees partial writes while the proxy writes faster."""
        if self.gauged:
            return
        if partial:
            self.queue.peer_waits = True
        elif self.unread is None:
            self.queue.peer_waits = False

    def gate(self, now: float) -> float | None:
        """While the queue merges: how long to wait before the next write, so that the peer's
        kernel buffer holds at most about ``GATE_UNREAD`` bytes it has not read; ``None``:
        write now. Each look also measures the peer's pace, which tells the queue whether
        merging pays (the rules: ``coalesce_gate``)."""
        queue = self.queue
        unread_of = self.unread
        if unread_of is None or len(queue) == 0:
            return None
        unread = unread_of()
        if unread is None:
            return None
        self.gauged = True
        look = self._gate.look(now, unread, self.stats.bytes)
        if look.consumed is not None:
            queue.consumed(*look.consumed)
        if look.peer_waits is not None:
            queue.peer_waits = look.peer_waits
        return self._gate.wait(unread, look.rate, queue.merging(now))

    def paused(self, now: float) -> bool:
        """The peer has read nothing for ``GATE_PAUSED_S`` (as far as the gate looked)."""
        return self._gate.paused(now, GATE_PAUSED_S)

    def flush_now(self, now: float) -> None:
        """After a push: write what is ready right here if the writer is idle, else wake it."""
        if self.try_send is None or self.busy or self.tail or self.broken or self.replies:
            self._ready.set()
            return
        queue = self.queue
        while True:
            if self.gate(now) is not None:
                self._ready.set()  # the writer waits for the peer to read down
                return
            frames, deadline = queue.take(now, WRITE_CHUNK, look=not self.gauged)
            self._space.set()  # (any take may make room: ``write_all``)
            if frames:
                self._send_now(frames[0] if len(frames) == 1 else b"".join(frames))
            if deadline is not None:
                self._ready.set()  # the writer sleeps until the queue's deadline
            # The peer took it all and more waits: the next piece (it may take that too).
            if not frames or self.tail or len(queue) == 0:
                return

    async def _wait_space(self) -> None:
        # Both readers may wait on one outbox (one for queue room, the other for reply room):
        # they share the event, which is only replaced once it fired.
        if self._space.is_set():
            self._space = anyio.Event()
        space = self._space
        self._ready.set()
        await space.wait()

    async def wait_room(self) -> None:
        """Backpressure: wait until the writer made room (the queue is below its bounds)."""
        while not self.closed and not self.queue.has_room():
            await self._wait_space()

    async def wait_reply_room(self) -> None:
        """Wait until the replies owed to this side are below their bounds."""
        while not self.closed and not self.has_reply_room():
            await self._wait_space()

    async def wait_ready(self, deadline: float | None) -> None:
        """Park the writer until something is pushed, the outbox closes, or ``deadline``."""
        self._ready = anyio.Event()
        if deadline is None:
            self.parked = True
            try:
                await self._ready.wait()
            finally:
                self.parked = False
            return
        with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
            await self._ready.wait()

    def close(self) -> None:
        self.closed = True
        self._ready.set()


def _joined(frames: tuple[OutFrame, ...]) -> bytes:
    """``frames`` as one buffer, each line ending in a newline (one copy)."""
    if len(frames) == 1:
        return frames[0].raw + b"\n"
    return b"\n".join([*[frame.raw for frame in frames], b""])


async def write_all(
    outbox: Outbox, account: Callable[[], None], peer_gone: Callable[[], None]
) -> None:
    """The writer task of ``outbox``: write what it holds until it is closed and empty.

    ``account`` is called whenever the bytes the outbox holds changed (the session reports them
    to the buffer budget); ``peer_gone`` once, when a write fails because the peer stopped
    reading (from then on frames are counted as discarded, not written). Never closes the stream.
    """
    queue = outbox.queue
    stats = outbox.stats
    tx = outbox.tx
    while True:
        if outbox.tail:
            data: bytes | memoryview = outbox.tail.pop(0)
            count = 0
        elif outbox.replies:
            # Replies first: they answer this side's own messages and must not wait behind
            # (or for) the other side's traffic.
            replies = list(outbox.replies)
            outbox.replies.clear()
            outbox.reply_bytes = 0
            outbox.wake_reader()
            count = len(replies)
            if outbox.broken:
                stats.discarded += count
                account()
                continue
            data = b"\n".join(replies) + b"\n"
            stats.writes += 1
        else:
            now = time.monotonic()
            wait = outbox.gate(now)
            # Merging (or encoding ahead) fills time the peer needs anyway to read down its
            # buffer; a paused peer, once nothing is left to do, gets its buffer filled.
            if wait is not None:
                looked = queue.look(now, wait)
                if looked or not outbox.paused(now):
                    if looked:
                        # What the look merged may have made room: the reader reads on
                        # meanwhile (a wait with its condition lifted and no wake-up is the
                        # watchdog's bug). A look that did nothing changed nothing the reader
                        # waits for: waking it then only made it wake the writer again at
                        # once, a loop that burnt the CPU until the peer was judged paused.
                        outbox.wake_reader()
                    await outbox.wait_ready(now + wait)
                    continue
            written = queue.stats.written
            # (A paused peer's buffer is filled: what the reader read while it pauses still
            # counts against what it may read before the peer reads again.)
            paused = wait is not None
            frames, deadline = queue.take(now, WRITE_CHUNK, look=not outbox.gauged, paused=paused)
            # Every take may have made room, one that found nothing to write too: it ends the
            # paused-input count, which alone may have kept the reader waiting (waking only
            # after takes that wrote something lost that wake-up, and a session with an empty
            # queue waited for ever on an agent blocked on its full pipe).
            outbox.wake_reader()
            if not frames:
                if outbox.closed and deadline is None:
                    break
                await outbox.wait_ready(deadline)
                continue
            count = queue.stats.written - written  # messages (a run of lines holds several)
            if outbox.broken:
                stats.discarded += count
                account()
                continue
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            stats.writes += 1
        if outbox.broken:
            continue
        if outbox.try_send is not None and count:
            # A piece of the queue: tried without waiting first, which tells the queue whether
            # the peer keeps up (merging pays only while the proxy waits for the peer).
            try:
                sent = outbox.try_send(data)
            except STREAM_ERRORS:
                sent = 0  # the send below hits the same error and handles it
            outbox.note_write(sent < len(data))
            if sent == len(data):
                account()
                stats.bytes += sent
                continue
            data = memoryview(data)[sent:]
            stats.bytes += sent
        outbox.busy = True
        outbox.inflight = len(data)
        try:
            # A memoryview only comes from a tail, and tails only from try_send streams
            # (FdStream), whose send() takes any buffer.
            await tx.send(data)  # type: ignore[arg-type]
        except STREAM_ERRORS:
            outbox.broken = True
            stats.discarded += count
            peer_gone()
            continue
        finally:
            outbox.busy = False
            outbox.inflight = 0
            account()
        stats.bytes += len(data)
