"""Byte-stream transports for the shell: raw file descriptors (stdio, pipes) as anyio streams.

Contract: owns turning OS handles into anyio ``ByteReceiveStream`` / ``ByteSendStream`` objects
for a session (``session.PumpSession``). Only moves bytes; knows nothing about framing or
JSON-RPC.

Why not anyio's file streams: ``anyio.wrap_file`` / ``FileReadStream`` hop to a worker thread per
read (a thread hop per message costs far more than chunked reads: docs/performance.md,
"Figures behind the code"), and asyncio's pipe
transports refuse a regular file or ``/dev/null`` as stdout. ``FdStream`` reads and writes the
fd directly in non-blocking mode and only parks on the event loop's selector (``wait_readable``
/ ``wait_writable``) when the kernel says ``EAGAIN``. A regular file or ``/dev/null`` never says
``EAGAIN``, so they work too (without ever being registered with epoll, which rejects them).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
import sys
import termios
from collections.abc import Callable

import anyio
import anyio.abc
import anyio.lowlevel

from acp_proxy.shell.spawn import enlarge_pipe

DEFAULT_READ_SIZE = 256 * 1024
_READS_PER_YIELD = 4

# What a chunk consumer (``FdStream.set_consumer``) did with the bytes the readiness callback read.
NOT_HANDLED = 0  # nothing: the parked receive gets them, as without a consumer
HANDLED = 1  # handled, and the next read may follow: the receive stays parked
HANDLED_WAKE = 2  # handled, but the reader must run before the next read: the receive returns None

# What an anyio stream raises when its peer is gone (closed, reset, at EOF): the session treats
# each as the end of that direction, never as a crash. The one such tuple: every reader and
# writer of a stream (sessions, the conductor, the HTTP servers, replay) catches this.
STREAM_ERRORS = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError)


def gone(exc: OSError) -> anyio.BrokenResourceError:
    """The stream boundary's one mapping of an OS error: an error reading or writing a stream's
    descriptor or socket (``EPIPE``, ``ECONNRESET``, ...) is the peer gone, raised as
    ``anyio.BrokenResourceError`` caused by ``exc``, so that callers catch ``STREAM_ERRORS``
    and never an ``OSError`` of a stream."""
    err = anyio.BrokenResourceError()
    err.__cause__ = exc
    return err


class FdStream(anyio.abc.ByteStream):
    """A byte stream over one or two raw file descriptors (read side, write side).

    ``close_fds``: close the descriptors on ``aclose`` (pipes we created), or leave them open and
    only restore their flags (the process's own stdin/stdout); a set names the ones to close.
    """

    def __init__(
        self,
        read_fd: int | None,
        write_fd: int | None,
        *,
        close_fds: bool | frozenset[int] = True,
        read_size: int = DEFAULT_READ_SIZE,
    ) -> None:
        self._read_fd = read_fd
        self._write_fd = write_fd
        fds = {fd for fd in (read_fd, write_fd) if fd is not None}
        self._owned = frozenset(fds) if close_fds is True else (close_fds or frozenset())
        self._read_size = read_size
        self._saved_flags: dict[int, int] = {}
        self._ready_reads = 0
        self._read_closed = read_fd is None
        self._write_closed = write_fd is None
        # Readiness of the read fd, watched persistently while the reader keeps parking on it
        # (see _wait_readable).
        self._watch_loop: asyncio.AbstractEventLoop | None = None
        self._read_waiter: asyncio.Future[bytes | BaseException | None] | None = None
        self._wait_size = read_size  # what the parked receive asked for
        # Bytes (or the error) the readiness callback read for a receive that was cancelled
        # before it got them: the next receive returns them first.
        self._stash: bytes | BaseException | None = None
        self._last_full = False  # the last read filled its buffer: read again before parking
        # Runs on the bytes the readiness callback read while ``receive_or_handled`` is parked
        # (``set_consumer``); None: every chunk goes to the receiver.
        self._consumer: Callable[[bytes], int] | None = None
        self._consumer_on = False  # the parked receive accepts a consumer's handling
        self._write_kind: bool | None = None  # the write fd is a pipe (None: not looked yet)
        for fd in {read_fd, write_fd} - {None}:
            assert fd is not None
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            self._saved_flags[fd] = flags
            if not flags & os.O_NONBLOCK:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max(max_bytes, read_size)`` bytes as soon as any are available.

        Raises ``anyio.EndOfStream`` at EOF and ``anyio.ClosedResourceError`` after close.
        """
        data = await self._receive(max_bytes, consumer=False)
        assert data is not None
        return data

    def set_consumer(self, consumer: Callable[[bytes], int] | None) -> None:
        """Let ``consumer`` handle what the readiness callback reads while a
        ``receive_or_handled`` is parked (the round trip without a task switch).

        The consumer gets each chunk right where it was read, on the event loop's callback, and
        answers ``NOT_HANDLED`` (the receive returns the chunk), ``HANDLED`` (the receive stays
        parked and the next chunk comes to the consumer again) or ``HANDLED_WAKE`` (the receive
        returns ``None``: the reader has something to wait for before it reads again). It must
        not raise; if it does, the receive raises its exception.
        """
        self._consumer = consumer

    async def receive_or_handled(self, max_bytes: int = 65536) -> bytes | None:
        """``receive``, except that chunks read while parked may go to the consumer
        (``set_consumer``): ``None`` when the consumer handled what was read."""
        return await self._receive(max_bytes, consumer=True)

    async def _receive(self, max_bytes: int, *, consumer: bool) -> bytes | None:
        fd = self._read_fd
        if fd is None or self._read_closed:
            raise anyio.ClosedResourceError
        stash = self._stash
        if stash is not None:  # read by the readiness callback for a receive that was cancelled
            self._stash = None
            return self._result(stash)
        # Interactive traffic parks on the selector (EAGAIN) after each read anyway; a reader
        # whose input is always ready yields every few reads so it cannot starve other tasks.
        # The scheduling point comes before the read, so a cancellation never loses bytes.
        if self._ready_reads >= _READS_PER_YIELD:
            self._ready_reads = 0
            await anyio.lowlevel.checkpoint()
        size = max(max_bytes, self._read_size)
        if self._last_full or self._watch_loop is None:
            # The last read filled the buffer (a stream in full flow: more is likely waiting),
            # or the fd is not watched yet (first read, or a regular file epoll rejects): read.
            try:
                data = os.read(fd, size)
            except BlockingIOError:
                pass
            except OSError as exc:
                raise gone(exc) from exc
            else:
                return self._result(data, size)
        # Interactive traffic: park until the fd is readable; the readiness callback reads the
        # data itself (``_on_readable``), so the woken reader never reads just to find EAGAIN.
        self._ready_reads = 0
        self._consumer_on = consumer
        try:
            got = await self._wait_data(fd, size)
        finally:
            self._consumer_on = False
        if got is None:
            return None
        return self._result(got, size)

    def _result(self, data: bytes | BaseException, size: int = 0) -> bytes:
        if isinstance(data, BaseException):
            raise data
        if not data:
            raise anyio.EndOfStream
        self._ready_reads += 1
        self._last_full = len(data) >= size > 0
        return data

    async def _wait_data(self, fd: int, size: int) -> bytes | BaseException | None:
        """Park until ``fd`` is readable and ``_on_readable`` has read from it: the bytes read
        (``b""`` at EOF) or the error to raise.

        ``anyio.wait_readable`` registers the fd with epoll and unregisters it on every call:
        two ``epoll_ctl`` calls and a few objects per message, a large part of the proxy's CPU
        per round trip on interactive traffic (docs/performance.md, "Figures behind the code").
        Here the fd stays
        registered while the reader keeps coming back to wait; the callback drops the
        registration when it fires with nobody waiting (the reader is busy or held by
        backpressure), so a readable fd can never spin the loop, and nothing is read that no
        one asked for. asyncio backend only, which is the backend the proxy runs on
        (``anyio.run`` default).

        The callback reads: waking the reader only to read costs a loop iteration, and
        it left the fd readable during the next poll, whose stale event then woke the reader
        again for a read that found nothing (strace: one EAGAIN read and one extra
        ``epoll_wait`` per message). Bytes the callback read for a receive that is then
        cancelled are kept (``_stash``) for the next receive: a cancelled receive loses nothing.
        ``None``: a consumer handled what was read (``set_consumer``).
        """
        loop = self._watch_loop
        if loop is None:
            loop = asyncio.get_running_loop()
            loop.add_reader(fd, self._on_readable)
            self._watch_loop = loop
        waiter = loop.create_future()
        self._read_waiter = waiter
        self._wait_size = size
        try:
            return await waiter  # type: ignore[no-any-return]
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                self._stash = waiter.result()  # read, not delivered: the next receive's
            raise
        finally:
            self._read_waiter = None

    def _on_readable(self) -> None:
        waiter = self._read_waiter
        if waiter is None:
            self._unwatch()  # nobody waits: level-triggered epoll would fire on every iteration
            return
        if waiter.done():
            return  # fired again before the woken reader ran; it has its data
        fd = self._read_fd
        assert fd is not None
        try:
            data = os.read(fd, self._wait_size)
        except BlockingIOError:
            return  # a stale event (another reader of the same file took it): keep waiting
        except OSError as exc:
            waiter.set_result(gone(exc))
            return
        consumer = self._consumer
        if data and consumer is not None and self._consumer_on:
            try:
                outcome = consumer(data)
            except BaseException as exc:
                waiter.set_result(exc)
                return
            if outcome == HANDLED:
                return  # still parked; the fd stays watched
            if outcome == HANDLED_WAKE:
                waiter.set_result(None)
                return
        waiter.set_result(data)

    def _unwatch(self) -> None:
        loop, self._watch_loop = self._watch_loop, None
        if loop is not None and self._read_fd is not None:
            with contextlib.suppress(Exception):  # the loop may be closed at exit
                loop.remove_reader(self._read_fd)

    def try_send(self, data: bytes | memoryview) -> int:
        """Write what the kernel accepts right now, without waiting; the number of bytes written.

        Lets the outbox write a batch straight from the reader task when the writer is idle (one
        scheduling hop less per message). Raises ``anyio.BrokenResourceError`` (EPIPE)
        and ``anyio.ClosedResourceError``.
        """
        fd = self._write_fd
        if fd is None or self._write_closed:
            raise anyio.ClosedResourceError
        try:
            return os.write(fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise gone(exc) from exc

    def unread(self) -> int | None:
        """Bytes written that the peer has not read yet, when the kernel says (a pipe:
        ``FIONREAD``, which Linux answers on either end; ``SocketStream`` answers for Unix
        sockets); ``None`` when it cannot tell."""
        fd = self._write_fd
        if fd is None or self._write_closed or not self._write_is_pipe():
            return None
        return ioctl_int(fd, termios.FIONREAD)

    def _write_is_pipe(self) -> bool:
        kind = self._write_kind
        if kind is None:
            fd = self._write_fd
            try:
                kind = self._write_kind = fd is not None and stat.S_ISFIFO(os.fstat(fd).st_mode)
            except OSError:
                kind = self._write_kind = False
        return kind

    def try_sendv(self, parts: list[bytes | memoryview]) -> int:
        """``try_send`` of the concatenation of ``parts`` without building it (``writev``)."""
        fd = self._write_fd
        if fd is None or self._write_closed:
            raise anyio.ClosedResourceError
        try:
            return os.writev(fd, parts)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise gone(exc) from exc

    async def send(self, item: bytes) -> None:
        """Write all of ``item``, parking on the selector while the peer's buffer is full.

        Raises ``anyio.BrokenResourceError`` when the reader went away (``EPIPE``).
        """
        fd = self._write_fd
        if fd is None or self._write_closed:
            raise anyio.ClosedResourceError
        view = memoryview(item)
        total = len(view)
        done = 0
        if total == 0:
            await anyio.lowlevel.checkpoint()
        while done < total:
            try:
                done += os.write(fd, view[done:])
            except BlockingIOError:
                await anyio.wait_writable(fd)
            except OSError as exc:  # EPIPE, ECONNRESET, ...
                raise gone(exc) from exc

    async def send_eof(self) -> None:
        """Close the write side (the peer reads EOF)."""
        self._close_write()
        await anyio.lowlevel.checkpoint()

    def _close_write(self) -> None:
        if self._write_closed or self._write_fd is None:
            return
        self._write_closed = True
        self._release(self._write_fd, other=self._read_fd if not self._read_closed else None)

    def _close_read(self) -> None:
        if self._read_closed or self._read_fd is None:
            return
        self._read_closed = True
        self._unwatch()  # before the fd can be closed (and its number reused)
        self._release(self._read_fd, other=self._write_fd if not self._write_closed else None)

    def _release(self, fd: int, other: int | None) -> None:
        if fd == other:  # one descriptor for both directions: release with the last side
            return
        if fd in self._owned:
            with contextlib.suppress(OSError):
                os.close(fd)
        else:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, fcntl.F_SETFL, self._saved_flags[fd])

    async def aclose(self) -> None:
        self._close_read()
        self._close_write()
        await anyio.lowlevel.checkpoint()


def _private_copy(fd: int, flags: int) -> int | None:
    """A new open file description of what ``fd`` refers to, or ``None`` (e.g. a socket).

    O_NONBLOCK lives on the open file description, which stdin/stdout share with the editor and,
    under ``2>&1``, with our own stderr: setting it there could make a plain blocking write
    elsewhere fail with EAGAIN. Reopening ``/proc/self/fd/N`` (pipes, ttys, /dev/null) gives the
    proxy its own description to make non-blocking.
    """
    try:
        return os.open(f"/proc/self/fd/{fd}", flags | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None


def _stdio_fd(fd: int, flags: int) -> tuple[int, bool]:
    """(the fd to use for stdio ``fd``, whether we own it)."""
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            # A regular file never blocks, and reopening would lose its offset: use it as is.
            return fd, False
    except OSError:
        return fd, False
    copy = _private_copy(fd, flags)
    return (fd, False) if copy is None else (copy, True)


def stdio_stream() -> FdStream:
    """The proxy's own stdin/stdout as one byte stream.

    Uses private non-blocking copies of pipes and ttys when possible; otherwise fds 0/1
    themselves, whose flags are restored on close.
    """
    enlarge_pipe(0)
    enlarge_pipe(1)
    read_fd, own_read = _stdio_fd(0, os.O_RDONLY)
    write_fd, own_write = _stdio_fd(1, os.O_WRONLY)
    owned = frozenset(fd for fd, own in ((read_fd, own_read), (write_fd, own_write)) if own)
    return FdStream(read_fd, write_fd, close_fds=owned)


def ioctl_int(fd: int, request: int) -> int | None:
    """An ``int``-valued ioctl of ``fd`` (``None`` if the kernel refuses it)."""
    try:
        got = fcntl.ioctl(fd, request, b"\0\0\0\0")
    except OSError:
        return None
    return int.from_bytes(got, sys.byteorder, signed=True)
