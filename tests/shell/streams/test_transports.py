"""``FdStream`` (acp_proxy/shell/streams/transports.py) over real pipes: what each receive costs in
system calls, and that a cancelled receive loses nothing.

A reader parked on an idle pipe used to be woken by the readiness callback only to read
the data itself; the fd was still readable at the next poll, whose stale event woke the reader
again for a read that found nothing (strace of the round-trip bench: one EAGAIN read and one extra
``epoll_wait`` per message). Now the callback reads. The counts below are exact: ``os.read`` is
wrapped, no timing is involved.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import anyio
import pytest

from acp_proxy.shell.streams import transports
from acp_proxy.shell.streams.transports import FdStream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # FdStream's persistent watch is asyncio-only (the proxy's backend)


class _Reads:
    """Every ``os.read`` of the transports module: (fd, got bytes or EAGAIN)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def __call__(self, fd: int, size: int) -> bytes:
        try:
            data = os.read(fd, size)
        except BlockingIOError:
            self.calls.append((fd, "EAGAIN"))
            raise
        self.calls.append((fd, "data" if data else "EOF"))
        return data


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Reads]:
    spy = _Reads()

    class _Os:
        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        read = staticmethod(spy)

    monkeypatch.setattr(transports, "os", _Os())
    yield spy


async def test_a_parked_reader_reads_each_message_once_and_never_finds_eagain(
    reads: _Reads,
) -> None:
    r, w = os.pipe()
    stream = FdStream(r, None, read_size=4096)
    try:
        got: list[bytes] = []
        async with anyio.create_task_group() as tg:

            async def reader() -> None:
                for _ in range(20):
                    got.append(await stream.receive())

            tg.start_soon(reader)
            for i in range(20):
                # Wait until the reader is parked (it has asked for the next message).
                while len(got) < i or stream._read_waiter is None:
                    await anyio.sleep(0)
                os.write(w, b"msg %d\n" % i)
                while len(got) <= i:
                    await anyio.sleep(0)
        assert got == [b"msg %d\n" % i for i in range(20)]
        # The first receive tries a read (the fd is not watched yet); after that, each message
        # is read once, by the readiness callback: no read ever comes back empty-handed again.
        assert reads.calls == [(r, "EAGAIN")] + [(r, "data")] * 20
    finally:
        await stream.aclose()
        os.close(w)


async def test_a_stream_in_full_flow_reads_before_parking(reads: _Reads) -> None:
    """A read that fills the buffer is followed by a direct read (more is likely waiting)."""
    r, w = os.pipe()
    stream = FdStream(r, None, read_size=4096)
    try:
        os.write(w, b"x" * 10000)
        os.close(w)
        chunks = [await stream.receive(4096) for _ in range(3)]
        with pytest.raises(anyio.EndOfStream):
            await stream.receive(4096)
        assert [len(c) for c in chunks] == [4096, 4096, 1808]
        assert reads.calls == [(r, "data")] * 3 + [(r, "EOF")]
    finally:
        await stream.aclose()


async def test_bytes_read_for_a_cancelled_receive_go_to_the_next_receive() -> None:
    """The callback read the data, then the receiving task was cancelled before it resumed
    (asyncio delivers the cancellation): the bytes are the next receive's, none lost."""
    r, w = os.pipe()
    stream = FdStream(r, None, read_size=4096)
    try:
        task = asyncio.ensure_future(stream.receive())
        while stream._read_waiter is None:
            await asyncio.sleep(0)
        os.write(w, b'{"a":1}\n')
        stream._on_readable()  # what the loop calls on readiness: it reads the line
        assert stream._read_waiter is not None and stream._read_waiter.done()
        task.cancel()  # before the receive resumed
        with pytest.raises(asyncio.CancelledError):
            await task
        os.write(w, b'{"b":2}\n')
        assert await stream.receive() == b'{"a":1}\n'
        assert await stream.receive() == b'{"b":2}\n'
    finally:
        await stream.aclose()
        os.close(w)


