"""One proxied session: two readers, two outboxes, and the order in which a session ends.

Contract: owns one session between a client stream pair and an agent stream pair: it wires a
``Reader`` per direction (``reader``) to an ``Outbox`` per side (``outbox``) through the pure
``Connection``, dispatches what the core returns (forward, reply, notes for the log and the
observers), keeps the session's share of the process's buffer budget (``budget``) up to date,
and ends in order: the errors owed for requests in flight are queued, everything owed is
written, the agent's input is closed. It never parses JSON itself and never decides what a
message becomes (the core does), and it knows nothing of processes or sockets: ``pump_session``
works on any anyio byte streams (pipes, stdio, TCP, Unix); the agent's lifecycle is plugged in
by ``runtime`` through two callbacks.

Bounds (docs/bounds.md): backpressure in one direction stops reading *from the sender of that
direction* only; replies the proxy owes a sender wait in that sender's own small reply queue,
written first, so an agent that streams without reading its stdin (or a client that reads only
after it sent everything) works as it does without the proxy. Errors owed for requests in flight
are built and queued in chunks, never all in memory at once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import orjson

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.base.values import value
from acp_proxy.config import Config
from acp_proxy.shell.log.logsetup import debug_enabled, get_logger
from acp_proxy.shell.log.notelog import NoteLog
from acp_proxy.shell.session import hooks, watchdog
from acp_proxy.shell.session.buffer_budget import BufferBudget, process_budget
from acp_proxy.shell.session.hooks import SessionObserver
from acp_proxy.shell.streams.outbox import Outbox, SideStats, write_all
from acp_proxy.shell.streams.reader import Reader
from acp_proxy.shell.streams.transports import STREAM_ERRORS
from acp_proxy.wire.chain import Direction, Ticking
from acp_proxy.wire.coalesce.queue import OutboundQueue, OutFrame
from acp_proxy.wire.connection.pipeline import Connection, Result

if TYPE_CHECKING:
    from acp_proxy.shell.log.framelog import FrameLog

# How often the links that keep time are asked what falls due (``Ticking``).
TICK_S = 1.0


def _frames(messages: tuple[JsonObject, ...], version: int | None) -> tuple[OutFrame, ...]:
    """Messages of the proxy's own, encoded once, as frames to write."""
    return tuple(OutFrame(orjson.dumps(m), m, version) for m in messages)


@value(frozen=False)
class SessionStats:
    to_client: SideStats = field(default_factory=SideStats)
    to_agent: SideStats = field(default_factory=SideStats)
    client_eof: bool = False
    agent_eof: bool = False


