"""Reading a record file back: its sessions, line by line, in bounded memory.

Contract: owns reading a record file for ``show``, ``replay`` and ``ui``: one line at a time,
split by the proxy's ``LineSplitter`` (at most ``MAX_LINE_BYTES`` of a line held; a longer line
is skipped as it is read; blank lines count, so a line's number is its number in the file), each
header starting a session (a file written by ``--record`` twice holds two), each line that cannot
be used reported once as ``FILE:LINE: why`` on stderr (the first ``MAX_REPORTED``, then a count)
and skipped, never an exception. With ``follow``, it waits for the file to exist and to grow.
What a line means is ``acp_proxy.record.format``'s job.
"""

from __future__ import annotations

import io
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.record.escape import visible
from acp_proxy.record.format import RecordError, is_header, parse_header, read_line
from acp_proxy.wire.framing import Line, LineSplitter, Oversize

# A header is small (a command line, a few names): a first line longer than this is not one
# (``/dev/zero`` is refused after reading 1 MiB, not read until memory runs out).
MAX_HEADER_BYTES = 1024 * 1024
# One frame line: a frame of up to ``max_frame_bytes`` (64 MiB by default) and the copy the
# proxy sent instead, JSON-escaped. A longer line is read through and skipped.
MAX_LINE_BYTES = 160 * 1024 * 1024
MAX_REPORTED = 20  # unusable lines reported one by one; the rest are counted
FOLLOW_POLL_S = 0.2
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session of a record file: its number (from 1), header and where it starts."""

    number: int
    line: int
    header: JsonObject


@dataclass(slots=True)
class Problems:
    """Unusable lines: reported to ``out`` as they come (the first ``MAX_REPORTED``)."""

    name: str
    prog: str
    out: IO[str] | None = None  # None: stderr; ``quiet``: nowhere
    quiet: bool = False
    count: int = 0

    def report(self, line: int, why: str) -> None:
        self.count += 1
        if self.count <= MAX_REPORTED and not self.quiet:
            where = f"{visible(self.name)}:{line}"
            print(f"{self.prog}: {where}: {visible(why)}; skipped", file=self.out or sys.stderr)

    def close(self) -> None:
        if self.count > MAX_REPORTED and not self.quiet:
            print(
                f"{self.prog}: {visible(self.name)}: {self.count - MAX_REPORTED} more unusable "
                "lines skipped",
                file=self.out or sys.stderr,
            )


def open_record(path: str, *, follow: bool, prog: str) -> io.BufferedIOBase | str:
    """The record file opened for reading, or why it cannot be (with ``follow``, a file that
    does not exist yet is waited for: a live view starts before the session does)."""
    told = False
    while True:
        try:
            return open(path, "rb")
        except FileNotFoundError as exc:
            if not follow:
                return exc.strerror or str(exc)
            if not told:
                print(f"{prog}: waiting for {visible(path)} to exist", file=sys.stderr, flush=True)
                told = True
            time.sleep(FOLLOW_POLL_S)
        except OSError as exc:
            return exc.strerror or str(exc)


class EndOfFile:
    """What ``RecordLines.read`` gives at the end of the file."""


EOF = EndOfFile()


class RecordLines:
    """The lines of a record stream, numbered from 1, each without its newline; ``None`` for a
    line longer than ``max_line`` (read through, not kept); ``EOF`` at the end (with
    ``follow``, never: it waits for more). A torn last line (no newline at the end) is a line:
    the format decides what it is."""

    def __init__(
        self, stream: io.BufferedIOBase, *, follow: bool = False, max_line: int = MAX_LINE_BYTES
    ) -> None:
        self._stream = stream
        self._follow = follow
        self._max_line = max_line
        self._splitter = LineSplitter(max_line, blank_lines=True)
        self._ready: deque[Line | Oversize] = deque()  # split, not yet returned
        self._given_up = False  # a line over a smaller ``limit`` ended the reading
        self.number = 0  # of the line last returned
        # Where the next line starts in the file (-1: not seekable).
        self._next = stream.tell() if stream.seekable() else -1
        self.offset = -1  # where the line last returned starts in the file (-1: not seekable)

    def read(self, limit: int | None = None) -> bytes | EndOfFile | None:
        """The next line; ``None`` when it is longer than ``limit`` (default: ``max_line``). A
        line longer than a smaller ``limit`` (a header's) ends the reading as soon as more than
        ``limit`` bytes of it are in: it is not read through (``/dev/zero`` has no newline), and
        every later read gives ``EOF``."""
        if limit is None:
            limit = self._max_line
        while not self._ready:
            if self._given_up:
                return EOF
            if self._splitter.buffered > limit:
                self._given_up = True
                self.number += 1
                self.offset = self._next
                return None
            chunk = self._stream.read1(_CHUNK)  # what is there: a pipe never waits for more
            if chunk:
                self._ready.extend(self._splitter.feed(chunk))
            elif self._follow:
                time.sleep(FOLLOW_POLL_S)
            else:
                self._ready.extend(self._splitter.end())
                if not self._ready:
                    return EOF
        event = self._ready.popleft()
        self.number += 1
        self.offset = self._next
        size = event.size if isinstance(event, Oversize) else len(event.raw)
        if self._next >= 0:
            self._next += size + 1
        if size <= limit and isinstance(event, Line):
            return event.raw
        if limit < self._max_line:
            self._given_up = True
        return None


def first_header(lines: RecordLines) -> JsonObject | str:
    """The first line as a header, or why the file is not a record."""
    line = lines.read(MAX_HEADER_BYTES)
    if line is None:
        return "not a record: the first line is longer than a header can be"
    if isinstance(line, EndOfFile) or not line.strip():
        return "empty file"
    try:
        return parse_header(line)
    except RecordError as exc:
        return str(exc)


def entries(
    lines: RecordLines, header: JsonObject, problems: Problems
) -> Iterator[tuple[SessionInfo, JsonObject]]:
    """Every usable line from the first header on, with the session it belongs to (headers
    included: each starts a session). A header of an unreadable version makes its session's
    lines skipped (reported once)."""
    for session, entry, _offset in placed_entries(lines, header, problems):
        yield session, entry


def placed_entries(
    lines: RecordLines, header: JsonObject, problems: Problems
) -> Iterator[tuple[SessionInfo, JsonObject, int]]:
    """``entries``, each with where its line starts in the file (``-1`` when the file cannot
    seek: a pipe), so a reader can leave a large value in the file and read it again."""
    session = SessionInfo(1, 1, header)
    readable = True
    yield session, header, 0
    while True:
        raw = lines.read()
        if isinstance(raw, EndOfFile):
            return
        if raw is None:
            if readable:
                problems.report(lines.number, f"longer than {MAX_LINE_BYTES} bytes")
            continue
        entry = read_line(raw)
        if isinstance(entry, str):
            if readable:
                problems.report(lines.number, entry)
            continue
        if is_header(entry):
            session = SessionInfo(session.number + 1, lines.number, entry)
            try:
                parse_header(raw)
            except RecordError as exc:
                problems.report(lines.number, f"session {session.number}: {exc}")
                readable = False
                continue
            readable = True
        elif not readable:
            continue
        yield session, entry, lines.offset


def read_record(
    stream: io.BufferedIOBase, *, follow: bool, problems: Problems
) -> Iterator[tuple[SessionInfo, JsonObject]] | str:
    """An iterator over the record's usable lines (see ``entries``), or why the file is not a
    record (its first line is not a header)."""
    lines = RecordLines(stream, follow=follow)
    header = first_header(lines)
    if isinstance(header, str):
        return header
    return entries(lines, header, problems)


def read_placed_record(
    stream: io.BufferedIOBase, *, follow: bool, problems: Problems
) -> Iterator[tuple[SessionInfo, JsonObject, int]] | str:
    """``read_record`` with where each line starts (see ``placed_entries``)."""
    lines = RecordLines(stream, follow=follow)
    header = first_header(lines)
    if isinstance(header, str):
        return header
    return placed_entries(lines, header, problems)


def line_at(stream: io.BufferedIOBase, offset: int) -> bytes:
    """The line that starts at ``offset`` of a seekable record file, without its newline (at
    most ``MAX_LINE_BYTES``: the lines read back are ones read before, within it)."""
    stream.seek(offset)
    return stream.readline(MAX_LINE_BYTES + 1).removesuffix(b"\n")
