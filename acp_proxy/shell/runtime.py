"""The I/O shell of one proxied session: pump bytes through the pure pipeline, both ways.

Contract: owns moving bytes between two byte streams (client side, agent side) through the pure
core (``framing.LineSplitter`` -> ``pipeline.Connection`` -> ``coalesce.OutboundQueue``), the
tasks that do it, backpressure, end-of-session ordering, and logging what the core reports. It
never parses JSON itself and never decides what a message becomes (style.md habit 1: thin shell).

Shape (style.md habit 6, issue 6): per direction one reader task that reads large chunks and runs
the whole chunk through the core synchronously, and per side one writer task that takes every
ready frame and writes them in ONE ``send``. No task, thread hop or write per message. Order per
direction is the order of arrival.

Bounds (README "Bounds"):

* Backpressure in one direction stops reading *from the sender of that direction* only (issue
  9.3): when the queue toward a side is full, the reader feeding it waits. Replies the proxy owes
  a sender go into that sender's own small reply queue, written first; a reader never waits for
  the other direction's traffic, so an agent that streams without reading its stdin (or a client
  that reads only after it sent everything) works as it does without the proxy.
* All sessions of the process share a ``BufferBudget`` (issue 10.3): partial lines, queues and
  one reserved read per reader, summed, stay within ``max_buffer_bytes``.
* Errors owed for requests in flight are built and queued in chunks (issue 10.2).
* After the agent exited, its last output and the errors reach a slow client for up to
  ``agent.drain_timeout``; a cut-off is logged with what was discarded (issue 9.4).

``pump_session`` is transport-agnostic (any anyio byte streams: pipes, stdio, TCP, Unix); the
agent process lifecycle is plugged in by ``run_proxy`` through two hooks.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc

from acp_proxy.config import Config
from acp_proxy.shell import hooks
from acp_proxy.shell.logsetup import debug_enabled, get_logger
from acp_proxy.shell.process import (
    STDOUT_LINGER_S,
    AgentProcess,
    describe_status,
    drain_stderr,
    exit_code_of,
    spawn_agent,
    spawn_error_exit,
)
from acp_proxy.shell.spawn import SpawnError, early_signals
from acp_proxy.shell.transports import HANDLED, HANDLED_WAKE, NOT_HANDLED
from acp_proxy.values import value
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce import OutboundQueue, OutFrame
from acp_proxy.wire.framing import LineSplitter
from acp_proxy.wire.pipeline import (
    Connection,
    Dropped,
    FrameInfo,
    MiddlewareFailed,
    NonJson,
    Note,
    NotParsed,
    Observed,
    OversizeFrame,
    PendingFull,
    Result,
    Rewritten,
    SkippedV1,
    UnusualVersion,
    VersionNegotiated,
)

if TYPE_CHECKING:
    from acp_proxy.shell.framelog import FrameLog
    from acp_proxy.shell.recorder import Recorder

READ_SIZE = 256 * 1024
# A frame at least this big is written with writev (frame, newline) rather than copied.
_BIG_FRAME = 64 * 1024
_STREAM_ERRORS = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError)


@value(frozen=False)
class SideStats:
    """What one writer did (toward the client or toward the agent)."""

    writes: int = 0  # send() calls
    bytes: int = 0  # bytes handed to send()
    discarded: int = 0  # frames dropped because the peer was gone


@value(frozen=False)
class SessionStats:
    to_client: SideStats = field(default_factory=SideStats)
    to_agent: SideStats = field(default_factory=SideStats)
    client_eof: bool = False
    agent_eof: bool = False


# Replies the proxy itself owes a sender (error responses, middleware replies) wait in a small
# queue of their own per outbox, written ahead of forwarded frames: they never wait behind, nor
# make a reader wait for, the other direction's traffic (issue 9.3). Only when replies one
# sender provoked pile up unread beyond these bounds does the proxy stop reading that sender.
REPLY_QUEUE_FRAMES = 1024
REPLY_QUEUE_BYTES = 1024 * 1024


class BufferBudget:
    """The process-wide bound on bytes held by all sessions' buffers (issue 10.3).

    Counts what every session holds in its ``LineSplitter`` partial lines and its outbound
    queues (queued frames, replies, unwritten tails, the write in flight), plus one read
    (``READ_SIZE``) reserved by each reader before it reads. A reader reads only while the total
    stays below ``limit - reserve``; otherwise it waits until another session releases bytes.

    ``reserve`` (one maximal frame plus one read) is kept for a single reader at a time, the
    *owner*: a reader in the middle of a line may take it when it is free and what the others
    hold leaves room for a whole frame, so one legal frame can always complete (a budget full
    of partial lines would otherwise deadlock: every reader waits for the others to finish
    their lines). The owner gives it back once its pending line is complete. Normal reads keep
    the total below ``limit - reserve`` and the owner adds at most one frame and one read, so
    the total never exceeds ``limit`` (bytes a stream returns beyond ``READ_SIZE`` aside).

    Not thread-safe: all sessions sharing it run on one event loop.
    """

    __slots__ = ("_owner", "_waiters", "held", "limit", "peak", "reserve", "waits")

    def __init__(self, limit: int, reserve: int) -> None:
        """Raises ``ValueError`` unless ``limit`` leaves room for ``reserve`` and two reads."""
        if limit < reserve + 2 * READ_SIZE:
            raise ValueError(f"a buffer budget of {limit} bytes cannot hold {reserve} + 2 reads")
        self.limit = limit
        self.reserve = reserve
        self.held = 0  # bytes held and reserved right now, by all sessions
        self.peak = 0  # the largest ``held`` seen
        self.waits = 0  # times a reader had to wait for the budget
        self._owner: object | None = None  # the reader allowed into the reserve
        self._waiters: list[anyio.Event] = []

    def add(self, delta: int) -> None:
        """Account for ``delta`` more (or, negative, fewer) bytes held."""
        self.held += delta
        if delta > 0:
            self.peak = max(self.peak, self.held)
        elif delta < 0 and self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for event in waiters:
            event.set()

    def _may_read(self, reader: object, partial: int) -> bool:
        if self._owner is reader:
            return True
        threshold = self.limit - self.reserve
        if self.held + READ_SIZE <= threshold:
            return True
        # The reserve is free and this reader is in the middle of a line: it may finish it,
        # provided what the others hold leaves room for a whole frame (else wait for them).
        if partial and self._owner is None and self.held - partial <= threshold:
            self._owner = reader
            return True
        return False

    async def reserve_read(self, reader: object, partial: int) -> int:
        """Wait until ``reader`` may read, reserve one read (``READ_SIZE``) and return it.

        ``partial``: the bytes of the line ``reader`` is in the middle of (0: none); only such a
        reader may take the reserve.
        """
        while not self._may_read(reader, partial):
            event = anyio.Event()
            self._waiters.append(event)
            self.waits += 1
            try:
                await event.wait()
            finally:
                if event in self._waiters:
                    self._waiters.remove(event)
        self.add(READ_SIZE)
        return READ_SIZE

    def try_reserve_read(self, reader: object, partial: int) -> bool:
        """``reserve_read`` without waiting: True (one read reserved) when ``reader`` may read
        now, else False (nothing reserved)."""
        if not self._may_read(reader, partial):
            return False
        self.add(READ_SIZE)
        return True

    def keep_read(self, reader: object) -> bool:
        """Whether ``reader``, which just handled the chunk of its reserved read and holds no
        partial line, may keep that read reserved for its next read: True exactly when
        ``add(-READ_SIZE)``, ``release_owner(reader)`` and ``try_reserve_read(reader, 0)``
        would leave the budget as it is (nobody waits to be woken, ``reader`` does not own the
        reserve, and the budget has room for the read). Issue 13: three calls less per message
        on interactive traffic."""
        return (
            self._owner is not reader
            and not self._waiters
            and self.held <= self.limit - self.reserve
        )

    def release_owner(self, reader: object) -> None:
        """``reader`` finished its line (or stopped): the reserve is free for another."""
        if self._owner is reader:
            self._owner = None
            self._wake()

    def owned_by(self, reader: object) -> bool:
        return self._owner is reader


_BUDGETS: dict[tuple[int, int], BufferBudget] = {}


def process_budget(config: Config) -> BufferBudget:
    """The budget every session of this process with these settings shares (one per process in
    practice: all sessions of a listener use one config). Never below what one maximal frame
    needs, even for a ``Config`` built in code without the file's validation."""
    reserve = config.max_frame_bytes + READ_SIZE
    limit = max(config.max_buffer_bytes, reserve + 2 * READ_SIZE)
    budget = _BUDGETS.get((limit, reserve))
    if budget is None:
        budget = _BUDGETS[(limit, reserve)] = BufferBudget(limit, reserve)
    return budget