class PumpSession:
    """One session between a client stream pair and an agent stream pair.

    ``agent_exit_reason`` is awaited once the agent's output ended; its text goes into the
    -32603 errors for client requests still in flight (``Connection.abort_pending``), then
    what ``agent_exit_detail`` returns (the agent's last stderr line) after the method, with
    what ``agent_exit_data`` returns (encoded JSON) as their ``error.data``.
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
        agent_exit_data: Callable[[], bytes | None] | None = None,
        agent_exit_detail: Callable[[], str | None] | None = None,
        on_agent_input_closed: Callable[[], None] | None = None,
        connection: Connection | None = None,
        budget: BufferBudget | None = None,
        observers: Sequence[SessionObserver] = (),
    ) -> None:
        self.config = config
        self.log = log if log is not None else get_logger()
        debug = debug_enabled()
        # Process-wide observers (metrics, tracing) join the caller's.
        self.observers = (*observers, *hooks.session_observers(self))
        # Debug frame lines; --log-frames needs each frame's bytes: observe mode.
        self._frame_log: FrameLog | None = None
        if debug:
            # Imported only here: its redaction rules and frame tables serve the debug log.
            from acp_proxy.shell.log.framelog import FrameLog

            self._frame_log = FrameLog(self.log, config.record)
        self._log_notes = NoteLog(self.log, self._frame_log, debug, config.record)
        contents = self._frame_log is not None and self._frame_log.contents
        # Observers that read only the frames (the live view) let the core keep its fast paths.
        watch = hooks.frames_only(self.observers)
        self.connection = connection or Connection(
            config.build_chain(),
            non_json=config.non_json,
            inspect_all=debug,
            max_parse_bytes=config.max_parse_bytes,
            max_pending=config.max_pending_requests,
            observe=(bool(self.observers) and not watch) or contents,
            watch=watch,
        )
        self._client_rx = client_rx
        self._agent_rx = agent_rx
        self._agent_exit_reason = agent_exit_reason
        self._agent_exit_data = agent_exit_data
        self._agent_exit_detail = agent_exit_detail
        self.agent_gone_reason: str | None = None  # set once the agent's output ended
        self._on_agent_input_closed = on_agent_input_closed
        self.stats = SessionStats()
        self.to_agent = Outbox(
            OutboundQueue(config.coalesce, coalesce=False), agent_tx, self.stats.to_agent
        )
        # Coalescing only ever applies toward the client: agent updates are what a slow editor
        # falls behind on.
        self.to_client = Outbox(
            OutboundQueue(config.coalesce, coalesce=True), client_tx, self.stats.to_client
        )
        # Observers that show merges (the live view) are told what the queue merged; with none,
        # the queue has no callback and merging costs what it did.
        merges = hooks.coalesce_observers(self.observers)
        if merges:
            self.to_client.queue.on_coalesced = functools.partial(
                hooks.coalesced, merges, Direction.AGENT_TO_CLIENT
            )
        # This session's part of the budget shared with the others (its floor, then the pool).
        self.budget = (budget if budget is not None else process_budget(config)).share()
        self._held = 0  # what this session counts in the budget
        self.from_client = Reader(Direction.CLIENT_TO_AGENT, config.max_frame_bytes)
        self.from_agent = Reader(Direction.AGENT_TO_CLIENT, config.max_frame_bytes)
        # A line one of them parks can be refused when another session waits for the budget.
        self.budget.watch((self.from_client, self.from_agent), self._account)
        self.agent_output_ended = False  # the agent reader stopped (EOF or stop_agent_output)
        self._aborts_left = 0  # -32603 errors owed to the client and not queued yet

    # -- control --------------------------------------------------------------------------

    def stop_client_input(self) -> None:
        """Stop reading the client as if it had sent EOF (signals, client gone)."""
        self.from_client.stop()

    def agent_gone_error(self) -> tuple[bytes | None, str | None]:
        """``(error.data, detail)`` of the errors that answer requests once the agent is gone:
        what ``agent_exit_data`` and ``agent_exit_detail`` return."""
        data = self._agent_exit_data() if self._agent_exit_data is not None else None
        detail = self._agent_exit_detail() if self._agent_exit_detail is not None else None
        return data, detail

    def stop_agent_output(self) -> None:
        """Stop reading the agent as if it had closed its output (it exited; pipe lingers)."""
        self.from_agent.stop()

    @property
    def bytes_to_client(self) -> int:
        return self.stats.to_client.bytes

    def agent_receive_idle_s(self, now: float) -> float | None:
        """How long the agent reader has been waiting in receive() (None: it is not there, e.g.
        it waits for the client to make room)."""
        since = self.from_agent.receiving
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
            "agent_partial_line_bytes": self.from_agent.splitter.buffered,
        }

    # -- tasks ----------------------------------------------------------------------------

    async def run(self) -> SessionStats:
        """Pump until the agent's output ended and everything owed to the client was written."""
        try:
            async with anyio.create_task_group() as outer:
                # The watchdog looks for lost wake-ups while the session's tasks run.
                outer.start_soon(
                    watchdog.watch,
                    self.log,
                    self.from_client,
                    self.to_agent,
                    self.from_agent,
                    self.to_client,
                )
                ticking: list[Ticking] = [
                    mw for link in self.connection.chain.links
                    if isinstance(mw := link.middleware, Ticking)
                ]  # fmt: skip
                if ticking:
                    outer.start_soon(self._tick, ticking)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._writer, self.to_agent, True)
                    tg.start_soon(self._writer, self.to_client, False)
                    tg.start_soon(self._client_reader)
                    await self._agent_reader()
                outer.cancel_scope.cancel()
        finally:
            self._log_notes.flush()
            # Whatever is left is garbage once the session ends: give the budget back.
            self.budget.add(-self._held)
            self._held = 0
            self.budget.close()
            if self.observers:
                now = time.monotonic()
                for observer in self.observers:
                    observer.on_end(self, now)
        return self.stats

    async def _tick(self, ticking: list[Ticking]) -> None:
        """About once a second: what the links that keep time send (the budgets' cancel of a
        turn that ran too long while its agent said nothing), dispatched like what the core
        returns for a read: toward the client as forwarded frames, toward the agent as the
        proxy's own replies (first in line). Queued without waiting for room: what a tick
        returns is a few messages (``Ticking``)."""
        while True:
            await anyio.sleep(TICK_S)
            for link in ticking:
                try:
                    to_agent, to_client = link.on_tick()
                except Exception:  # a link's bug must not end the session
                    self.log.exception("a middleware failed on its tick", middleware=repr(link))
                    continue
                if to_agent or to_client:
                    version = self.connection.version  # negotiated by now, or still None
                    result = Result(_frames(to_client, version), _frames(to_agent, version), ())
                    self._dispatch(Direction.AGENT_TO_CLIENT, result, self.to_client, self.to_agent)

    def _account(self) -> None:
        """Report this session's buffered bytes to the shared budget."""
        held = (
            self.from_client.splitter.buffered
            + self.from_agent.splitter.buffered
            + self.to_agent.held()
            + self.to_client.held()
        )
        delta = held - self._held
        if delta:
            self._held = held
            self.budget.add(delta)

    def _dispatch(
        self, direction: Direction, result: Result, forward: Outbox, back: Outbox
    ) -> None:
        """Run what the core returned for a read: forward, reply to the sender, log, observe."""
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

    async def _queue_all(self, outbox: Outbox, chunks: Iterator[tuple[OutFrame, ...]]) -> None:
        """Queue generated frames chunk by chunk, waiting for room between chunks, so they are
        never all in memory at once."""
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
        await self.from_client.run(
            self._client_rx,
            connection=self.connection,
            forward=self.to_agent,
            back=self.to_client,
            budget=self.budget,
            dispatch=self._dispatch,
            account=self._account,
        )
        self.stats.client_eof = not self.from_client.stopping
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
        await self.from_agent.run(
            self._agent_rx,
            connection=self.connection,
            forward=self.to_client,
            back=self.to_agent,
            budget=self.budget,
            dispatch=self._dispatch,
            account=self._account,
        )
        self.agent_output_ended = True
        self.stats.agent_eof = True
        reason = "agent closed its output"
        if self._agent_exit_reason is not None:
            reason = await self._agent_exit_reason()
        self.agent_gone_reason = reason
        # Nothing read from the client after this point reaches the agent: stop first, so every
        # request the agent saw is either answered or in abort_pending (every client request
        # still awaiting a response when the agent is gone gets a JSON-RPC error response).
        self.stop_client_input()
        count = self.connection.pending_client_requests
        if count:
            self.log.warning("answering requests left in flight", count=count, reason=reason)
            self._aborts_left = count
            data, detail = self.agent_gone_error()
            await self._queue_all(
                self.to_client, self.connection.abort_pending(reason, data, detail)
            )
        self.to_client.close()

    async def _writer(self, outbox: Outbox, to_agent: bool) -> None:
        try:
            await write_all(
                outbox, self._account, self._agent_gone if to_agent else self._client_gone
            )
            if to_agent:
                await self._close_agent_input(outbox.tx)
        finally:
            outbox.finished.set()

    async def _close_agent_input(self, tx: anyio.abc.ByteSendStream) -> None:
        """Client input is over and flushed: EOF to the agent starts its shutdown."""
        with anyio.CancelScope(shield=True):
            try:
                # A shared duplex stream (socket) half-closes; a plain send stream closes.
                if isinstance(tx, anyio.abc.ByteStream):
                    await tx.send_eof()
                else:
                    await tx.aclose()
            except (*STREAM_ERRORS, OSError):
                pass
        if self._on_agent_input_closed is not None:
            self._on_agent_input_closed()

    def _agent_gone(self) -> None:
        self.log.warning("agent stopped reading its input; dropping frames sent to it")

    def _client_gone(self) -> None:
        self.log.warning("client stopped reading; shutting the agent down")
        self.stop_client_input()

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


async def pump_session(
    config: Config,
    client_rx: anyio.abc.ByteReceiveStream,
    client_tx: anyio.abc.ByteSendStream,
    agent_rx: anyio.abc.ByteReceiveStream,
    agent_tx: anyio.abc.ByteSendStream,
    *,
    log: Any = None,
    agent_exit_reason: Callable[[], Awaitable[str]] | None = None,
    agent_exit_data: Callable[[], bytes | None] | None = None,
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
        agent_exit_data=agent_exit_data,
        on_agent_input_closed=on_agent_input_closed,
        observers=observers,
    )
    await session.run()
    return session
