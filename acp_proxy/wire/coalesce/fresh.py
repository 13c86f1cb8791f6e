"""The frames pushed into the coalescing queue since its last merge pass, as they came.

Contract: owns those frames in order (their bytes, protocol version and line count), what they
hold in memory (``held``: their bytes, newlines and ``FRAME_OVERHEAD`` each), and where the
first of them stands in the stream (``first``: the lines pushed before it); ``cut`` hands the
first of them to a pass, whole frames, by lines or by bytes. Pure: no I/O, no clock; nothing is
parsed or scanned here.
"""

from __future__ import annotations

from acp_proxy.wire.coalesce.take import FRAME_OVERHEAD

# One frame as it came: its bytes (without the trailing newline), version, lines.
Frame = tuple[bytes, int | None, int]


class Fresh:
    """The frames pushed since the last merge pass (owned by the queue)."""

    __slots__ = ("first", "frames", "held")

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.held = 0
        self.first = 0  # the lines pushed before the first of them

    def __len__(self) -> int:
        return len(self.frames)

    def add(self, raw: bytes, version: int | None, lines: int, pushed: int) -> int:
        """Append a frame of ``lines`` lines (``pushed``: lines pushed before it); returns what
        it holds."""
        if not self.frames:
            self.first = pushed
        self.frames.append((raw, version, lines))
        size = len(raw) + 1 + FRAME_OVERHEAD
        self.held += size
        return size

    def cut(self, max_lines: int | None, max_bytes: int | None = None) -> tuple[list[Frame], int]:
        """The first frames (all, or about ``max_lines`` lines or ``max_bytes`` bytes: whole
        frames, at least one), no longer fresh, and what they held."""
        frames = self.frames
        if max_bytes is not None and self.held > max_bytes:
            max_lines = 0
        elif max_lines is None:
            held = self.held
            self.first += sum(count for _raw, _version, count in frames)
            self.frames, self.held = [], 0
            return frames, held
        lines = wire = n = 0
        for raw, _version, count in frames:
            if n and (lines >= max_lines if max_bytes is None else wire >= max_bytes):
                break
            lines += count
            wire += len(raw) + 1
            n += 1
        first = frames[:n]
        del frames[:n]
        held = wire + n * FRAME_OVERHEAD
        self.held -= held
        self.first += lines
        return first, held
