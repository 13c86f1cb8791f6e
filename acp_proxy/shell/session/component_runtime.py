"""``acp-proxy component``: the proxy as one component of a conductor's proxy chain.

Contract: owns the component's one stdio connection to its conductor: it reads lines, lets the pure
``wire.conductor.component.Link`` say which side each belongs to, and presents the two sides to an
ordinary ``PumpSession`` as two byte streams (``client``: what the predecessor sent, plain;
``agent``: what the successor sent, unwrapped), so rules, middleware, coalescing, recording,
metrics and traces run on the inner messages exactly as standalone. What the session writes toward
a side goes back through the link (wrapped toward the successor) and out in whole lines. It never
parses a message itself and spawns nothing.

Bounds: each side's stream holds at most ``SIDE_CHUNKS`` chunks of lines (a chunk is at most one
read, ``READ_SIZE``, plus one partial line of at most ``max_frame_bytes``); the partial line is
bounded by ``max_frame_bytes`` (the project's ``LineSplitter``: a longer one is discarded up to its
newline, with a log line, and a request in it gets the proxy's -32600 error). Both directions share
the conductor's one input, so a side that stops taking lines (its queue toward the other side full)
stops the reading of both: the connection itself is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.streams.memory
import orjson

from acp_proxy.config import Config
from acp_proxy.shell.log.logsetup import get_logger
from acp_proxy.shell.log.repeats import Repeats
from acp_proxy.shell.streams.transports import (
    HANDLED,
    HANDLED_WAKE,
    STREAM_ERRORS,
    ChunkConsumer,
    NonBlockingSend,
)
from acp_proxy.wire.conductor.component import Link, Side
from acp_proxy.wire.conductor.envelope import Dialect
from acp_proxy.wire.errors import INVALID_REQUEST, error_bytes
from acp_proxy.wire.framing import Line, LineSplitter, Oversize, read_request_id, scan_head

if TYPE_CHECKING:
    from acp_proxy.shell.record.recorder import Recorder

READ_SIZE = 256 * 1024
SIDE_CHUNKS = 8


class _SideStream(anyio.abc.ByteStream, ChunkConsumer):
    """One side of the conductor connection as the byte stream a ``PumpSession`` reads and
    writes: reads give whole lines routed to this side; writes go through the link.

    Like ``FdStream`` it takes a chunk consumer (``set_consumer``): while the session's reader
    is parked in ``receive_or_handled`` with nothing queued for it, the mux hands the next chunk
    to the consumer right where it was routed, without waking the reader task (the round
    trip's step, one task switch less per message)."""

    def __init__(self, mux: ConductorMux, side: Side, size: int) -> None:
        self._mux = mux
        self._side = side
        tx, rx = anyio.create_memory_object_stream[bytes | BaseException](size)
        self.incoming: anyio.streams.memory.MemoryObjectSendStream[bytes | BaseException] = tx
        self._rx = rx
        self.consumer: Callable[[bytes], int] | None = None
        self.parked = False  # the reader waits in receive_or_handled, nothing queued for it

    def set_consumer(self, consumer: Callable[[bytes], int] | None) -> None:
        self.consumer = consumer

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while True:
            got = await self._receive()
            if got:
                return got

    async def receive_or_handled(self, max_bytes: int = 65536) -> bytes | None:
        """``receive``, or None when the consumer handled what came (see the class)."""
        self.parked = True
        try:
            got = await self._receive()
        finally:
            self.parked = False
        return got or None

    async def _receive(self) -> bytes:
        try:
            got = await self._rx.receive()
        except anyio.ClosedResourceError:
            raise anyio.EndOfStream from None
        if isinstance(got, BaseException):  # the consumer raised: the receive raises it
            raise got
        return got

    async def send(self, item: bytes) -> None:
        # (A memoryview when the outbox writes the tail of a non-blocking write we declined.)
        await self._mux.write(self._side, bytes(item))

    async def send_eof(self) -> None:
        """The session's input toward this side is over: nothing to close (the conductor owns
        the successor; closing our stdout would cut the client side too)."""

    async def aclose(self) -> None:
        self._rx.close()

    async def deliver(self, chunk: bytes) -> None:
        """``chunk`` (whole lines) for the session's reader: to the consumer when the reader is
        parked with nothing queued, else queued."""
        consumer = self.consumer
        if consumer is not None and self.parked:
            try:
                handled = consumer(chunk)
            except Exception as exc:  # handed to the reader, as FdStream does
                self.parked = False
                await self.incoming.send(exc)
                return
            if handled == HANDLED:
                return
            self.parked = False  # from here the reader has something to take first
            await self.incoming.send(b"" if handled == HANDLED_WAKE else chunk)
            return
        self.parked = False
        await self.incoming.send(chunk)


class _DirectSideStream(_SideStream, NonBlockingSend):
    """A side whose conductor stream writes without waiting (an ``FdStream``): the outbox's fast
    path (a write straight from the reader task when its writer is idle) is offered."""

    def try_send(self, data: bytes | memoryview) -> int:
        """Take all of ``data`` (whole lines) and write what they become without waiting; what
        the kernel did not take waits in the mux (``ConductorMux.flush``). 0 when the mux has
        a write in flight or owes one: the outbox then queues for ``send``."""
        return self._mux.try_write(self._side, bytes(data))


class ConductorMux:
    """The conductor connection split into ``client`` and ``agent`` streams by a ``Link``."""

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        link: Link,
        *,
        log: Any,
        max_frame_bytes: int,
        recorder: Recorder | None = None,
    ) -> None:
        self.stream = stream
        self.recorder = recorder
        self.link = link
        self.log = log
        self.max_frame_bytes = max_frame_bytes
        self._write_lock = anyio.Lock()
        self._try_send = stream.try_send if isinstance(stream, NonBlockingSend) else None
        self.can_try_send = self._try_send is not None
        self._owed = b""  # what a non-blocking write left unwritten (flush writes it)
        self._owe = anyio.Event()
        side = _DirectSideStream if self.can_try_send else _SideStream
        self.client = side(self, Side.CLIENT, SIDE_CHUNKS)
        self.agent = side(self, Side.AGENT, SIDE_CHUNKS)
        self._partial = {Side.CLIENT: b"", Side.AGENT: b""}  # a write's unfinished line
        self.closed = anyio.Event()  # the conductor closed its side (EOF)
        self.envelopes_in = 0
        self.envelopes_out = 0
        self.dialect_logged = False
        # Warnings the conductor or the session can repeat at will: logged once, then counted.
        self.repeats = Repeats()
        # Errors for requests no envelope could carry, for the session as the successor's
        # answers (``give_back``); at most ``link.max_in_flight``, the oldest dropped past it.
        self._replies: deque[bytes] = deque()
        self._replies_ready = anyio.Event()

    # -- from the conductor --------------------------------------------------------------------

    async def pump_in(self) -> None:
        """Read the conductor until EOF, routing each line; then end both sides' input."""
        splitter = LineSplitter(self.max_frame_bytes)
        try:
            while True:
                try:
                    chunk = await self.stream.receive(READ_SIZE)
                except STREAM_ERRORS:
                    break
                await self._take(splitter.feed(chunk))
            await self._take(splitter.end())
        finally:
            self.closed.set()
            self.client.incoming.close()
            self.agent.incoming.close()

    async def _take(self, events: list[Line | Oversize]) -> None:
        """Route the complete lines; a line over ``max_frame_bytes`` was not kept: a request
        in it (its id read from its head) is answered with the proxy's -32600 error on the
        conductor connection, whichever side sent it, so it never waits for nothing."""
        lines: list[bytes] = []
        for event in events:
            if isinstance(event, Line):
                lines.append(event.raw)
                continue
            if lines:
                await self._route(lines)
                lines = []
            self.repeats(
                "oversize",
                self.log.warning,
                "a line from the conductor is longer than max_frame_bytes; discarded",
                max_frame_bytes=self.max_frame_bytes,
            )
            if read_request_id(event.head)[0]:
                text = (
                    f"acp-proxy: message of {event.size} bytes exceeds the {event.limit}-byte "
                    "limit; not forwarded"
                )
                reply = error_bytes(scan_head(event.head).id_bytes, INVALID_REQUEST, text)
                await self._send(reply + b"\n")
        if lines:
            await self._route(lines)

    async def _route(self, lines: list[bytes]) -> None:
        """Lines to their sides, consecutive lines of one side in one chunk."""
        incoming = self.link.incoming
        run: list[bytes] = []
        run_side: Side | None = None
        for line in lines:
            if not line.strip():
                continue
            routed = incoming(line)
            if routed.note is not None:
                self.repeats(routed.kind or routed.note, self.log.warning, routed.note)
            if routed.envelope is not None:
                self.envelopes_in += 1
                if routed.hop_meta is not None and self.recorder is not None:
                    self._record_hop(routed.envelope, routed.hop_meta)
            side = routed.side
            if not self.dialect_logged and self.link.dialect is not None:
                self._detected(self.link.dialect)
            if side is not run_side and run:
                await self._deliver(run_side, run)
                run = []
            run_side = side
            run.append(routed.data)
        if run:
            await self._deliver(run_side, run)

    def _detected(self, dialect: Dialect) -> None:
        self.dialect_logged = True
        self.log.info("conductor dialect detected", dialect=dialect.value)
        if self.recorder is not None:
            self.recorder.event(
                "conductor",
                time.monotonic(),
                dialect=dialect.value,
                initialize=dialect.init_method,
                envelope=dialect.envelope_method(request=True),
                notification_envelope=dialect.envelope_method(request=False),
            )

    def _record_hop(self, envelope: str, hop_meta: bytes) -> None:
        """The envelope's own ``_meta`` (hop metadata, which the inner message the record holds
        does not carry), redacted like a frame."""
        assert self.recorder is not None
        cleaned, _changed = self.recorder.redactor.frame(hop_meta)
        try:
            value = orjson.loads(cleaned)
        except orjson.JSONDecodeError:
            value = cleaned.decode("utf-8", "replace")
        self.recorder.event(
            "hop",
            time.monotonic(),
            direction="agent_to_client",
            envelope=envelope,
            hop_meta=value,
        )

    async def _deliver(self, side: Side | None, lines: list[bytes]) -> None:
        if side is Side.CLIENT or side is Side.AGENT:
            target = self.client if side is Side.CLIENT else self.agent
            # (Broken or closed: the session stopped reading that side, shutting down.)
            with contextlib.suppress(*STREAM_ERRORS):
                await target.deliver(b"\n".join(lines) + b"\n")
        elif side is Side.CONDUCTOR:
            await self._send(b"\n".join(lines) + b"\n")

    # -- toward the conductor ------------------------------------------------------------------

    async def write(self, side: Side, data: bytes) -> None:
        """Whole lines the session wrote toward ``side``, through the link, in one write."""
        out = self._transform(side, data)
        if out:
            await self._send(out)

    def try_write(self, side: Side, data: bytes) -> int:
        """``write`` without waiting (see ``_DirectSideStream.try_send``): ``len(data)``, or 0 when
        nothing was done."""
        if self._owed or self._write_lock.locked() or self._partial[side]:
            return 0
        out = self._transform(side, data)
        if out:
            assert self._try_send is not None
            written = self._try_send(out)
            if written < len(out):
                self._owed = out[written:]
                self._owe.set()
        return len(data)

    async def flush(self) -> None:
        """Write what ``try_write`` left unwritten (runs for the whole session)."""
        while True:
            await self._owe.wait()
            self._owe = anyio.Event()
            await self._send(b"")

    def _transform(self, side: Side, data: bytes) -> bytes:
        """What the whole lines of ``data`` become on the conductor connection (a partial
        line waits for the rest)."""
        partial = self._partial[side]
        if partial:
            data = partial + data
        end = data.rfind(b"\n")
        self._partial[side] = data[end + 1 :]
        if end < 0:
            return b""
        outgoing = self.link.outgoing
        out: list[bytes] = []
        for line in data[:end].split(b"\n"):
            sent = outgoing(side, line)
            if sent.note is not None:
                self.repeats(sent.note, self.log.warning, sent.note)
            if sent.replies:
                self._give_back(sent.replies)
            if sent.data is not None:
                out.append(sent.data)
                if sent.envelope is not None:
                    self.envelopes_out += 1
        return b"\n".join(out) + b"\n" if out else b""

    def _give_back(self, replies: tuple[bytes, ...]) -> None:
        self._replies.extend(replies)
        while len(self._replies) > self.link.max_in_flight:
            self._replies.popleft()
            self.repeats(
                "replies dropped",
                self.log.warning,
                "an error for a request that could not go on was dropped (too many waiting)",
            )
        self._replies_ready.set()

    async def give_back(self) -> None:
        """Deliver the errors ``_transform`` made for requests that could not go toward the
        successor, to the session as the successor's answers (runs for the whole session)."""
        while True:
            await self._replies_ready.wait()
            self._replies_ready = anyio.Event()
            while self._replies:
                lines = list(self._replies)
                self._replies.clear()
                with contextlib.suppress(*STREAM_ERRORS):
                    await self.agent.deliver(b"\n".join(lines) + b"\n")

    async def _send(self, data: bytes) -> None:
        async with self._write_lock:
            if self._owed:  # first what a non-blocking write left
                data, self._owed = self._owed + data, b""
            if data:
                await self.stream.send(data)


