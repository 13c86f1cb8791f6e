"""The live view's history: the event stream's bytes, shared by every observer.

Contract: owns the bytes of the Server-Sent Events stream the hub published (each event one
chunk ``id: SEQ\\ndata: JSON\\n\\n``), kept as one contiguous byte stream in **blocks** (one
joined ``bytes`` per batch of events), the oldest dropped whole past its byte bound (which
counts ``outside`` too: what its owner holds of the stream elsewhere, not published yet). A
reader's place in it is a byte offset into that stream since the first event (``end`` is the
total), so handing a reader its backlog costs one slice per block, however many events they
hold and however many readers there are. Pure: no I/O, no clock; it never parses an event on the hot
path (only the cold paths that split blocks back into events do: a replay as JSON Lines, an
export).

A reader that accepts gzip is handed each block compressed, once for all of them: a block's
deflate segment is compressed on its own (a fresh compressor, ended by a sync flush), so the
segments of consecutive blocks, after a gzip header, are one valid gzip stream from any block
on (``deflated``); the compressed copy is kept beside the block and counted in ``held``.

A chunk's JSON never holds a raw newline (JSON escapes it), so an event starts at a block's
start or right after a ``\\n\\n``: that is how a replay from ``SEQ`` finds its first byte.
"""

from __future__ import annotations

import zlib
from bisect import bisect_right
from collections.abc import Iterator
from typing import Final

