"""Cutting the head of the coalescing queue for one write.

Contract: a pure function over the queue's waiting entries (frames as they came, and merged
groups), ``take_some``: the first entries up to a byte budget as one run of whole lines, each
merged group encoded (``Group.frames``) and told, and what was taken removed from the list.
A frame that holds several lines is cut at a line boundary when it does not fit, so a write
never waits for more than about its budget. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable

from acp_proxy.base.values import value
from acp_proxy.wire.coalesce_merge import Group

# Memory a waiting frame or line takes beyond its bytes: the bytes object, its tuple and list
# slots (one figure for both: an upper estimate for a line split out of a frame).
FRAME_OVERHEAD = 128


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
    done: list[bytes | Group], limit: int, written: Callable[[Group], list[bytes]]
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
        if isinstance(entry, bytes):
            room = limit - size
            if len(entry) >= room and b"\n" in entry:
                # A run of lines bigger than the room: its first lines go, the rest waits.
                cut = entry.rfind(b"\n", 0, room)
                if cut < 0:
                    cut = entry.find(b"\n")
                head = entry[:cut]
                parts.append(head)
                lines += head.count(b"\n") + 1
                size += len(head) + 1
                freed += len(head) + 1
                done[taken] = entry[cut + 1 :]
                break
            parts.append(entry)
            lines += entry.count(b"\n") + 1
            size += len(entry) + 1
            freed += len(entry) + 1 + FRAME_OVERHEAD
        else:
            frames = written(entry)
            parts.extend(frames)
            lines += entry.lines
            size += sum(len(f) + 1 for f in frames)
            freed += entry.charge
            groups += 1
        taken += 1
    del done[:taken]
    return Taken(b"\n".join(parts) + b"\n", taken, lines, freed, groups)