class _Outbox:
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
        "_ready",
        "_space",
        "broken",
        "busy",
        "closed",
        "finished",
        "inflight",
        "queue",
        "replies",
        "reply_bytes",
        "stats",
        "tail",
        "try_send",
        "try_sendv",
        "tx",
    )

    def __init__(
        self, queue: OutboundQueue, tx: anyio.abc.ByteSendStream, stats: SideStats
    ) -> None:
        self.queue = queue
        self.tx = tx
        self.stats = stats
        # Streams over raw fds (FdStream) offer a non-blocking write; others use send() only.
        try_send = getattr(tx, "try_send", None)
        self.try_send: Callable[[bytes], int] | None = try_send if callable(try_send) else None
        try_sendv = getattr(tx, "try_sendv", None)
        self.try_sendv: Callable[[list[bytes]], int] | None = (
            try_sendv if callable(try_sendv) else None
        )
        # What the kernel did not take yet of a direct write, in order (views, not copies: a
        # 10 MB frame is not duplicated when the pipe takes only part of it).
        self.tail: list[bytes | memoryview] = []
        self.replies: deque[bytes] = deque()  # frames (without newline) owed to this side
        self.reply_bytes = 0
        self.inflight = 0  # bytes inside the writer's current send()
        self.busy = False  # the writer task is inside tx.send()
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

    def push(self, frames: tuple[OutFrame, ...], now: float) -> bool:
        """Queue ``frames`` in order (the reader waited for room before reading them).

        False when the frames need no flush: written at once, or dropped because the outbox is
        already closed (its writer is gone).
        """
        if self.closed:
            return False
        if self._writes_now():
            # No backlog: the peer keeps up, so write at once and never merge (issue 4:
            # "while the consumer keeps up, every message is written as it comes"). What the
            # kernel does not take becomes the tail, and the next frames queue behind it.
            self._write_direct(frames)
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
        """Issue 13 (round trip): ``push`` of one frame ``raw`` that is written at once, without
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
        except _STREAM_ERRORS:
            written = 0  # the writer task hits the same error and handles it
        self.stats.writes += 1
        self.stats.bytes += written
        if written < len(data):
            self.tail = [memoryview(data)[written:]]
            self._ready.set()

    def _write_direct(self, frames: tuple[OutFrame, ...]) -> None:
        assert self.try_send is not None
        if len(frames) == 1 and len(frames[0].raw) >= _BIG_FRAME and self.try_sendv is not None:
            # One big frame: writev the frame and its newline, no concatenated copy (issue 6:
            # peak RSS with a 10 MB line).
            raw = frames[0].raw
            try:
                written = self.try_sendv([raw, b"\n"])
            except _STREAM_ERRORS:
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
        self._send_now(
            frames[0].raw + b"\n"
            if len(frames) == 1
            else b"\n".join([f.raw for f in frames]) + b"\n"
        )

    def flush_now(self, now: float) -> None:
        """After a push: write what is ready right here if the writer is idle, else wake it."""
        if self.try_send is None or self.busy or self.tail or self.broken or self.replies:
            self._ready.set()
            return
        frames, deadline = self.queue.take(now)
        if frames:
            self._space.set()
            self._send_now(frames[0] if len(frames) == 1 else b"".join(frames))
        if deadline is not None:
            self._ready.set()  # the writer sleeps until the queue's deadline

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
            await self._ready.wait()
            return
        with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
            await self._ready.wait()

    def close(self) -> None:
        self.closed = True
        self._ready.set()


class SessionObserver(Protocol):
    """What recording, metrics and tracing see of one session (issues 11 and 12).

    A ``PumpSession`` with observers runs its ``Connection`` in observe mode: every frame read
    comes with an ``Observed`` note (the raw frame, what was sent instead, the replies, each
    message's method / id / the method a response answers). Observers run on the session's task,
    synchronously, so they must be quick and must never raise (a failing observer would stop the
    session); heavy work (files, exporters) goes behind a bounded buffer of their own.
    """

    def on_notes(self, notes: tuple[Note, ...], now: float) -> None:
        """The notes of one read (``Observed`` per frame, ``VersionNegotiated``, warnings...);
        ``now`` is ``time.monotonic()``."""

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        """Frames the proxy wrote on its own toward ``direction``'s receiver (the -32603 errors
        owed when a peer is gone), without their newlines."""

    def on_end(self, session: PumpSession, now: float) -> None:
        """The session is over (``session.summary()`` has its counts)."""


class PumpSession:
    """One session between a client stream pair and an agent stream pair.

    ``agent_exit_reason`` is awaited once the agent's output ended; its text goes into the
    -32603 errors for client requests still in flight (``Connection.abort_pending``).
    ``on_agent_input_closed`` is called once the agent's input was flushed and closed (client
    EOF or ``stop_client_input``): the process layer starts its shutdown ladder there.
    ``budget`` is the buffer budget shared with other sessions (default: ``process_budget``).
    """

    def __init__(
        self,
        config: Config,
        client_rx: anyio.abc.ByteReceiveStream,
        client_tx: anyio.abc.ByteSendStream,
        agent_rx: anyio.abc.ByteReceiveStream,
        agent_tx: anyio.abc.ByteSendStream,
        *,
        log: Any = None,
        agent_exit_reason: Callable[[], Awaitable[str]] | None = None,
        on_agent_input_closed: Callable[[], None] | None = None,
        connection: Connection | None = None,
        budget: BufferBudget | None = None,
        observers: Sequence[SessionObserver] = (),
    ) -> None:
        self.config = config
        self.log = log if log is not None else get_logger()
        self._debug = debug_enabled()
        # Process-wide observers (metrics, tracing: issue 12) join the caller's.
        self.observers = (*observers, *hooks.session_observers(self))
        # Debug frame lines (issue 11); --log-frames needs each frame's bytes: observe mode.
        self._frame_log: FrameLog | None = None
        if self._debug:
            # Imported only here: its redaction rules and frame tables serve the debug log.
            from acp_proxy.shell.framelog import FrameLog

            self._frame_log = FrameLog(self.log, config.record)
        contents = self._frame_log is not None and self._frame_log.contents
        self.connection = connection or Connection(
            config.build_chain(),
            non_json=config.non_json,
            inspect_all=self._debug,
            max_parse_bytes=config.max_parse_bytes,
            max_pending=config.max_pending_requests,
            observe=bool(self.observers) or contents,
        )
        self._client_rx, self._client_tx = client_rx, client_tx
        self._agent_rx, self._agent_tx = agent_rx, agent_tx
        self._agent_exit_reason = agent_exit_reason
        self._on_agent_input_closed = on_agent_input_closed
        self.stats = SessionStats()
        self.to_agent = _Outbox(
            OutboundQueue(config.coalesce, coalesce=False), agent_tx, self.stats.to_agent
        )
        # Coalescing (issue 4) only ever applies toward the client: agent updates are what a
        # slow editor falls behind on.
        self.to_client = _Outbox(
            OutboundQueue(config.coalesce, coalesce=True), client_tx, self.stats.to_client
        )
        self.budget = budget if budget is not None else process_budget(config)
        self._held = 0  # what this session counts in the budget
        self._splitters = {
            Direction.CLIENT_TO_AGENT: LineSplitter(config.max_frame_bytes),
            Direction.AGENT_TO_CLIENT: LineSplitter(config.max_frame_bytes),
        }
        self._stopping = {Direction.CLIENT_TO_AGENT: False, Direction.AGENT_TO_CLIENT: False}
        self._recv_scopes: dict[Direction, anyio.CancelScope] = {}
        # When each reader started waiting in receive() (None: it is not in receive()).
        self._receiving: dict[Direction, float | None] = {
            Direction.CLIENT_TO_AGENT: None,
            Direction.AGENT_TO_CLIENT: None,
        }
        self.agent_output_ended = False  # the agent reader stopped (EOF or stop_agent_output)
        self._aborts_left = 0  # -32603 errors owed to the client and not queued yet

    # -- control --------------------------------------------------------------------------

    def stop_client_input(self) -> None:
        """Stop reading the client as if it had sent EOF (signals, client gone)."""
        self._stop(Direction.CLIENT_TO_AGENT)

    def stop_agent_output(self) -> None:
        """Stop reading the agent as if it had closed its output (it exited; pipe lingers)."""
        self._stop(Direction.AGENT_TO_CLIENT)

    def _stop(self, direction: Direction) -> None:
        self._stopping[direction] = True
        scope = self._recv_scopes.get(direction)
        if scope is not None:
            scope.cancel()

    @property
    def bytes_to_client(self) -> int:
        return self.stats.to_client.bytes

    def agent_receive_idle_s(self, now: float) -> float | None:
        """How long the agent reader has been waiting in receive() (None: it is not there, e.g.
        it waits for the client to make room)."""
        since = self._receiving[Direction.AGENT_TO_CLIENT]
        return None if since is None else now - since

    def undelivered(self) -> dict[str, Any]:
        """What the client has not received yet (for the log when the session is cut short)."""
        box = self.to_client
        return {
            "frames": len(box.queue) + len(box.replies) + (1 if box.tail or box.inflight else 0),
            "bytes": box.held(),
            # Owed -32603 errors not queued yet (still tracked, or detached but not built).
            "errors_not_queued": self._aborts_left + self.connection.pending_client_requests,
            "agent_output_read_to_end": self.agent_output_ended,
            "agent_partial_line_bytes": self._splitters[Direction.AGENT_TO_CLIENT].buffered,
        }

    # -- tasks ----------------------------------------------------------------------------

    async def run(self) -> SessionStats:
        """Pump until the agent's output ended and everything owed to the client was written."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._writer, self.to_agent, True)
                tg.start_soon(self._writer, self.to_client, False)
                tg.start_soon(self._client_reader)
                await self._agent_reader()
        finally:
            # Whatever is left is garbage once the session ends: give the budget back.
            self.budget.add(-self._held)
            self._held = 0
            if self.observers:
                now = time.monotonic()
                for observer in self.observers:
                    observer.on_end(self, now)
        return self.stats

    def _account(self) -> None:
        """Report this session's buffered bytes to the shared budget."""
        splitters = self._splitters
        held = (
            splitters[Direction.CLIENT_TO_AGENT].buffered
            + splitters[Direction.AGENT_TO_CLIENT].buffered
            + self.to_agent.held()
            + self.to_client.held()
        )
        delta = held - self._held
        if delta:
            self._held = held
            self.budget.add(delta)

    async def _read_loop(
        self,
        direction: Direction,
        rx: anyio.abc.ByteReceiveStream,
        forward: _Outbox,
        back: _Outbox,
    ) -> None:
        # The whole chunk goes through the core in one call, and its frames are queued without
        # awaiting: the queue may overshoot its bound by one chunk's frames, which keeps memory
        # bounded (read size + one maximal frame) and the hot path free of per-frame awaits.
        #
        # Before each read it waits for three things only (issue 9.3: backpressure in one
        # direction stops reading *from the sender of that direction* only): room in the queue
        # toward the receiver, room for the replies this sender provoked, and the buffer budget.
        # Never for the other direction's forwarded traffic.
        splitter = self._splitters[direction]
        single_line = splitter.single_line
        connection = self.connection
        handle_many = connection.handle_many
        handle_line = connection.handle_line
        dispatch = self._dispatch
        budget = self.budget
        receiving = self._receiving
        stopping = self._stopping
        reserved = 0

        def handle(chunk: bytes, line: bytes | None) -> None:
            """One chunk through the core and out (synchronous); ``line``: what
            ``single_line(chunk)`` gave."""
            # The complete lines of the chunk travel as one block (``Connection._block``: one
            # scan finds the lines that need the per-line path; the runs between them are
            # forwarded whole). Backlog or not: a joined run that has to wait in the outbound
            # queue is split into its lines there, so coalescing still merges them (issue 4;
            # the queue's merge pass). Issue 13: going line by line under backlog made a
            # proxy that fell behind slower still (0.27x the line relay on small chunks).
            events: list[Any] | bool
            if line is not None:  # the interactive case, one line a read: fewer steps
                events = True
                got = handle_line(direction, line)
                if not isinstance(got, Result):  # tracked, on as it came
                    got = Result((OutFrame(line, got, connection.version),))
                dispatch(direction, got, forward, back)
            else:
                events = splitter.feed_blocks(chunk)
                if events:
                    dispatch(direction, handle_many(direction, events, join=True), forward, back)
            self._account()
            budget.add(-READ_SIZE)  # the read reserved before this chunk was read
            if (events or not splitter.buffered) and budget.owned_by(splitter):
                budget.release_owner(splitter)  # its line is complete

        def consume(chunk: bytes) -> int:
            """Issue 13: a chunk read by the stream's readiness callback while this reader is
            parked in ``receive_or_handled`` is handled right there, without waking the reader
            task (one loop iteration and one task switch less per message). When the next read
            may follow at once (the same three conditions as the loop's waits below), the
            callback reserves it and the reader stays parked; otherwise the reader wakes to
            wait. Not while stopping: the reader takes the chunk, as without a consumer."""
            if stopping[direction]:
                return NOT_HANDLED
            line = single_line(chunk)
            if line is not None:
                # The round trip's step (issue 13): one line, forwarded as it came and written
                # at once. Nothing any buffer holds changed (the splitter holds no partial
                # line, the outbox wrote it whole), so no accounting is due, and the read this
                # chunk reserved is kept for the next one when the budget would grant it again.
                got = handle_line(direction, line)
                if not isinstance(got, Result):  # a request or response, tracked: on as it came
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
                        self._account()
                    if (
                        budget.keep_read(splitter)
                        and forward.queue.has_room()
                        and back.has_reply_room()
                    ):
                        receiving[direction] = time.monotonic()
                        return HANDLED
                    budget.add(-READ_SIZE)
                    budget.release_owner(splitter)
                else:
                    if not isinstance(got, Result):
                        got = Result((OutFrame(line, got, connection.version),))
                    dispatch(direction, got, forward, back)
                    self._account()
                    budget.add(-READ_SIZE)
                    budget.release_owner(splitter)
            else:
                handle(chunk, None)
            if (
                forward.queue.has_room()
                and back.has_reply_room()
                and budget.try_reserve_read(splitter, splitter.buffered)
            ):
                receiving[direction] = time.monotonic()
                return HANDLED
            return HANDLED_WAKE

        set_consumer = getattr(rx, "set_consumer", None)
        receive: Callable[[int], Awaitable[bytes | None]] = rx.receive
        if callable(set_consumer):
            set_consumer(consume)
            receive = rx.receive_or_handled  # type: ignore[attr-defined]
        # One cancel scope for the whole loop (``stop_*`` cancels it): the only awaits are the
        # waits for room and ``receive``, and a cancelled receive consumes nothing, while each
        # chunk is dispatched synchronously, so stopping never loses or splits a frame.
        with anyio.CancelScope() as scope:
            self._recv_scopes[direction] = scope
            if stopping[direction]:
                scope.cancel()
            try:
                while True:
                    if not forward.queue.has_room():
                        await forward.wait_room()
                    if not back.has_reply_room():
                        await back.wait_reply_room()
                    reserved = await budget.reserve_read(splitter, splitter.buffered)
                    receiving[direction] = time.monotonic()
                    try:
                        chunk = await receive(reserved)
                    except _STREAM_ERRORS:
                        break
                    finally:
                        receiving[direction] = None
                    if chunk is not None:
                        handle(chunk, single_line(chunk))  # gives the reserved read back
                    # (``None``: the consumer handled what was read, and gave back the reserved
                    # read of the last chunk it handled without reserving another.)
                    reserved = 0
            finally:
                if callable(set_consumer):
                    set_consumer(None)
                if reserved:
                    budget.add(-reserved)
                budget.release_owner(splitter)
        del self._recv_scopes[direction]
        if not scope.cancel_called:  # real EOF: a last line without its newline still counts
            tail = splitter.end()
            if tail:
                dispatch(direction, handle_many(direction, tail), forward, back)
        self._account()

    def _dispatch(
        self, direction: Direction, result: Result, forward: _Outbox, back: _Outbox
    ) -> None:
        if result.forward:
            now = time.monotonic()
            if forward.push(result.forward, now):
                forward.flush_now(now)
        if result.reply:
            back.push_reply(result.reply)
            if self._frame_log is not None:
                toward = (
                    Direction.CLIENT_TO_AGENT
                    if direction is Direction.AGENT_TO_CLIENT
                    else Direction.AGENT_TO_CLIENT
                )
                self._frame_log.generated(toward, tuple(f.raw for f in result.reply))
        if result.notes:
            self._log_notes(result.notes)
            if self.observers:
                now = time.monotonic()
                for observer in self.observers:
                    observer.on_notes(result.notes, now)

    async def _queue_all(self, outbox: _Outbox, chunks: Iterator[tuple[OutFrame, ...]]) -> None:
        """Queue generated frames chunk by chunk, waiting for room between chunks, so they are
        never all in memory at once (issue 10.2)."""
        toward = (
            Direction.AGENT_TO_CLIENT if outbox is self.to_client else Direction.CLIENT_TO_AGENT
        )
        for chunk in chunks:
            if not outbox.queue.has_room():
                await outbox.wait_room()
            now = time.monotonic()
            for observer in self.observers:
                observer.on_generated(toward, tuple(f.raw for f in chunk), now)
            if self._frame_log is not None:
                self._frame_log.generated(toward, tuple(f.raw for f in chunk))
            if outbox.push(chunk, now):
                outbox.flush_now(now)
            if outbox is self.to_client:
                self._aborts_left -= len(chunk)
            self._account()

    async def _client_reader(self) -> None:
        await self._read_loop(
            Direction.CLIENT_TO_AGENT, self._client_rx, self.to_agent, self.to_client
        )
        self.stats.client_eof = not self._stopping[Direction.CLIENT_TO_AGENT]
        if self.stats.client_eof:
            self.log.info("client closed its input")
        # The agent's own requests to the client can no longer be answered by it.
        if self.connection.pending_agent_requests:
            await self._queue_all(
                self.to_agent,
                self.connection.abort_agent_requests("acp-proxy: the client disconnected"),
            )
        self.to_agent.close()

    async def _agent_reader(self) -> None:
        await self._read_loop(
            Direction.AGENT_TO_CLIENT, self._agent_rx, self.to_client, self.to_agent
        )
        self.agent_output_ended = True
        self.stats.agent_eof = True
        reason = "agent closed its output"
        if self._agent_exit_reason is not None:
            reason = await self._agent_exit_reason()
        # Nothing read from the client after this point reaches the agent: stop first, so every
        # request the agent saw is either answered or in abort_pending (issue 3: "every client
        # request still awaiting a response gets a JSON-RPC error response").
        self.stop_client_input()
        count = self.connection.pending_client_requests
        if count:
            self.log.warning("answering requests left in flight", count=count, reason=reason)
            self._aborts_left = count
            await self._queue_all(self.to_client, self.connection.abort_pending(reason))
        self.to_client.close()

    async def _writer(self, outbox: _Outbox, to_agent: bool) -> None:
        try:
            await self._write_loop(outbox, to_agent)
        finally:
            outbox.finished.set()

    async def _write_loop(self, outbox: _Outbox, to_agent: bool) -> None:
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
                    self._account()
                    continue
                data = b"\n".join(replies) + b"\n"
                stats.writes += 1
            else:
                written = queue.stats.written
                frames, deadline = queue.take(time.monotonic())
                if not frames:
                    if outbox.closed and deadline is None:
                        break
                    await outbox.wait_ready(deadline)
                    continue
                outbox.wake_reader()
                count = queue.stats.written - written  # messages (a run holds several)
                if outbox.broken:
                    stats.discarded += count
                    self._account()
                    continue
                data = frames[0] if count == 1 else b"".join(frames)
                stats.writes += 1
            if outbox.broken:
                continue
            outbox.busy = True
            outbox.inflight = len(data)
            try:
                # A memoryview only comes from a tail, and tails only from try_send streams
                # (FdStream), whose send() takes any buffer.
                await tx.send(data)  # type: ignore[arg-type]
            except _STREAM_ERRORS:
                outbox.broken = True
                stats.discarded += count
                self._peer_gone(to_agent)
                continue
            finally:
                outbox.busy = False
                outbox.inflight = 0
                self._account()
            stats.bytes += len(data)
        if to_agent:
            # Client input is over and flushed: EOF to the agent starts its shutdown.
            with anyio.CancelScope(shield=True):
                try:
                    # A shared duplex stream (socket) half-closes; a plain send stream closes.
                    if isinstance(tx, anyio.abc.ByteStream):
                        await tx.send_eof()
                    else:
                        await tx.aclose()
                except (*_STREAM_ERRORS, OSError):
                    pass
            if self._on_agent_input_closed is not None:
                self._on_agent_input_closed()

    def _peer_gone(self, agent: bool) -> None:
        if agent:
            self.log.warning("agent stopped reading its input; dropping frames sent to it")
        else:
            self.log.warning("client stopped reading; shutting the agent down")
            self.stop_client_input()

    # -- logging --------------------------------------------------------------------------

    def _log_notes(self, notes: tuple[Note, ...]) -> None:
        log = self.log
        for note in notes:
            if type(note) is FrameInfo:
                if self._frame_log is not None:
                    self._frame_log.frame(note)
            elif type(note) is Rewritten:
                if self._frame_log is not None:
                    self._frame_log.rewritten(note)
            elif type(note) is SkippedV1:
                if self._frame_log is not None:
                    self._frame_log.skipped(note)
            elif type(note) is Observed:
                if self._frame_log is not None:
                    self._frame_log.observed(note)
            elif type(note) is NonJson:
                # Warn once per kind (the pipeline marks the first), then only count (summary).
                if note.first_of_kind or self._debug:
                    from acp_proxy.shell.framelog import redacted_text

                    (log.warning if note.first_of_kind else log.debug)(
                        "agent wrote non-JSON output"
                        + ("; forwarded" if note.forwarded else "; diverted to the log")
                        + (
                            " (further lines of this kind are only counted)"
                            if note.first_of_kind
                            else ""
                        ),
                        kind=note.kind,
                        size=note.size,
                        # The agent's own output: secrets in it stay out of the log (issue 11).
                        sample=redacted_text(self.config.record, note.sample),
                    )
            elif type(note) is OversizeFrame:
                log.warning(
                    "frame over the size limit discarded",
                    size=note.size,
                    limit=note.limit,
                    id=_loggable(note.request_id),
                    replied=note.replied,
                    answered=note.answered,
                )
            elif type(note) is MiddlewareFailed:
                failure = note.failure
                log.error(
                    "middleware failed",
                    middleware=failure.middleware,
                    error=failure.error,
                    policy="fail-closed: message dropped"
                    if failure.fail_closed
                    else "fail-open: message forwarded unchanged",
                )
            elif type(note) is VersionNegotiated:
                log.info("protocol version negotiated", version=note.version)
            elif type(note) is Dropped:
                log.info("message dropped by middleware", method=note.method, by=note.dropped_by)
            elif type(note) is NotParsed:
                # Warn for the first, then count (the summary's ``not_parsed``).
                (log.warning if note.first_of_kind else log.debug)(
                    "frame could not be parsed; forwarded untouched, no rule applied"
                    + (" (further ones are only counted)" if note.first_of_kind else ""),
                    direction=str(note.direction),
                    size=note.size,
                    reason=note.reason,
                )
            elif type(note) is UnusualVersion:
                log.warning(
                    "initialize response has an unusual protocolVersion",
                    protocol_version=note.value,
                    action=note.action,
                )
            elif type(note) is PendingFull:
                log.warning(
                    "too many requests awaiting an answer; request answered with an error",
                    direction=str(note.direction),
                    method=note.method,
                    limit=note.limit,
                )

    def summary(self) -> dict[str, Any]:
        """Counts for the exit summary line."""
        stats = self.connection.stats
        return {
            "frames_client_to_agent": stats.client_to_agent_out,
            "frames_agent_to_client": stats.agent_to_client_out,
            "rewritten": stats.rewritten,
            "coalesced": self.to_client.queue.stats.merged,
            "diverted": stats.diverted,
            "dropped": stats.dropped,
            "oversize": stats.oversize,
            "not_parsed": stats.not_parsed,
            "pending_refused": stats.pending_refused,
            "errors": stats.errors_replied + stats.middleware_failures,
            "discarded": self.stats.to_client.discarded + self.stats.to_agent.discarded,
            "version": self.connection.version,
        }


