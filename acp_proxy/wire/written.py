"""Writing frames without joining them: the buffers of a write and where it stopped.

Contract: pure arithmetic over a sequence of ``OutFrame`` written as the stream
``raw + b"\\n"`` per frame (``frames_size`` bytes). ``parts_of`` gives the buffers of the first
bytes of that stream for one ``writev`` (views and the newline constant: no frame is copied);
``line_end_within`` says where the last whole line inside a byte limit ends; ``after_written``
splits what a partial write left into the rest of the line it cut (a tail, as views) and the
frames of the whole lines after it. Everything here equals the same operation on the joined
bytes (``b"".join(f.raw + b"\\n" for f in frames)``), which the property tests check. No I/O.

Why: a read of a stream in full flow becomes two or three frames (the line that completes the
previous read's partial line, then the block's runs); joining them for one ``write`` copied the
whole read twice more (the join, then its newline), a large part of the proxy's CPU while a
reader caught up on a backlog (docs/performance.md, "Figures behind the code").
"""

from __future__ import annotations

from collections.abc import Sequence

from acp_proxy.wire.coalesce import OutFrame

NEWLINE = b"\n"


def frames_size(frames: Sequence[OutFrame]) -> int:
    """Bytes of the stream ``frames`` make (each frame and its newline)."""
    size = len(frames)
    for frame in frames:
        size += len(frame.raw)
    return size


def parts_of(frames: Sequence[OutFrame], upto: int) -> list[bytes | memoryview]:
    """The buffers holding the first ``upto`` bytes of the stream, in order (for ``writev``)."""
    parts: list[bytes | memoryview] = []
    pos = 0
    for frame in frames:
        if pos >= upto:
            break
        raw = frame.raw
        end = pos + len(raw)
        if end <= upto:
            parts.append(raw)
        else:
            parts.append(memoryview(raw)[: upto - pos])
            break
        if end < upto:
            parts.append(NEWLINE)
        pos = end + 1
    return parts


def line_end_within(frames: Sequence[OutFrame], limit: int) -> int:
    """Where the last whole line ending within the first ``limit`` bytes ends (just past its
    newline); 0 when none does. ``data.rfind(b"\\n", 0, limit) + 1`` on the joined bytes."""
    pos = 0
    best = 0
    for frame in frames:
        raw = frame.raw
        end = pos + len(raw)  # the frame's newline
        if end < limit:
            best = end + 1
            pos = end + 1
            continue
        cut = raw.rfind(NEWLINE, 0, limit - pos)
        if cut >= 0:
            best = pos + cut + 1
        break
    return best


def rest_of(frame: OutFrame, cut: int) -> OutFrame:
    """The lines of ``frame`` from ``cut`` (the start of one of its lines) on; their number is
    kept when the frame's was known (the written lines' newlines are counted)."""
    raw = frame.raw
    lines = frame.lines - raw.count(NEWLINE, 0, cut) if frame.lines else 0
    return OutFrame(raw[cut:], None, frame.version, lines)


def after_written(
    frames: Sequence[OutFrame], written: int
) -> tuple[list[bytes | memoryview], list[OutFrame]]:
    """What a write of the stream's first ``written`` bytes left: the rest of the line it cut
    (views, ending with that line's newline; empty when it stopped at a line boundary), and the
    frames of the whole lines after it (a frame cut inside keeps its later lines, ``rest_of``)."""
    pos = 0
    for index, frame in enumerate(frames):
        raw = frame.raw
        end = pos + len(raw) + 1  # past the frame's newline
        if written >= end:
            pos = end
            continue
        rest = list(frames[index + 1 :])
        at = written - pos
        if at == 0:
            return [], [frame, *rest]
        if raw[at - 1] == 10:  # a line boundary inside the frame: no tail
            return [], [rest_of(frame, at), *rest]
        if at == len(raw):
            return [NEWLINE], rest
        nl = raw.find(NEWLINE, at)
        if nl < 0:
            return [memoryview(raw)[at:], NEWLINE], rest
        return [memoryview(raw)[at : nl + 1]], [rest_of(frame, nl + 1), *rest]
    return [], []
