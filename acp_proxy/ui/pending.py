"""What the live view was told and has not described yet: a ring of raw items, bounded in bytes.

Contract: pure (no I/O, no clock). Holds the items the tap queued (``acp_proxy.shell.ui.tap``:
tuples of the session's ``conn``, the time, what the item is, its fields, and last what it
costs), oldest first, and what they cost together (``held``). Room is made in one of two ways,
each counting what it drops in a ``lost`` item (``(conn, t, "lost", {conn: frames}, cost)``)
that stands where they were, one for a run of drops: ``refuse`` turns the newest item away (the
view keeps up with an observer: what was shown stays continuous up to the gap), ``drop_oldest``
drops the oldest (nobody looks: the ring keeps the latest). A run of frames counts as its
frames, any other item as one; ``take`` cuts a run to take no more frames than asked for.
``added`` and ``left`` count the items queued and those gone since (described or dropped;
``lost`` items are not counted), so that a reader can wait until everything queued before a
moment is described.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

LOST_BYTES: Final = 256  # what a ``lost`` item costs


def frames_of(item: tuple[Any, ...]) -> int:
    """How many frames ``item`` stands for (a run: its frames; anything else: one)."""
    count: int = item[5] if item[2] == "run" else 1
    return count


class Pending:
    """The items not described yet (see the module docstring)."""

    __slots__ = ("added", "held", "items", "left", "lost")

    def __init__(self) -> None:
        self.items: deque[tuple[Any, ...]] = deque()
        self.held = 0  # what the items cost, in bytes
        self.added = 0  # items queued (not counting ``lost`` items)
        self.left = 0  # of them, those gone (described or dropped)
        self.lost = 0  # frames dropped, in all

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, item: tuple[Any, ...]) -> None:
        """Queue ``item`` (its cost is its last field)."""
        self.items.append(item)
        self.held += item[-1]
        self.added += 1

    def take(self, frames: int | None = None) -> list[tuple[Any, ...]]:
        """The oldest items, as many as hold ``frames`` frames (``None``: all), no longer held;
        a run of more than are wanted is cut: its first frames are taken, the rest stays."""
        items = self.items
        out = []
        count = 0
        while items and (frames is None or count < frames):
            item = items[0]
            if frames is not None and item[2] == "run" and item[5] > frames - count:
                out.append(self._cut(frames - count))
                break
            items.popleft()
            out.append(item)
            self.held -= item[-1]
            if item[2] == "run":
                count += item[5]
            else:
                count += 1
                if item[2] == "lost":
                    continue
            self.left += 1
        return out

    def _cut(self, want: int) -> tuple[Any, ...]:
        """The first ``want`` frames of the run at the head, as a run of their own; the rest
        stays at the head (with the item's own cost)."""
        conn, t, what, direction, parts, _, size = self.items[0]
        lines = [frame for part in parts for frame in part.split(b"\n")]
        first, rest = lines[:want], lines[want:]
        cost = sum(map(len, first))
        self.items[0] = (conn, t, what, direction, rest, len(rest), size - cost)
        self.held -= cost
        return (conn, t, what, direction, first, want, cost)

    def refuse(self, item: tuple[Any, ...]) -> int:
        """Count ``item`` as dropped where it would have been (it is not queued); the frames
        it stood for."""
        frames = frames_of(item)
        items = self.items
        last = items[-1] if items else None
        if last is not None and last[2] == "lost":
            counts = last[3]
            counts[item[0]] = counts.get(item[0], 0) + frames
        else:
            items.append((item[0], item[1], "lost", {item[0]: frames}, LOST_BYTES))
            self.held += LOST_BYTES
        self.lost += frames
        return frames

    def drop_oldest(self, room: int) -> int:
        """Drop the oldest items until what is held fits in ``room`` (or only the ``lost``
        item that counts them is left); the frames they stood for."""
        items = self.items
        marker = items.popleft() if items and items[0][2] == "lost" else None
        counts: dict[int, int] = marker[3] if marker is not None else {}
        extra = 0 if marker is not None else LOST_BYTES
        first: tuple[Any, ...] | None = None
        dropped = 0
        while items and self.held + extra > room:
            item = items.popleft()
            self.held -= item[-1]
            first = first or item
            if item[2] == "lost":  # (one that ``refuse`` left): its counts join the head's
                for conn, frames in item[3].items():
                    counts[conn] = counts.get(conn, 0) + frames
                continue
            self.left += 1
            frames = frames_of(item)
            counts[item[0]] = counts.get(item[0], 0) + frames
            dropped += frames
        if marker is not None:
            items.appendleft(marker)
        elif first is not None:
            items.appendleft((first[0], first[1], "lost", counts, LOST_BYTES))
            self.held += LOST_BYTES
        self.lost += dropped
        return dropped