def _loggable(value: object) -> object:
    # orjson cannot encode integers above 64 bits; a log line must never fail.
    if type(value) is int and not -(2**63) <= value < 2**64:
        return str(value)
    return value


async def pump_session(
    config: Config,
    client_rx: anyio.abc.ByteReceiveStream,
    client_tx: anyio.abc.ByteSendStream,
    agent_rx: anyio.abc.ByteReceiveStream,
    agent_tx: anyio.abc.ByteSendStream,
    *,
    log: Any = None,
    agent_exit_reason: Callable[[], Awaitable[str]] | None = None,
    on_agent_input_closed: Callable[[], None] | None = None,
    observers: Sequence[SessionObserver] = (),
) -> PumpSession:
    """Run one session to its end (see ``PumpSession``) and return it (stats, summary)."""
    session = PumpSession(
        config,
        client_rx,
        client_tx,
        agent_rx,
        agent_tx,
        log=log,
        agent_exit_reason=agent_exit_reason,
        on_agent_input_closed=on_agent_input_closed,
        observers=observers,
    )
    await session.run()
    return session


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


async def shutdown_on_signals(
    shutdown: anyio.Event,
    log: Any,
    event: str,
    signals: AsyncIterator[signal.Signals] | None = None,
) -> None:
    """Set ``shutdown`` on every SIGINT, SIGTERM or SIGHUP (logged as ``event``), until cancelled.

    One session's signal watcher, for stdio and ``--connect``: each signal takes the same
    ladder as client EOF (issue 3). ``signals`` is a receiver the caller opened earlier (so
    that no signal is lost in between); without it, one is opened here.
    """
    if signals is None:
        with anyio.open_signal_receiver(*_SIGNALS) as own:
            await shutdown_on_signals(shutdown, log, event, own)
        return
    async for signum in signals:
        log.info(event, signal=signum.name)
        shutdown.set()


