"""The agent's stderr: read to its end, logged or copied through, its last lines kept.

Contract: owns what becomes of the bytes the agent writes to stderr. The proxy always reads the
pipe (a chatty agent never stalls on a full one) and always keeps its tail (``StderrTail``): the
last lines go with the errors that answer the agent's requests when it dies, the very last one in
``error.message`` itself (what editors show), the tail in ``error.data``, both redacted. With
``agent.stderr: log`` each line is a log event (redacted like a record); with ``passthrough`` the
bytes are copied to the proxy's stderr unchanged, whole lines per write where they fit, and a
stderr that does not drain holds the agent back as it would without the proxy. Never touches
the protocol.
"""

from __future__ import annotations

import os
import select
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import orjson

from acp_proxy.shell import hooks
from acp_proxy.shell.transports import STREAM_ERRORS, FdStream
from acp_proxy.wire.framing import Line, LineSplitter, Oversize

# Longest agent stderr line kept whole in a log event; the rest of the line is dropped (and
# counted) so a binary blob on stderr cannot grow memory.
MAX_STDERR_LINE = 64 * 1024
# The tail of the agent's stderr kept for the errors that answer its requests when it dies
# (``error.data.stderr``): the last lines, at most this many bytes and lines.
MAX_STDERR_TAIL_BYTES = 2048
MAX_STDERR_TAIL_LINES = 20
# The last line of that tail in ``error.message``: at most this many characters (cut with "…").
MAX_STDERR_MESSAGE_CHARS = 200
# A write of at most this many bytes to a pipe that polls writable never blocks (POSIX PIPE_BUF).
_ATOMIC = getattr(select, "PIPE_BUF", 512)
# While the proxy's stderr does not drain, how often the copy looks again (doubling up to max).
_MIN_PAUSE_S = 0.001
_MAX_PAUSE_S = 0.05

Redact = Callable[[bytes], str]


class StderrTail:
    """The last lines of the agent's stderr: at most ``MAX_STDERR_TAIL_LINES`` lines and
    ``MAX_STDERR_TAIL_BYTES`` bytes, oldest dropped first."""

    __slots__ = ("_lines", "_size")

    def __init__(self) -> None:
        self._lines: deque[bytes] = deque()
        self._size = 0

    def add(self, line: bytes) -> None:
        line = line.rstrip(b"\r")[-MAX_STDERR_TAIL_BYTES:]
        self._lines.append(line)
        self._size += len(line) + 1
        while self._lines and (
            self._size - 1 > MAX_STDERR_TAIL_BYTES or len(self._lines) > MAX_STDERR_TAIL_LINES
        ):
            self._size -= len(self._lines.popleft()) + 1

    def data(self, redact: Redact) -> bytes | None:
        """``{"stderr": TEXT}`` as JSON (the lines redacted by ``redact``, still within the
        bound), or None when the agent wrote nothing."""
        if not self._lines:
            return None
        text = redact(b"\n".join(self._lines))
        raw = text.encode("utf-8", "replace")
        if len(raw) > MAX_STDERR_TAIL_BYTES:
            raw = raw[-MAX_STDERR_TAIL_BYTES:]
            raw = raw[raw.find(b"\n") + 1 :] if b"\n" in raw else raw
            text = raw.decode("utf-8", "ignore")
        return b'{"stderr":' + orjson.dumps(text) + b"}"

    def last_line(self, redact: Redact) -> str | None:
        """The last line that says something (redacted by ``redact``, spaces trimmed, at most
        ``MAX_STDERR_MESSAGE_CHARS`` characters), or None when no line does."""
        for line in reversed(self._lines):
            text = " ".join(redact(line).split())
            if text:
                if len(text) > MAX_STDERR_MESSAGE_CHARS:
                    text = text[: MAX_STDERR_MESSAGE_CHARS - 1] + "…"
                return text
        return None


async def drain_stderr(
    fd: int,
    log: Any,
    tail: StderrTail | None = None,
    session: Any = None,
    *,
    copy_to: int | None = None,
    redact: Redact | None = None,
) -> None:
    """Read the agent's stderr until EOF; each line goes into ``tail``.

    With ``copy_to`` (``passthrough``) the bytes are written there unchanged. Without it
    (``log``) each line is a log event, its text redacted by ``redact``, and the live view's
    stderr readers are told (``session``: the session this agent serves). Reads large chunks;
    lines longer than ``MAX_STDERR_LINE`` are truncated in the log and the tail (never in the
    copy).
    """
    stream = FdStream(fd, None)  # owns (and closes) the read end
    # Every line, blank ones too; a longer one comes as its first MAX_STDERR_LINE bytes.
    splitter = LineSplitter(MAX_STDERR_LINE, blank_lines=True, head_bytes=MAX_STDERR_LINE)
    unwritten = b""  # copied bytes after the last newline, written with their line

    def lines_done(events: list[Line | Oversize]) -> None:
        for event in events:
            truncated = isinstance(event, Oversize)
            line = event.head if isinstance(event, Oversize) else event.raw
            if copy_to is None:
                _log_stderr_line(log, line, truncated, session, redact)
            if tail is not None:
                tail.add(line)

    try:
        while True:
            try:
                chunk = await stream.receive()
            except STREAM_ERRORS:
                break
            if copy_to is not None:
                data = unwritten + chunk
                cut = data.rfind(b"\n") + 1
                if cut == 0 and len(data) > MAX_STDERR_LINE:
                    cut = len(data)
                unwritten = data[cut:]
                if cut:
                    await copy_out(copy_to, data[:cut])
            lines_done(splitter.feed(chunk))
        lines_done(splitter.end())
        if copy_to is not None and unwritten:
            await copy_out(copy_to, unwritten)
    finally:
        await stream.aclose()


async def copy_out(fd: int, data: bytes) -> None:
    """Write ``data`` whole to ``fd``, never blocking the loop: pieces of at most ``PIPE_BUF``
    bytes (cut after a newline when one is in reach, so lines stay whole) while ``fd`` polls
    writable, else wait for it. No thread: a stderr nobody reads holds only this task, which the
    session's end cancels (a thread stuck in ``write`` would hold the process's exit)."""
    view = memoryview(data)
    pause = _MIN_PAUSE_S
    while view:
        if not _writable(fd):
            await anyio.sleep(pause)
            pause = min(pause * 2, _MAX_PAUSE_S)
            continue
        pause = _MIN_PAUSE_S
        piece = view[:_ATOMIC]
        if len(view) > _ATOMIC:
            cut = bytes(piece).rfind(b"\n") + 1
            piece = piece[:cut] if cut else piece
        try:
            view = view[os.write(fd, piece) :]
        except OSError:
            return  # a stderr that is gone takes nothing more


def _writable(fd: int) -> bool:
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    try:
        return any(event & select.POLLOUT for _, event in poll.poll(0))
    except OSError:
        return False


def _log_stderr_line(
    log: Any, line: bytes, truncated: bool, session: Any, redact: Redact | None
) -> None:
    if hooks.STDERR_READERS:  # the live view shows it too (its hub redacts it)
        hooks.agent_stderr(line, session)
    line = line.rstrip(b"\r")
    text = redact(line) if redact is not None else line.decode("utf-8", "replace")
    if truncated:
        log.info("agent stderr", line=text, truncated=True)
    else:
        log.info("agent stderr", line=text)
