"""Cutting the head of the coalescing queue for one write.

Contract: what the queue counts of its writes (``QueueStats``, ``Coalesced``), and pure
functions over the queue's waiting entries (lines and runs of lines as they
came, and merged groups), ``take_some``: the first entries up to a byte budget as one run of
whole lines, each merged group encoded (``Group.frames``) and told, and what was taken removed
from the list; ``frames_of``: every entry's frames. A run that does not fit is cut at a line
boundary, so a write never waits for more than about its budget. A run carries its line count
(``Run``): no line is counted by scanning its bytes again, except those of the shorter side of
a cut. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from acp_proxy.base.values import value
from acp_proxy.wire.coalesce.merge import Group

# Memory a waiting frame or line takes beyond its bytes: the bytes object, its tuple and list
# slots, a ``Run``'s object (one figure for all: an upper estimate for a line split out of a
# frame).
FRAME_OVERHEAD = 128


@value(frozen=False)
class QueueStats:
    # Counted in messages (lines): the shell may push a run of untouched lines as one frame.
    pushed: int = 0  # messages pushed
    written: int = 0  # messages handed out by take()
    merged: int = 0  # frames absorbed into a pending frame
    split: int = 0  # extra frames created by clear-then-object splits (counted when written)
    passes: int = 0  # merge passes run
    skipped: int = 0  # lines that waited but skipped merging (it did not pay)


@value
class Coalesced:
    """What the queue wrote for one entity's merged frames (told to ``on_coalesced``): ``merged``
    frames of update kind ``kind`` became ``written`` frames (1, or 2 for a clear then an
    object) of ``size`` bytes, newlines included."""

    kind: str
    entity: tuple[object, ...]
    merged: int
    written: int
    size: int


class Run:
    """Several whole lines waiting as they came, joined by ``\n`` (no trailing newline), and how
    many there are: known from the scan that read them, so neither the queue nor the write
    counts their newlines again. (One line waits as plain ``bytes``.)"""

    __slots__ = ("lines", "raw")

    def __init__(self, raw: bytes, lines: int) -> None:
        self.raw = raw
        self.lines = lines


def waiting(raw: bytes, lines: int) -> bytes | Run:
    """How ``lines`` whole lines (``raw``) wait as they came: one line as its bytes, more as a
    ``Run``."""
    return raw if lines == 1 else Run(raw, lines)


@value
class Taken:
    """What ``take_some`` took: the bytes to write (newlines included), the entries removed
    from the head, the lines they hold, the memory they held and the groups among them."""

    data: bytes
    entries: int
    lines: int
    freed: int
    groups: int


def take_some(
    done: list[bytes | Run | Group], limit: int, written: Callable[[Group], list[bytes]]
) -> Taken:
    """The first entries of ``done``, about ``limit`` bytes of them (whole lines, at least one),
    removed from it; a run of lines bigger than what is left of ``limit`` leaves its first
    lines and waits with the rest. ``written`` gives a group's frames (and tells who wants to
    know)."""
    parts: list[bytes] = []
    size = lines = taken = freed = groups = 0
    for entry in done:
        if size >= limit:
            break
        if isinstance(entry, bytes):  # one line
            parts.append(entry)
            lines += 1
            size += len(entry) + 1
            freed += len(entry) + 1 + FRAME_OVERHEAD
        elif isinstance(entry, Run):
            raw = entry.raw
            room = limit - size
            if len(raw) >= room:
                # A run of lines bigger than the room: its first lines go, the rest waits.
                cut = raw.rfind(b"\n", 0, room)
                if cut < 0:
                    cut = raw.find(b"\n")
                head = raw[:cut]
                parts.append(head)
                # The lines of the shorter side are counted (every newline ends a line).
                if cut <= len(raw) - cut:
                    head_lines = raw.count(b"\n", 0, cut) + 1
                else:
                    head_lines = entry.lines - raw.count(b"\n", cut + 1) - 1
                lines += head_lines
                size += cut + 1
                freed += cut + 1
                rest, left = raw[cut + 1 :], entry.lines - head_lines
                done[taken] = waiting(rest, left)
                break
            parts.append(raw)
            lines += entry.lines
            size += len(raw) + 1
            freed += len(raw) + 1 + FRAME_OVERHEAD
        else:
            frames = written(entry)
            parts.extend(frames)
            lines += entry.lines
            size += sum(len(f) + 1 for f in frames)
            freed += entry.charge
            groups += 1
        taken += 1
    del done[:taken]
    parts.append(b"")  # the last line's newline, in the same copy
    return Taken(b"\n".join(parts), taken, lines, freed, groups)


def frames_of(
    entries: Sequence[bytes | Run | Group], written: Callable[[Group], list[bytes]]
) -> tuple[list[bytes], int]:
    """The frames ``entries`` write (each group's from ``written``), and how many lines."""
    parts: list[bytes] = []
    lines = 0
    for entry in entries:
        if isinstance(entry, bytes):
            parts.append(entry)
            lines += 1
        elif isinstance(entry, Run):
            parts.append(entry.raw)
            lines += entry.lines
        else:
            parts.extend(written(entry))
            lines += entry.lines
    return parts, lines