async def run_proxy(
    config: Config,
    agent_argv: list[str] | tuple[str, ...],
    *,
    client_stream: anyio.abc.ByteStream | None = None,
) -> int:
    """Spawn the agent, pump the session between it and the client, return the exit code.

    ``client_stream`` defaults to the proxy's own stdin/stdout. Returns the agent's exit code
    (128 + N when signal N ended it), or 127/126 when it cannot be spawned.
    """
    from acp_proxy.shell.transports import stdio_stream

    log = get_logger()
    log.info(
        "starting",
        agent=list(agent_argv),
        config=config.source,
        rules=list(config.rule_names),
        middleware=[spec.name for spec in config.middleware],
    )
    # Signals are handled from before the spawn (issue 10): one arriving right after the fork
    # takes the ladder, instead of the default action leaving the agent behind without us.
    recorder: Recorder | None = None
    if config.record.path is not None:
        # Imported only with a record path (start-up, issue 13).
        from acp_proxy.shell.recorder import exit_info, open_recorder

        recorder = open_recorder(config, log=log, agent=agent_argv)
        if recorder is None:
            return 2  # --record names a file that cannot be written: a usage error
    with anyio.open_signal_receiver(*_SIGNALS) as signals:
        try:
            agent = await spawn_agent(agent_argv, config.agent)
        except SpawnError as exc:
            if recorder is not None:
                recorder.finish(None)
            return spawn_error_exit(exc)
        log = log.bind(agent_pid=agent.pid)
        client = client_stream if client_stream is not None else stdio_stream()
        started = time.monotonic()
        shutdown = anyio.Event()
        # A signal that came between an early start (``spawn.start_early``) and the receiver
        # above takes the same ladder as one that comes now.
        for signum in early_signals():
            log.info("signal received; shutting the agent down", signal=signum.name)
            shutdown.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    shutdown_on_signals,
                    shutdown,
                    log,
                    "signal received; shutting the agent down",
                    signals,
                )
                rc, session = await run_agent_session(
                    config,
                    agent,
                    client,
                    client,
                    log=log,
                    shutdown=shutdown,
                    observers=[recorder] if recorder is not None else [],
                )
                tg.cancel_scope.cancel()
        finally:
            if client_stream is None:
                with anyio.CancelScope(shield=True):
                    await client.aclose()
            if recorder is not None:
                recorder.finish(
                    exit_info(agent.returncode) if agent.returncode is not None else None
                )
    log.info(
        "exit",
        status=describe_status(rc),
        exit_code=exit_code_of(rc),
        duration_s=round(time.monotonic() - started, 3),
        **session.summary(),
    )
    return exit_code_of(rc)