async def test_a_reader_stopped_by_its_cancel_scope_loses_nothing() -> None:
    """The runtime's ``stop_*`` cancels the reader's anyio scope. When the callback has already
    read, the receive either returns the bytes (anyio lets a task whose wait is over resume) or
    leaves them to the next receive; either way every byte arrives once, in order."""
    r, w = os.pipe()
    stream = FdStream(r, None, read_size=4096)
    got: list[bytes] = []
    try:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def reader() -> None:
                    got.append(await stream.receive())
                    await anyio.sleep_forever()

                tg.start_soon(reader)
                while stream._read_waiter is None:
                    await anyio.sleep(0)
                os.write(w, b'{"a":1}\n')
                stream._on_readable()
                scope.cancel()
        os.write(w, b'{"b":2}\n')
        os.close(w)
        while True:
            try:
                got.append(await stream.receive())
            except anyio.EndOfStream:
                break
        assert b"".join(got) == b'{"a":1}\n{"b":2}\n'
    finally:
        await stream.aclose()


async def test_eof_and_errors_found_by_the_callback_reach_the_receiver() -> None:
    r, w = os.pipe()
    stream = FdStream(r, None, read_size=4096)
    try:
        async with anyio.create_task_group() as tg:
            outcome: list[str] = []

            async def reader() -> None:
                try:
                    await stream.receive()
                except anyio.EndOfStream:
                    outcome.append("eof")

            tg.start_soon(reader)
            while stream._read_waiter is None:
                await anyio.sleep(0)
            os.close(w)
        assert outcome == ["eof"]
    finally:
        await stream.aclose()


async def test_a_consumer_handles_what_the_callback_reads_without_waking_the_receiver() -> None:
    """``set_consumer`` (the runtime handles a chunk on the readiness callback, no task
    switch): HANDLED keeps the receive parked, HANDLED_WAKE returns None, NOT_HANDLED returns
    the bytes, and an exception in the consumer is raised by the receive."""
    r, w = os.pipe()
    stream = FdStream(r, None, read_size=4096)
    seen: list[bytes] = []
    answers = [transports.HANDLED, transports.HANDLED, transports.HANDLED_WAKE]

    def consumer(chunk: bytes) -> int:
        seen.append(chunk)
        if not answers:
            return transports.NOT_HANDLED
        return answers.pop(0)

    stream.set_consumer(consumer)
    try:
        results: list[bytes | None] = []
        async with anyio.create_task_group() as tg:

            async def reader() -> None:
                results.append(await stream.receive_or_handled())
                results.append(await stream.receive_or_handled())

            tg.start_soon(reader)
            for i in range(4):
                while stream._read_waiter is None:
                    await anyio.sleep(0)
                os.write(w, b"m%d\n" % i)
                stream._on_readable()
                if i == 0:
                    # handled on the callback: the receiver is still parked, nothing returned
                    assert results == [] and stream._read_waiter is not None
                    assert not stream._read_waiter.done()
                await anyio.sleep(0)
        assert seen == [b"m0\n", b"m1\n", b"m2\n", b"m3\n"]
        assert results == [None, b"m3\n"]
        # ``receive`` never offers chunks to the consumer.
        async with anyio.create_task_group() as tg:
            got: list[bytes] = []

            async def plain() -> None:
                got.append(await stream.receive())

            tg.start_soon(plain)
            while stream._read_waiter is None:
                await anyio.sleep(0)
            os.write(w, b"m4\n")
            stream._on_readable()
        assert got == [b"m4\n"] and seen[-1] == b"m3\n"

        def failing(chunk: bytes) -> int:
            raise RuntimeError("consumer bug")

        stream.set_consumer(failing)
        async with anyio.create_task_group() as tg:

            async def reader2() -> None:
                with pytest.raises(RuntimeError, match="consumer bug"):
                    await stream.receive_or_handled()

            tg.start_soon(reader2)
            while stream._read_waiter is None:
                await anyio.sleep(0)
            os.write(w, b"m5\n")
            stream._on_readable()
    finally:
        await stream.aclose()
        os.close(w)