# Events are joined into one block once this many bytes wait (and at the end of every batch
# the hub publishes): the larger, the fewer slices a reader is handed; the history is dropped
# a block at a time.
BLOCK_BYTES: Final = 64 * 1024
# What starts a gzip stream (no name, no time, "unknown" OS); segments follow, no trailer.
GZIP_HEADER: Final = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def deflated(data: bytes | memoryview) -> bytes:
    """``data`` as a deflate segment of its own (fast level, ended by a sync flush, never
    final): segments concatenate into one deflate stream."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)


class History:
    """The published stream, as blocks (see the module docstring)."""

    __slots__ = (
        "_base",
        "_blocks",
        "_firsts",
        "_gz",
        "_open",
        "_open_bytes",
        "_open_first",
        "_starts",
        "dropped",
        "end",
        "held",
        "last_seq",
        "limit",
        "outside",
    )

    def __init__(self, limit: int) -> None:
        self.limit = limit  # bytes held at most (but always the newest block)...
        # ... together with these, held elsewhere (the frames the hub has not described yet)
        self.outside = 0
        self._blocks: list[bytes] = []  # sealed blocks; ``[:_base]`` are dropped (emptied)
        self._starts: list[int] = []  # the stream offset of each block's first byte
        self._firsts: list[int] = []  # the seq of each block's first event
        self._gz: list[bytes | None] = []  # each block deflated, once a reader wanted it
        self._base = 0  # index of the oldest block held
        self._open: list[bytes] = []  # chunks not yet joined into a block
        self._open_bytes = 0
        self._open_first = 0  # the seq of the first of them
        self.held = 0  # bytes held: the blocks and the open chunks
        self.end = 0  # bytes appended since the first event
        self.last_seq = 0  # the seq of the last event appended
        self.dropped = 0  # events no longer held (the oldest)

    # -- writing ------------------------------------------------------------------------------

    def append(self, seq: int, chunk: bytes) -> None:
        """One event's chunk (``seq`` one more than the last one's)."""
        if not self._open:
            self._open_first = seq
        self._open.append(chunk)
        self._open_bytes += len(chunk)
        self.held += len(chunk)
        self.end += len(chunk)
        self.last_seq = seq
        if self._open_bytes >= BLOCK_BYTES:
            self.seal()
        elif self.held + self.outside > self.limit:
            self.trim()

    def seal(self) -> None:
        """Join the open chunks into a block (readers are handed whole blocks only)."""
        if not self._open:
            return
        block = self._open[0] if len(self._open) == 1 else b"".join(self._open)
        self._starts.append(self.end - len(block))
        self._firsts.append(self._open_first)
        self._blocks.append(block)
        self._gz.append(None)
        self._open = []
        self._open_bytes = 0
        self.trim()

    def trim(self) -> None:
        """Drop the oldest blocks until what is held, with ``outside``, fits in ``limit``."""
        blocks = self._blocks
        # The newest block stays, whatever its size (an event bigger than the bound).
        while self.held + self.outside > self.limit and self._base < len(blocks) - 1:
            base = self._base
            self.held -= len(blocks[base])
            gz = self._gz[base]
            if gz is not None:
                self.held -= len(gz)
                self._gz[base] = None
            self.dropped += self._firsts[base + 1] - self._firsts[base]
            blocks[base] = b""
            self._base = base + 1
        if self._base > 64 and self._base * 2 > len(blocks):
            # Forget the dropped blocks' places (amortised O(1) per block dropped).
            del blocks[: self._base], self._starts[: self._base], self._firsts[: self._base]
            del self._gz[: self._base]
            self._base = 0

    # -- reading ------------------------------------------------------------------------------

    @property
    def start(self) -> int:
        """The stream offset of the oldest byte held."""
        self.seal()
        return self._starts[self._base] if self._base < len(self._starts) else self.end

    @property
    def first_seq(self) -> int:
        """The seq of the oldest event held (``last_seq + 1`` when none is)."""
        self.seal()
        return self._firsts[self._base] if self._base < len(self._firsts) else self.last_seq + 1

    def read(
        self, offset: int, max_bytes: int, gzip: bool = False
    ) -> tuple[list[bytes | memoryview], int] | None:
        """The bytes after ``offset`` (an event boundary), whole blocks up to about
        ``max_bytes`` (at least one), and the offset after them; ``None`` when the byte at
        ``offset`` is no longer held. ``gzip``: as deflate segments (see the module
        docstring)."""
        self.seal()
        if offset >= self.end:
            return [], offset
        if offset < self.start:
            return None
        found = self._slices(offset, max_bytes, gzip)
        if self.held + self.outside > self.limit:
            self.trim()  # compressed copies count too (what was handed out stays referenced)
        return found

    def _slices(
        self, offset: int, max_bytes: int, gzip: bool = False
    ) -> tuple[list[bytes | memoryview], int]:
        blocks, starts = self._blocks, self._starts
        i = bisect_right(starts, offset, self._base) - 1
        out: list[bytes | memoryview] = []
        size = 0
        while i < len(blocks) and size < max_bytes:
            block, begin = blocks[i], starts[i]
            part: bytes | memoryview = block
            if offset != begin:
                part = memoryview(block)[offset - begin :]
                if gzip:
                    part = deflated(part)  # a replay from inside a block (not kept)
            elif gzip:
                gz = self._gz[i]
                if gz is None:
                    gz = self._gz[i] = deflated(block)
                    self.held += len(gz)
                part = gz
            out.append(part)
            size += len(block) - (offset - begin)
            offset = begin + len(block)
            i += 1
        return out, offset

    def offset_of(self, seq: int) -> int:
        """The stream offset where event ``seq`` starts (``end`` past the last one; the oldest
        held when it is no longer held)."""
        self.seal()
        if seq > self.last_seq:
            return self.end
        if seq <= self.first_seq:
            return self.start
        i = bisect_right(self._firsts, seq, self._base) - 1
        block = self._blocks[i]
        if self._firsts[i] == seq:
            return self._starts[i]
        at = block.find(b"\n\nid: %d\n" % seq)
        assert at >= 0, "every event of a block starts after a blank line"
        return self._starts[i] + at + 2

    def since(self, seq: int, gzip: bool = False) -> tuple[list[bytes | memoryview], int]:
        """The bytes of the events after ``seq`` still held (``gzip``: as deflate segments),
        and how many of them are not."""
        first = self.first_seq
        missing = max(0, first - seq - 1)
        if seq >= self.last_seq:
            return [], missing
        parts, _ = self._slices(self.offset_of(seq + 1), self.end, gzip)
        if self.held + self.outside > self.limit:
            self.trim()
        return parts, missing

    def data(self, since: int = 0) -> Iterator[bytes]:
        """The JSON of each event after ``since`` still held, oldest first (cold path)."""
        parts, _ = self.since(since)
        for part in parts:
            yield from datas(part)


def datas(part: bytes | memoryview) -> list[bytes]:
    """The JSON of each event in ``part`` (whole events of the stream, as ``read`` and
    ``since`` hand them out)."""
    return [chunk[chunk.index(b"data: ") + 6 :] for chunk in bytes(part).split(b"\n\n") if chunk]