# -- one spawned agent's session, for stdio and the socket transports ----------------------------
# ``run_proxy`` above is the stdio entry point and owns the process's signals; the socket
# listener (``acp_proxy.shell.sockets``) runs many sessions in one process and owns the signals
# itself. Both drive a session through ``run_agent_session`` with a ``shutdown`` event, so the
# ladder is the same everywhere (issue 5: "the same lifecycle rules as stdio").


async def run_agent_session(
    config: Config,
    agent: AgentProcess,
    client_rx: anyio.abc.ByteReceiveStream,
    client_tx: anyio.abc.ByteSendStream,
    *,
    log: Any,
    shutdown: anyio.Event,
    observers: Sequence[SessionObserver] = (),
) -> tuple[int, PumpSession]:
    """Pump one client stream pair to/from a spawned ``agent`` and take it down with the ladder.

    Client EOF, or ``shutdown`` being set, starts the stdio ladder: close the agent's stdin, wait
    ``grace_period``, SIGTERM the group, wait, SIGKILL. Returns the agent's raw return code and the
    finished session. Never leaves the agent (or its group) behind, even when cancelled. The
    caller owns the client streams.
    """
    grace = config.agent.grace_period_s
    drain_timeout = config.agent.drain_timeout_s
    returncode: int | None = None
    input_closed = anyio.Event()
    shutdown_requested = anyio.Event()

    async def exit_reason() -> str:
        shutdown_requested.set()
        rc = await agent.wait()
        return f"agent {describe_status(rc)}"

    session = PumpSession(
        config,
        client_rx,
        client_tx,
        agent.stdio,
        agent.stdio,
        log=log,
        agent_exit_reason=exit_reason,
        on_agent_input_closed=input_closed.set,
        observers=observers,
    )

    async def ladder() -> None:
        async with anyio.create_task_group() as inner:

            async def on_closed() -> None:
                await input_closed.wait()
                shutdown_requested.set()

            async def on_shutdown() -> None:
                await shutdown.wait()
                session.stop_client_input()
                shutdown_requested.set()

            inner.start_soon(on_closed)
            inner.start_soon(on_shutdown)
            await shutdown_requested.wait()
            inner.cancel_scope.cancel()
        if shutdown.is_set():
            session.stop_client_input()
        with anyio.move_on_after(grace):
            await input_closed.wait()
            await agent.wait()
            return
        if agent.returncode is None:
            log.warning("agent still running after grace period; sending SIGTERM", grace_s=grace)
            agent.signal_group(signal.SIGTERM)
            with anyio.move_on_after(grace):
                await agent.wait()
                return
            log.warning("agent ignored SIGTERM; sending SIGKILL")
            agent.signal_group(signal.SIGKILL)

    async def watch_exit(cancel: anyio.CancelScope) -> None:
        nonlocal returncode
        returncode = await agent.wait()
        agent.reap_group()
        log.info("agent " + describe_status(returncode), exit_code=exit_code_of(returncode))
        hooks.agent_exited(returncode)
        # Issue 9.4: everything the agent wrote, and the errors owed to the client, reach even a
        # slow or paused client, for up to ``drain_timeout`` after the exit; then the rest is
        # discarded, and the log says what.
        deadline = time.monotonic() + drain_timeout
        # Its output is normally at EOF now. A reader that waits in receive() for a whole
        # linger means the pipe is empty yet open: a process outside the group still holds it.
        # (A reader waiting for the client to make room is not that: the client is slow.)
        while not session.agent_output_ended:
            now = time.monotonic()
            if now >= deadline:
                break
            idle = session.agent_receive_idle_s(now)
            if idle is not None and idle >= STDOUT_LINGER_S:
                log.warning(
                    "the agent exited but its output is still open (held by a process outside "
                    "its group); no longer reading it"
                )
                session.stop_agent_output()
                break
            wait = STDOUT_LINGER_S - idle if idle is not None else STDOUT_LINGER_S / 4
            await anyio.sleep(min(max(wait, 0.01), deadline - now))
        with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
            await session.to_client.finished.wait()
            # The client has everything; only the writer toward the dead agent can still be
            # stuck (its input held open by a process outside its group).
            await anyio.sleep(STDOUT_LINGER_S)
            log.warning("session did not finish after the agent exited; closing it")
            cancel.cancel()
            return
        log.warning(
            "the client did not take everything the agent wrote within agent.drain_timeout; "
            "discarding the rest",
            drain_timeout_s=drain_timeout,
            **session.undelivered(),
        )
        cancel.cancel()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ladder)
            stderr_done = anyio.Event()
            if agent.stderr_fd is not None:
                stderr_fd, agent.stderr_fd = agent.stderr_fd, None

                async def drain() -> None:
                    try:
                        await drain_stderr(stderr_fd, log.bind(stream="agent_stderr"))
                    finally:
                        stderr_done.set()

                tg.start_soon(drain)
            else:
                stderr_done.set()
            tg.start_soon(watch_exit, tg.cancel_scope)
            await session.run()
            if returncode is None:
                returncode = await agent.wait()
            # The group is dead, so its stderr is at EOF: let the last lines reach the log.
            with anyio.move_on_after(STDOUT_LINGER_S):
                await stderr_done.wait()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if agent.returncode is None:  # cancelled: never leave the agent behind
                agent.signal_group(signal.SIGKILL)
                await agent.wait()
            agent.reap_group()
            await agent.aclose()
    rc = agent.returncode if agent.returncode is not None else returncode
    assert rc is not None
    return rc, session