async def run_component(
    config: Config, *, conductor_stream: anyio.abc.ByteStream | None = None
) -> int:
    """Serve one conductor on stdin/stdout (or ``conductor_stream``) until it closes the
    connection; 0 then, whatever the successor did (the conductor owns the chain)."""
    from acp_proxy.shell.session.runtime import run_remote_agent_session, shutdown_on_signals
    from acp_proxy.shell.streams.transports import stdio_stream

    log = get_logger().bind(role="component")
    log.info(
        "starting as a proxy component",
        config=config.source,
        rules=list(config.rule_names),
        middleware=[spec.name for spec in config.middleware],
    )
    recorder: Recorder | None = None
    if config.record.path is not None:
        from acp_proxy.shell.record.recorder import open_recorder

        recorder = open_recorder(config, log=log, connect="conductor")
        if recorder is None:
            return 2
    stream = conductor_stream if conductor_stream is not None else stdio_stream()
    link = Link(max(config.max_pending_requests, 1))
    mux = ConductorMux(
        stream, link, log=log, max_frame_bytes=config.max_frame_bytes, recorder=recorder
    )
    shutdown = anyio.Event()
    started = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(shutdown_on_signals, shutdown, log, "signal received; closing")
            tg.start_soon(mux.pump_in)
            tg.start_soon(mux.flush)
            tg.start_soon(mux.give_back)
            _lost, session = await run_remote_agent_session(
                config,
                mux.agent,
                mux.client,
                mux.client,
                log=log,
                shutdown=shutdown,
                agent_label="the successor (through the conductor)",
                observers=[recorder] if recorder is not None else [],
            )
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if conductor_stream is None:
                await stream.aclose()
    mux.repeats.flush()
    if recorder is not None:
        recorder.finish({"status": "conductor closed the connection"})
    log.info(
        "exit",
        status="conductor closed the connection",
        exit_code=0,
        dialect=link.dialect.value if link.dialect is not None else None,
        envelopes_in=mux.envelopes_in,
        envelopes_out=mux.envelopes_out,
        duration_s=round(time.monotonic() - started, 3),
        **session.summary(),
    )
    return 0


# -- the command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """``acp-proxy component``'s options: the main command's, less the agent's and sockets'."""
    from acp_proxy.cli import flags
    from acp_proxy.cli.options import CONFIG_ENV

    parser = argparse.ArgumentParser(
        prog="acp-proxy component",
        description="Run as a proxy component of an ACP conductor (proxy chains): one stdio "
        "connection to the conductor, which spawns this command and routes the chain. The "
        "conductor's dialect (proxy/initialize, _proxy/initialize, or initialize with "
        "_meta.proxy) is detected from its first message.",
    )
    flags.add(
        parser, "--config", f"rules file (YAML); default ${CONFIG_ENV}, else pure pass-through"
    )
    flags.add_log_options(parser, level="info", level_help="debug logs one line per frame")
    flags.add(parser, "--record", "record the inner messages to PATH")
    flags.add(parser, "--metrics", "serve Prometheus metrics at URL")
    flags.add(parser, "--ui", "serve the live view at URL (e.g. tcp://127.0.0.1:0)")
    flags.add(parser, "--max-frame-bytes", "longest accepted line (default: the config's, 64MiB)")
    flags.add(
        parser,
        "--middleware-path",
        "search DIR first for the modules of the config's use: entries (repeatable)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """Entry point of ``acp-proxy component``; returns the exit code (2: usage or config)."""
    import dataclasses

    from acp_proxy.cli.launch import with_telemetry
    from acp_proxy.cli.options import (
        CONFIG_ENV,
        EXIT_USAGE,
        load_or_report,
        search_middleware_paths,
    )

    parser = build_parser()
    args = parser.parse_args(list(argv))
    config_path = args.config or os.environ.get(CONFIG_ENV) or None
    search_middleware_paths(parser, args.middleware_path)
    config = load_or_report(config_path)
    if config is None:
        return EXIT_USAGE
    changes: dict[str, Any] = {}
    if args.max_frame_bytes is not None:
        changes["max_frame_bytes"] = args.max_frame_bytes
    if args.record is not None:
        changes["record"] = dataclasses.replace(config.record, path=args.record)
    from acp_proxy.telemetry.endpoint import endpoint_url

    if args.metrics is not None:
        changes["metrics"] = endpoint_url(args.metrics)
    if args.ui is not None:
        changes["ui"] = dataclasses.replace(config.ui, address=endpoint_url(args.ui))
    if changes:
        config = dataclasses.replace(config, **changes)
    from acp_proxy.shell.sockets.address import AddressError, parse_endpoint

    for flag, url in (("metrics", config.metrics), ("ui", config.ui.address)):
        if url is not None:
            try:
                parse_endpoint(url, browser=flag == "ui")
            except AddressError as exc:
                parser.error(f"--{flag}: {exc}")
    from acp_proxy.shell.log.logsetup import configure_logging

    if args.log_frames:
        from acp_proxy.shell.log.framelog import enable_frame_contents

        enable_frame_contents()
        args.log_level = "debug"
    try:
        configure_logging(args.log_level, args.log_format, args.log_file)
    except OSError as exc:
        print(f"acp-proxy: --log-file {args.log_file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    return int(anyio.run(*with_telemetry(config, run_component)))


__all__ = ["ConductorMux", "build_parser", "main", "run_component"]