async def run_remote_agent_session(
    config: Config,
    agent_stream: anyio.abc.ByteStream,
    client_rx: anyio.abc.ByteReceiveStream,
    client_tx: anyio.abc.ByteSendStream,
    *,
    log: Any,
    shutdown: anyio.Event,
    agent_label: str,
    observers: Sequence[SessionObserver] = (),
) -> tuple[bool, PumpSession]:
    """Pump one client stream pair to/from an agent reached over a socket (``--connect``).

    Client EOF or ``shutdown`` half-closes the agent connection (the agent reads EOF, as with
    stdin); if the agent has not closed its side ``grace_period`` later, the session is ended.
    Returns ``(lost, session)``: ``lost`` is True when the agent side ended while the client was
    still sending, in which case every client request in flight got a -32603 error response
    naming the address (issue 5: "Lost connection -> in-flight requests get error responses").
    The caller owns (and closes) all streams.
    """
    grace = config.agent.grace_period_s
    input_closed = anyio.Event()
    lost = False

    async def exit_reason() -> str:
        nonlocal lost
        if input_closed.is_set():
            return f"agent connection to {agent_label} closed"
        lost = True
        return f"agent connection to {agent_label} was lost"

    session = PumpSession(
        config,
        client_rx,
        client_tx,
        agent_stream,
        agent_stream,
        log=log,
        agent_exit_reason=exit_reason,
        on_agent_input_closed=input_closed.set,
        observers=observers,
    )

    async def on_shutdown() -> None:
        await shutdown.wait()
        session.stop_client_input()

    async def after_input_closed() -> None:
        await input_closed.wait()
        await anyio.sleep(grace)
        log.warning(
            "agent did not close its connection within the grace period; closing it",
            grace_s=grace,
        )
        session.stop_agent_output()

    async with anyio.create_task_group() as tg:
        tg.start_soon(on_shutdown)
        tg.start_soon(after_input_closed)
        await session.run()
        tg.cancel_scope.cancel()
    return lost, session
